/* Persistent point-to-point starts and ``Prequest.Startall`` in C (collcomm/MPI/_p2p.py,
 * _prequest.py; included by _shmcore.c after _mpi_prequest.c, whose pq_start it calls).
 *
 * A persistent ``Send_init`` / ``Recv_init``'s ``Start`` is one native call (``P2P.send``:
 * the array written into the peer's ring; ``P2P.mpi_irecv``: the receive deferred in the
 * engine's line), reached through a Python function that checks the communicator is live
 * (``_quick_send_start`` / ``_quick_recv_start``), and ``Startall`` a Python loop over the
 * requests: three frames of ~1.2-1.8 us for a Recv_init + Send_init pair's
 * ``Startall`` + ``Waitall`` (mpi4py + Open MPI: 0.8-1.4; session 43).
 *
 * ``mpi_quick_setup(py_send, py_recv, orphans, sent, ndarray, deferred, native_recv,
 * request)``: the Python functions (each start that is not the common case goes to them,
 * which do what they always did), the list of orphaned receives (non-empty: the Python
 * way), the op of a send done at once and the classes ``mpi_irecv`` is given; once.
 * ``mpi_quick_send(h, g0, buf, dest, tag)`` / ``mpi_quick_recv(h, g0, buf, source, tag,
 * mask)``: the start, where the communicator's group ``h.g`` is still ``g0`` (the one its
 * ``…_init`` checked the peer and tag against), not closed, nothing orphaned, and its
 * native point-to-point entry made (``g._p2p_native``; made by the Python way's first
 * start): the op (a send done, the receive's op) or None (nothing done: the general start);
 * else the Python function's answer. ``mpi_prequest_startall(cls, requests)``: each
 * request's ``Start`` in order (the C one for a Prequest, pq_start), stopping at the first
 * error as the Python loop does.
 */

static PyObject *qs_py_send, *qs_py_recv, *qs_orphans, *qs_sent, *qs_ndarray, *qs_deferred,
    *qs_native_recv, *qs_request;   /* strong references, once set up */
static PyObject *qs_s_g, *qs_s_closed, *qs_s_native, *qs_s_send, *qs_s_irecv, *qs_s_op, *qs_s_start,
    *qs_zero;

static PyObject *mod_mpi_quick_setup(PyObject *m, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 8 || !PyCallable_Check(args[0]) || !PyCallable_Check(args[1]) || !PyList_CheckExact(args[2])) {
        PyErr_SetString(PyExc_TypeError, "mpi_quick_setup(py_send, py_recv, orphans, sent, ndarray, "
                        "deferred, native_recv, request)");
        return NULL;
    }
    if (qs_py_send != NULL)
        Py_RETURN_FALSE;             /* (once: later calls change nothing) */
    const char *names[7] = {"g", "_closed", "_p2p_native", "send", "mpi_irecv", "_op", "Start"};
    PyObject **slots[7] = {&qs_s_g, &qs_s_closed, &qs_s_native, &qs_s_send, &qs_s_irecv, &qs_s_op,
                           &qs_s_start};
    for (int i = 0; i < 7; i++)
        if (*slots[i] == NULL && (*slots[i] = PyUnicode_InternFromString(names[i])) == NULL)
            return NULL;
    if (qs_zero == NULL && (qs_zero = PyLong_FromLong(0)) == NULL)
        return NULL;
    PyObject **keep[8] = {&qs_py_send, &qs_py_recv, &qs_orphans, &qs_sent, &qs_ndarray, &qs_deferred,
                          &qs_native_recv, &qs_request};
    for (int i = 0; i < 8; i++)
        *keep[i] = Py_NewRef(args[i]);
    Py_RETURN_TRUE;
}

/* The native entry of handle h's group where the quick start applies (a new reference;
 * None: no entry, the start is None), or NULL without an exception: the Python way (NULL
 * with one: an error other than a missing attribute, MemoryError..., which goes on). */
