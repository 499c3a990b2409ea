/* P2P.obj_irecv and obj_wait: collcomm.MPI's object ``irecv`` from one rank of this host
 * and its ``wait``, each in one call (included by _p2p_type.c after _p2p_obj.c; the module
 * function obj_wait is in _shmcore.c's table).
 *
 * ``obj_irecv(g, first, local, tag, mask, deferred, op, request, init)``: the receive of
 * an object's first part into ``first`` (a 64 KiB byte array, MPI/_pobj.py's) made a
 * ``deferred`` receive (core/p2p.py Deferred, joining the engine's line as P2P.start does,
 * no record), its op an ``op`` (MPI/_pobj.py _ObjRecv: its fourteen slots written from the
 * tuple ``init``, but ``_g``, ``_first``, ``_buf`` and ``_src``, no __init__) and the
 * returned ``request`` (MPI/_request.py Request: its ``_op``). None, having done nothing,
 * where mpi_irecv would decline (the Python code then takes its regular way).
 *
 * ``obj_wait(op, native, spare)``: _ObjRecv.wait's common case: the first part received by
 * the deferred receive's native wait (Deferred.wait's d_fast), a small object's pickle
 * unpickled with the serializer's own loads (``native``: Serializer.native) from a copy
 * (obj_loads: a program's own loads gets a memoryview of it, as on the Python way), so
 * the buffer goes back to ``spare`` (a list, at most OBJ_SPARE_MAX) for the next
 * receive; the op then complete (``value``, ``source``, ``tag``, ``nbytes``), True. None
 * where the Python code must go on (_ObjRecv._ready): nothing received natively (the
 * deferred receive's regular wait: posted, a timeout scope, an error kept), a large
 * object's first part or a message that is no object's (``_st`` set: its body asked for,
 * or the error raised, there), a serializer C cannot call, an op not in its first state.
 * An exception raised by the wait is kept in ``_exc`` as _ready keeps it; one raised by
 * ``loads`` is raised and nothing kept (a second wait unpickles again, as _ready does).
 */

#define OBJ_SPARE_MAX 8             /* MPI/_pobj.py _SPARE_MAX */

enum { OS_G, OS_FIRST, OS_BUF, OS_BODY, OS_DATA, OS_EXC, OS_ST, OS_DONE, OS_VALUE, OS_SOURCE,
       OS_TAG, OS_NBYTES, OS_CANCELLED, OS_SRC, OS_COUNT };

static PyObject *s_os_names[OS_COUNT];
static struct {
    PyTypeObject *type;             /* strong reference: the class the offsets are of */
    Py_ssize_t at[OS_COUNT];
    int ok;
} os_slots;

static int obj_irecv_names(void)
{
    const char *names[OS_COUNT] = {"_g", "_first", "_buf", "_body", "_data", "_exc", "_st",
                                   "_done", "value", "source", "tag", "nbytes", "cancelled", "_src"};
    for (int i = 0; i < OS_COUNT; i++)
        if ((s_os_names[i] = PyUnicode_InternFromString(names[i])) == NULL)
            return -1;
    return 0;
}

/* Are `t`'s fourteen slots plain slots (offsets found once per class)? */
static int os_fit(PyTypeObject *t)
{
    if (os_slots.type != t) {
        Py_XSETREF(os_slots.type, (PyTypeObject *)Py_NewRef((PyObject *)t));
        os_slots.ok = 1;
        for (int i = 0; i < OS_COUNT; i++)
            os_slots.ok = os_slots.ok && (os_slots.at[i] = plain_slot_offset(t, s_os_names[i])) > 0;
    }
    return os_slots.ok;
}

#define OS(op, i) SLOT_AT(op, os_slots.at[i])

static PyObject *P2P_obj_irecv(P2P *s, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError,
                        "obj_irecv(g, first, local, tag, mask, deferred, op, request, init)");
        return NULL;
    }
    PyObject *g = args[0], *first = args[1], *local = args[2], *tag = args[3], *mask = args[4],
             *dcls = args[5], *ocls = args[6], *rcls = args[7], *init = args[8];
    if (s->paused || s->engine == NULL || !PyObject_CheckBuffer(first) ||
        !PyTuple_CheckExact(init) || PyTuple_GET_SIZE(init) != OS_COUNT ||
        !PyType_Check(dcls) || !PyType_IsSubtype((PyTypeObject *)dcls, &DeferredType) ||
        !PyType_Check(ocls) || !os_fit((PyTypeObject *)ocls) ||
        !PyType_Check(rcls) || !slots_of(&m_req_slots, (PyTypeObject *)rcls, s_m_names + 7, 1))
        Py_RETURN_NONE;
    Pipe *p = p2p_pipe(s, local);
    if (p == NULL || !p->has_in || p2p_tag(s, tag) == 0)
        Py_RETURN_NONE;
    Py_ssize_t at[OS_COUNT], req_at = m_req_slots.at[0];   /* (Python code may run below: */
    memcpy(at, os_slots.at, sizeof at);                     /* the collector, ...) */
    PyObject *d, *op, *req;
    int made = mpi_recv_objects(s, g, first, local, tag, mask, dcls, ocls, rcls, &d, &op, &req);
    if (made <= 0)
        return made < 0 ? NULL : Py_NewRef(Py_None);
    for (int i = 0; i < OS_COUNT; i++)      /* (fresh objects: nothing to drop) */
        SLOT_AT(op, at[i]) = Py_NewRef(PyTuple_GET_ITEM(init, i));
    Py_SETREF(SLOT_AT(op, at[OS_G]), Py_NewRef(g));
    Py_SETREF(SLOT_AT(op, at[OS_FIRST]), d);
    Py_SETREF(SLOT_AT(op, at[OS_BUF]), Py_NewRef(first));
    Py_SETREF(SLOT_AT(op, at[OS_SRC]), Py_NewRef(local));
    SLOT_AT(req, req_at) = op;
    return req;
}

