/* Python objects through the fast call's byte collectives (included by _fastcall.c after
 * _fastcall_a2a_parts.c): what collcomm/core/pickled_small.py does for an object
 * collective, without its Python, in the common case.
 *
 * obj_bcast(obj, root, name, native), obj_gathered(obj, root or -1 (all), name, native),
 * obj_scatter(objs or None, root, name, native), obj_alltoall(objs, name, native):
 * `native` is the serializer's ``Serializer.native`` (dumps, loads, protocol, whether
 * dumps takes a buffer_callback, oob_min). Each pickles this rank's object(s) as
 * pickled_small._pickle does, in band: an object that does not pickle, whose pickle is
 * not bytes or is empty, or (standard pickle at protocol 5 and up, where buffers may
 * travel out of band) that holds a buffer of oob_min bytes or more is declined: None,
 * before any traffic; pickled_small then pickles it again its own way (its pickling
 * hooks run a second time) and reports it on every rank or sends the buffer apart. The first
 * call (the slots, or alltoall's size table) goes through the fast call's own entry
 * (declined there: None, nothing moved). When everything came inline (bcast: or in a
 * second broadcast the fast call took; alltoall: in the all_to_all_v it took), the
 * result is unpickled here: (True, result). Otherwise (False, first call's bytes, this
 * rank's pickle(s)): the first call made, pickled_small goes on from there (a second
 * call, the general way, a failure raised on every rank), exactly as after its own.
 * The slot layout and codes are pickled_small's (the OBJ_* constants of this module; a
 * test compares them). The root's list (scatter, alltoall) is read as a tuple first:
 * pickling runs the program's code, which may change the list. */

enum { OBJ_SLOT = 256, OBJ_HEADER = 16, OBJ_INLINE = OBJ_SLOT - OBJ_HEADER };
#define OBJ_SMALL_MAX ((Py_ssize_t)64 * 1024)
enum { OBJ_BIG = -1 };
enum { OBJ_DONE, OBJ_OVERFLOW, OBJ_GENERAL };     /* scatter's "what follows" */

static PyObject *s_buffer_callback_kw;             /* ("buffer_callback",) */

/* pickle's buffer_callback: True (in band) for a buffer under oob_min bytes (`self`, an
 * int); a larger one raises (it would travel out of band: the Python code's way) */
static PyObject *obj_in_band(PyObject *self, PyObject *pb)
{
    Py_buffer v;
    if (PyObject_GetBuffer(pb, &v, PyBUF_FULL_RO) < 0)
        return NULL;
    Py_ssize_t len = v.len;
    PyBuffer_Release(&v);
    if (len >= PyLong_AsSsize_t(self)) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_BufferError, "collcomm: a buffer to travel out of band");
        return NULL;
    }
    Py_RETURN_TRUE;
}

static PyMethodDef obj_in_band_def = {"in_band", (PyCFunction)obj_in_band, METH_O, NULL};

static int obj_names(void)
{
    PyObject *kw = PyUnicode_InternFromString("buffer_callback");
    s_buffer_callback_kw = kw == NULL ? NULL : PyTuple_Pack(1, kw);
    Py_XDECREF(kw);
    return s_buffer_callback_kw == NULL ? -1 : 0;
}

/* `obj` pickled in band as the serializer `native` says: 1 (*out: the bytes), 0 declined
 * (no exception), -1 an exception that is not an Exception (Ctrl-C): raised */
static int obj_dumps(PyObject *obj, PyObject *native, PyObject **out)
{
    PyObject *dumps = PyTuple_GET_ITEM(native, 0), *protocol = PyTuple_GET_ITEM(native, 2);
    PyObject *r;
    if (PyTuple_GET_ITEM(native, 3) == Py_True) {
        PyObject *cb = PyCFunction_New(&obj_in_band_def, PyTuple_GET_ITEM(native, 4));
        PyObject *args[3] = {obj, protocol, cb};
        r = cb == NULL ? NULL : PyObject_Vectorcall(dumps, args, 2, s_buffer_callback_kw);
        Py_XDECREF(cb);
    } else if (protocol == Py_None) {
        r = PyObject_CallOneArg(dumps, obj);
    } else {
        PyObject *args[2] = {obj, protocol};
        r = PyObject_Vectorcall(dumps, args, 2, NULL);
    }
    if (r == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_Exception))
            return -1;
        PyErr_Clear();
        return 0;
    }
    if (!PyBytes_CheckExact(r) || PyBytes_GET_SIZE(r) == 0) {
        Py_DECREF(r);
        return 0;
    }
    *out = r;
    return 1;
}

