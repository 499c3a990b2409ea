/* Lent: the native half of api_p2p_work.LentWork, a send lent from C (P2P.lend, or a
 * batch_isend_irecv send P2P.batch lent: a LENT record carrying the buffer's address; see
 * _p2p_lend.c). Included by _p2p_type.c after _p2p_lend.c and before _p2p_batch.c, which
 * makes these works without their Python __init__.
 *
 * The Python class subclasses this type: its fields are a C struct (the attribute names
 * ``_f``, ``_group``, ``_peer``, ``_local``, ``_loan``, ``_buf``, ``_rec``, ``_status``,
 * ``_exc``, ``_nbytes`` as before) and its ``wait`` does the common case in C: the loan
 * released by the receiver (it read the buffer), already or within bounds that grow with
 * its size (lent_fast; the GIL released), the receives of this rank deferred meanwhile
 * tried in C (own_test, as the Python loop's test(): the peer may be waiting for this
 * rank to read its own loan), then the status ``Status(peer, nbytes)`` made and the
 * record marked completed, where the Python wait took four frames (~1.5 µs, on the
 * critical path of a two-rank exchange) and, past its first 2 µs, polled the engine
 * (which read the peer's next loan aside, a copy and an allocation more: such waits took
 * 86 µs, median, at 512 KiB). Everything else (a timeout given, an error kept, a receive
 * not C's to try, the loan still out past the deadline) is the Python ``_wait``:
 * core/p2p_loans.py's loop, the reference.
 *
 * A work dropped unwaited ends its loan (tp_finalize: withdrawn into a copy, or, being
 * read, its array kept alive for the reader), as core/p2p_loans.keep_unwaited does.
 */

/* How long the wait stays in C: with receives deferred, LENT_POLL_NS (core/p2p_loans.
 * STEP_NS) and the time to read the loan at LENT_BYTES_PER_NS (the peer reads this rank's
 * loan while this rank reads the peer's: a phase of a two-rank exchange lasts about a
 * read; 512 KiB read by CMA took 25 µs here, 21 bytes/ns), at most LENT_READ_NS; with
 * none, LENT_FIRST_STEP_NS (core/p2p_loans.FIRST_STEP_NS), longer (to that same bound)
 * only while the receiver reads the loan (lent_past). Past it, the Python loop, whose
 * engine poll reads the peers' loans aside (sends that all wait before any receive is
 * posted, or receives posted the regular way, get their messages there). */
#define LENT_FIRST_STEP_NS 2000LL     /* (both checked against p2p_loans by a test: the */
#define LENT_POLL_NS 20000LL          /*  module's LENT_FIRST_STEP_NS, LENT_POLL_NS) */
#define LENT_BYTES_PER_NS 8           /* (2.5x below the 21 bytes/ns measured: a margin for
                                       * a slower read, a descheduled peer) */
#define LENT_READ_NS 5000000LL

typedef struct {
    PyObject_HEAD
    PyObject *f, *group, *peer, *local, *loan, *buf, *rec, *status, *exc;
    Py_ssize_t nbytes;
} Lent;

static PyObject *s_lw_wait;           /* "_wait": the Python reference wait */

/* End `loan` (lend_write's (ident, start, since)) of `arr` to local rank `local` now, as a
 * work dropped unwaited ends it (core/p2p_loans.keep_unwaited): one bounded try of
 * P2P.loan_wait with no patience (withdrawn under the channel's send lock); not over
 * (being read, or the lock busy): the array kept alive for its reader (shm_end._kept). Any
 * pending exception is kept. */
static void loan_end_unwaited(P2P *s, PyObject *local, PyObject *loan, PyObject *arr)
{
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    PyObject *one = PyLong_FromLong(1), *zero = PyLong_FromLong(0), *over = NULL;
    if (one != NULL && zero != NULL) {
        PyObject *args[7] = {local, PyTuple_GET_ITEM(loan, 0), PyTuple_GET_ITEM(loan, 1), arr,
                             PyTuple_GET_ITEM(loan, 2), one, zero};
        over = P2P_loan_wait(s, args, 7);
    }
    PyErr_Clear();
    if (over != Py_True && lend_keep(arr) < 0)
        PyErr_WriteUnraisable(arr);
    Py_XDECREF(over);
    Py_XDECREF(one);
    Py_XDECREF(zero);
    PyErr_Restore(et, ev, tb);
}

/* Is the work's loan what C can wait for? Its pipe, else NULL (no exception). */
static Pipe *lent_pipe(Lent *w)
{
    if (w->f == NULL || Py_TYPE(w->f) != &P2PType || ((P2P *)w->f)->paused ||
        ((P2P *)w->f)->pipes == NULL || w->loan == NULL ||
        !PyTuple_CheckExact(w->loan) || PyTuple_GET_SIZE(w->loan) != 3 || d_none(w->buf) ||
        d_none(w->local))
        return NULL;
    Pipe *p = p2p_pipe((P2P *)w->f, w->local);
    return p != NULL && p->has_out ? p : NULL;
}

