/* The flight recorder's point-to-point records made in C: ``P2PRec``, a small object that
 * reads as the 11-item list ``Observer.p2p`` appends (core/recorder.py; the R_* indices of
 * core/recorder_records.py): [observer index, 0, op, 0, 0, caller's code, its offset, t0,
 * global peer, state, t1]. Included by _shmcore.c after _record.c.
 *
 * Why not that list: a list record holds two floats of its own and eleven items, so the
 * ring's eviction of its 2,000th record back (cold by then) and the next record's making
 * cost ~280-330 cycles a record, and its end ~150-200 (a new float); two records a
 * batch_isend_irecv of two ops came to ~0.5-0.8 µs of a 2.3-3 µs exchange (BENCHMARKS.md,
 * session 24). Here the times, the peer and the state are C fields: a record is one
 * object, its end writes two fields, and the oldest record is reused in place.
 *
 * It reads like the list: ``len()`` 11, ``rec[i]`` (negative too; the numbers made on
 * demand), iteration, ``repr`` the list's; ``rec[R_PSTATE] = state`` (one of "entered",
 * "completed", "failed") and ``rec[R_PT1] = t1`` (a number) as core/p2p.py ``finished``
 * sets them; any other item is read-only. It holds strings, an int and a code object: no
 * cycle, so the collector never tracks it.
 */

#define P2PREC_ITEMS 11
#define P2PREC_STATE 9       /* recorder_records.R_PSTATE */
#define P2PREC_T1 10         /* recorder_records.R_PT1 */

typedef struct {
    PyObject_HEAD
    PyObject *index, *op, *code, *lasti;    /* strong references (code: None or a code) */
    double t0, t1;
    long peer;
    int state;                               /* 0 entered, 1 completed, 2 failed */
} P2PRec;

static PyTypeObject P2PRecType;

static PyObject *p2prec_state_name(int state)
{
    return state == 1 ? s_rec_completed : state == 2 ? s_rec_failed : s_rec_entered;
}

static PyObject *P2PRec_item(P2PRec *r, Py_ssize_t i)
{
    if (i < 0)
        i += P2PREC_ITEMS;
    switch (i) {
    case 0: return Py_NewRef(r->index ? r->index : Py_None);
    case 1: case 3: case 4: return PyLong_FromLong(0);
    case 2: return Py_NewRef(r->op ? r->op : Py_None);
    case 5: return Py_NewRef(r->code ? r->code : Py_None);
    case 6: return Py_NewRef(r->lasti ? r->lasti : Py_None);
    case 7: return PyFloat_FromDouble(r->t0);
    case 8: return PyLong_FromLong(r->peer);
    case P2PREC_STATE: return Py_NewRef(p2prec_state_name(r->state));
    case P2PREC_T1: return PyFloat_FromDouble(r->t1);
    default:
        PyErr_SetString(PyExc_IndexError, "record index out of range");
        return NULL;
    }
}

static Py_ssize_t P2PRec_length(P2PRec *r) { return P2PREC_ITEMS; }

/* sq_item: PySequence_GetItem has added the length to a negative index already */
static PyObject *P2PRec_sq_item(P2PRec *r, Py_ssize_t i)
{
    if (i < 0) {
        PyErr_SetString(PyExc_IndexError, "record index out of range");
        return NULL;
    }
    return P2PRec_item(r, i);
}

static PyObject *P2PRec_subscript(P2PRec *r, PyObject *key)
{
    Py_ssize_t i = PyNumber_AsSsize_t(key, PyExc_IndexError);
    if (i == -1 && PyErr_Occurred())
        return NULL;
    return P2PRec_item(r, i);
}

/* rec[R_PSTATE] = "entered" | "completed" | "failed"; rec[R_PT1] = a number */
static int P2PRec_ass_subscript(P2PRec *r, PyObject *key, PyObject *value)
{
    Py_ssize_t i = PyNumber_AsSsize_t(key, PyExc_IndexError);
    if (i == -1 && PyErr_Occurred())
        return -1;
    if (i < 0)
        i += P2PREC_ITEMS;
    if (i < 0 || i >= P2PREC_ITEMS) {
        PyErr_SetString(PyExc_IndexError, "record assignment index out of range");
        return -1;
    }
    if (value != NULL && i == P2PREC_STATE && PyUnicode_Check(value)) {
        for (int s = 0; s < 3; s++)
            if (PyUnicode_Compare(value, p2prec_state_name(s)) == 0) {
                r->state = s;
                return 0;
            }
        PyErr_Format(PyExc_ValueError, "a point-to-point record's state is entered, completed "
                     "or failed, not %R", value);
        return -1;
    }
    if (value != NULL && i == P2PREC_T1) {
        double t1 = PyFloat_AsDouble(value);
        if (t1 == -1.0 && PyErr_Occurred())
            return -1;
        r->t1 = t1;
        return 0;
    }
    PyErr_SetString(PyExc_TypeError, i == P2PREC_STATE ? "a point-to-point record's state is a str"
                    : "a point-to-point record's items are read-only but its state and end time");
    return -1;
}