/* obj_wait past its checks (`at`: the op's slot offsets; d, buf, src held by the caller) */
#define AT(i) SLOT_AT(op, at[i])
static PyObject *obj_wait_taken(PyObject *op, const Py_ssize_t *at, Deferred *d, PyObject *buf,
                                PyObject *src, PyObject *native, PyObject *spare)
{
    PyObject *st = d_fast(d);
    if (st == NULL) {
        if (!PyErr_Occurred())
            Py_RETURN_NONE;
        PyObject *t, *v, *tb;         /* the wait's error kept in _exc, as _ready keeps it */
        PyErr_Fetch(&t, &v, &tb);
        PyErr_NormalizeException(&t, &v, &tb);
        if (v != NULL) {
            if (tb != NULL)
                PyException_SetTraceback(v, tb);
            Py_XSETREF(AT(OS_EXC), Py_NewRef(v));
        }
        PyErr_Restore(t, v, tb);
        return NULL;
    }
    PyObject *nb = PyObject_GetAttr(st, s_d_nbytes);
    PyObject *wire = nb == NULL ? NULL : PyObject_GetAttr(st, s_p2p_tag);
    if (wire == NULL) {
        Py_DECREF(st);
        Py_XDECREF(nb);
        return NULL;
    }
    Py_XSETREF(AT(OS_ST), st);
    Py_ssize_t got = PyLong_AsSsize_t(nb);
    uint64_t tag = PyLong_AsUnsignedLongLongMask(wire) & OBJ_TAG_BITS;
    Py_DECREF(nb);
    Py_DECREF(wire);
    if (PyErr_Occurred())
        return NULL;
    Py_buffer v;
    if (PyObject_GetBuffer(buf, &v, PyBUF_SIMPLE) < 0)
        return NULL;
    int64_t size = got >= 8 && v.len >= 8 ? obj_word(v.buf) : -1;
    int small = got >= 8 && size >= 0 && size <= v.len - 8 && got == 8 + size;
    /* (loads gets a copy: the buffer is free once this returns) */
    PyObject *obj = small ? obj_loads(native, (const char *)v.buf + 8, (Py_ssize_t)size) : NULL;
    Py_ssize_t len = v.len;
    PyBuffer_Release(&v);
    if (!small)                 /* a large object or no object's message: _ready's */
        Py_RETURN_NONE;
    if (obj == NULL)            /* loads raised: raised, nothing kept (a next wait unpickles again) */
        return NULL;
    if (AT(OS_DONE) == Py_True) {     /* (another thread's wait completed it meanwhile) */
        Py_DECREF(obj);
        Py_RETURN_TRUE;
    }
    PyObject *t = PyLong_FromUnsignedLongLong(tag), *n = t == NULL ? NULL : PyLong_FromLongLong(size);
    if (n == NULL) {
        Py_DECREF(obj);
        Py_XDECREF(t);
        return NULL;
    }
    Py_XSETREF(AT(OS_VALUE), obj);
    Py_XSETREF(AT(OS_SOURCE), Py_NewRef(src));
    Py_XSETREF(AT(OS_TAG), t);
    Py_XSETREF(AT(OS_NBYTES), n);
    Py_XSETREF(AT(OS_DONE), Py_NewRef(Py_True));
    /* its message read: the buffer serves the next receive */
    if (len == OBJ_EAGER && PyList_CheckExact(spare) && PyList_GET_SIZE(spare) < OBJ_SPARE_MAX &&
        PyList_Append(spare, buf) < 0)
        return NULL;
    Py_RETURN_TRUE;
}
#undef AT

static PyObject *mod_obj_wait(PyObject *unused, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "obj_wait(op, native, spare)");
        return NULL;
    }
    PyObject *op = args[0], *native = args[1], *spare = args[2];
    if (!os_fit(Py_TYPE(op)) || OS(op, OS_DONE) == NULL)
        Py_RETURN_NONE;
    if (OS(op, OS_DONE) == Py_True)
        Py_RETURN_TRUE;
    /* the offsets, the receive's buffer and source held: Python code runs below (the
     * wait's other threads, loads) and may ask os_fit about another class */
    Py_ssize_t at[OS_COUNT];
    memcpy(at, os_slots.at, sizeof at);
    PyObject *d = OS(op, OS_FIRST), *buf = OS(op, OS_BUF), *src = OS(op, OS_SRC);
    if (!obj_native_ok(native) || d == NULL || !PyObject_TypeCheck(d, &DeferredType) ||
        OS(op, OS_ST) != Py_None || OS(op, OS_EXC) != Py_None || OS(op, OS_DATA) != Py_None ||
        OS(op, OS_BODY) != Py_None || buf == NULL || src == NULL || !PyLong_CheckExact(src))
        Py_RETURN_NONE;
    int work = d_is_work((Deferred *)d);        /* (a functional-API RecvWork: not ours) */
    if (work != 0)
        return work < 0 ? NULL : Py_NewRef(Py_None);
    Py_INCREF(d);
    Py_INCREF(buf);
    Py_INCREF(src);
    PyObject *r = obj_wait_taken(op, at, (Deferred *)d, buf, src, native, spare);
    Py_DECREF(d);
    Py_DECREF(buf);
    Py_DECREF(src);
    return r;
}