/* LentWork._done in C: Status(peer, nbytes), the buffer let go, the record completed.
 * 0, or -1 with an exception. */
static int lent_done(Lent *w)
{
    if (!d_none(w->status))
        return 0;                     /* (another thread's wait ended it meanwhile) */
    PyObject *n = PyLong_FromSsize_t(w->nbytes), *tag = PyLong_FromLong(-1);
    PyObject *st = n == NULL || tag == NULL ? NULL : p2p_status(w->peer, n, tag);
    Py_XDECREF(n);
    Py_XDECREF(tag);
    if (st == NULL)
        return -1;
    Py_XSETREF(w->status, st);
    Py_CLEAR(w->buf);                 /* the receiver has it (or our copy) */
    rec_p2p_end(w->rec, 1);           /* (none: nothing) */
    return 0;
}

/* A loan being waited for: its pipe, release id and ring position, and until when a
 * read the receiver has begun is waited for (lent_past). */
typedef struct {
    P2P *s;
    Pipe *out;
    uint64_t ident, start;
    long long read_until;
} LentWatch;

static int lent_released(LentWatch *lw)
{
    return __atomic_load_n(&lw->out->out_ctl[P2P_RELEASED], __ATOMIC_ACQUIRE) > lw->ident;
}

/* Is the receiver reading the loan now? Its record's state word CLAIMED (shm_lent.py:
 * the reader's swap before its read), the release not yet written; read again after the
 * state, the release proves the ring slot still held this record (the slot is reused
 * only once the receiver's tail has passed it, which comes after the release). */
static int lent_claimed(LentWatch *lw)
{
    Pipe *p = lw->out;
    const uint64_t *state = (const uint64_t *)(p->out_data + lw->start % p->out_ring + P2P_HDR + 8);
    return __atomic_load_n(state, __ATOMIC_ACQUIRE) == LENT_CLAIMED && !lent_released(lw);
}

/* Is `deadline` past at `now`? Not while the receiver reads the loan, up to read_until:
 * the release is a read's time away then, where the Python loop's poll could read the
 * peer's next loan aside (measured at 512 KiB: such waits took 86 µs, median). */
static int lent_past(LentWatch *lw, long long now, long long deadline)
{
    return now >= deadline && (now >= lw->read_until || !lent_claimed(lw));
}

/* Wait (the GIL released) until the loan is released (1), a record lands in the ring
 * ``in`` (its head leaves `tail`: 2; no ring, NULL: never) or `deadline` passes (0; see
 * lent_past): spinning for the P2P's spin_ns, then yielding the CPU (at once where the
 * host has more ranks than CPUs: spin_ns 0; the peer may need this CPU to read the loan). */
static int lent_spin(LentWatch *lw, Pipe *in, uint64_t tail, long long deadline)
{
    int why = 0;
    long long t0 = now_ns(), spin = lw->s->spin_ns;
    Py_BEGIN_ALLOW_THREADS
    while (1) {
        if (lent_released(lw)) {
            why = 1;
            break;
        }
        if (in != NULL && __atomic_load_n(&in->in_ctl[0], __ATOMIC_ACQUIRE) != tail) {
            why = 2;
            break;
        }
        long long now = now_ns();
        if (lent_past(lw, now, deadline))
            break;
        if (now - t0 < spin)
            for (int i = 0; i < 64; i++)
                cpu_relax();
        else
            sched_yield();
    }
    Py_END_ALLOW_THREADS
    return why;
}

/* This rank's first deferred receive tried in C (own_test), as the Python loop's test()
 * tries it: 1 taken (received or posted), 0 nothing yet (*in: its ring, to watch), 2 no
 * receive deferred, 3 not C's to try (the Python loop's), -1 with an exception that is not
 * a CollcommError (Ctrl-C: the loan ended first, as loan_over ends it); a CollcommError of
 * the receive is left to the Python loop, which tries again and handles it as it does. */
