/* What the native object calls share (included by _fastcall.c before _fastcall_obj.c, whose
 * entries and _p2p_obj.c's use it): collcomm/core/pickled_small.py's slot layout and codes,
 * an object pickled in band as its _pickle does (obj_dumps: the serializer's own functions,
 * ``Serializer.native``), a pickle unpickled (obj_loads), a slot filled (obj_fill), and the
 * shapes of the entries' results (obj_done, obj_go_on). */

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

static PyObject *obj_std_loads;                    /* pickle.loads */

#include "_obj_quick.c"                            /* scalars without the pickle module */

static int obj_names(void)
{
    PyObject *kw = PyUnicode_InternFromString("buffer_callback");
    s_buffer_callback_kw = kw == NULL ? NULL : PyTuple_Pack(1, kw);
    Py_XDECREF(kw);
    PyObject *pickle = s_buffer_callback_kw == NULL ? NULL : PyImport_ImportModule("pickle");
    obj_std_loads = pickle == NULL ? NULL : PyObject_GetAttrString(pickle, "loads");
    obj_std_dumps = obj_std_loads == NULL ? NULL : PyObject_GetAttrString(pickle, "dumps");
    Py_XDECREF(pickle);
    return obj_std_dumps == NULL ? -1 : 0;
}

/* `obj` pickled in band as the serializer `native` says: 1 (*out: the bytes), 0 declined
 * (no exception), -1 an exception that is not an Exception (Ctrl-C): raised */
static int obj_dumps(PyObject *obj, PyObject *native, PyObject **out)
{
    PyObject *dumps = PyTuple_GET_ITEM(native, 0), *protocol = PyTuple_GET_ITEM(native, 2);
    PyObject *r;
    if (dumps == obj_std_dumps && PyLong_CheckExact(protocol)) {   /* (a scalar: no Pickler) */
        long proto = PyLong_AsLong(protocol);
        r = proto == 4 || proto == 5 ? quick_dumps(obj, proto) : NULL;
        if (r != NULL) {
            *out = r;
            return 1;
        }
        if (PyErr_Occurred())
            return PyErr_ExceptionMatches(PyExc_Exception) ? (PyErr_Clear(), 0) : -1;
    }
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

/* The pickle at `p` unpickled by the serializer's loads, from a copy (the caller's memory
 * may be reused at once): a program's own loads gets a memoryview of it, as the Python
 * code's loads gets one of the received array (mpi4py's gets a buffer object too);
 * pickle.loads the bytes (the same result, without the view). */
static PyObject *obj_loads(PyObject *native, const char *p, Py_ssize_t len)
{
    PyObject *loads = PyTuple_GET_ITEM(native, 1);
    if (loads == obj_std_loads) {
        PyObject *q = quick_loads(p, len);
        if (q != NULL || PyErr_Occurred())
            return q;
    }
    PyObject *b = PyBytes_FromStringAndSize(p, len);
    if (b != NULL && loads != obj_std_loads)
        Py_SETREF(b, PyMemoryView_FromObject(b));
    if (b == NULL)
        return NULL;
    PyObject *r = PyObject_CallOneArg(loads, b);
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
