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
 * This file: the types, what the calls read of the Python engine (_p2p_engine.c), the
 * channels' locks as C sees them, and small helpers. The rings from C (``pipe_append``
 * writes one INLINE record, ``pipe_recv`` reads the ring in order and waits) are in
 * _p2p_ring.c; the calls built on them (``send``, ``recv``, ``note``, and what each
 * promises) in _p2p_calls.c, the types' construction and method tables in _p2p_type.c;
 * _shmcore.c includes the four in that order.
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
/* (_thread.lock and _thread.RLock taken directly where their layout allows: _thread_locks.c) */

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

static int p2p_try(PyObject *acquire)   /* 1: taken, 0: busy, -1: error */
{
    GilLock *g = gil_lock_of(acquire);    /* (the GIL is held: a plain load and store) */
    if (g != NULL) {
        if (g->locked)
            return 0;
        g->locked = 1;
        return 1;
    }
    TLock *l = tlock_of(acquire);
    if (l != NULL)
        return tlock_take(l);
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
    TLock *l = tlock_of(release);
    if (l != NULL && l->locked)
        tlock_give(l);
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
