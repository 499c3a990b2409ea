/* Native point-to-point over the shared-memory rings (collcomm/transport/shm.py).
 *
 * Included by _shmcore.c after the fast call (it uses now_ns, cpu_relax, the Gil helpers,
 * GIL_SPIN_NS and fast_dtype from there). Two types:
 *
 * - ``Pipe``: one ShmChannel seen from C: its out ring (in the peer's inbox, this rank
 *   produces) and its in ring (in this rank's inbox, this rank consumes), the channel's
 *   ``send_lock`` and ``poll_lock`` (only ever tried from here) and ``_take_one`` (the
 *   Python consumer of one record, called with poll_lock held).
 * - ``P2P``: a process group's native point-to-point entry (collcomm/core/p2p.py builds
 *   it): its Pipes by local rank, the tag base (context and P2P kind bits), the engine
 *   and the check hook.
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
 * While the ring is empty it spins (GIL held, up to 5 us), yields, then sleeps 50 us
 * growing to 1 ms, with the GIL released; every 100 ms the hook ``check(channel, nbytes,
 * tag, elapsed)`` checks Ctrl-C, the engine, the peer's liveness and the timeout and
 * raises the Python path's errors (a message in the ring meanwhile wins over its error).
 *
 * The flight recorder (``record`` True as the last argument, collcomm.send/recv): the
 * call's record is the list Observer.p2p appends (_record.c; op isend/irecv, the peer's
 * global rank, the caller's code and offset), written here only for a call that runs
 * here. A send that completes (or fails) appends it ended; a receive appends it as
 * "entered" before it waits and marks it "completed" or "failed" when it returns. A
 * receive that leaves the message to the regular path (after its record was made)
 * returns the record (a list) instead of None: the caller hands it to the regular path,
 * which marks it (ProcessGroup.p2p_irecv's ``rec``). A call that declines before that
 * makes no record: the regular path makes its own. Either way one record per call.
 * ``note(recv, peer)`` makes the "entered" record of a non-blocking call (isend/irecv),
 * which core/p2p.py marks ended when it is waited for.
 */

#define P2P_HDR 40                       /* shm.HEADER.size: "<IIQQQQ" */
#define P2P_INLINE 1
#define P2P_PAD 3
#define P2P_ABORT_SIG (0xFULL << 60)     /* transport.base.ABORT_SIG */
#define P2P_USER ((1ULL << 35) - 1)      /* core.tags.MAX_USER_TAG */
#define P2P_CHECK_NS 100000000LL

static PyObject *s_p2p_aborted, *s_p2p_closed, *s_p2p_lost, *s_p2p_posted, *s_p2p_unexpected,
    *s_p2p_peer, *s_p2p_tag, *s_p2p_mask, *s_p2p_source, *s_p2p_waiter, *s_p2p_head,
    *s_p2p_tail, *s_p2p_chclosed, *s_p2p_deferred;

typedef struct {
    PyObject_HEAD
    PyObject *channel, *send_acquire, *send_release, *poll_acquire, *poll_release, *take_one;
    Py_buffer out, in;
    uint64_t *out_ctl, *in_ctl;          /* word 0: head, word 8: tail */
    uint8_t *out_data, *in_data;
    uint64_t out_ring, in_ring, eager;
    long peer;                           /* global rank */
    int has_out, has_in;
} Pipe;

typedef struct {
    PyObject_HEAD
    PyObject *engine, *check, *pipes;    /* pipes: tuple (local rank -> Pipe or None) */
    uint64_t tag_base;
    long long spin_ns;
    int yields, paused;
    int steal;                           /* set by another thread: a waiting receive leaves */
    unsigned long long sends, recvs;     /* calls done here (tests check the path) */
    RecWriter rw;                        /* the flight recorder's records (_record.c) */
} P2P;

static PyTypeObject PipeType, P2PType;

#include "_p2p_engine.c"

/* -------------------------------------------------------------- small helpers */
static int p2p_try(PyObject *acquire)   /* 1: taken, 0: busy, -1: error */
{
    PyObject *r = PyObject_CallOneArg(acquire, Py_False);
    if (r == NULL)
        return -1;
    int got = PyObject_IsTrue(r);
    Py_DECREF(r);
    return got;
}

static void p2p_release(PyObject *release)   /* keeps a pending exception */
{
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    PyObject *r = PyObject_CallNoArgs(release);
    Py_XDECREF(r);
    if (t != NULL)
        PyErr_Restore(t, v, tb);
    else if (r == NULL)
        PyErr_WriteUnraisable(release);
}

static int p2p_set(PyObject *o, PyObject *name, uint64_t v)
{
    PyObject *n = PyLong_FromUnsignedLongLong(v);
    int rc = n == NULL ? -1 : PyObject_SetAttr(o, name, n);
    Py_XDECREF(n);
    return rc;
}

/* The Pipe of local rank r, or NULL (no exception). */
static Pipe *p2p_pipe(P2P *s, PyObject *r)
{
    if (!PyLong_Check(r))
        return NULL;
    long i = PyLong_AsLong(r);
    if (i < 0 || i >= PyTuple_GET_SIZE(s->pipes)) {
        PyErr_Clear();
        return NULL;
    }
    PyObject *p = PyTuple_GET_ITEM(s->pipes, i);
    return Py_TYPE(p) == &PipeType ? (Pipe *)p : NULL;
}

