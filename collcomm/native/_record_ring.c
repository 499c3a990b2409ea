/* The flight recorder's ring in C: ``Ring(size)``, the process's last ``size`` records
 * (core/recorder_ring.py makes it where the native core is built; a bounded deque on the
 * pure-Python path). Included by _shmcore.c after _record_rec.c, before _record.c.
 *
 * Python appends to it as to the deque (``append(rec)``: the oldest record is dropped
 * once it holds ``size``), reads it oldest first (``list(ring)``, ``len(ring)``,
 * ``ring.maxlen``). The C writers (_record.c, _record_p2p.c) take the next slot with
 * ``ring_claim``: the Record there is refilled in place when nothing else holds it (a
 * work waiting on it, a group's last completed call, a reader's list), else a new one
 * takes the slot. Why not the deque: taking its oldest record and appending it again were
 * two calls (~40 ns), and the record, 2,000 calls old, came from memory on the next
 * call's critical path. Here the slots are one array walked in order, and as a record is
 * claimed the record a few slots on is prefetched, so it is in the cache by its turn.
 * Everything runs holding the GIL. The ring holds records only (strings, ints, code
 * objects, lists of them): it cannot be part of a cycle, so it is not tracked either.
 */

typedef struct {
    PyObject_HEAD
    PyObject **slots;      /* size of them; NULL: not written yet */
    Py_ssize_t size;
    Py_ssize_t head;       /* the slot written next (once full, the oldest record's) */
    Py_ssize_t count;      /* records held (at most size) */
    unsigned long long refilled;   /* C records refilled in place (tests) */
} Ring;

static PyTypeObject RingType;

static int Ring_init(Ring *r, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"size", NULL};
    Py_ssize_t size;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "n", kwlist, &size))
        return -1;
    if (size < 1) {
        PyErr_SetString(PyExc_ValueError, "a ring holds at least one record");
        return -1;
    }
    if (r->slots != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Ring already initialised");
        return -1;
    }
    r->slots = PyMem_Calloc((size_t)size, sizeof(PyObject *));
    if (r->slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    r->size = size;
    r->head = r->count = 0;
    return 0;
}

static void Ring_dealloc(Ring *r)
{
    if (r->slots != NULL) {
        for (Py_ssize_t i = 0; i < r->size; i++)
            Py_CLEAR(r->slots[i]);
        PyMem_Free(r->slots);
        r->slots = NULL;
    }
    Py_TYPE(r)->tp_free((PyObject *)r);
}

static inline void ring_advance(Ring *r)
{
    r->head = r->head + 1 == r->size ? 0 : r->head + 1;
    if (r->count < r->size)
        r->count++;
}

/* `rec` (a reference, stolen) into the next slot; the record there dropped last (its
 * deallocation runs no Python code, but the ring is consistent before it runs). */
static void ring_put(Ring *r, PyObject *rec)
{
    PyObject *old = r->slots[r->head];
    r->slots[r->head] = rec;
    ring_advance(r);
    Py_XDECREF(old);
}

#define RING_AHEAD 3     /* slots past the next one whose records are fetched ahead */

/* The record RING_AHEAD slots past the next one on its way into the cache (for writing:
 * it is refilled then). Claims come in bursts (a batch_isend_irecv claims one a op, one
 * right after another), so a record is asked for a few claims before its own: the
 * nearer ones were asked for by the claims before. */
static inline void ring_prefetch(Ring *r)
{
#if defined(__GNUC__)
    Py_ssize_t at = r->head + RING_AHEAD;
    PyObject *next = r->slots[at < r->size ? at : at % r->size];
    if (next != NULL) {       /* (a Record's 112 bytes span two or three lines) */
        __builtin_prefetch(next, 1, 3);
        __builtin_prefetch((char *)next + 64, 1, 3);
        __builtin_prefetch((char *)next + sizeof(Record) - 1, 1, 3);
    }
#endif
}