/* a pickle's header code: its size, or OBJ_BIG over OBJ_SMALL_MAX */
static inline int64_t obj_code(PyObject *data)
{
    Py_ssize_t len = PyBytes_GET_SIZE(data);
    return len <= OBJ_SMALL_MAX ? (int64_t)len : OBJ_BIG;
}

/* slot `at` of `slots`: the header (code, then) and the pickle when it fits */
static void obj_fill(char *slots, Py_ssize_t at, PyObject *data, int64_t then)
{
    char *slot = slots + at * OBJ_SLOT;
    int64_t head[2] = {obj_code(data), then};
    memcpy(slot, head, sizeof head);
    if (head[0] > 0 && head[0] <= OBJ_INLINE)
        memcpy(slot + OBJ_HEADER, PyBytes_AS_STRING(data), (size_t)head[0]);
}

static inline int64_t obj_word(const char *p)
{
    int64_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static PyObject *obj_loads(PyObject *native, const char *p, Py_ssize_t len)
{
    PyObject *b = PyBytes_FromStringAndSize(p, len);
    if (b == NULL)
        return NULL;
    PyObject *r = PyObject_CallOneArg(PyTuple_GET_ITEM(native, 1), b);
    Py_DECREF(b);
    return r;
}

/* a zeroed bytearray of `len` bytes */
static PyObject *obj_bytes(Py_ssize_t len)
{
    PyObject *b = PyByteArray_FromStringAndSize(NULL, len);
    if (b != NULL && len > 0)
        memset(PyByteArray_AS_STRING(b), 0, (size_t)len);
    return b;
}

static int obj_native_ok(PyObject *native)
{
    return PyTuple_CheckExact(native) && PyTuple_GET_SIZE(native) == 5 &&
           PyLong_CheckExact(PyTuple_GET_ITEM(native, 4));
}

/* (True, result) / (False, first, mine): steals `result` (NULL: an exception, passed on),
 * or `first` and `mine` */
static PyObject *obj_done(PyObject *result)
{
    if (result == NULL)
        return NULL;
    PyObject *t = PyTuple_Pack(2, Py_True, result);
    Py_DECREF(result);
    return t;
}

static PyObject *obj_go_on(PyObject *first, PyObject *mine)
{
    PyObject *t = PyTuple_Pack(3, Py_False, first, mine != NULL ? mine : Py_None);
    Py_DECREF(first);
    Py_XDECREF(mine);
    return t;
}

/* a byte call's entry result: 1 taken (True), 0 declined (None), -1 an exception */
static int obj_taken(PyObject *r)
{
    if (r == NULL)
        return -1;
    int taken = r == Py_True;
    Py_DECREF(r);
    return taken;
}

static PyObject *Fast_obj_bcast(Fast *s, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_args(nargs, 4, "obj_bcast") < 0)
        return NULL;
    long root = fast_root(s, args[1]);
    if (root < 0 || !fast_open(s) || !obj_native_ok(args[3]))
        Py_RETURN_NONE;
    PyObject *native = args[3], *data = NULL;
    if (s->rank == root) {
        int d = obj_dumps(args[0], native, &data);
        if (d <= 0)
            return d < 0 ? NULL : Py_NewRef(Py_None);
    }
    PyObject *slot = obj_bytes(OBJ_SLOT);
    if (slot == NULL) {
        Py_XDECREF(data);
        return NULL;
    }
    if (data != NULL)
        obj_fill(PyByteArray_AS_STRING(slot), 0, data, 0);
    PyObject *call[3] = {slot, args[1], args[2]};
    int taken = obj_taken(fast_broadcast(s, call, 3, PART_WHOLE));
    if (taken <= 0) {
        Py_DECREF(slot);
        Py_XDECREF(data);
        return taken < 0 ? NULL : Py_NewRef(Py_None);
    }
    int64_t code = obj_word(PyByteArray_AS_STRING(slot));
    if (code > 0 && code <= OBJ_INLINE) {
        Py_XDECREF(data);
        PyObject *r = obj_done(obj_loads(native, PyByteArray_AS_STRING(slot) + OBJ_HEADER, code));
        Py_DECREF(slot);
        return r;
    }
    if (code > OBJ_INLINE && code <= OBJ_SMALL_MAX) {    /* the pickle in a second broadcast */
        PyObject *rest = data != NULL ? PyByteArray_FromObject(data) : obj_bytes((Py_ssize_t)code);
        if (rest == NULL) {
            Py_DECREF(slot);
            Py_XDECREF(data);
            return NULL;
        }
        call[0] = rest;
        taken = obj_taken(fast_broadcast(s, call, 3, PART_WHOLE));
        if (taken > 0) {
            Py_DECREF(slot);
            Py_XDECREF(data);
            PyObject *r = obj_done(obj_loads(native, PyByteArray_AS_STRING(rest), code));
            Py_DECREF(rest);
            return r;
        }
        Py_DECREF(rest);
        if (taken < 0) {
            Py_DECREF(slot);
            Py_XDECREF(data);
            return NULL;
        }
    }
    return obj_go_on(slot, data);
}

