/* Deferred: the native half of core/p2p.py's ``Deferred`` (a receive from a peer on this
 * host whose posting waits for its wait), included by _p2p_type.c before _p2p_own.c.
 *
 * The Python class (and the functional API's ``RecvWork``, which *is* one) subclasses this
 * type: its fields are a C struct (the same attribute names, so the engine's Python code
 * and core/p2p.py read and set them as before) and its ``wait`` is C. That wait does the
 * common case in one call, where the Python path took four frames:
 *
 * - already done: the status (``RecvWork``: True);
 * - not posted, no error, no explicit ``timeout`` and the call timeout the same as when it
 *   started: ``P2P.own`` (the native receive, first in line; _p2p_own.c), then the status
 *   (``RecvWork``: its byte count checked against the buffer's, True);
 * - ``own`` raising: exactly what Deferred._wait does (a CollcommError kept in ``exc`` and
 *   the native wait ended; anything else, Ctrl-C, ends it if it began and is raised).
 *
 * A receive's status is made here too (Deferred._done in C, for P2P.own).
 *
 * Everything else (a timeout given, posted, an error kept, C declining, a size mismatch)
 * is the Python ``_wait``, the reference, which raises the same errors. P2P.batch makes
 * the functional API's works here without their Python ``__init__`` (deferred_make).
 */

typedef struct {
    PyObject_HEAD
    PyObject *f, *g, *eng, *arr, *local, *utag, *umask, *sig, *tag, *limit, *rec, *h, *req,
        *status, *exc, *work_exc;
    char waiting;      /* its wait receives natively (Engine.begin_native) */
    char ok;           /* (RecvWork) waited for, the size right */
    char early;        /* received when started, the size right (_p2p_batch.c batch_take_now) */
} Deferred;

static PyObject *s_d_wait, *s_d_timeout, *s_d_end_native, *s_d_nbytes, *s_d_is_work,
    *s_d_ranks, *s_d_source;
static PyObject *d_local;     /* core/timeouts.py's _local: the thread's call_timeout */
static PyObject *d_error;     /* collcomm.errors.CollcommError */
static PyObject *d_status;    /* transport/base.py's Status (a slotted dataclass) */

static PyObject *P2P_own(P2P *s, PyObject *d);      /* _p2p_own.c */

#define D_SET(field, value) Py_XSETREF(field, Py_NewRef(value))

static int d_none(PyObject *o) { return o == NULL || o == Py_None; }

/* current_timeout(g.timeout): the innermost call_timeout of this thread, else the group's */
static PyObject *d_current_timeout(PyObject *g)
{
    if (fast_timeout_scopes == 0)      /* no scope open in any thread (core/timeouts.py) */
        return PyObject_GetAttr(g, s_d_timeout);
    PyObject *t = PyObject_GetAttr(d_local, s_d_timeout);
    if (t == NULL || t != Py_None)
        return t;
    Py_DECREF(t);
    return PyObject_GetAttr(g, s_d_timeout);
}

/* The pending exception kept in ``exc`` if it is a CollcommError (the wait raises it, with
 * the call's context): 1, nothing pending now; 0 any other exception, -1 the test failed
 * (the exception still pending, either way). */
static int d_keep_error(Deferred *d)
{
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    PyErr_NormalizeException(&t, &v, &tb);
    if (tb != NULL && v != NULL)
        PyException_SetTraceback(v, tb);
    int mine = v != NULL && d_error != NULL ? PyObject_IsInstance(v, d_error) : 0;
    if (mine > 0) {
        D_SET(d->exc, v);
        Py_XDECREF(t);
        Py_XDECREF(v);
        Py_XDECREF(tb);
        return 1;
    }
    PyErr_Restore(t, v, tb);
    return mine;
}

/* P2P.own raised: Deferred._wait's two except clauses. 0: a CollcommError, now kept in
 * ``exc`` (the caller goes on to _wait, which raises it); -1 with the exception to raise. */
static int d_own_failed(Deferred *d)
{
    PyObject *t, *v, *tb, *r;
    int mine = d_keep_error(d);
    if (mine > 0) {
        r = PyObject_CallMethodObjArgs(d->eng, s_d_end_native, (PyObject *)d, Py_False, NULL);
        Py_XDECREF(r);
        return r == NULL ? -1 : 0;
    }
    if (mine == 0 && d->waiting) {
        PyErr_Fetch(&t, &v, &tb);
        r = PyObject_CallMethodObjArgs(d->eng, s_d_end_native, (PyObject *)d,
                                       d_none(d->status) ? Py_True : Py_False, NULL);
        if (r == NULL) {              /* raised while handling: that one, chained */
            PyObject *t2, *v2, *tb2;
            PyErr_Fetch(&t2, &v2, &tb2);
            PyErr_NormalizeException(&t2, &v2, &tb2);
            if (v2 != NULL && v != NULL)
                PyException_SetContext(v2, Py_NewRef(v));
            Py_XDECREF(t);
            Py_XDECREF(v);
            Py_XDECREF(tb);
            PyErr_Restore(t2, v2, tb2);
            return -1;
        }
        Py_DECREF(r);
        PyErr_Restore(t, v, tb);
    }
    return -1;
}

