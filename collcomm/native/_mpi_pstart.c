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
 * ``mpi_quick_send(h, g0, f, buf, dest, tag)`` / ``mpi_quick_recv(h, g0, f, buf, source,
 * tag, mask)``: the start, where the communicator's group (``h.g``, its slot) is still
 * ``g0`` (the one its ``…_init`` checked the peer and tag against), nothing orphaned, and
 * ``f``, the group's native point-to-point entry (made at ``…_init``: MPI/_p2p.py _entry),
 * is not paused (closing the group pauses it): ``P2P.send`` / ``mpi_irecv``'s work called
 * straight (the receive's op made without a Request), the op (a send done, the receive's
 * op) or None (nothing done: the general start);
 * else the Python function's answer. ``mpi_prequest_startall(cls, requests)``: each
 * request's ``Start`` in order (the C one for a Prequest, pq_start), stopping at the first
 * error as the Python loop does.
 */

static PyObject *qs_py_send, *qs_py_recv, *qs_orphans, *qs_sent, *qs_ndarray, *qs_deferred,
    *qs_native_recv, *qs_request;   /* strong references, once set up */
static PyObject *qs_s_g, *qs_s_start, *qs_zero;

static PyObject *mod_mpi_quick_setup(PyObject *m, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 8 || !PyCallable_Check(args[0]) || !PyCallable_Check(args[1]) || !PyList_CheckExact(args[2])) {
        PyErr_SetString(PyExc_TypeError, "mpi_quick_setup(py_send, py_recv, orphans, sent, ndarray, "
                        "deferred, native_recv, request)");
        return NULL;
    }
    if (qs_py_send != NULL)
        Py_RETURN_FALSE;             /* (once: later calls change nothing) */
    const char *names[2] = {"g", "Start"};
    PyObject **slots[2] = {&qs_s_g, &qs_s_start};
    for (int i = 0; i < 2; i++)
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

static SlotsOf qs_rec;                  /* the communicator's handle (MPI/_comm.py _CommRec): g */

/* May a start call entry `f` itself? It is a P2P not paused (a closed group pauses it),
 * handle h's group is still `g0` (the one its ``…_init`` checked the peer and tag against,
 * read from h's slot) and nothing is orphaned. 0: the Python function's way. */
static int qs_live(PyObject *h, PyObject *g0, PyObject *f)
{
    if (Py_TYPE(f) != &P2PType || ((P2P *)f)->paused || PyList_GET_SIZE(qs_orphans) != 0)
        return 0;
    if (Py_TYPE(h) != qs_rec.type && !slots_of(&qs_rec, Py_TYPE(h), &qs_s_g, 1))
        return 0;
    return qs_rec.ok && SLOT_AT(h, qs_rec.at[0]) == g0;
}

static PyObject *mod_mpi_quick_send(PyObject *m, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6 || qs_py_send == NULL) {
        PyErr_SetString(PyExc_TypeError, "mpi_quick_send(h, g0, f, buf, dest, tag) (after mpi_quick_setup)");
        return NULL;
    }
    if (!qs_live(args[0], args[1], args[2])) {
        PyObject *py_args[4] = {args[0], args[3], args[4], args[5]};
        return PyObject_Vectorcall(qs_py_send, py_args, 4, NULL);
    }
    Py_INCREF(args[2]);                 /* (the send may let the GIL go) */
    PyObject *call[4] = {args[3], args[4], args[5], qs_zero};
    PyObject *r = P2P_send((P2P *)args[2], call, 4);
    Py_DECREF(args[2]);
    if (r == NULL)
        return NULL;
    int sent = r == Py_True;
    Py_DECREF(r);
    return Py_NewRef(sent ? qs_sent : Py_None);
}

static PyObject *mod_mpi_quick_recv(PyObject *m, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7 || qs_py_recv == NULL) {
        PyErr_SetString(PyExc_TypeError,
                        "mpi_quick_recv(h, g0, f, buf, source, tag, mask) (after mpi_quick_setup)");
        return NULL;
    }
    if (!qs_live(args[0], args[1], args[2])) {
        PyObject *py_args[5] = {args[0], args[3], args[4], args[5], args[6]};
        return PyObject_Vectorcall(qs_py_recv, py_args, 5, NULL);
    }
    PyObject *call[9] = {args[1], args[3], args[4], args[5], args[6], qs_ndarray, qs_deferred,
                         qs_native_recv, qs_request};
    Py_INCREF(args[2]);
    PyObject *op = mpi_irecv_made((P2P *)args[2], call, 0);    /* the op, or None */
    Py_DECREF(args[2]);
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
