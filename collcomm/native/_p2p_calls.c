/* The native point-to-point calls: P2P.send, P2P.recv and P2P.note (the types, the
 * helpers and the rings they use are in _p2p.c; included by _shmcore.c after it).
 *
 * ``send(buf, dst, tag, sig)``: True having written one INLINE record exactly as
 * ShmChannel._try_append writes it (PAD first where the record would wrap), holding the
 * channel's send_lock; or None having done nothing (no shared-memory channel to dst, a
 * body above the inline limit, a full ring, a busy lock, the engine aborted or closed,
 * the channel closed, a peer lost, a buffer that is not C-contiguous numeric): the caller
 * then takes the Python path, which raises every error with its text.
 *
 * ``recv(buf, src, tag, mask, sig[, record[, own]])``: the byte count of the message
 * received into buf, or None having consumed nothing that the receive matches. It runs
 * only while the engine cannot hold a message for it: poll_lock taken (tried), no early
 * (unexpected) message from src that the receive matches, no posted receive that would
 * match a message from src with this tag (MPI's non-overtaking order), no deferred receive
 * (engine._deferred, core/p2p.py Deferred: posted earlier, waiting for its wait) unless
 * ``own`` is True (the wait of a deferred receive, which posted those before it first).
 * ``block`` False (a deferred receive's test()): False at once when the ring holds no
 * record (the records before the first it matches are still handed to the engine); no
 * record is made. ``steal`` (a member another thread sets, Engine._post_before): a receive
 * waiting on an empty ring leaves it to the regular path (None) at once. Then it reads the ring in order:
 * PAD is skipped; a record the receive does not match (another tag, a collective's
 * message) goes to ``_take_one`` unchanged, which hands it to the engine as poll() does;
 * the first record it matches is taken if it is INLINE, of exactly this tag, fits the
 * buffer and carries the expected signature, else it is left in the ring and None
 * returned (the Python path then finds it at once and raises or completes as always).
 * While the ring is empty it spins (GIL held, up to 5 us), yields (at least 2 ms:
 * P2P_YIELD_NS), then sleeps 50 us growing to 1 ms, with the GIL released; every 100 ms the hook ``check(channel, nbytes,
 * tag, elapsed)`` checks Ctrl-C, the engine, the peer's liveness and the timeout and
 * raises the Python path's errors (a message in the ring meanwhile wins over its error).
 *
 * The flight recorder (``record`` True as the last argument, collcomm.send/recv): the
 * call's record reads as the list Observer.p2p appends (a Record, _record_rec.c; op
 * isend/irecv, the peer's
 * global rank, the caller's code and offset), written here only for a call that runs
 * here. A send that completes (or fails) appends it ended; a receive appends it as
 * "entered" before it waits and marks it "completed" or "failed" when it returns. A
 * receive that leaves the message to the regular path (after its record was made)
 * returns the record (a Record) instead of None: the caller hands it to the regular path,
 * which marks it (ProcessGroup.p2p_irecv's ``rec``). A call that declines before that
 * makes no record: the regular path makes its own. Either way one record per call.
 * ``note(recv, peer)`` makes the "entered" record of a non-blocking call (isend/irecv),
 * which core/p2p.py marks ended when it is waited for.
 */

/* -------------------------------------------------------------- send */
/* Write buffer b to pipe p as one INLINE record (the engine checked open): 1 written, 0
 * not (above the inline limit, send_lock busy, the channel closed, no room), -1 error. */
static int p2p_write(P2P *s, Pipe *p, const Py_buffer *b, uint64_t tag, uint64_t sig)
{
    if ((uint64_t)b->len > p->eager)
        return 0;
    int got = p2p_try(p->send_acquire);
    if (got <= 0)
        return got;
    int rc = 0;
    uint64_t head;
    if (!p->closed && pipe_append(p, b->buf, (uint64_t)b->len, tag, sig, &head)) {
        rc = 1;                           /* (the channel's head is the ring's word) */
        s->sends++;
    }
    p2p_release(p->send_release);
    return rc;
}

/* What P2P.send and P2P.lend check of (buf, dst, tag, sig): 1 all fits (*p, *tag, *sig
 * set, *b held: the caller releases it), 0 the caller declines (nothing held), -1 error. */
static int p2p_send_args(P2P *s, PyObject *const *args, Pipe **p, uint64_t *tag, uint64_t *sig,
                         Py_buffer *b)
{
    *p = s->paused ? NULL : p2p_pipe(s, args[1]);
    *tag = *p == NULL ? 0 : p2p_tag(s, args[2]);
    if (*tag == 0 || !(*p)->has_out || !PyLong_Check(args[3]))
        return 0;
    *sig = p2p_u64(args[3]);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    int busy = p2p_engine_busy(s);
    if (busy)
        return busy < 0 ? -1 : 0;
    return p2p_buffer(args[0], b, 0) < 0 ? 0 : 1;
}

