/* The flight recorder's records made in C: ``Record``, a small object that reads as the
 * tuple ``Observer.call`` appends for a collective or the list ``Observer.p2p`` appends for
 * a point-to-point call (core/recorder.py; the R_* indices of core/recorder_records.py).
 * Included by _shmcore.c after _cmethod.c, before the ring (_record_ring.c) that holds
 * them and the writers (_record.c, _record_p2p.c).
 *
 * - a collective's (``kind`` REC_COLLECTIVE): 8 items, (observer index, tag, name,
 *   signature, id(family), caller's code, its offset, t0), read-only;
 * - a point-to-point call's (REC_P2P): 11 items, [observer index, 0, op, 0, 0, code,
 *   offset, t0, global peer, state, t1]; ``rec[R_PSTATE] = state`` (one of "entered",
 *   "completed", "failed") and ``rec[R_PT1] = t1`` (a number) as core/p2p.py ``finished``
 *   sets them; any other item is read-only.
 *
 * Why not the tuple or the list: they hold a float of their own (t0, and t1) and, for a
 * collective, the call's tag, each made per call and freed when the ring drops the record
 * 2,000 calls later, cold by then; their items are references to drop and take again.
 * Here the times, the tag, the peer and the state are C fields, so a record is one object
 * the ring refills in place (_record_ring.c ring_claim) and an end writes two fields.
 * It reads as the tuple or list does: ``len()``, ``rec[i]`` (negative too; numbers made on
 * demand), iteration, ``repr``. It holds strings, ints and a code object: no cycle, so
 * the collector never tracks it. Two records are equal only when they are the same
 * object (the recorder keys failures by identity; nothing compares records by value).
 */

#define REC_COLLECTIVE 0
#define REC_P2P 1
#define REC_COLL_ITEMS 8
#define REC_P2P_ITEMS 11
#define REC_STATE 9       /* recorder_records.R_PSTATE */
#define REC_T1 10         /* recorder_records.R_PT1 */

typedef struct {
    PyObject_HEAD
    PyObject *index, *op, *code, *lasti;    /* strong references (code: None or a code) */
    PyObject *sig, *algo;                   /* a collective's (strong references), else NULL */
    unsigned long long seq;                 /* a collective's tag */
    double t0, t1;
    long peer;
    int state;                              /* 0 entered, 1 completed, 2 failed */
    int kind;                               /* REC_COLLECTIVE or REC_P2P */
} Record;

static PyTypeObject RecordType;
static PyObject *s_rec_entered, *s_rec_completed, *s_rec_failed;

static PyObject *record_state_name(int state)
{
    return state == 1 ? s_rec_completed : state == 2 ? s_rec_failed : s_rec_entered;
}

static inline Py_ssize_t record_items(const Record *r)
{
    return r->kind == REC_P2P ? REC_P2P_ITEMS : REC_COLL_ITEMS;
}

static PyObject *ref_or_zero(PyObject *o)
{
    return o != NULL ? Py_NewRef(o) : PyLong_FromLong(0);
}

static PyObject *Record_item(Record *r, Py_ssize_t i)
{
    Py_ssize_t n = record_items(r);
    if (i < 0)
        i += n;
    if (i < 0 || i >= n) {
        PyErr_SetString(PyExc_IndexError, "record index out of range");
        return NULL;
    }
    switch (i) {
    case 0: return Py_NewRef(r->index ? r->index : Py_None);
    case 1: return r->kind == REC_P2P ? PyLong_FromLong(0) : PyLong_FromUnsignedLongLong(r->seq);
    case 2: return Py_NewRef(r->op ? r->op : Py_None);
    case 3: return ref_or_zero(r->sig);
    case 4: return ref_or_zero(r->algo);
    case 5: return Py_NewRef(r->code ? r->code : Py_None);
    case 6: return Py_NewRef(r->lasti ? r->lasti : Py_None);
    case 7: return PyFloat_FromDouble(r->t0);
    case 8: return PyLong_FromLong(r->peer);
    case REC_STATE: return Py_NewRef(record_state_name(r->state));
    default: return PyFloat_FromDouble(r->t1);
    }
}

static Py_ssize_t Record_length(Record *r) { return record_items(r); }

/* sq_item: PySequence_GetItem has added the length to a negative index already */
static PyObject *Record_sq_item(Record *r, Py_ssize_t i)
{
    if (i < 0) {
        PyErr_SetString(PyExc_IndexError, "record index out of range");
        return NULL;
    }
    return Record_item(r, i);
}