/* The Record to fill as the newest: the next slot's when nothing else holds it (as it
 * was: the writer sets every field, with record_keep / record_take), else a new one put
 * there (its references NULL). A new reference (the ring holds another), or NULL with an
 * exception (the ring unchanged). */
static Record *ring_claim(Ring *r)
{
    PyObject *old = r->slots[r->head];
    Record *x;
    if (old != NULL && Py_TYPE(old) == &RecordType && Py_REFCNT(old) == 1) {
        x = (Record *)Py_NewRef(old);
        ring_advance(r);
        r->refilled++;
    } else {
        x = record_new();
        if (x == NULL)
            return NULL;
        ring_put(r, Py_NewRef((PyObject *)x));   /* (ours held first: the old one's drop
                                                    could run code that claims again) */
    }
    ring_prefetch(r);
    return x;
}

/* 1, or 0 with RuntimeError: the ring was made without __init__ (no slots) */
static int ring_ready(Ring *r)
{
    if (r->slots == NULL)
        PyErr_SetString(PyExc_RuntimeError, "Ring not initialised");
    return r->slots != NULL;
}

/* ring.append(rec): as a bounded deque's (the oldest dropped once full) */
static PyObject *Ring_append(Ring *r, PyObject *rec)
{
    if (!ring_ready(r))
        return NULL;
    ring_put(r, Py_NewRef(rec));
    Py_RETURN_NONE;
}

/* The records held, oldest first (a new list). (The count is read once: making the list
 * may run a collection, and with it another thread that appends.) */
static PyObject *ring_list(Ring *r)
{
    Py_ssize_t n = r->count;
    PyObject *out = PyList_New(n);
    if (out == NULL)
        return NULL;
    Py_ssize_t at = r->head - n;       /* (the newest n: the count never shrinks) */
    if (at < 0)
        at += r->size;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *rec = r->slots[at];
        PyList_SET_ITEM(out, i, Py_NewRef(rec != NULL ? rec : Py_None));
        at = at + 1 == r->size ? 0 : at + 1;
    }
    return out;
}

static PyObject *Ring_iter(Ring *r)
{
    if (!ring_ready(r))
        return NULL;
    PyObject *items = ring_list(r);
    PyObject *it = items == NULL ? NULL : PyObject_GetIter(items);
    Py_XDECREF(items);
    return it;
}

static Py_ssize_t Ring_length(Ring *r) { return r->count; }

static PyObject *Ring_get_maxlen(Ring *r, void *closure)
{
    return PyLong_FromSsize_t(r->size);
}

static PyMethodDef Ring_methods[] = {
    {"append", (PyCFunction)Ring_append, METH_O,
     "append(rec): the newest record (the oldest dropped once the ring is full)"},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef Ring_members[] = {
    {"refilled", T_ULONGLONG, offsetof(Ring, refilled), READONLY,
     "records C refilled in their slot (the others it wrote were made new)"},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef Ring_getset[] = {
    {"maxlen", (getter)Ring_get_maxlen, NULL, "the records it holds at most", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods Ring_seq = {
    .sq_length = (lenfunc)Ring_length,
};

static PyTypeObject RingType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "collcomm.native._shmcore.Ring",
    .tp_doc = "Ring(size): the flight recorder's last `size` records, read oldest first "
              "(_record_ring.c).",
    .tp_basicsize = sizeof(Ring),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Ring_init,
    .tp_dealloc = (destructor)Ring_dealloc,
    .tp_iter = (getiterfunc)Ring_iter,
    .tp_methods = Ring_methods,
    .tp_members = Ring_members,
    .tp_getset = Ring_getset,
    .tp_as_sequence = &Ring_seq,
};

static int rec_ring_module_init(PyObject *m)
{
    return add_type(m, "Ring", &RingType) < 0 ? -1 : add_type(m, "Record", &RecordType);
}