/* obj_gathered(obj, root, name, native): allgather (root -1) or gather */
static PyObject *Fast_obj_gathered(Fast *s, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_args(nargs, 4, "obj_gathered") < 0)
        return NULL;
    long root = PyLong_CheckExact(args[1]) ? PyLong_AsLong(args[1]) : -2;
    if (root == -1 && PyErr_Occurred())
        return NULL;
    if (root < -1 || root >= s->size || !fast_open(s) || !obj_native_ok(args[3]))
        Py_RETURN_NONE;
    PyObject *native = args[3], *data = NULL;
    int d = obj_dumps(args[0], native, &data);
    if (d <= 0)
        return d < 0 ? NULL : Py_NewRef(Py_None);
    int n = s->size;
    PyObject *own = obj_bytes(OBJ_SLOT), *slots = own == NULL ? NULL : obj_bytes((Py_ssize_t)n * OBJ_SLOT);
    if (slots == NULL) {
        Py_XDECREF(own);
        Py_DECREF(data);
        return NULL;
    }
    obj_fill(PyByteArray_AS_STRING(own), 0, data, 0);
    PyObject *call[3] = {own, slots, args[2]};
    int taken = obj_taken(fast_all_gather(s, call, 3, PART_WHOLE));
    Py_DECREF(own);
    if (taken <= 0) {
        Py_DECREF(slots);
        Py_DECREF(data);
        return taken < 0 ? NULL : Py_NewRef(Py_None);
    }
    const char *at = PyByteArray_AS_STRING(slots);
    int inline_all = 1;
    for (int i = 0; i < n && inline_all; i++) {
        int64_t c = obj_word(at + (Py_ssize_t)i * OBJ_SLOT);
        inline_all = c > 0 && c <= OBJ_INLINE;
    }
    if (!inline_all)
        return obj_go_on(slots, data);
    Py_DECREF(data);
    if (root >= 0 && s->rank != root) {
        Py_DECREF(slots);
        return obj_done(Py_NewRef(Py_None));
    }
    PyObject *out = PyList_New(n);
    for (int i = 0; out != NULL && i < n; i++) {
        const char *slot = at + (Py_ssize_t)i * OBJ_SLOT;
        PyObject *o = obj_loads(native, slot + OBJ_HEADER, obj_word(slot));
        if (o == NULL)
            Py_CLEAR(out);
        else
            PyList_SET_ITEM(out, i, o);
    }
    Py_DECREF(slots);
    return obj_done(out);
}

