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
 * The slot layout and codes are pickled_small's (the OBJ_* constants of this module, in
 * _obj_pickle.c with the pickling helpers; a test compares them). The root's list (scatter, alltoall) is read as a tuple first:
 * pickling runs the program's code, which may change the list. */

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
    PyObject *call[3] = {row, table, args[1]};
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