/* Is ``n`` (the bytes a receive got) the size of d's array? 1, 0 (not: a count past
 * Py_ssize_t is not the size either), -1 with an exception. */
static int d_size_right(Deferred *d, PyObject *n)
{
    Py_ssize_t want = nd_nbytes(d->arr, s_d_nbytes);
    if (want < 0)
        return -1;
    Py_ssize_t got = PyLong_AsSsize_t(n);
    if (got == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return got == want;
}

/* Where Status keeps source, nbytes and tag (read by _mpi_wait.c too, where its ``ok``) */
static SlotsOf status_slots;

/* Status(src, n, tag) (transport/base.py, a slotted dataclass) made without its __init__
 * frame; NULL with an exception. */
static PyObject *p2p_status(PyObject *src, PyObject *n, PyObject *tag)
{
    PyObject *names[3] = {s_d_source, s_d_nbytes, s_p2p_tag};
    PyTypeObject *t = (PyTypeObject *)d_status;
    if (t == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Status is not set up (core/p2p.py Deferred._setup)");
        return NULL;
    }
    PyObject *st = t->tp_alloc(t, 0);
    if (st != NULL && slots_of(&status_slots, t, names, 3)) {
        PyObject *values[3] = {src, n, tag};
        for (int i = 0; i < 3; i++)   /* (a fresh object: its slots are empty) */
            SLOT_AT(st, status_slots.at[i]) = Py_NewRef(values[i]);
    } else if (st != NULL && (PyObject_SetAttr(st, s_d_source, src) < 0 ||
                              PyObject_SetAttr(st, s_d_nbytes, n) < 0 ||
                              PyObject_SetAttr(st, s_p2p_tag, tag) < 0))
        Py_CLEAR(st);
    return st;
}

/* Deferred._done(n) in C (P2P.own calls it): the status Status(g.ranks[local], n, tag)
 * and the record marked completed; `wire_tag` the message's tag (the receive's, but for
 * the bits a wildcard mask leaves out). 0, or -1. */
static int deferred_done(Deferred *d, PyObject *n, uint64_t wire_tag)
{
    PyObject *tag = p2p_u64(d->tag) == wire_tag ? Py_NewRef(d->tag) : PyLong_FromUnsignedLongLong(wire_tag);
    if (tag == NULL)
        return -1;
    /* the source's global rank: its pipe's peer (g.ranks[local], without the look-ups) */
    Pipe *pipe = d->f != NULL && d->local != NULL && Py_TYPE(d->f) == &P2PType
                 ? p2p_pipe((P2P *)d->f, d->local) : NULL;
    PyObject *src;
    if (pipe != NULL)
        src = PyLong_FromLong(pipe->peer);
    else {
        PyObject *ranks = PyObject_GetAttr(d->g, s_d_ranks);
        src = ranks == NULL ? NULL : PyObject_GetItem(ranks, d->local);
        Py_XDECREF(ranks);
    }
    PyObject *st = src == NULL ? NULL : p2p_status(src, n, tag);
    Py_XDECREF(src);
    Py_DECREF(tag);
    if (st == NULL)
        return -1;
    Py_XSETREF(d->status, st);
    rec_p2p_end(d->rec, 1);           /* (none: nothing) */
    return 0;
}

/* A functional-API RecvWork (its class's ``_IS_WORK``): wait() returns True, the byte
 * count checked. 1, 0, or -1 with an exception. */
static int d_is_work(Deferred *d)
{
    /* the answer for the last class asked (a strong reference: its address is not reused;
     * a class attribute the package sets once, at class creation) */
    static PyTypeObject *last_type;
    static int last_work;
    if (Py_TYPE(d) == last_type)
        return last_work;
    PyObject *is_work = PyObject_GetAttr((PyObject *)Py_TYPE(d), s_d_is_work);
    int work = is_work == NULL ? -1 : PyObject_IsTrue(is_work);
    Py_XDECREF(is_work);
    if (work >= 0) {
        Py_INCREF(Py_TYPE(d));
        Py_XSETREF(last_type, Py_TYPE(d));
        last_work = work;
    }
    return work;
}

/* Receive d took message `n` before its wait (P2P.batch taking it as it starts; a lent
 * send's wait testing it, own_test): its status and record set as its wait would set them
 * (``early`` too, for a RecvWork of the right size: its wait only marks it waited for;
 * another size: its wait raises the size error). 0, or -1 with an exception. */
static int deferred_taken(Deferred *d, PyObject *n)
{
    int work = deferred_done(d, n, p2p_last_tag) < 0 ? -1 : d_is_work(d);
    if (work > 0) {
        work = d_size_right(d, n);
        d->early = work > 0;
    }
    return work < 0 ? -1 : 0;
}

/* The common case; NULL with no exception set: not taken (the caller calls _wait). */
static PyObject *d_fast(Deferred *d)
{
    int work = d_is_work(d);
    if (work < 0)
        return NULL;
    if (work) {
        if (d->ok)
            Py_RETURN_TRUE;
        if (d->early && d_none(d->work_exc)) {   /* received when it started: waited for now */
            d->ok = 1;
            Py_RETURN_TRUE;
        }
    } else if (!d_none(d->status))
        return Py_NewRef(d->status);
    if (!d_none(d->h) || !d_none(d->exc) || !d_none(d->status) || !d_none(d->work_exc) ||
        d_local == NULL || d->f == NULL || Py_TYPE(d->f) != &P2PType || d->g == NULL ||
        d->arr == NULL)
        return NULL;
    PyObject *cur = d_current_timeout(d->g);
    int same = cur == NULL ? -1 : PyObject_RichCompareBool(cur, d->limit ? d->limit : Py_None, Py_EQ);
    Py_XDECREF(cur);
    if (same <= 0)
        return NULL;
    PyObject *n = P2P_own((P2P *)d->f, (PyObject *)d);
    if (n == NULL) {                 /* raised: a CollcommError is kept (no exception set: */
        d_own_failed(d);             /* _wait raises it, with the call's context), anything */
        return NULL;                 /* else is raised from here */
    }
    if (!PyLong_Check(n) || d_none(d->status)) {    /* False (not first in line) or None */
        Py_DECREF(n);                                /* (posted): _wait's general path */
        return NULL;
    }
    if (!work) {
        Py_DECREF(n);
        return Py_NewRef(d->status);
    }
    int right = d_size_right(d, n);
    Py_DECREF(n);
    if (right <= 0)
        return NULL;                 /* the size error: _wait raises it */
    d->ok = 1;
    Py_RETURN_TRUE;
}

static PyObject *Deferred_wait(Deferred *d, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    if (nargs + nkw > 3) {
        PyErr_SetString(PyExc_TypeError, "wait() takes at most 1 argument (timeout)");
        return NULL;
    }
    PyObject *timeout = nargs + nkw == 1 ? args[0] : Py_None;
    if (nargs + nkw <= 1 && (nkw == 0 || PyUnicode_Compare(PyTuple_GET_ITEM(kwnames, 0),
                                                        s_d_timeout) == 0) && timeout == Py_None) {
        PyObject *r = d_fast(d);
        if (r != NULL || PyErr_Occurred())
            return r;
    }
    PyObject *call[4] = {(PyObject *)d, NULL, NULL, NULL};
    for (Py_ssize_t i = 0; i < nargs + nkw; i++)
        call[i + 1] = args[i];
    return PyObject_VectorcallMethod(s_d_wait, call, (size_t)(nargs + 1), kwnames);
}

/* A Deferred of type ``cls`` (a subclass) made without its Python __init__, as
 * Deferred.__init__ makes it (the batch's receives); NULL with an exception. */
static PyObject *deferred_make(PyTypeObject *cls, P2P *s, PyObject *g, PyObject *arr,
                               PyObject *local, PyObject *utag, PyObject *umask, PyObject *sig,
                               PyObject *rec)
{
    PyObject *limit = d_current_timeout(g);
    PyObject *tag = limit == NULL ? NULL
        : PyLong_FromUnsignedLongLong(s->tag_base | (p2p_u64(utag) & P2P_USER));
    Deferred *d = tag == NULL || PyErr_Occurred() ? NULL : (Deferred *)cls->tp_alloc(cls, 0);
    if (d == NULL) {
        Py_XDECREF(limit);
        Py_XDECREF(tag);
        return NULL;
    }
    d->f = Py_NewRef((PyObject *)s);
    d->g = Py_NewRef(g);
    d->eng = Py_NewRef(s->engine);
    d->arr = Py_NewRef(arr);
    d->local = Py_NewRef(local);
    d->utag = Py_NewRef(utag);
    d->umask = Py_NewRef(umask);
    d->sig = Py_NewRef(sig);
    d->rec = Py_NewRef(rec);
    d->tag = tag;
    d->limit = limit;
    return (PyObject *)d;
}

/* Deferred._setup(local, error, status): core/p2p.py hands over the timeouts'
 * thread-local, CollcommError and Status once, at import */
static PyObject *Deferred_setup(PyObject *unused, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyType_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "_setup(local, error, status)");
        return NULL;
    }
    Py_XSETREF(d_local, Py_NewRef(args[0]));
    Py_XSETREF(d_error, Py_NewRef(args[1]));
    Py_XSETREF(d_status, Py_NewRef(args[2]));
    Py_RETURN_NONE;
}