static PyObject *P2PRec_repr(P2PRec *r)
{
    PyObject *lst = PySequence_List((PyObject *)r);
    PyObject *s = lst == NULL ? NULL : PyObject_Repr(lst);
    Py_XDECREF(lst);
    return s;
}

static void P2PRec_clear_refs(P2PRec *r)
{
    Py_CLEAR(r->index);
    Py_CLEAR(r->op);
    Py_CLEAR(r->code);
    Py_CLEAR(r->lasti);
}

static void P2PRec_dealloc(P2PRec *r)
{
    P2PRec_clear_refs(r);
    Py_TYPE(r)->tp_free((PyObject *)r);
}

static PySequenceMethods P2PRec_seq = {
    .sq_length = (lenfunc)P2PRec_length,
    .sq_item = (ssizeargfunc)P2PRec_sq_item,
};

static PyMappingMethods P2PRec_map = {
    .mp_length = (lenfunc)P2PRec_length,
    .mp_subscript = (binaryfunc)P2PRec_subscript,
    .mp_ass_subscript = (objobjargproc)P2PRec_ass_subscript,
};

static PyTypeObject P2PRecType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "collcomm.native._shmcore.P2PRec",
    .tp_doc = "A point-to-point flight-recorder record made in C; reads as Observer.p2p's "
              "list (_record_p2p.c).",
    .tp_basicsize = sizeof(P2PRec),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = (destructor)P2PRec_dealloc,
    .tp_repr = (reprfunc)P2PRec_repr,
    .tp_as_sequence = &P2PRec_seq,
    .tp_as_mapping = &P2PRec_map,
};

/* Is `rec` a point-to-point record C can end (a P2PRec, or a list of 11 items)? */
static int rec_is_p2p(PyObject *rec)
{
    return rec != NULL && (Py_TYPE(rec) == &P2PRecType ||
                           (PyList_CheckExact(rec) && PyList_GET_SIZE(rec) == P2PREC_ITEMS));
}

/* Is `rec` (rec_is_p2p) still "entered"? */
static int rec_p2p_entered(PyObject *rec)
{
    if (Py_TYPE(rec) == &P2PRecType)
        return ((P2PRec *)rec)->state == 0;
    PyObject *state = PyList_GET_ITEM(rec, P2PREC_STATE);
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
 * at->t0, called from at's caller, ended at t1 (0.0 while entered), appended to the ring:
 * the oldest record reused in place where the full ring's is a P2PRec nothing else holds.
 * A new reference, or NULL with an exception. */
static PyObject *rec_p2p_at(RecWriter *w, PyObject *op, long peer, PyObject *state,
                            const RecAt *at, double t1)
{
    PyObject *old = rec_take_oldest(w);
    P2PRec *r = NULL;
    if (old != NULL && Py_TYPE(old) == &P2PRecType && Py_REFCNT(old) == 1) {
        r = (P2PRec *)old;
        P2PRec_clear_refs(r);
    } else {
        Py_XDECREF(old);          /* (evicted, as the append would have) */
        r = PyObject_New(P2PRec, &P2PRecType);
        if (r == NULL)
            return NULL;
        r->index = r->op = r->code = r->lasti = NULL;
    }
    r->lasti = Py_NewRef(at->lasti);
    r->code = Py_NewRef(at->code);
    r->index = Py_NewRef(w->index);
    r->op = Py_NewRef(op);
    r->t0 = at->t0;
    r->t1 = t1;
    r->peer = peer;
    r->state = state == s_rec_completed ? 1 : state == s_rec_failed ? 2 : 0;
    if (rec_append(w, (PyObject *)r) < 0) {
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
    if (rec != NULL && Py_TYPE(rec) == &P2PRecType) {
        P2PRec *r = (P2PRec *)rec;
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
        PyObject *state = PyList_GET_ITEM(rec, P2PREC_STATE), *old = PyList_GET_ITEM(rec, P2PREC_T1);
        PyList_SET_ITEM(rec, P2PREC_STATE, Py_NewRef(ok ? s_rec_completed : s_rec_failed));
        PyList_SET_ITEM(rec, P2PREC_T1, t1);
        Py_XDECREF(state);
        Py_XDECREF(old);
    }
    PyErr_Clear();
    if (pending)
        PyErr_Restore(t, v, tb);
}

static int rec_p2p_module_init(PyObject *m)
{
    return add_type(m, "P2PRec", &P2PRecType);
}
