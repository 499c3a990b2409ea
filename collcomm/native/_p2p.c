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
 * This file: the types, what the calls read of the Python engine (_p2p_engine.c), small
 * helpers, and the rings from C: ``pipe_append`` writes one INLINE record,
 * ``pipe_recv`` reads the ring in order and waits. The calls built on them (``send``,
 * ``recv``, ``note``, and what each promises) are in _p2p_calls.c, the types'
 * construction and method tables in _p2p_type.c; _shmcore.c includes the three in that
 * order.
 */

#define P2P_HDR 40                       /* shm.HEADER.size: "<IIQQQQ" */
#define P2P_INLINE 1
#define P2P_PAD 3
#define P2P_LENT 6                       /* shm_ring.LENT: the body is in the sender's memory */
#define P2P_RELEASED 9                   /* shm_ring.RELEASED: the consumer's release watermark */
#define LENT_POSTED 0                    /* shm_lent.py: the state word of a LENT record */
#define LENT_CLAIMED 1
#define LENT_WITHDRAWN 2
#define P2P_ABORT_SIG (0xFULL << 60)     /* transport.base.ABORT_SIG */
#define P2P_USER ((1ULL << 35) - 1)      /* core.tags.MAX_USER_TAG */
/* The user tag proper (MPI's TAG_UB): a receive whose mask leaves some of these bits out
 * (collcomm.MPI's ANY_TAG) takes a message whatever they hold; every other bit of the
 * message's tag must be the receive's (MPI's SYNC, ACK, BODY flags: a synchronous send's
 * message, which needs an ack, is left to the Python code) */
#define P2P_WILD_BITS ((1ULL << 31) - 1)

/* The wire tag of the last message a native receive took on this thread (P2P.last_tag
 * reads it): per thread, because another thread's receive may take its message while
 * this one's waits with the GIL released, or between its return and the read. */
static _Thread_local uint64_t p2p_last_tag;
#define P2P_CHECK_NS 100000000LL
/* A receive waiting on an empty ring yields the CPU for at least this long (after its
 * spin, whatever the yield count) before it sleeps: a ring has no wake-up, so a sleeping
 * receiver sees its message only at the end of a 50 µs - 1 ms nap. Measured (8-byte ring
 * exchange, 4 ranks on the 2-vCPU VM): 3 yields then naps 190-345 µs per exchange, 2 ms
 * of yields 10-13 µs (Open MPI, which polls, ~9). */
#define P2P_YIELD_NS 2000000LL

static PyObject *s_p2p_aborted, *s_p2p_closed, *s_p2p_lost, *s_p2p_posted, *s_p2p_unexpected,
    *s_p2p_peer, *s_p2p_tag, *s_p2p_mask, *s_p2p_source, *s_p2p_waiter,
    *s_p2p_chclosed, *s_p2p_deferred;

typedef struct {
    PyObject_HEAD
    PyObject *channel, *send_acquire, *send_release, *poll_acquire, *poll_release, *take_one;
    Py_buffer out, in;
    uint64_t *out_ctl, *in_ctl;          /* word 0: head, word 8: tail */
    uint8_t *out_data, *in_data;
    uint64_t out_ring, in_ring, eager;
    long peer;                           /* global rank */
    int has_out, has_in;
    int closed;                          /* the channel's ``closed`` (its setter keeps it) */
    int backlog;                         /* the channel has sends waiting for room (shm_backlog.py):
                                          * every record goes after them, the Python way */
    long peer_pid;                       /* the peer's pid (0: unknown: LENT records to Python) */
    int lends;                           /* the peer takes LENT records (shm_lent.py) */
} Pipe;

