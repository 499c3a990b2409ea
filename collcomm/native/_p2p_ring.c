/* The shared-memory rings from C (the types and helpers: _p2p.c, included just before).
 *
 * Included by _shmcore.c after _p2p.c. Send: ``pipe_record`` appends one record (PAD
 * first where it would wrap; declining while sends wait in the channel's backlog, so a
 * record written now never overtakes them), ``pipe_append`` one INLINE record. Receive:
 * ``pipe_read_lent`` copies a LENT record's body from the sender's memory, and
 * ``pipe_recv`` reads the in ring in order and waits (spin, yield, sleep; the engine's
 * check hook every 100 ms), the layout being shm_ring.py's.
 */

/* -------------------------------------------------------------- the rings: send */
/* Append one record (send_lock held; PAD first where it would wrap): its header (`kind`,
 * `tag`, `nbytes`, `aux`, `sig`) and a body of `blen` bytes; 1 written (*start: its ring
 * position, *head_out: the new head), 0 no room, or sends wait in the channel's backlog
 * (a record written now would overtake them: the caller declines, the Python send queues). */
static int pipe_record(Pipe *p, uint32_t kind, const void *body, uint64_t blen, uint64_t nbytes,
                       uint64_t aux, uint64_t tag, uint64_t sig, uint64_t *start, uint64_t *head_out)
{
    if (p->backlog)
        return 0;
    uint64_t ring = p->out_ring;
    uint64_t need = (P2P_HDR + blen + 63) / 64 * 64;
    uint64_t head = __atomic_load_n(&p->out_ctl[0], __ATOMIC_RELAXED);   /* ours alone */
    uint64_t off = head % ring;
    uint64_t pad = ring - off < need ? ring - off : 0;
    uint64_t tail = __atomic_load_n(&p->out_ctl[8], __ATOMIC_ACQUIRE);
    if (need + pad > ring || ring - (head - tail) < need + pad)
        return 0;
    uint8_t *d = p->out_data;
    if (pad) {
        uint8_t h[P2P_HDR] = {0};
        uint32_t len32 = (uint32_t)pad, pk = P2P_PAD;
        memcpy(h, &len32, 4);
        memcpy(h + 4, &pk, 4);
        memcpy(d + off, h, P2P_HDR);
        off = 0;
    }
    near_copy(d + off + P2P_HDR, body, blen);
    uint32_t len32 = (uint32_t)need;
    memcpy(d + off, &len32, 4);
    memcpy(d + off + 4, &kind, 4);
    memcpy(d + off + 8, &tag, 8);
    memcpy(d + off + 16, &nbytes, 8);
    memcpy(d + off + 24, &aux, 8);
    memcpy(d + off + 32, &sig, 8);
    *start = head + pad;
    *head_out = head + pad + need;
    __atomic_store_n(&p->out_ctl[0], *head_out, __ATOMIC_RELEASE);   /* body before head */
    return 1;
}

/* Append one INLINE record (send_lock held): 1 written, 0 no room. */
static int pipe_append(Pipe *p, const void *body, uint64_t n, uint64_t tag, uint64_t sig,
                       uint64_t *head_out)
{
    uint64_t start;
    return pipe_record(p, P2P_INLINE, body, n, n, 0, tag, sig, &start, head_out);
}

/* -------------------------------------------------------------- the rings: recv */
/* Read the LENT record at `rec` (shm_lent.py: its body is `nbytes` of the sender's memory)
 * into `dst`, as LentBodies.take_lent does: claim the loan (its state word POSTED ->
 * CLAIMED; already CLAIMED: our own claim, the record taken again after a failed read; a
 * WITHDRAWN loan is read from the sender's copy, whose address it carries), read it by
 * cross-memory attach, then release it (the ring's RELEASED word: the sender's request
 * completes, or its copy is dropped). 1 read; 0 the read failed: the record stays at the
 * tail, claimed, and the Python path reads it again and raises what it raises. */
