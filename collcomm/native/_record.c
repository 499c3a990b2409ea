/* The flight recorder's records, written from C (collcomm/core/recorder.py has the ring and
 * the layout, collcomm/core/recorder_records.py the R_* indices and the states).
 *
 * Included by _shmcore.c after the records and the ring (_record_rec.c, _record_ring.c),
 * before the fast call. One ``RecWriter`` lives in each object that records calls (the
 * collectives' ``Fast``, a group's point-to-point ``P2P``): the ring's ``append`` (bound
 * once; the Ring itself when it is one), the group's observer index, collcomm's package
 * path prefix and a per-code-object cache of "this code is collcomm's own" for the walk
 * to the caller. It writes what the Python observer writes, as a ``Record`` that reads
 * the same (_record_rec.c):
 *
 * - a collective's record (``rec_collective``): what the tuple ``Observer.call`` appends
 *   reads, (observer index, tag, name, signature, id(family), caller's code, caller's
 *   instruction offset, perf_counter time);
 * - a point-to-point record (``rec_p2p``, _record_p2p.c): what the list
 *   ``Observer.p2p`` appends reads, [observer index, 0, op, 0, 0, code, offset, t0,
 *   global peer, state, t1] with state "entered" (t1 0.0) until ``rec_p2p_end`` marks it
 *   "completed" or "failed" (t1 then).
 *
 * The caller is the first frame outside collcomm (at most 8 frames up), as
 * recorder_records.caller() finds it; times are CLOCK_MONOTONIC, the clock of
 * time.perf_counter on Linux. On CPython 3.11-3.13 the walk reads the interpreter's own
 * frame records (internal/pycore_frame.h) instead of asking for frame objects: the public
 * calls make a frame object for every frame they look at (the caller's frame is a new
 * one per call), which cost ~60 ns of a ~280 ns fast barrier on 3.11, and ~0.1 us of a
 * 0.5-0.9 us small call on 3.13 (session 42: Allreduce 0.91 against 0.78 with the recorder
 * off); the code object and instruction offset found are the same. 3.12 names the frame
 * through tstate->cframe and its code f_code, 3.13 tstate->current_frame and
 * f_executable (_PyFrame_GetCode). 3.10 and 3.14+ take the public calls.
 */

#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030E0000 && !defined(Py_GIL_DISABLED)
#define REC_IFRAMES 1
#ifndef Py_BUILD_CORE
#define Py_BUILD_CORE 1
#define REC_UNDEF_BUILD_CORE
#endif
#include "internal/pycore_frame.h"
#ifdef REC_UNDEF_BUILD_CORE
#undef Py_BUILD_CORE
#undef REC_UNDEF_BUILD_CORE
#endif
#elif PY_VERSION_HEX < 0x030B0000
#include <frameobject.h>      /* 3.10: PyFrame_GetBack and the frame's fields */
#endif

typedef struct {
    PyObject *code;             /* a code object (strong reference) */
    int inside;                 /* it lies inside the collcomm package */
    int lasti;                  /* the offset last recorded for it as a caller, */
    PyObject *lasti_obj;        /* ... as an int (reused while the call site repeats) */
} CodeSeen;

#define CODE_CACHE 64

typedef struct {
    PyObject *append;           /* the recorder ring's append, or NULL: no records */
    Ring *ring;                 /* the Ring when ``append`` is a Ring's own (borrowed:
                                   ``append`` holds it): records claimed in place; else NULL:
                                   each record made new and handed to ``append`` */
    PyObject *index;            /* the observer's index (records name their group by it) */
    PyObject *pkg;              /* the package's path prefix (str) */
    int on;                     /* 0: no records (to measure what they cost) */
    CodeSeen seen[CODE_CACHE];
    PyObject *sigs[16];         /* per collective (the signature's top 4 bits): the last */
    uint64_t sig_of[16];        /* signature's int object, reused while it repeats */
} RecWriter;

static PyObject *s_rec_isend, *s_rec_irecv;