/* A user tag (0 .. MAX_USER_TAG) as the full wire tag, or 0 with no exception. */
static uint64_t p2p_tag(P2P *s, PyObject *t)
{
    if (!PyLong_Check(t))
        return 0;
    long long v = PyLong_AsLongLong(t);
    if (v < 0 || (uint64_t)v > P2P_USER) {
        PyErr_Clear();
        return 0;
    }
    return s->tag_base | (uint64_t)v;
}

static int p2p_buffer(PyObject *o, Py_buffer *b, int writable)
{
    if (PyObject_GetBuffer(o, b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT |
                                     (writable ? PyBUF_WRITABLE : 0)) < 0) {
        PyErr_Clear();
        return -1;
    }
    if (fast_dtype(b) < 0) {
        PyBuffer_Release(b);
        return -1;
    }
    return 0;
}

/* -------------------------------------------------------------- send */
/* Append one INLINE record (send_lock held): 1 written, 0 no room. */
static int pipe_append(Pipe *p, const void *body, uint64_t n, uint64_t tag, uint64_t sig,
                       uint64_t *head_out)
{
    uint64_t ring = p->out_ring;
    uint64_t need = (P2P_HDR + n + 63) / 64 * 64;
    uint64_t head = __atomic_load_n(&p->out_ctl[0], __ATOMIC_RELAXED);   /* ours alone */
    uint64_t off = head % ring;
    uint64_t pad = ring - off < need ? ring - off : 0;
    uint64_t tail = __atomic_load_n(&p->out_ctl[8], __ATOMIC_ACQUIRE);
    if (need + pad > ring || ring - (head - tail) < need + pad)
        return 0;
    uint8_t *d = p->out_data;
    if (pad) {
        uint8_t h[P2P_HDR] = {0};
        uint32_t len32 = (uint32_t)pad, kind = P2P_PAD;
        memcpy(h, &len32, 4);
        memcpy(h + 4, &kind, 4);
        memcpy(d + off, h, P2P_HDR);
        off = 0;
    }
    memcpy(d + off + P2P_HDR, body, n);
    uint32_t len32 = (uint32_t)need, kind = P2P_INLINE;
    uint64_t zero = 0;
    memcpy(d + off, &len32, 4);
    memcpy(d + off + 4, &kind, 4);
    memcpy(d + off + 8, &tag, 8);
    memcpy(d + off + 16, &n, 8);
    memcpy(d + off + 24, &zero, 8);
    memcpy(d + off + 32, &sig, 8);
    *head_out = head + need + pad;
    __atomic_store_n(&p->out_ctl[0], *head_out, __ATOMIC_RELEASE);   /* body before head */
    return 1;
}

static PyObject *P2P_send(P2P *s, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 && nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "send(buf, dst, tag, sig[, record])");
        return NULL;
    }
    int record = nargs == 5 && args[4] == Py_True && rec_on(&s->rw);
    double t0 = record ? rec_now() : 0.0;
    Pipe *p = s->paused ? NULL : p2p_pipe(s, args[1]);
    uint64_t tag = p == NULL ? 0 : p2p_tag(s, args[2]);
    if (tag == 0 || !p->has_out || !PyLong_Check(args[3]))
        Py_RETURN_NONE;
    uint64_t sig = PyLong_AsUnsignedLongLong(args[3]);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    int busy = p2p_engine_busy(s->engine);
    if (busy)
        return busy < 0 ? NULL : Py_NewRef(Py_None);
    Py_buffer b;
    if (p2p_buffer(args[0], &b, 0) < 0)
        Py_RETURN_NONE;
    PyObject *result = Py_None;
    if ((uint64_t)b.len <= p->eager) {
        int got = p2p_try(p->send_acquire);
        if (got < 0)
            result = NULL;
        else if (got) {
            PyObject *closed = PyObject_GetAttr(p->channel, s_p2p_chclosed);
            uint64_t head;
            if (closed == NULL)
                result = NULL;
            else if (closed == Py_False && pipe_append(p, b.buf, (uint64_t)b.len, tag, sig, &head)) {
                result = p2p_set(p->channel, s_p2p_head, head) < 0 ? NULL : Py_True;
                s->sends++;
            }
            Py_XDECREF(closed);
            p2p_release(p->send_release);
        }
    }
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
/* Receive from the ring (poll_lock held, GIL held on entry and return): the byte count,
 * -2 to leave it to Python, -1 with an exception. */
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
                if (kind != P2P_INLINE || rtag != tag || nbytes > cap || rsig == P2P_ABORT_SIG ||
                    (sig && rsig && sig != rsig)) {
                    gil_take(&gil);
                    return -2;                             /* left in the ring for Python */
                }
                memcpy(dst, rec + P2P_HDR, nbytes);
                take = 2;
            }
            if (take) {
                tail += length;
                __atomic_store_n(&p->in_ctl[8], tail, __ATOMIC_RELEASE);
                gil_take(&gil);
                if (p2p_set(p->channel, s_p2p_tail, tail) < 0)
                    return -1;
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
        } else if (yields < s->yields) {
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
    uint64_t mask = PyLong_AsUnsignedLongLong(args[3]);
    uint64_t sig = PyLong_AsUnsignedLongLong(args[4]);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    mask = ~P2P_USER | (mask & P2P_USER);   /* context and kind bits always compared */
    int busy = p2p_engine_busy(s->engine);
    if (!busy && !own)           /* receives deferred before this one: theirs first */
        busy = p2p_engine_deferred(s->engine);
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
        int claim = p2p_engine_claims(s->engine, p->peer, tag, mask);
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

#include "_p2p_type.c"
