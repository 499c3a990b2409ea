/* P2P.mpi_irecv / mpi_isend: collcomm.MPI's ``Irecv`` of a plain array from one rank of
 * this host with an exact tag, and its ``Isend`` written at once, each in one call
 * (included by _p2p_type.c after _p2p_batch.c).
 *
 * ``mpi_irecv(g, arr, local, tag, mask, ndarray, deferred, op, request)``: ``arr`` an exact
 * ``ndarray`` whose buffer is one-dimensional, C-contiguous, writable and numeric (what
 * MPI/_p2p.py checked with five attribute reads), ``local`` a peer of this host with an
 * inbound ring, ``tag`` valid: the receive is made a ``deferred`` (core/p2p.py Deferred,
 * joining the engine's line as P2P.start does, no record: collcomm.MPI keeps none), its op
 * an ``op`` (MPI/_p2p.py _NativeRecv: its seven slots written here, no __init__) and the
 * returned ``request`` (MPI/_request.py Request: its ``_op`` slot). None, having done
 * nothing, for anything else (the Python code then takes its general way).
 */

static PyObject *s_m_names[8];       /* _NativeRecv's slots, then Request's _op */
static SlotsOf m_op_slots, m_req_slots;

static int mpi_names(void)
{
    const char *names[8] = {"_g", "_h", "_done", "source", "tag", "nbytes", "cancelled", "_op"};
    for (int i = 0; i < 8; i++)
        if ((s_m_names[i] = PyUnicode_InternFromString(names[i])) == NULL)
            return -1;
    return 0;
}

/* A buffer format numpy gives a numeric dtype (kinds b, i, u, f, c), byte order aside */
static int mpi_numeric(const char *f)
{
    if (f == NULL)
        return 1;                       /* (unsigned bytes) */
    if (*f == '<' || *f == '>' || *f == '=' || *f == '@' || *f == '!')
        f++;
    if (f[0] == 'Z')
        return (f[1] == 'f' || f[1] == 'd' || f[1] == 'g') && f[2] == 0;
    return f[0] != 0 && strchr("?bBhHiIlLqQnNefdg", f[0]) != NULL && f[1] == 0;
}

/* A receive of `arr` from local rank `local` made a deferred receive of class `dcls` in
 * the engine's line (no record), and an op of class `ocls` and a Request of class `rcls`
 * (none where `rcls` is NULL) made for it, without their __init__ (their slots empty: the
 * caller fills them): 1 with new references in *d, *op, *req; 0 not now (the engine busy:
 * nothing done); -1 with an exception (out of memory: a receive made stays in line, as the
 * regular one). */
static int mpi_recv_objects(P2P *s, PyObject *g, PyObject *arr, PyObject *local, PyObject *tag,
                            PyObject *mask, PyObject *dcls, PyObject *ocls, PyObject *rcls,
                            PyObject **d, PyObject **op, PyObject **req)
{
    PyObject *held;
    int line = deferred_line(s, &held);
    if (line <= 0)
        return line;
    PyObject *zero = PyLong_FromLong(0);
    *d = zero == NULL ? NULL : batch_deferred((PyTypeObject *)dcls, s, held, g, arr, local, tag,
                                              mask, zero, Py_None);
    Py_DECREF(held);
    Py_XDECREF(zero);
    *op = *d == NULL ? NULL : ((PyTypeObject *)ocls)->tp_alloc((PyTypeObject *)ocls, 0);
    *req = *op == NULL || rcls == NULL ? NULL : ((PyTypeObject *)rcls)->tp_alloc((PyTypeObject *)rcls, 0);
    if (*op == NULL || (rcls != NULL && *req == NULL)) {
        Py_XDECREF(*d);
        Py_XDECREF(*op);
        return -1;
    }
    return 1;
}

/* mpi_irecv's work (its nine arguments in `args`); `with_request` 0: the op itself is
 * returned, no Request made (a persistent Recv_init's start, _mpi_pstart.c). */
