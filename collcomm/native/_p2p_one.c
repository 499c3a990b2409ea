/* P2P.one and P2P.start: one functional-API isend / irecv (and collcomm.MPI's Irecv) in
 * one call, built on the batch's pieces (included by _p2p_type.c after _p2p_batch.c, whose
 * batch_classes, batch_values, batch_run, batch_sent, batch_deferred and deferred_line
 * they use).
 */

/* P2P.one(recv, arr, peer, tag, ndarray, sigs, sent, received, g, record): the functional
 * API's isend (``recv`` False) or irecv on the world group ``g`` in one call, the checks
 * api_p2p._native makes in Python (an exact ``ndarray``, a peer of this host other than
 * this rank, a tag in the user space, a numeric C-contiguous buffer, writable to receive)
 * made as the batch makes them for an op: its work, started as the batch starts an op;
 * None having done nothing (anything else, a send C cannot write: the caller goes on in
 * Python, which checks again and raises what it raises). */
static PyObject *P2P_one(P2P *s, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError,
                        "one(recv, arr, peer, tag, ndarray, sigs, sent, received, g, record)");
        return NULL;
    }
    PyObject *ndarray = args[4], *sigs = args[5], *sent = args[6], *received = args[7],
             *g = args[8];
    int recv = args[0] == Py_True, record = args[9] == Py_True && rec_on(&s->rw);
    BatchOp o;
    memset(&o, 0, sizeof(o));
    if (!batch_classes(s, ndarray, sigs, sent, received) ||
        !batch_values(s, recv, args[1], args[2], args[3], ndarray, sigs, &o))
        Py_RETURN_NONE;
    /* the engine open with no peer lost, as P2P.send and the batch (deferred_line) ask:
     * else the Python path, which fails the call as it must (PeerLostError, ...) */
    PyObject *held = NULL, *w = NULL;
    int line = recv ? deferred_line(s, &held) : p2p_engine_busy(s);
    line = recv ? line : line < 0 ? -1 : !line;
    RecAt at = {0.0, NULL, NULL};
    if (line > 0 && record && rec_at_caller(&s->rw, &at, rec_now()) < 0)
        line = -1;
    if (line > 0)
        w = batch_run(s, &o, record ? &at : NULL, held, g, sent, received,
                      NULL);                                   /* (isend: no loan here) */
    else if (line == 0)
        w = Py_NewRef(Py_None);       /* (line < 0: the exception, w NULL) */
    rec_at_release(&at);
    Py_XDECREF(held);
    batch_release(&o);
    return w;
}

/* P2P.start(recv, cls, g, arr, local, tag, sig, record[, mask]): api_p2p_work.start_native
 * (and collcomm.MPI's Irecv: ``mask`` the receive's user tag mask, else the exact tag) in one
 * call. A send (``recv`` False) is P2P.send's write, its work ``cls(g, peer, rec)`` made
 * as the batch makes it; a receive is core/p2p.py ``defer``: its work (a subclass of the C
 * Deferred) made as Deferred.__init__ makes it and held in the engine's line. ``rec``: the
 * "entered" record P2P.note makes (``record`` True). None having done nothing (no pipe, the
 * engine aborted, closed or missing a peer, a send C cannot write): the caller takes the
 * regular path. The caller (api_p2p._native) checked the array, the peer and the tag. */
static PyObject *P2P_start(P2P *s, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 8 && (nargs != 9 || !PyLong_Check(args[8]))) {
        PyErr_SetString(PyExc_TypeError, "start(recv, cls, g, arr, local, tag, sig, record[, mask])");
        return NULL;
    }
    PyObject *cls = args[1], *g = args[2], *arr = args[3], *local = args[4], *tag = args[5],
             *sig = args[6];
    int recv = PyObject_IsTrue(args[0]);
    int record = args[7] == Py_True && rec_on(&s->rw);
    Pipe *p = recv < 0 || s->paused ? NULL : p2p_pipe(s, local);
    if (recv < 0)
        return NULL;
    if (p == NULL || p2p_tag(s, tag) == 0 || !(recv ? p->has_in : p->has_out))
        Py_RETURN_NONE;
    PyObject *w = NULL, *rec = Py_None;
    if (!PyType_Check(cls) || (recv && !PyType_IsSubtype((PyTypeObject *)cls, &DeferredType)))
        Py_RETURN_NONE;
    if (recv) {
        PyObject *held;
        int line = deferred_line(s, &held);
        if (line <= 0)
            return line < 0 ? NULL : Py_NewRef(Py_None);
        if (record)
            rec = rec_p2p(&s->rw, s_rec_irecv, p->peer, s_rec_entered, rec_now(), 0.0);
        if (rec != NULL)
            w = batch_deferred((PyTypeObject *)cls, s, held, g, arr, local, tag,
                               nargs == 9 ? args[8] : b_user_mask, sig, rec);
        Py_DECREF(held);
    } else {
        PyObject *sent = P2P_send(s, args + 3, 4);
        if (sent != Py_True)
            return sent;
        Py_DECREF(sent);
        if (record)
            rec = rec_p2p(&s->rw, s_rec_isend, p->peer, s_rec_entered, rec_now(), 0.0);
        PyObject *peer = rec == NULL ? NULL : PyLong_FromLong(p->peer);
        if (peer != NULL)
            w = batch_sent((PyTypeObject *)cls, g, peer, rec);
        Py_XDECREF(peer);
    }
    if (record)
        Py_XDECREF(rec);
    return w;
}