/* obj_scatter(objs or None, root, name, native): item i of the root's `objs` (a list or
 * tuple of n) to rank i */
static PyObject *Fast_obj_scatter(Fast *s, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_args(nargs, 4, "obj_scatter") < 0)
        return NULL;
    long root = fast_root(s, args[1]);
    int n = s->size, me_root = s->rank == root;
    PyObject *objs = args[0];
    if (root < 0 || !fast_open(s) || !obj_native_ok(args[3]) ||
        (me_root && !((PyList_CheckExact(objs) || PyTuple_CheckExact(objs)) &&
                      PySequence_Fast_GET_SIZE(objs) == n)))
        Py_RETURN_NONE;
    PyObject *native = args[3], *mine = NULL, *slots = Py_NewRef(Py_None);
    if (me_root) {
        /* the items held here: pickling runs the program's code, which may change the list */
        PyObject *items = PySequence_Tuple(objs);
        mine = items == NULL ? NULL : PyList_New(n);
        int64_t then = OBJ_DONE;
        for (int i = 0; mine != NULL && i < n; i++) {
            PyObject *data = NULL;
            int d = obj_dumps(PyTuple_GET_ITEM(items, i), native, &data);
            if (d <= 0) {
                Py_CLEAR(mine);
                Py_DECREF(items);
                Py_DECREF(slots);
                return d < 0 ? NULL : Py_NewRef(Py_None);
            }
            PyList_SET_ITEM(mine, i, data);
            int64_t code = obj_code(data);
            if (code == OBJ_BIG)
                then = OBJ_GENERAL;
            else if (code > OBJ_INLINE && then == OBJ_DONE)
                then = OBJ_OVERFLOW;
        }
        Py_XDECREF(items);
        Py_SETREF(slots, mine == NULL ? NULL : obj_bytes((Py_ssize_t)n * OBJ_SLOT));
        if (slots == NULL) {
            Py_XDECREF(mine);
            return NULL;
        }
        for (int i = 0; i < n; i++)
            obj_fill(PyByteArray_AS_STRING(slots), i, PyList_GET_ITEM(mine, i), then);
    }
    PyObject *slot = obj_bytes(OBJ_SLOT);
    if (slot == NULL) {
        Py_DECREF(slots);
        Py_XDECREF(mine);
        return NULL;
    }
    PyObject *call[4] = {slots, slot, args[1], args[2]};
    int taken = obj_taken(fast_scatter(s, call, 4, PART_WHOLE));
    Py_DECREF(slots);
    if (taken <= 0) {
        Py_DECREF(slot);
        Py_XDECREF(mine);
        return taken < 0 ? NULL : Py_NewRef(Py_None);
    }
    const char *got = PyByteArray_AS_STRING(slot);
    if (obj_word(got + 8) != OBJ_DONE)
        return obj_go_on(slot, mine);
    Py_XDECREF(mine);
    PyObject *r = obj_done(obj_loads(native, got + OBJ_HEADER, obj_word(got)));
    Py_DECREF(slot);
    return r;
}

/* obj_alltoall(objs, name, native): item j of every rank's `objs` (a list of n) to rank
 * j: the size table all-gathered (row i: rank i's int64 sizes), then the pickles in one
 * all_to_all_v */