static PyObject *P2P_send(P2P *s, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 && nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "send(buf, dst, tag, sig[, record])");
        return NULL;
    }
    int record = nargs == 5 && args[4] == Py_True && rec_on(&s->rw);
    double t0 = record ? rec_now() : 0.0;
    Pipe *p;
    uint64_t tag, sig;
    Py_buffer b;
    int ok = p2p_send_args(s, args, &p, &tag, &sig, &b);
    if (ok <= 0)
        return ok < 0 ? NULL : Py_NewRef(Py_None);
    int wrote = p2p_write(s, p, &b, tag, sig);
    PyObject *result = wrote < 0 ? NULL : wrote ? Py_True : Py_None;
    PyBuffer_Release(&b);
    if (record && result != Py_None) {   /* done or failed here: its record, ended */
        PyObject *t, *v, *tb;
        PyErr_Fetch(&t, &v, &tb);
        PyObject *rec = rec_p2p(&s->rw, s_rec_isend, p->peer,
                                result == NULL ? s_rec_failed : s_rec_completed, t0, rec_now());
        if (rec == NULL && result != NULL) {
            Py_XDECREF(t);
            Py_XDECREF(v);
            Py_XDECREF(tb);
            return NULL;
        }
        Py_XDECREF(rec);
        PyErr_Clear();
        PyErr_Restore(t, v, tb);
    }
    return Py_XNewRef(result);
}

/* -------------------------------------------------------------- recv */
static PyObject *P2P_recv(P2P *s, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 5 || nargs > 8) {
        PyErr_SetString(PyExc_TypeError, "recv(buf, src, tag, mask, sig[, record[, own[, block]]])");
        return NULL;
    }
    int block = nargs < 8 || args[7] != Py_False;
    int record = block && nargs >= 6 && args[5] == Py_True && rec_on(&s->rw);
    int own = nargs >= 7 && args[6] == Py_True;
    double t0 = record ? rec_now() : 0.0;
    Pipe *p = s->paused ? NULL : p2p_pipe(s, args[1]);
    uint64_t tag = p == NULL ? 0 : p2p_tag(s, args[2]);
    if (tag == 0 || !p->has_in || !PyLong_Check(args[3]) || !PyLong_Check(args[4]))
        Py_RETURN_NONE;
    uint64_t mask = p2p_u64(args[3]);
    uint64_t sig = p2p_u64(args[4]);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    mask = ~P2P_USER | (mask & P2P_USER);   /* context and kind bits always compared */
    int busy = p2p_engine_busy(s);
    if (!busy && !own)           /* receives deferred before this one: theirs first */
        busy = p2p_engine_deferred(s);
    if (busy)
        return busy < 0 ? NULL : Py_NewRef(Py_None);
    Py_buffer b;
    if (p2p_buffer(args[0], &b, 1) < 0)
        Py_RETURN_NONE;
    PyObject *result = Py_None;
    int got = p2p_try(p->poll_acquire);
    if (got < 0)
        result = NULL;
    else if (got) {
        PyObject *rec = NULL;
        int claim = p2p_engine_claims(s, p->peer, tag, mask);
        if (claim == 0 && record) {       /* it waits here: recorded as entered first */
            rec = rec_p2p(&s->rw, s_rec_irecv, p->peer, s_rec_entered, t0, 0.0);
            if (rec == NULL)
                claim = -1;
        }
        long long n = claim < 0 ? -1 : claim ? -2
                    : pipe_recv(s, p, (uint8_t *)b.buf, (uint64_t)b.len, tag, mask, sig, block);
        p2p_release(p->poll_release);
        if (n == -1)
            result = NULL;
        else if (n == -3)
            result = Py_NewRef(Py_False);     /* (block False) nothing for it yet */
        else if (n >= 0) {
            result = PyLong_FromLongLong(n);
            s->recvs++;
        }
        if (rec != NULL) {
            if (n == -2)
                result = Py_NewRef(rec);   /* left to the regular path, with its record */
            else
                rec_p2p_end(rec, result != NULL);
            Py_DECREF(rec);
        }
    }
    PyBuffer_Release(&b);
    return result == Py_None ? Py_NewRef(Py_None) : result;
}

/* -------------------------------------------------------------- note */
/* note(op, dst): the flight recorder's record of a non-blocking call (op 0: isend, 1:
 * irecv; dst: the local peer, -1 for any source) as Observer.p2p writes it: "entered",
 * started now, at the caller's code outside collcomm; None when not recording. The
 * caller marks it ended (core.p2p.finished) when the call is waited for. */
static PyObject *P2P_note(P2P *s, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyLong_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "note(op, peer)");
        return NULL;
    }
    if (!rec_on(&s->rw))
        Py_RETURN_NONE;
    int recv = PyObject_IsTrue(args[0]);
    if (recv < 0)
        return NULL;
    long peer = -1;
    long i = PyLong_AsLong(args[1]);
    if (i == -1 && PyErr_Occurred())
        return NULL;
    if (i >= 0) {
        if (s->pipes == NULL || i >= PyTuple_GET_SIZE(s->pipes))
            Py_RETURN_NONE;
        PyObject *p = PyTuple_GET_ITEM(s->pipes, i);
        if (Py_TYPE(p) != &PipeType)
            Py_RETURN_NONE;
        peer = ((Pipe *)p)->peer;
    }
    return rec_p2p(&s->rw, recv ? s_rec_irecv : s_rec_isend, peer, s_rec_entered, rec_now(), 0.0);
}