static int lent_receive(Lent *w, PyObject *local, PyObject *loan, PyObject *buf, Pipe **in)
{
    P2P *s = (P2P *)w->f;
    PyObject *held = s->engine == NULL || s->paused ? NULL : p2p_engine_list(s);
    if (held == NULL || !PyList_Check(held)) {
        Py_XDECREF(held);
        PyErr_Clear();
        return 3;
    }
    int rc = 2;
    if (PyList_GET_SIZE(held) > 0) {
        PyObject *first = Py_NewRef(PyList_GET_ITEM(held, 0));
        rc = PyObject_TypeCheck(first, &DeferredType) ? own_test(s, (Deferred *)first) : 2;
        rc = rc == 2 ? 3 : rc;        /* (not C's to try now: the Python loop's) */
        if (rc == 0) {
            *in = p2p_pipe(s, ((Deferred *)first)->local);
            rc = *in != NULL && (*in)->has_in ? 0 : 3;
        }
        Py_DECREF(first);
        if (rc < 0 && d_error != NULL && PyErr_ExceptionMatches(d_error)) {
            PyErr_Clear();
            rc = 3;
        } else if (rc < 0) {          /* (its own references: another thread's wait may
                                       * have let go of the work's meanwhile) */
            loan_end_unwaited(s, local, loan, buf);
            Py_CLEAR(w->buf);         /* ended: nothing for a later wait or the finalizer */
        }
    }
    Py_DECREF(held);
    return rc;
}

/* The common case of wait(): 1 done, 0 not tried (the Python wait's, from its start), 2
 * not over yet (the Python wait goes on: nothing done here but the deferred receives'
 * tries and the spin), -1 with an exception. Released already: done.
 * Else, while receives of this rank are deferred, the first is tried (own_test) whenever
 * a record lands in its ring (the peer may be waiting for this rank to read its own
 * loan), within LENT_POLL_NS + nbytes / LENT_BYTES_PER_NS (at most LENT_READ_NS); then,
 * none deferred, the release is waited for LENT_FIRST_STEP_NS, or, while the receiver
 * reads the loan, up to that same deadline (lent_past). */
static int lent_fast(Lent *w)
{
    Pipe *p = lent_pipe(w);
    if (p == NULL || w->peer == NULL || w->nbytes <= 0)   /* (a loan is never empty) */
        return 0;
    LentWatch lw = {(P2P *)w->f, p, 0, 0, 0};
    lw.ident = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(w->loan, 0));
    if (!PyErr_Occurred())
        lw.start = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(w->loan, 1));
    if (PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    /* held for the whole wait: the GIL is let go, and another thread's wait of the same
     * work may end it and let go of the work's own (the pipes live as long as f) */
    PyObject *f = Py_NewRef(w->f), *local = Py_NewRef(w->local), *loan = Py_NewRef(w->loan),
             *buf = Py_NewRef(w->buf);
    int over = lent_released(&lw), result = 0;
    long long t0 = now_ns(), patience = LENT_POLL_NS + (long long)(w->nbytes / LENT_BYTES_PER_NS);
    long long deadline = t0 + (patience < LENT_READ_NS ? patience : LENT_READ_NS);
    lw.read_until = deadline;
    while (!over && result == 0) {
        if (lent_past(&lw, now_ns(), deadline)) {   /* (records keep coming, none ours) */
            result = 2;
            break;
        }
        Pipe *in = NULL;
        int got = lent_receive(w, local, loan, buf, &in);
        if (got < 0 || got == 3)
            result = got < 0 ? -1 : 2;
        else if (got == 1)
            over = lent_released(&lw);
        else if (got == 0) {
            uint64_t tail = __atomic_load_n(&in->in_ctl[8], __ATOMIC_ACQUIRE);
            int why = lent_spin(&lw, in, tail, deadline);
            over = why == 1;
            result = why == 0 ? 2 : 0;
        } else {                      /* none deferred: the first step, longer only while
                                       * the receiver reads the loan (lent_past) */
            long long first = now_ns() + LENT_FIRST_STEP_NS;
            over = lent_spin(&lw, NULL, 0, first < deadline ? first : deadline) == 1;
            result = over ? 0 : 2;
        }
    }
    Py_DECREF(f);
    Py_DECREF(local);
    Py_DECREF(loan);
    Py_DECREF(buf);
    if (over && result == 0)
        result = lent_done(w) < 0 ? -1 : 1;
    return result;
}

static PyObject *Lent_wait(Lent *w, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    if (nargs + nkw > 1 || (nkw == 1 && PyUnicode_CompareWithASCIIString(
                                            PyTuple_GET_ITEM(kwnames, 0), "timeout") != 0)) {
        PyErr_SetString(PyExc_TypeError, "wait(timeout=None)");
        return NULL;
    }
    PyObject *timeout = nargs + nkw == 1 ? args[0] : Py_None;
    if (d_none(w->exc) && !d_none(w->status))
        Py_RETURN_TRUE;
    int done = d_none(w->exc) && timeout == Py_None ? lent_fast(w) : 0;
    if (done == 1 || done < 0)
        return done < 0 ? NULL : Py_NewRef(Py_True);
    PyObject *call[3] = {(PyObject *)w, timeout, done == 2 ? Py_True : Py_False};
    return PyObject_VectorcallMethod(s_lw_wait, call, 3, NULL);
}