static PyObject *Fast_obj_alltoall(Fast *s, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_args(nargs, 3, "obj_alltoall") < 0)
        return NULL;
    int n = s->size, me = s->rank;
    PyObject *objs = args[0], *native = args[2];
    if (!fast_open(s) || !obj_native_ok(native) || !PyList_CheckExact(objs) || PyList_GET_SIZE(objs) != n)
        Py_RETURN_NONE;
    /* the items held here: pickling runs the program's code, which may change the list */
    PyObject *items = PyList_AsTuple(objs);
    PyObject *mine = items == NULL ? NULL : PyList_New(n), *row = NULL, *table = NULL;
    for (int i = 0; mine != NULL && i < n; i++) {
        PyObject *data = NULL;
        int d = obj_dumps(PyTuple_GET_ITEM(items, i), native, &data);
        if (d <= 0) {
            Py_DECREF(mine);
            Py_DECREF(items);
            return d < 0 ? NULL : Py_NewRef(Py_None);
        }
        PyList_SET_ITEM(mine, i, data);
    }
    Py_XDECREF(items);
    if (mine != NULL)
        row = obj_bytes((Py_ssize_t)8 * n);
    if (row != NULL)
        table = obj_bytes((Py_ssize_t)8 * n * n);
    if (table == NULL) {
        Py_XDECREF(mine);
        Py_XDECREF(row);
        return NULL;
    }
    for (int j = 0; j < n; j++) {
        int64_t c = obj_code(PyList_GET_ITEM(mine, j));
        memcpy(PyByteArray_AS_STRING(row) + 8 * j, &c, 8);
    }
    PyObject *call[7] = {row, table, args[1]};
    int taken = obj_taken(fast_all_gather(s, call, 3, PART_WHOLE));
    Py_DECREF(row);
    if (taken <= 0) {
        Py_DECREF(table);
        Py_DECREF(mine);
        return taken < 0 ? NULL : Py_NewRef(Py_None);
    }
    const char *t = PyByteArray_AS_STRING(table);
    Py_ssize_t ssum = 0, rsum = 0;
    for (int i = 0; i < n * n; i++)
        if (obj_word(t + 8 * i) <= 0)          /* BIG (or FAILED, from the Python way) */
            return obj_go_on(table, mine);
    PyObject *sc = PyList_New(n), *rc = sc == NULL ? NULL : PyList_New(n);
    for (int j = 0; rc != NULL && j < n; j++) {
        int64_t a = obj_word(t + 8 * ((Py_ssize_t)me * n + j)), b = obj_word(t + 8 * ((Py_ssize_t)j * n + me));
        ssum += a;
        rsum += b;
        PyObject *x = PyLong_FromLongLong(a), *y = PyLong_FromLongLong(b);
        if (x == NULL || y == NULL) {
            Py_XDECREF(x);
            Py_XDECREF(y);
            Py_CLEAR(rc);
            break;
        }
        PyList_SET_ITEM(sc, j, x);
        PyList_SET_ITEM(rc, j, y);
    }
    PyObject *send = rc == NULL ? NULL : obj_bytes(ssum), *recv = send == NULL ? NULL : obj_bytes(rsum);
    if (recv == NULL) {
        Py_XDECREF(send);
        Py_XDECREF(sc);
        Py_XDECREF(rc);
        Py_DECREF(table);
        Py_DECREF(mine);
        return NULL;
    }
    char *w = PyByteArray_AS_STRING(send);
    for (int j = 0; j < n; j++) {
        PyObject *data = PyList_GET_ITEM(mine, j);
        memcpy(w, PyBytes_AS_STRING(data), (size_t)PyBytes_GET_SIZE(data));
        w += PyBytes_GET_SIZE(data);
    }
    PyObject *a2a[7] = {send, sc, Py_None, recv, rc, Py_None, args[1]};
    taken = obj_taken(Fast_all_to_all_v(s, a2a, 7));
    Py_DECREF(send);
    PyObject *out = NULL;
    if (taken > 0) {
        out = PyList_New(n);
        const char *p = PyByteArray_AS_STRING(recv);
        for (int j = 0; out != NULL && j < n; j++) {
            Py_ssize_t len = PyLong_AsSsize_t(PyList_GET_ITEM(rc, j));
            PyObject *o = obj_loads(native, p, len);
            if (o == NULL)
                Py_CLEAR(out);
            else
                PyList_SET_ITEM(out, j, o);
            p += len;
        }
    }
    Py_DECREF(sc);
    Py_DECREF(rc);
    Py_DECREF(recv);
    if (taken < 0 || (taken > 0 && out == NULL)) {
        Py_DECREF(table);
        Py_DECREF(mine);
        return NULL;
    }
    if (taken > 0) {
        Py_DECREF(table);
        Py_DECREF(mine);
        return obj_done(out);
    }
    return obj_go_on(table, mine);
}