static PyObject *qs_entry(PyObject *h, PyObject *g0)
{
    PyObject *g = PyObject_GetAttr(h, qs_s_g);
    if (g == NULL) {
        if (PyErr_ExceptionMatches(PyExc_AttributeError))
            PyErr_Clear();
        return NULL;
    }
    int live = g == g0 && PyList_GET_SIZE(qs_orphans) == 0;
    PyObject *closed = live ? PyObject_GetAttr(g, qs_s_closed) : NULL;
    PyObject *f = closed == Py_False ? PyObject_GetAttr(g, qs_s_native) : NULL;
    Py_XDECREF(closed);
    Py_DECREF(g);
    if (f == NULL && (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_AttributeError)))
        PyErr_Clear();             /* (no entry made yet: the Python way makes it) */
    return f;
}

static PyObject *mod_mpi_quick_send(PyObject *m, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5 || qs_py_send == NULL) {
        PyErr_SetString(PyExc_TypeError, "mpi_quick_send(h, g0, buf, dest, tag) (after mpi_quick_setup)");
        return NULL;
    }
    PyObject *f = qs_entry(args[0], args[1]);
    if (f == NULL && PyErr_Occurred())
        return NULL;
    if (f == NULL) {
        PyObject *py_args[4] = {args[0], args[2], args[3], args[4]};
        return PyObject_Vectorcall(qs_py_send, py_args, 4, NULL);
    }
    if (f == Py_None)
        return f;
    PyObject *call[5] = {f, args[2], args[3], args[4], qs_zero};
    PyObject *r = PyObject_VectorcallMethod(qs_s_send, call, 5, NULL);   /* (no slot before call[0]) */
    Py_DECREF(f);
    if (r == NULL)
        return NULL;
    int sent = r == Py_True;
    Py_DECREF(r);
    return Py_NewRef(sent ? qs_sent : Py_None);
}

static PyObject *mod_mpi_quick_recv(PyObject *m, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6 || qs_py_recv == NULL) {
        PyErr_SetString(PyExc_TypeError, "mpi_quick_recv(h, g0, buf, source, tag, mask) (after mpi_quick_setup)");
        return NULL;
    }
    PyObject *f = qs_entry(args[0], args[1]);
    if (f == NULL && PyErr_Occurred())
        return NULL;
    if (f == NULL) {
        PyObject *py_args[5] = {args[0], args[2], args[3], args[4], args[5]};
        return PyObject_Vectorcall(qs_py_recv, py_args, 5, NULL);
    }
    if (f == Py_None)
        return f;
    PyObject *call[10] = {f, args[1], args[2], args[3], args[4], args[5], qs_ndarray, qs_deferred,
                          qs_native_recv, qs_request};
    PyObject *r = PyObject_VectorcallMethod(qs_s_irecv, call, 10, NULL);
    Py_DECREF(f);
    if (r == NULL || r == Py_None)
        return r;
    PyObject *op = PyObject_GetAttr(r, qs_s_op);
    Py_DECREF(r);
    return op;
}

static PyObject *mod_mpi_prequest_startall(PyObject *m, PyObject *const *args, Py_ssize_t nargs,
                                           PyObject *kwnames)
{
    /* (cls, requests), requests also by keyword, as the Python classmethod took it */
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    if (nargs + nkw != 2 || nargs < 1 ||
        (nkw == 1 && !PyUnicode_Check(PyTuple_GET_ITEM(kwnames, 0))) ||
        (nkw == 1 && PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, 0), "requests") != 0)) {
        PyErr_SetString(PyExc_TypeError, "Startall(requests)");
        return NULL;
    }
    if (qs_s_start == NULL && (qs_s_start = PyUnicode_InternFromString("Start")) == NULL)
        return NULL;
    PyObject *seq = PySequence_Fast(args[1], "Startall: requests must be a sequence of Prequests");
    if (seq == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
        PyObject *r = Py_NewRef(PySequence_Fast_GET_ITEM(seq, i));   /* (a Start may run code) */
        PyObject *done = pq_req_slots.type != NULL && Py_TYPE(r) == pq_req_slots.type
                             ? pq_start(r, NULL) : PyObject_CallMethodNoArgs(r, qs_s_start);
        Py_DECREF(r);
        if (done == NULL) {
            Py_DECREF(seq);
            return NULL;
        }
        Py_DECREF(done);
    }
    Py_DECREF(seq);
    Py_RETURN_NONE;
}