/* A Lent of type `cls` (a subclass) made without its Python __init__, as
 * LentWork.__init__ makes it (the batch's lent sends); NULL with an exception. */
static PyObject *lent_make(PyTypeObject *cls, P2P *s, PyObject *g, PyObject *peer,
                           PyObject *local, PyObject *loan, PyObject *arr, Py_ssize_t nbytes,
                           PyObject *rec)
{
    Lent *w = (Lent *)cls->tp_alloc(cls, 0);
    if (w == NULL)
        return NULL;
    w->f = Py_NewRef((PyObject *)s);
    w->group = Py_NewRef(g);
    w->peer = Py_NewRef(peer);
    w->local = Py_NewRef(local);
    w->loan = Py_NewRef(loan);
    w->buf = Py_NewRef(arr);
    w->rec = Py_NewRef(rec);
    w->nbytes = nbytes;
    return (PyObject *)w;
}

/* Dropped unwaited, its loan still out: ended now (loan_end_unwaited). */
static void Lent_finalize(Lent *w)
{
    if (!d_none(w->status) || !d_none(w->exc) || d_none(w->buf))
        return;
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    if (lent_pipe(w) != NULL)
        loan_end_unwaited((P2P *)w->f, w->local, w->loan, w->buf);
    else if (lend_keep(w->buf) < 0)   /* (no pipe to end it through: kept for a reader) */
        PyErr_WriteUnraisable(w->buf);
    PyErr_Restore(et, ev, tb);
}

#define LENT_FIELDS(X) X(f) X(group) X(peer) X(local) X(loan) X(buf) X(rec) X(status) X(exc)

static int Lent_traverse(Lent *w, visitproc visit, void *arg)
{
#define LENT_VISIT(name) Py_VISIT(w->name);
    LENT_FIELDS(LENT_VISIT)
    return 0;
}

static int Lent_clear(Lent *w)
{
#define LENT_CLEAR(name) Py_CLEAR(w->name);
    LENT_FIELDS(LENT_CLEAR)
    return 0;
}

static void Lent_dealloc(Lent *w)
{
    if (PyObject_CallFinalizerFromDealloc((PyObject *)w) < 0)
        return;                       /* (resurrected) */
    PyObject_GC_UnTrack(w);
    Lent_clear(w);
    Py_TYPE(w)->tp_free((PyObject *)w);
}

static PyMethodDef Lent_methods[] = {
    {"wait", (PyCFunction)(void (*)(void))Lent_wait, METH_FASTCALL | METH_KEYWORDS,
     "wait(timeout=None) -> True once the loan is over (the common case in C, else _wait)"},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef Lent_members[] = {
    {"_f", T_OBJECT, offsetof(Lent, f), 0, NULL},
    {"_group", T_OBJECT, offsetof(Lent, group), 0, NULL},
    {"_peer", T_OBJECT, offsetof(Lent, peer), 0, NULL},
    {"_local", T_OBJECT, offsetof(Lent, local), 0, NULL},
    {"_loan", T_OBJECT, offsetof(Lent, loan), 0, NULL},
    {"_buf", T_OBJECT, offsetof(Lent, buf), 0, NULL},
    {"_rec", T_OBJECT, offsetof(Lent, rec), 0, NULL},
    {"_status", T_OBJECT, offsetof(Lent, status), 0, NULL},
    {"_exc", T_OBJECT, offsetof(Lent, exc), 0, NULL},
    {"_nbytes", T_PYSSIZET, offsetof(Lent, nbytes), 0, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject LentType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "collcomm.native._shmcore.Lent",
    .tp_doc = "The fields and the wait of api_p2p_work.LentWork (_p2p_lent.c).",
    .tp_basicsize = sizeof(Lent),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_BASETYPE,
    .tp_new = PyType_GenericNew,
    .tp_traverse = (traverseproc)Lent_traverse,
    .tp_clear = (inquiry)Lent_clear,
    .tp_dealloc = (destructor)Lent_dealloc,
    .tp_finalize = (destructor)Lent_finalize,
    .tp_methods = Lent_methods,
    .tp_members = Lent_members,
};

static int lent_module_init(PyObject *m)
{
    if ((s_lw_wait = PyUnicode_InternFromString("_wait")) == NULL ||
        PyModule_AddIntConstant(m, "LENT_FIRST_STEP_NS", (long)LENT_FIRST_STEP_NS) < 0 ||
        PyModule_AddIntConstant(m, "LENT_POLL_NS", (long)LENT_POLL_NS) < 0)
        return -1;
    return add_type(m, "Lent", &LentType);
}
