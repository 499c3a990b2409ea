/* P2P.probe: collcomm.MPI's Probe / Iprobe of a message from one rank of this host in one
 * call (included by _p2p_type.c after _p2p_mpi.c; the ring is read by pipe_recv,
 * _p2p_ring.c, in its probe form).
 *
 * ``probe(src, tag, mask, block)``: the byte count of the first message from local rank
 * ``src`` that a receive ``(tag, mask)`` would match, left where it is for the receive
 * that follows (``P2P.last_tag``: its tag); False (``block`` False) when there is none
 * yet; None having decided nothing, so the Python probe (engine_wait.py) answers: where
 * P2P.recv would not run (the engine aborted, closed or holding a lost peer, receives
 * deferred in its line, an early message from ``src`` this receive matches, a posted
 * receive that would take it, the poll lock busy, no inbound ring), or where the first
 * matching record is not one P2P.recv takes (above the inline limit and not lent, an
 * aborted call's, of another exact tag than a wildcard receive's bits allow). Records
 * before it that it does not match go to the engine as the Python probe's poll hands
 * them over. Waiting (``block``) spins, yields and sleeps as P2P.recv does, with the
 * same checks every 100 ms (Ctrl-C, the peer's liveness, the timeout: the check hook
 * is given the byte count PROBE_NBYTES or PROBE_ANY_NBYTES, for a probe's text); a message found is
 * reported only if no receive deferred or posted meanwhile by another thread would take
 * it (pipe_recv checks again, holding the GIL), else None.
 */

#define PROBE_NBYTES UINT64_MAX     /* transport/engine_wait.py NATIVE_PROBE (a tag) */
#define PROBE_ANY_NBYTES (UINT64_MAX - 1)   /* ... NATIVE_PROBE_ANY (ANY_TAG) */

static PyObject *P2P_probe(P2P *s, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "probe(src, tag, mask, block)");
        return NULL;
    }
    int block = args[3] != Py_False;
    Pipe *p = s->paused ? NULL : p2p_pipe(s, args[0]);
    uint64_t tag = p == NULL ? 0 : p2p_tag(s, args[1]);
    if (tag == 0 || !p->has_in || !PyLong_Check(args[2]))
        Py_RETURN_NONE;
    uint64_t mask = p2p_u64(args[2]);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    mask = ~P2P_USER | (mask & P2P_USER);   /* context and kind bits always compared */
    int busy = p2p_engine_busy(s);
    if (!busy)                     /* receives deferred before it match first */
        busy = p2p_engine_deferred(s);
    if (busy)
        return busy < 0 ? NULL : Py_NewRef(Py_None);
    int got = p2p_try(p->poll_acquire);
    if (got <= 0)
        return got < 0 ? NULL : Py_NewRef(Py_None);
    int claim = p2p_engine_claims(s, p->peer, tag, mask);
    long long n = claim < 0 ? -1 : claim ? -2 : pipe_recv(s, p, NULL, (mask & P2P_WILD_BITS) ? PROBE_NBYTES : PROBE_ANY_NBYTES, tag, mask, 0, block);
    p2p_release(p->poll_release);
    if (n == -1)
        return NULL;
    if (n == -3)
        Py_RETURN_FALSE;
    return n < 0 ? Py_NewRef(Py_None) : PyLong_FromLongLong(n);
}