typedef struct {
    PyObject_HEAD
    PyObject *engine, *check, *pipes;    /* pipes: tuple (local rank -> Pipe or None) */
    /* the engine's ``health`` bytearray (byte 0: aborted, closed or a peer lost), its
     * ``_deferred`` list and ``_defer_mutex``, read once: none is ever replaced; and its
     * ``_posted`` and ``_unexpected`` lists as they were then, the current ones while the
     * health byte is 0 (only abort and peer_lost replace them, after setting it) */
    PyObject *health, *deferred, *defer_mutex, *posted, *unexpected;
    uint64_t tag_base;
    long long spin_ns;
    int yields, paused;
    int take_now;                        /* receives taken when started, their message there */
    int steal;                           /* set by another thread: a waiting receive leaves */
    Py_ssize_t lend_from;                /* > 0: a batch's sends of this many bytes or more to
                                          * a rank that takes loans are lent (P2P.batch, its
                                          * work made of its `lent` class: LentWork) */
    unsigned long long sends, recvs;     /* calls done here (tests check the path) */
    RecWriter rw;                        /* the flight recorder's records (_record.c) */
} P2P;

static PyTypeObject PipeType, P2PType;

#include "_p2p_engine.c"

/* -------------------------------------------------------------- the locks */
/* A threading.Lock (``_thread.lock``) is tried and released here without calling its
 * methods when it has the layout of CPython 3.10-3.12 (below): ``acquire`` parses its
 * arguments, ~100 ns of a ~1.3 us native exchange per call. ``p2p_lock_type`` is that type
 * once p2p_lock_init has checked the layout on a fresh lock (taken and released here, its
 * ``locked()`` seen to follow); else NULL and every lock goes through its methods. Both
 * ways run holding the GIL and do what the methods do: a try that never blocks, then
 * ``locked`` set; ``locked`` cleared, then the release. */
typedef struct {
    PyObject_HEAD
    PyThread_type_lock lock_lock;
    PyObject *in_weakreflist;
    char locked;
} P2PLock;

static PyTypeObject *p2p_lock_type;

static P2PLock *p2p_direct(PyObject *lock)   /* the lock if it is taken here directly */
{
    return p2p_lock_type != NULL && Py_TYPE(lock) == p2p_lock_type ? (P2PLock *)lock : NULL;
}

static P2PLock *p2p_lock_of(PyObject *method)   /* the same, by its bound acquire/release */
{
    if (!PyCFunction_Check(method))
        return NULL;
    PyObject *self = PyCFunction_GET_SELF(method);
    return self == NULL ? NULL : p2p_direct(self);
}

static int p2p_take(P2PLock *l)   /* acquire(False) of a direct lock: 1 taken, 0 busy */
{
    if (!PyThread_acquire_lock(l->lock_lock, NOWAIT_LOCK))
        return 0;
    l->locked = 1;
    return 1;
}

static void p2p_give(P2PLock *l)   /* release() of a direct lock this thread took */
{
    l->locked = 0;
    PyThread_release_lock(l->lock_lock);
}

/* A lock's release through its method: ``obj`` the bound release (``name`` NULL) or the
 * lock (``name`` the method's name); a pending exception is kept. */
static void p2p_release_calling(PyObject *obj, PyObject *name)
{
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    PyObject *r = name == NULL ? PyObject_CallNoArgs(obj) : PyObject_CallMethodNoArgs(obj, name);
    Py_XDECREF(r);
    if (t != NULL)
        PyErr_Restore(t, v, tb);
    else if (r == NULL)
        PyErr_WriteUnraisable(obj);
}

static int p2p_lock_locked(PyObject *lock)   /* its locked(): 1, 0, -1 error */
{
    PyObject *r = PyObject_CallMethod(lock, "locked", NULL);
    int v = r == NULL ? -1 : PyObject_IsTrue(r);
    Py_XDECREF(r);
    return v;
}

static int p2p_lock_init(void)
{
    PyObject *mod = PyImport_ImportModule("_thread");
    PyObject *lock = mod == NULL ? NULL : PyObject_CallMethod(mod, "allocate_lock", NULL);
    Py_XDECREF(mod);
    if (lock == NULL)
        return -1;
#if PY_VERSION_HEX < 0x030D0000
    P2PLock *l = (P2PLock *)lock;
    if (Py_TYPE(lock)->tp_basicsize == sizeof(P2PLock) && l->locked == 0 && l->lock_lock != NULL &&
        strcmp(Py_TYPE(lock)->tp_name, "_thread.lock") == 0 &&
        PyThread_acquire_lock(l->lock_lock, NOWAIT_LOCK)) {
        l->locked = 1;
        int held = p2p_lock_locked(lock);
        int twice = PyThread_acquire_lock(l->lock_lock, NOWAIT_LOCK);
        l->locked = 0;
        PyThread_release_lock(l->lock_lock);
        if (held == 1 && !twice && p2p_lock_locked(lock) == 0)
            p2p_lock_type = Py_TYPE(lock);
    }
#endif
    PyErr_Clear();
    Py_DECREF(lock);
    return 0;
}