/* Set the writer up (append None: it records nothing). 0, or -1 with an exception. */
static int rec_init(RecWriter *w, PyObject *append, PyObject *index, PyObject *pkg)
{
    if (append != Py_None && !PyCallable_Check(append)) {
        PyErr_SetString(PyExc_TypeError, "the recorder's append must be callable or None");
        return -1;
    }
    if (append != Py_None && !PyUnicode_Check(pkg)) {
        PyErr_SetString(PyExc_TypeError, "the package prefix must be a str");
        return -1;
    }
    Py_XSETREF(w->append, append == Py_None ? NULL : Py_NewRef(append));
    w->ring = NULL;
    PyObject *ring = append != Py_None && PyCFunction_Check(append) ? PyCFunction_GET_SELF(append) : NULL;
    /* only where `append` is a Ring's own append (anything else is called as given) */
    if (ring != NULL && Py_TYPE(ring) == &RingType && ((Ring *)ring)->slots != NULL &&
        PyCFunction_GET_FUNCTION(append) == (PyCFunction)Ring_append)
        w->ring = (Ring *)ring;
    Py_XSETREF(w->index, Py_NewRef(index));
    Py_XSETREF(w->pkg, Py_NewRef(pkg));
    w->on = 1;
    return 0;
}

static inline int rec_on(const RecWriter *w)
{
    return w->on && w->append != NULL;
}

static int rec_traverse(RecWriter *w, visitproc visit, void *arg)
{
    Py_VISIT(w->append);
    return 0;
}

static void rec_clear(RecWriter *w)
{
    Py_CLEAR(w->append);
    w->ring = NULL;
    Py_CLEAR(w->index);
    Py_CLEAR(w->pkg);
    for (int i = 0; i < CODE_CACHE; i++) {
        Py_CLEAR(w->seen[i].code);
        Py_CLEAR(w->seen[i].lasti_obj);
    }
    for (int i = 0; i < 16; i++)
        Py_CLEAR(w->sigs[i]);
}

/* The signature as an int (new reference; NULL with an exception): a call repeats its
 * collective's last signature most of the time, and ints are immutable. */
static PyObject *rec_sig(RecWriter *w, uint64_t sig)
{
    int k = (int)(sig >> 60);
    if (w->sigs[k] == NULL || w->sig_of[k] != sig) {
        PyObject *o = PyLong_FromUnsignedLongLong(sig);
        if (o == NULL)
            return NULL;
        Py_XSETREF(w->sigs[k], o);
        w->sig_of[k] = sig;
    }
    return Py_NewRef(w->sigs[k]);
}

/* Is `code` collcomm's own (cached per code object)? */
static int rec_inside(RecWriter *w, PyCodeObject *code)
{
    CodeSeen *c = &w->seen[((uintptr_t)code >> 4) % CODE_CACHE];
    if (c->code == (PyObject *)code)
        return c->inside;
    int inside = PyUnicode_Tailmatch(code->co_filename, w->pkg, 0, PY_SSIZE_T_MAX, -1) == 1;
    Py_INCREF(code);
    Py_XSETREF(c->code, (PyObject *)code);
    Py_CLEAR(c->lasti_obj);
    c->inside = inside;
    return inside;
}

/* The caller's instruction offset as an int (new reference; NULL with an exception),
 * the one made last time when `code` called from the same place */
static PyObject *rec_lasti(RecWriter *w, PyCodeObject *code, int lasti)
{
    CodeSeen *c = &w->seen[((uintptr_t)code >> 4) % CODE_CACHE];
    if (code == NULL || c->code != (PyObject *)code)
        return PyLong_FromLong(lasti);
    if (c->lasti_obj == NULL || c->lasti != lasti) {
        PyObject *o = PyLong_FromLong(lasti);
        if (o == NULL)
            return NULL;
        Py_XSETREF(c->lasti_obj, o);
        c->lasti = lasti;
    }
    return Py_NewRef(c->lasti_obj);
}

/* The caller's code object (new reference; NULL, no exception: no Python frame) and its
 * instruction offset: the first frame outside collcomm, at most 8 frames up. */
#ifdef REC_IFRAMES
/* `f` or the first complete frame below it (PyFrame_GetBack / PyEval_GetFrame skip the
 * incomplete ones, frames whose first instruction has not run) */
static inline _PyInterpreterFrame *rec_complete(_PyInterpreterFrame *f)
{
    while (f != NULL && _PyFrame_IsIncomplete(f))
        f = f->previous;
    return f;
}

#if PY_VERSION_HEX >= 0x030D0000
#define REC_NEWEST(ts) ((ts)->current_frame)
#define REC_CODE(f) _PyFrame_GetCode(f)
#else
#define REC_NEWEST(ts) ((ts)->cframe->current_frame)
#define REC_CODE(f) ((f)->f_code)
#endif

