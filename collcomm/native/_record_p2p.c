/* The flight recorder's point-to-point records made in C: a ``Record`` of kind REC_P2P
 * (_record_rec.c) that reads as the 11-item list ``Observer.p2p`` appends
 * (core/recorder.py; the R_* indices of core/recorder_records.py): [observer index, 0,
 * op, 0, 0, caller's code, its offset, t0, global peer, state, t1]. Included by
 * _shmcore.c after _record.c.
 *
 * Why not that list: a list record holds two floats of its own and eleven items, so the
 * ring's eviction of its 2,000th record back (cold by then) and the next record's making
 * cost ~280-330 cycles a record, and its end ~150-200 (a new float); two records a
 * batch_isend_irecv of two ops came to ~0.5-0.8 µs of a 2.3-3 µs exchange (BENCHMARKS.md,
 * session 24). As a Record the times, the peer and the state are C fields: its end writes
 * two fields, and the ring refills its oldest record in place (_record_ring.c).
 */

/* Is `rec` a point-to-point record C can end (a Record of kind REC_P2P, or a list of 11 items)? */
static int rec_is_p2p(PyObject *rec)
{
    return rec != NULL && ((Py_TYPE(rec) == &RecordType && ((Record *)rec)->kind == REC_P2P) ||
                           (PyList_CheckExact(rec) && PyList_GET_SIZE(rec) == REC_P2P_ITEMS));
}

/* Is `rec` (rec_is_p2p) still "entered"? */
static int rec_p2p_entered(PyObject *rec)
{
    if (Py_TYPE(rec) == &RecordType)
        return ((Record *)rec)->state == 0;
    PyObject *state = PyList_GET_ITEM(rec, REC_STATE);
    return state == s_rec_entered ||        /* (two strs: the compare cannot fail) */
           (PyUnicode_Check(state) && PyUnicode_Compare(state, s_rec_entered) == 0);
}

/* Where and since when the calls of one Python call are recorded: its caller outside
 * collcomm (code, offset: rec_caller, rec_lasti) and its start. A batch's records share
 * it, so the frames are walked once a batch, not once an op. */
typedef struct {
    double t0;
    PyObject *code, *lasti;      /* strong references (NULL: none taken yet) */
} RecAt;

/* The caller into `at`, started at t0 (released with rec_at_release, either way): 0, or
 * -1 with an exception. */
static int rec_at_caller(RecWriter *w, RecAt *at, double t0)
{
    int lasti;
    PyCodeObject *code = rec_caller(w, &lasti);         /* (a new reference, or NULL) */
    at->lasti = rec_lasti(w, code, lasti);
    at->code = code == NULL ? Py_NewRef(Py_None) : (PyObject *)code;
    at->t0 = t0;
    return at->lasti == NULL ? -1 : 0;
}

static void rec_at_release(RecAt *at)
{
    Py_CLEAR(at->code);
    Py_CLEAR(at->lasti);
}

/* A point-to-point record of `op` with global rank `peer`, in `state` (s_rec_*) since
 * at->t0, called from at's caller, ended at t1 (0.0 while entered), the newest in the
 * ring (rec_claim: the oldest refilled in place where nothing else holds it). A new
 * reference, or NULL with an exception. */
static PyObject *rec_p2p_at(RecWriter *w, PyObject *op, long peer, PyObject *state,
                            const RecAt *at, double t1)
{
    int hand;
    Record *r = rec_claim(w, &hand);
    if (r == NULL)
        return NULL;
    r->kind = REC_P2P;
    record_keep(&r->lasti, at->lasti);
    record_keep(&r->code, at->code);
    record_keep(&r->index, w->index);
    record_keep(&r->op, op);
    record_keep(&r->sig, NULL);
    record_keep(&r->algo, NULL);
    r->seq = 0;
    r->t0 = at->t0;
    r->t1 = t1;
    r->peer = peer;
    r->state = state == s_rec_completed ? 1 : state == s_rec_failed ? 2 : 0;
    if (hand && rec_hand(w, r) < 0) {
        Py_DECREF(r);
        return NULL;
    }
    return (PyObject *)r;
}

/* rec_p2p_at for one op of a call started at t0, its caller found here. */
static PyObject *rec_p2p(RecWriter *w, PyObject *op, long peer, PyObject *state, double t0,
                         double t1)
{
    RecAt at;
    PyObject *r = rec_at_caller(w, &at, t0) < 0 ? NULL : rec_p2p_at(w, op, peer, state, &at, t1);
    rec_at_release(&at);
    return r;
}

/* Mark a point-to-point record completed (ok) or failed, ended now (anything else, None
 * or NULL: nothing); keeps a pending exception. */
static void rec_p2p_end(PyObject *rec, int ok)
{
    if (rec != NULL && Py_TYPE(rec) == &RecordType && ((Record *)rec)->kind == REC_P2P) {
        Record *r = (Record *)rec;
        r->state = ok ? 1 : 2;
        r->t1 = rec_now();
        return;
    }
    if (!rec_is_p2p(rec))
        return;
    PyObject *t = NULL, *v = NULL, *tb = NULL;
    int pending = PyErr_Occurred() != NULL;
    if (pending)                  /* (the common case has none: no fetch and restore) */
        PyErr_Fetch(&t, &v, &tb);
    PyObject *t1 = PyFloat_FromDouble(rec_now());
    if (t1 != NULL) {
        PyObject *state = PyList_GET_ITEM(rec, REC_STATE), *old = PyList_GET_ITEM(rec, REC_T1);
        PyList_SET_ITEM(rec, REC_STATE, Py_NewRef(ok ? s_rec_completed : s_rec_failed));
        PyList_SET_ITEM(rec, REC_T1, t1);
        Py_XDECREF(state);
        Py_XDECREF(old);
    }
    PyErr_Clear();
    if (pending)
        PyErr_Restore(t, v, tb);
}

static int rec_p2p_module_init(PyObject *m)
{
    return rec_ring_module_init(m);
}