static int p2p_try(PyObject *acquire)   /* 1: taken, 0: busy, -1: error */
{
    GilLock *g = gil_lock_of(acquire);    /* (the GIL is held: a plain load and store) */
    if (g != NULL) {
        if (g->locked)
            return 0;
        g->locked = 1;
        return 1;
    }
    P2PLock *l = p2p_lock_of(acquire);
    if (l != NULL)
        return p2p_take(l);
    PyObject *r = PyObject_CallOneArg(acquire, Py_False);
    if (r == NULL)
        return -1;
    int got = PyObject_IsTrue(r);
    Py_DECREF(r);
    return got;
}

static void p2p_release(PyObject *release)   /* keeps a pending exception */
{
    GilLock *g = gil_lock_of(release);
    if (g != NULL && g->locked) {
        g->locked = 0;
        return;
    }
    P2PLock *l = p2p_lock_of(release);
    if (l != NULL && l->locked)
        p2p_give(l);
    else
        p2p_release_calling(release, NULL);
}

/* -------------------------------------------------------------- small helpers */

/* An int the package made (a signature, a tag mask: 0 .. 2**64 - 1) as a uint64_t.
 * PyLong_AsUnsignedLongLong goes through a byte array for any value past 30 bits, most
 * signatures (~190 instructions, four times per exchange); the mask conversion is a loop
 * over the digits. Not for user values: it does not refuse a negative or wider int. */
static inline uint64_t p2p_u64(PyObject *o)
{
    return PyLong_AsUnsignedLongLongMask(o);
}

/* Where a class keeps its plain slots (plain_slot_offset, _fastcall.c), found once per
 * class (P2POp's fields, a Status's, collcomm.MPI's _NativeRecv and Request). A class
 * without them (a subclass with a __dict__, say) has none: attribute calls then. */
typedef struct {
    PyTypeObject *type;          /* strong reference: the class the offsets are of */
    Py_ssize_t at[8];            /* (up to eight slots) */
    int ok;
} SlotsOf;

static int slots_of(SlotsOf *c, PyTypeObject *type, PyObject *const *names, int count)
{
    if (c->type != type) {
        Py_XSETREF(c->type, (PyTypeObject *)Py_NewRef((PyObject *)type));
        c->ok = 1;
        for (int i = 0; i < count; i++)
            c->ok = c->ok && (c->at[i] = plain_slot_offset(type, names[i])) > 0;
    }
    return c->ok;
}

#define SLOT_AT(obj, off) (*(PyObject **)((char *)(obj) + (off)))

/* The Pipe of local rank r, or NULL (no exception). */
static Pipe *p2p_pipe(P2P *s, PyObject *r)
{
    if (s->pipes == NULL || !PyLong_Check(r))      /* (no pipes: a cleared P2P) */
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
    if (nd_buffer(o, b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT |
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
    memcpy(d + off + P2P_HDR, body, blen);
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
                int lent = kind == P2P_LENT && p->peer_pid > 0;
                if ((kind != P2P_INLINE && !lent) || ((rtag ^ tag) & ~P2P_WILD_BITS) ||
                    nbytes > cap || rsig == P2P_ABORT_SIG ||
                    (sig && rsig && sig != rsig)) {
                    gil_take(&gil);
                    return -2;                             /* left in the ring for Python */
                }
                if (lent) {
                    if (nbytes > 65536)
                        gil_release(&gil);
                    if (!pipe_read_lent(p, (uint8_t *)rec, nbytes, dst)) {
                        gil_take(&gil);
                        return -2;        /* (claimed: Python's take_lent reads it again) */
                    }
                } else
                    memcpy(dst, rec + P2P_HDR, nbytes);
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