static PyCodeObject *rec_caller(RecWriter *w, int *lasti)
{
    _PyInterpreterFrame *f = rec_complete(REC_NEWEST(PyThreadState_Get()));
    *lasti = 0;
    if (f == NULL)
        return NULL;
    for (int i = 0; i < 8; i++) {
        if (!rec_inside(w, REC_CODE(f)))
            break;
        _PyInterpreterFrame *back = rec_complete(f->previous);
        if (back == NULL)
            break;
        f = back;
    }
    int at = _PyInterpreterFrame_LASTI(f);        /* PyFrame_GetLasti's value */
    *lasti = at < 0 ? -1 : at * (int)sizeof(_Py_CODEUNIT);
    return (PyCodeObject *)Py_NewRef(REC_CODE(f));
}
#else
static PyCodeObject *rec_caller(RecWriter *w, int *lasti)
{
    PyFrameObject *f = PyEval_GetFrame();
    Py_XINCREF(f);
    PyCodeObject *code = NULL;
    *lasti = 0;
    for (int i = 0; f != NULL && i < 8; i++) {
        code = PyFrame_GetCode(f);
        if (!rec_inside(w, code))
            break;
        PyFrameObject *back = PyFrame_GetBack(f);
        if (back == NULL)
            break;
        Py_DECREF(code);
        code = NULL;
        Py_DECREF(f);
        f = back;
    }
    if (f != NULL) {
        if (code == NULL)
            code = PyFrame_GetCode(f);
#if PY_VERSION_HEX >= 0x030B0000
        *lasti = PyFrame_GetLasti(f);
#else
        *lasti = f->f_lasti * 2;
#endif
        Py_DECREF(f);
    }
    return code;
}
#endif

/* The newest record, to fill (every field: a refilled one holds its last values):
 * claimed from the Ring (the oldest refilled in place where nothing else holds it:
 * _record_ring.c); where the ring is another object, a new one (*hand set: hand it to
 * `append` once filled, rec_hand). A new reference, or NULL with an exception. */
static Record *rec_claim(RecWriter *w, int *hand)
{
    *hand = w->ring == NULL;
    return *hand ? record_new() : ring_claim(w->ring);
}

/* A record rec_claim made new, filled, handed to the ring's `append`: 0, or -1 with an
 * exception. */
static int rec_hand(RecWriter *w, Record *r)
{
    PyObject *x = PyObject_CallOneArg(w->append, (PyObject *)r);
    Py_XDECREF(x);
    return x == NULL ? -1 : 0;
}

/* A collective's record (reads as Observer.call's tuple: index, tag, name, signature,
 * algorithm, the caller's code and offset, t0), the caller's time now, the newest in the
 * ring. A new reference, or NULL with an exception. */
static PyObject *rec_collective(RecWriter *w, PyObject *tag, PyObject *name, uint64_t sig,
                                PyObject *algo_id)
{
    double t0 = rec_now();
    int lasti, hand = 0;
    PyCodeObject *code = rec_caller(w, &lasti);
    PyObject *sigobj = rec_sig(w, sig), *lastio = rec_lasti(w, code, lasti);
    unsigned long long seq = PyLong_AsUnsignedLongLongMask(tag);
    int bad = sigobj == NULL || lastio == NULL || (seq == (unsigned long long)-1 && PyErr_Occurred());
    Record *r = bad ? NULL : rec_claim(w, &hand);
    if (r == NULL) {
        Py_XDECREF(code);
        Py_XDECREF(sigobj);
        Py_XDECREF(lastio);
        return NULL;
    }
    r->kind = REC_COLLECTIVE;
    record_keep(&r->index, w->index);
    r->seq = seq;
    record_keep(&r->op, name);
    record_take(&r->sig, sigobj);
    record_keep(&r->algo, algo_id);
    record_take(&r->code, code == NULL ? Py_NewRef(Py_None) : (PyObject *)code);
    record_take(&r->lasti, lastio);
    r->t0 = t0;
    r->t1 = 0.0;
    r->peer = 0;
    r->state = 0;
    if (hand && rec_hand(w, r) < 0) {
        Py_DECREF(r);
        return NULL;
    }
    return (PyObject *)r;
}

static int rec_module_init(void)
{
    struct { PyObject **slot; const char *name; } names[] = {
        {&s_rec_entered, "entered"}, {&s_rec_completed, "completed"}, {&s_rec_failed, "failed"},
        {&s_rec_isend, "isend"}, {&s_rec_irecv, "irecv"},
    };
    rec_clock_init();
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if ((*names[i].slot = PyUnicode_InternFromString(names[i].name)) == NULL)
            return -1;
    return 0;
}
