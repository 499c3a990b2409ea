/* P2P.obj_send / obj_recv: collcomm.MPI's blocking object ``send``/``recv`` (and
 * ``sendrecv``) with one rank of this host, pickling and unpickling here (included by
 * _p2p_type.c after _p2p_mpi.c; the pickling helpers are _obj_pickle.c's).
 *
 * The message is MPI/_pobj.py's: an 8-byte length and the pickle, one INLINE record
 * (P2P.send); a large object's first part is 16 bytes (the length, a body id) and its
 * body a message of its own, which the Python code sends and receives.
 *
 * ``obj_send(obj, dst, tag, native)``: True, sent; None, nothing done (the P2P paused, a
 * `native` it cannot read, or the object did not pickle in band as pickled_small would:
 * the Python code pickles it again and reports or sends it its way); the pickle (bytes),
 * not sent (larger than one record, a ring without room, ...): the Python code sends that
 * pickle the regular way.
 * ``obj_recv(src, tag, mask, native)``: (True, obj, tag, size) the next matching message
 * received and unpickled; (False, body id, tag, size) a large object's first part
 * received (the Python code receives the body); (None, its byte count, tag, 0) a message
 * received that is neither (sent with Send: the caller raises); None, nothing consumed
 * (P2P.recv declined).
 * ``obj_sendrecv(obj, dst, stag, src, rtag, rmask, native)``: the two in one call (below).
 */

#define OBJ_EAGER ((Py_ssize_t)64 * 1024)     /* MPI/_pobj.py EAGER */
#define OBJ_TAG_BITS ((uint64_t)0x7FFFFFFF)    /* MPI's TAG_UB (core/tags.py MPI_TAG_BITS) */

static PyObject *P2P_obj_send(P2P *s, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "obj_send(obj, dst, tag, native)");
        return NULL;
    }
    if (s->paused || !obj_native_ok(args[3]))
        Py_RETURN_NONE;
    PyObject *data = NULL;
    int d = obj_dumps(args[0], args[3], &data);
    if (d <= 0)
        return d < 0 ? NULL : Py_NewRef(Py_None);
    Py_ssize_t len = PyBytes_GET_SIZE(data);
    if (len > OBJ_EAGER - 8)
        return data;
    PyObject *msg = PyBytes_FromStringAndSize(NULL, 8 + len);
    if (msg == NULL) {
        Py_DECREF(data);
        return NULL;
    }
    int64_t head = len;
    memcpy(PyBytes_AS_STRING(msg), &head, 8);
    memcpy(PyBytes_AS_STRING(msg) + 8, PyBytes_AS_STRING(data), (size_t)len);
    PyObject *zero = PyLong_FromLong(0);
    PyObject *call[4] = {msg, args[1], args[2], zero};
    PyObject *sent = zero == NULL ? NULL : P2P_send(s, call, 4);
    Py_XDECREF(zero);
    Py_DECREF(msg);
    if (sent == NULL || sent == Py_True) {
        Py_DECREF(data);
        return sent;
    }
    Py_DECREF(sent);
    return data;
}

static PyObject *P2P_obj_recv(P2P *s, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "obj_recv(src, tag, mask, native)");
        return NULL;
    }
    if (s->paused || !obj_native_ok(args[3]))
        Py_RETURN_NONE;
    PyObject *buf = PyByteArray_FromStringAndSize(NULL, OBJ_EAGER);
    PyObject *zero = buf == NULL ? NULL : PyLong_FromLong(0);
    if (zero == NULL) {
        Py_XDECREF(buf);
        return NULL;
    }
    PyObject *call[5] = {buf, args[0], args[1], args[2], zero};
    PyObject *n = P2P_recv(s, call, 5);
    Py_DECREF(zero);
    if (n == NULL || n == Py_None) {
        Py_DECREF(buf);
        return n;
    }
    Py_ssize_t got = PyLong_AsSsize_t(n);
    Py_DECREF(n);
    uint64_t tag = p2p_last_tag & OBJ_TAG_BITS;
    const char *p = PyByteArray_AS_STRING(buf);
    int64_t size = got >= 8 ? obj_word(p) : -1;
    PyObject *r = NULL;
    if (got >= 8 && got == 8 + size) {
        PyObject *obj = obj_loads(args[3], p + 8, (Py_ssize_t)size);
        if (obj != NULL) {
            r = Py_BuildValue("(ONKL)", Py_True, obj, (unsigned long long)tag, (long long)size);
        }
    } else if (got == 16 && size > OBJ_EAGER - 8) {
        r = Py_BuildValue("(OLKL)", Py_False, (long long)obj_word(p + 8), (unsigned long long)tag,
                          (long long)size);
    } else {       /* not an object's message (sent with Send?): the caller says so */
        r = Py_BuildValue("(OnKL)", Py_None, got, (unsigned long long)tag, 0LL);
    }
    Py_DECREF(buf);
    return r;
}

/* obj_sendrecv(obj, dst, stag, src, rtag, rmask, native): MPI's object ``sendrecv`` with
 * ranks of this host in one call: obj_send, then (sent) obj_recv. Returns what obj_send
 * returns when it did not send (None, or the pickle: nothing received either), True when
 * it sent and obj_recv declined (the receive is the Python code's), else obj_recv's tuple. */
static PyObject *P2P_obj_sendrecv(P2P *s, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "obj_sendrecv(obj, dst, stag, src, rtag, rmask, native)");
        return NULL;
    }
    PyObject *send_args[4] = {args[0], args[1], args[2], args[6]};
    PyObject *sent = P2P_obj_send(s, send_args, 4);
    if (sent != Py_True)
        return sent;
    PyObject *recv_args[4] = {args[3], args[4], args[5], args[6]};
    PyObject *got = P2P_obj_recv(s, recv_args, 4);
    if (got == Py_None) {
        Py_DECREF(got);
        return sent;
    }
    Py_DECREF(sent);
    return got;
}