static PyObject *Record_subscript(Record *r, PyObject *key)
{
    Py_ssize_t i = PyNumber_AsSsize_t(key, PyExc_IndexError);
    if (i == -1 && PyErr_Occurred())
        return NULL;
    return Record_item(r, i);
}

/* A point-to-point record's rec[R_PSTATE] = "entered" | "completed" | "failed" and
 * rec[R_PT1] = a number; everything else is read-only */
static int Record_ass_subscript(Record *r, PyObject *key, PyObject *value)
{
    Py_ssize_t i = PyNumber_AsSsize_t(key, PyExc_IndexError);
    if (i == -1 && PyErr_Occurred())
        return -1;
    Py_ssize_t n = record_items(r);
    if (i < 0)
        i += n;
    if (i < 0 || i >= n) {
        PyErr_SetString(PyExc_IndexError, "record assignment index out of range");
        return -1;
    }
    if (r->kind == REC_P2P && value != NULL && i == REC_STATE && PyUnicode_Check(value)) {
        for (int s = 0; s < 3; s++)
            if (PyUnicode_Compare(value, record_state_name(s)) == 0) {
                r->state = s;
                return 0;
            }
        PyErr_Format(PyExc_ValueError, "a point-to-point record's state is entered, completed "
                     "or failed, not %R", value);
        return -1;
    }
    if (r->kind == REC_P2P && value != NULL && i == REC_T1) {
        double t1 = PyFloat_AsDouble(value);
        if (t1 == -1.0 && PyErr_Occurred())
            return -1;
        r->t1 = t1;
        return 0;
    }
    PyErr_SetString(PyExc_TypeError,
                    r->kind != REC_P2P ? "a collective's record is read-only"
                    : i == REC_STATE ? "a point-to-point record's state is a str"
                    : "a point-to-point record's items are read-only but its state and end time");
    return -1;
}

/* repr: the tuple's (a collective) or the list's (point to point) */
static PyObject *Record_repr(Record *r)
{
    PyObject *items = r->kind == REC_P2P ? PySequence_List((PyObject *)r)
                                         : PySequence_Tuple((PyObject *)r);
    PyObject *s = items == NULL ? NULL : PyObject_Repr(items);
    Py_XDECREF(items);
    return s;
}

static void record_clear_refs(Record *r)
{
    Py_CLEAR(r->index);
    Py_CLEAR(r->op);
    Py_CLEAR(r->code);
    Py_CLEAR(r->lasti);
    Py_CLEAR(r->sig);
    Py_CLEAR(r->algo);
}

/* *slot = v (a borrowed reference; NULL: none), the reference counts touched only where
 * it changes: a ring slot's record is mostly refilled with the objects it held (the same
 * op, caller, offset, group at the same point of a loop) */
static inline void record_keep(PyObject **slot, PyObject *v)
{
    if (*slot != v) {
        PyObject *old = *slot;
        *slot = Py_XNewRef(v);
        Py_XDECREF(old);
    }
}

/* *slot = v, a reference the caller hands over (dropped at once where it is held already) */
static inline void record_take(PyObject **slot, PyObject *v)
{
    PyObject *old = *slot;
    *slot = v;
    Py_XDECREF(old);
}

static void Record_dealloc(Record *r)
{
    record_clear_refs(r);
    Py_TYPE(r)->tp_free((PyObject *)r);
}

/* A new empty record (a new reference), or NULL with an exception. */
static Record *record_new(void)
{
    Record *r = PyObject_New(Record, &RecordType);
    if (r != NULL) {
        r->index = r->op = r->code = r->lasti = r->sig = r->algo = NULL;
        r->seq = 0;
        r->t0 = r->t1 = 0.0;
        r->peer = 0;
        r->state = 0;
        r->kind = REC_COLLECTIVE;
    }
    return r;
}

static PySequenceMethods Record_seq = {
    .sq_length = (lenfunc)Record_length,
    .sq_item = (ssizeargfunc)Record_sq_item,
};

static PyMappingMethods Record_map = {
    .mp_length = (lenfunc)Record_length,
    .mp_subscript = (binaryfunc)Record_subscript,
    .mp_ass_subscript = (objobjargproc)Record_ass_subscript,
};

static PyTypeObject RecordType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "collcomm.native._shmcore.Record",
    .tp_doc = "A flight-recorder record made in C; reads as Observer.call's tuple (a collective) "
              "or Observer.p2p's list (point to point) (_record_rec.c).",
    .tp_basicsize = sizeof(Record),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = (destructor)Record_dealloc,
    .tp_repr = (reprfunc)Record_repr,
    .tp_as_sequence = &Record_seq,
    .tp_as_mapping = &Record_map,
};