static PyObject *mpi_irecv_made(P2P *s, PyObject *const *args, int with_request)
{
    PyObject *g = args[0], *arr = args[1], *local = args[2], *tag = args[3], *mask = args[4],
             *ndarray = args[5], *dcls = args[6], *ocls = args[7], *rcls = args[8];
    if (s->paused || s->engine == NULL || Py_TYPE(arr) != (PyTypeObject *)ndarray ||
        !PyType_Check(dcls) || !PyType_IsSubtype((PyTypeObject *)dcls, &DeferredType) ||
        !PyType_Check(ocls) || !PyType_Check(rcls) ||
        !slots_of(&m_op_slots, (PyTypeObject *)ocls, s_m_names, 7) ||
        !slots_of(&m_req_slots, (PyTypeObject *)rcls, s_m_names + 7, 1))
        Py_RETURN_NONE;
    Py_buffer v;
    if (nd_buffer(arr, &v, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    int fit = v.ndim == 1 && mpi_numeric(v.format);
    PyBuffer_Release(&v);
    Pipe *p = fit ? p2p_pipe(s, local) : NULL;
    if (p == NULL || !p->has_in || p2p_tag(s, tag) == 0)
        Py_RETURN_NONE;
    PyObject *d, *op, *req = NULL;
    int made = mpi_recv_objects(s, g, arr, local, tag, mask, dcls, ocls, with_request ? rcls : NULL,
                                &d, &op, &req);
    if (made <= 0)
        return made < 0 ? NULL : Py_NewRef(Py_None);
    PyObject *zero = PyLong_FromLong(0);
    if (zero == NULL) {      /* (out of memory; the receive made stays in line, as the regular one) */
        Py_DECREF(d);
        Py_DECREF(op);
        Py_XDECREF(req);
        return NULL;
    }
    PyObject *values[7] = {g, d, Py_False, local, tag, zero, Py_False};
    for (int i = 0; i < 7; i++)      /* (fresh objects: nothing to drop) */
        SLOT_AT(op, m_op_slots.at[i]) = Py_NewRef(values[i]);
    Py_DECREF(d);
    Py_DECREF(zero);
    if (req == NULL)
        return op;
    SLOT_AT(req, m_req_slots.at[0]) = op;
    return req;
}

static PyObject *P2P_mpi_irecv(P2P *s, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError,
                        "mpi_irecv(g, arr, local, tag, mask, ndarray, deferred, op, request)");
        return NULL;
    }
    return mpi_irecv_made(s, args, 1);
}

/* mpi_isend(buf, dst, tag, ndarray, request, op) -> Request | None: ``buf`` an exact
 * ``ndarray`` written into the peer's ring at once as P2P.send(buf, dst, tag, 0) writes
 * it, its Request holding ``op`` (MPI/_p2p.py's _SENT); None, having done nothing, where
 * P2P.send declines (the Python code then takes its general way). */
static PyObject *P2P_mpi_isend(P2P *s, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "mpi_isend(buf, dst, tag, ndarray, request, op)");
        return NULL;
    }
    PyObject *rcls = args[4];
    if (Py_TYPE(args[0]) != (PyTypeObject *)args[3] || !PyType_Check(rcls) ||
        !slots_of(&m_req_slots, (PyTypeObject *)rcls, s_m_names + 7, 1))
        Py_RETURN_NONE;
    PyObject *zero = PyLong_FromLong(0);
    if (zero == NULL)
        return NULL;
    PyObject *send_args[4] = {args[0], args[1], args[2], zero};
    PyObject *sent = P2P_send(s, send_args, 4);
    Py_DECREF(zero);
    if (sent != Py_True)
        return sent;                    /* None (declined) or NULL (failed) */
    Py_DECREF(sent);
    PyObject *req = ((PyTypeObject *)rcls)->tp_alloc((PyTypeObject *)rcls, 0);
    if (req != NULL)
        SLOT_AT(req, m_req_slots.at[0]) = Py_NewRef(args[5]);
    return req;
}