static int pipe_read_lent(Pipe *p, uint8_t *rec, uint64_t nbytes, uint8_t *dst)
{
    uint64_t ident, address, held = LENT_POSTED;
    memcpy(&ident, rec + P2P_HDR, 8);
    memcpy(&address, rec + 24, 8);                     /* the header's aux: the buffer */
    __atomic_compare_exchange_n((uint64_t *)(rec + P2P_HDR + 8), &held, LENT_CLAIMED, 0,
                                __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    if (held == LENT_WITHDRAWN)
        memcpy(&address, rec + P2P_HDR + 16, 8);       /* (written before the swap) */
    if (nbytes && cma_move((pid_t)p->peer_pid, (char *)dst, address, (Py_ssize_t)nbytes, 0) < 0)
        return 0;
    __atomic_store_n(&p->in_ctl[P2P_RELEASED], ident + 1, __ATOMIC_RELEASE);
    return 1;
}

/* Receive from the ring (poll_lock held, GIL held on entry and return): the byte count,
 * -2 to leave it to Python, -1 with an exception. `dst` NULL: a probe (P2P.probe): the
 * first record it matches, if it could take it, is left in the ring (its tag in
 * p2p_last_tag, its byte count returned), checked first, holding the GIL, that no receive
 * deferred or posted since the probe began (another thread) would take it (else -2); the
 * records before it go to the engine all the same, as the Python probe's poll hands them
 * over. */
static long long pipe_recv(P2P *s, Pipe *p, uint8_t *dst, uint64_t cap, uint64_t tag,
                           uint64_t mask, uint64_t sig, int block)
{
    Gil gil = {NULL};
    uint64_t tail = __atomic_load_n(&p->in_ctl[8], __ATOMIC_RELAXED);   /* ours alone */
    long long start = 0, next_check = 0;
    int yields = 0;
    long sleep_ns = 50000;
    while (1) {
        uint64_t head = __atomic_load_n(&p->in_ctl[0], __ATOMIC_ACQUIRE);
        if (head != tail) {
            const uint8_t *rec = p->in_data + tail % p->in_ring;
            uint32_t length, kind;
            uint64_t rtag, nbytes, rsig;
            memcpy(&length, rec, 4);
            memcpy(&kind, rec + 4, 4);
            memcpy(&rtag, rec + 8, 8);
            memcpy(&nbytes, rec + 16, 8);
            memcpy(&rsig, rec + 32, 8);
            int take = kind == P2P_PAD;
            if (!take && !((rtag ^ tag) & mask)) {        /* the first message it matches */
                int lent = kind == P2P_LENT && p->peer_pid > 0;
                if ((kind != P2P_INLINE && !lent) || ((rtag ^ tag) & ~P2P_WILD_BITS) ||
                    nbytes > cap || rsig == P2P_ABORT_SIG ||
                    (sig && rsig && sig != rsig)) {
                    gil_take(&gil);
                    return -2;                             /* left in the ring for Python */
                }
                if (dst == NULL) {                         /* a probe: it stays there */
                    gil_take(&gil);
                    /* unless a receive posted meanwhile (another thread, while this one
                     * waited or handed records over) would take it: the Python probe's */
                    int held = p2p_engine_deferred(s);
                    if (held == 0)
                        held = p2p_engine_claims(s, p->peer, tag, mask);
                    if (held != 0)
                        return held < 0 ? -1 : -2;
                    p2p_last_tag = rtag;
                    return (long long)nbytes;
                }
                if (lent) {
                    if (nbytes > 65536)
                        gil_release(&gil);
                    if (!pipe_read_lent(p, (uint8_t *)rec, nbytes, dst)) {
                        gil_take(&gil);
                        return -2;        /* (claimed: Python's take_lent reads it again) */
                    }
                } else
                    near_copy(dst, rec + P2P_HDR, nbytes);
                p2p_last_tag = rtag;
                take = 2;
            }
            if (take) {
                tail += length;
                __atomic_store_n(&p->in_ctl[8], tail, __ATOMIC_RELEASE);
                gil_take(&gil);               /* (the channel's tail is that word) */
                if (take == 2)
                    return (long long)nbytes;
                continue;
            }
            gil_take(&gil);                               /* not for us: the engine's */
            PyObject *r = PyObject_CallNoArgs(p->take_one);
            if (r == NULL)
                return -1;
            Py_DECREF(r);
            tail = __atomic_load_n(&p->in_ctl[8], __ATOMIC_RELAXED);
            continue;
        }
        if (!block) {                                     /* nothing yet: -3 */
            gil_take(&gil);
            return -3;
        }
        if (__atomic_load_n(&s->steal, __ATOMIC_RELAXED)) {   /* another thread must post */
            gil_take(&gil);
            return -2;
        }
        long long now = now_ns();
        if (start == 0) {
            start = now;
            next_check = now + P2P_CHECK_NS;
        }
        if (now - start < s->spin_ns) {
            if (now - start >= GIL_SPIN_NS)
                gil_release(&gil);
            for (int i = 0; i < 64; i++) {
                cpu_relax();
                if (__atomic_load_n(&p->in_ctl[0], __ATOMIC_ACQUIRE) != tail)
                    break;
            }
        } else if (yields < s->yields || now - start < P2P_YIELD_NS) {
            gil_release(&gil);
            sched_yield();
            yields++;
        } else {
            gil_release(&gil);
            struct timespec ts = {0, sleep_ns};
            nanosleep(&ts, NULL);
            sleep_ns = sleep_ns * 2 > 1000000 ? 1000000 : sleep_ns * 2;
        }
        if (now >= next_check) {
            next_check = now + P2P_CHECK_NS;
            gil_take(&gil);
            PyObject *r = NULL;
            if (PyErr_CheckSignals() == 0)
                r = PyObject_CallFunction(s->check, "OKKd", p->channel, (unsigned long long)cap,
                                          (unsigned long long)tag, (double)(now - start) / 1e9);
            if (r == NULL) {
                if (__atomic_load_n(&p->in_ctl[0], __ATOMIC_ACQUIRE) == tail ||
                    !PyErr_ExceptionMatches(PyExc_Exception))
                    return -1;
                PyErr_Clear();          /* it came meanwhile: the message wins */
            }
            Py_XDECREF(r);
        }
    }
}
