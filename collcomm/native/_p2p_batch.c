/* P2P.batch: the functional API's batch_isend_irecv in one call (included by _p2p_type.c
 * after _p2p_calls.c, whose p2p_write and helpers it uses, _p2p_lend.c: lend_write, and
 * _p2p_lent.c: the Lent work, loan_end_unwaited).
 *
 * ``batch(ops, p2pop, irecv, ndarray, sigs, sent, received, g, record, lent)``: ``ops`` a list
 * or tuple of ``p2pop`` (collcomm.P2POp) on the world group of this P2P (``group`` and
 * ``group_peer`` None), each a peer of this host other than this rank (a Pipe), an int
 * tag within the user tag space, an exact ``ndarray`` whose dtype ``sigs`` (signature._P2P)
 * knows and whose buffer is C-contiguous numeric (writable to receive): every op is
 * checked before anything is done, and any other batch gives None having done nothing
 * (the Python path then checks and starts it op by op, raising what it raises). The
 * engine must be open with no peer lost (else None, the same way).
 *
 * Then in order: a send (``op`` not ``irecv``) is written to its ring as P2P.send writes
 * it, its work a ``sent`` (api_p2p_work.SentWork: its slots ``_group``, ``_peer``, ``_rec``,
 * ``_ok`` set here, no __init__ run), or, of ``lend_from`` bytes or more to a rank that takes
 * loans, lent as P2P.lend lends (written as a plain send where it cannot lend now), its
 * work of class ``lent`` (api_p2p_work.LentWork: a subclass of the C Lent, made without its
 * __init__ by lent_make; any other class called as ``lent(p2p, g, local, loan, arr,
 * rec)``); a receive becomes a
 * ``received`` (a subclass of the C
 * Deferred, made here as core/p2p.py Deferred.__init__ makes it: its wait receives) and
 * joins the engine's ``_deferred`` line, as core/p2p.py ``defer`` does. ``rec``: the
 * flight recorder's "entered" record (``record`` True) as P2P.note makes it, the batch's
 * records sharing one start and one caller (found once: RecAt, _record_p2p.c). Returns the
 * works of the ops done: all of them, or those before the first send C could not write
 * (full ring, busy lock, closed channel: the caller starts the rest op by op).
 */

static PyObject *s_b_op, *s_b_tensor, *s_b_peer, *s_b_group, *s_b_tag, *s_b_group_peer,
    *s_b_dtype, *s_b_wgroup, *s_b_wpeer, *s_b_wrec, *s_b_wok;
static PyObject *b_user_mask;     /* P2P_USER as an int: an exact receive's user tag mask */

static int batch_names(void)
{
    struct { PyObject **slot; const char *name; } names[] = {
        {&s_b_op, "op"}, {&s_b_tensor, "tensor"}, {&s_b_peer, "peer"}, {&s_b_group, "group"},
        {&s_b_tag, "tag"}, {&s_b_group_peer, "group_peer"}, {&s_b_dtype, "dtype"},
        {&s_b_wgroup, "_group"}, {&s_b_wpeer, "_peer"},
        {&s_b_wrec, "_rec"}, {&s_b_wok, "_ok"},
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if ((*names[i].slot = PyUnicode_InternFromString(names[i].name)) == NULL)
            return -1;
    return (b_user_mask = PyLong_FromUnsignedLongLong(P2P_USER)) == NULL ? -1 : 0;
}

#define BATCH_MAX 64          /* longer batches take the Python path */

typedef struct {
    PyObject *arr, *sig, *tag;    /* strong references */
    Pipe *pipe;                   /* borrowed from s->pipes */
    uint64_t wire_tag, wire_sig;
    long local;
    int recv, has_buf;
    Py_buffer buf;
} BatchOp;

static SlotsOf b_op_slots;     /* P2POp's six fields (slots_of, _p2p.c) */

/* Check one op's values (a P2POp's fields, or isend's / irecv's arguments on the world
 * group): 1 if C takes it (o filled), 0 if not (no exception). */
static int batch_values(P2P *s, int recv, PyObject *arr, PyObject *peer, PyObject *tag,
                        PyObject *ndarray, PyObject *sigs, BatchOp *o)
{
    int fit = Py_TYPE(arr) == (PyTypeObject *)ndarray && PyLong_CheckExact(peer) &&
              PyLong_CheckExact(tag);
    if (fit) {
        o->recv = recv;
        o->pipe = p2p_pipe(s, peer);
        o->local = o->pipe == NULL ? -1 : PyLong_AsLong(peer);
        fit = o->pipe != NULL && p2p_tag(s, tag) != 0 && (o->recv ? o->pipe->has_in : o->pipe->has_out);
    }
    PyObject *dtype = fit ? nd_dtype(arr, s_b_dtype) : NULL;
    PyObject *sig = dtype == NULL ? NULL : PyDict_GetItemWithError(sigs, dtype);
    Py_XDECREF(dtype);
    if (sig != NULL && PyLong_Check(sig)) {
        o->wire_tag = p2p_tag(s, tag);
        o->wire_sig = p2p_u64(sig);
    }
    fit = sig != NULL && PyLong_Check(sig) && !PyErr_Occurred() &&
          p2p_buffer(arr, &o->buf, o->recv) == 0;
    if (fit) {
        o->has_buf = 1;
        o->arr = Py_NewRef(arr);
        o->sig = Py_NewRef(sig);
        o->tag = Py_NewRef(tag);
    }
    PyErr_Clear();           /* anything odd: the Python path checks it and raises */
    return fit;
}

/* Check op p (a P2POp): 1 if C takes it (o filled), 0 if not (no exception). */
static int batch_check(P2P *s, PyObject *p, PyObject *irecv, PyObject *ndarray, PyObject *sigs,
                       BatchOp *o)
{
    PyObject *names[6] = {s_b_op, s_b_tensor, s_b_peer, s_b_group, s_b_tag, s_b_group_peer};
    PyObject *v[6] = {NULL, NULL, NULL, NULL, NULL, NULL};
    int fit = 1;
    if (slots_of(&b_op_slots, Py_TYPE(p), names, 6)) {    /* P2POp's __slots__, read here */
        for (int i = 0; i < 6 && fit; i++)
            fit = (v[i] = Py_XNewRef(SLOT_AT(p, b_op_slots.at[i]))) != NULL;
    } else {
        for (int i = 0; i < 6 && fit; i++)
            fit = (v[i] = PyObject_GetAttr(p, names[i])) != NULL;
    }
    fit = fit && v[3] == Py_None && v[5] == Py_None &&
          batch_values(s, v[0] == irecv, v[1], v[2], v[4], ndarray, sigs, o);
    PyErr_Clear();
    for (int i = 0; i < 6; i++)
        Py_XDECREF(v[i]);
    return fit;
}

/* Release what batch_values holds of an op. */
static void batch_release(BatchOp *o)
{
    if (o->has_buf) {
        PyBuffer_Release(&o->buf);
        Py_DECREF(o->arr);
        Py_DECREF(o->sig);
        Py_DECREF(o->tag);
        o->has_buf = 0;
    }
}

/* A SentWork of class ``sent`` (api_p2p_work.py) with its four slots set here, as its
 * __init__ sets them, without running it */
static PyObject *batch_sent(PyTypeObject *sent, PyObject *g, PyObject *peer, PyObject *rec)
{
    PyObject *w = sent->tp_alloc(sent, 0);
    if (w == NULL)
        return NULL;
    if (PyType_IsSubtype(sent, &SentType)) {   /* fresh (zeroed): nothing to drop */
        Sent *x = (Sent *)w;
        x->group = Py_NewRef(g);
        x->peer = Py_NewRef(peer);
        x->rec = Py_NewRef(rec);
        return w;
    }
    PyObject *names[4] = {s_b_wgroup, s_b_wpeer, s_b_wrec, s_b_wok};
    PyObject *values[4] = {g, peer, rec, Py_False};
    for (int i = 0; i < 4; i++)
        if (PyObject_SetAttr(w, names[i], values[i]) < 0) {
            Py_CLEAR(w);
            break;
        }
    return w;
}

/* The engine's line of deferred receives, for one to join it (new reference in *held):
 * 1; 0 not now (the engine busy, or no such list: the regular path); -1 an exception. */
static int deferred_line(P2P *s, PyObject **held)
{
    *held = NULL;
    int busy = p2p_engine_busy(s);
    if (busy)
        return busy < 0 ? -1 : 0;
    *held = p2p_engine_list(s);
    if (*held != NULL && PyList_Check(*held))
        return 1;
    int error = *held == NULL ? -1 : 0;
    Py_CLEAR(*held);
    return error;
}

/* The receive ``d`` (made, in no line) taken now if its message is already there and
 * nothing waits in the engine's line ``held`` before it: what Deferred.test does for a
 * receive first in line, without waiting (P2P.recv, ``block`` False). Received: its status
 * and record set as its wait would set them (``early`` too, for a RecvWork of the right
 * size: its wait only marks it waited for). 1 taken (or its error kept in ``exc`` for its wait
 * to raise, as P2P.own's), 0 not (nothing there, or C leaves it to the regular path), -1
 * with an exception. */
static int batch_take_now(P2P *s, Deferred *d, PyObject *held)
{
    if (!s->take_now || !PyList_CheckExact(held) || PyList_GET_SIZE(held) != 0)
        return 0;
    PyObject *n = d_recv(s, d, 0, 0);
    if (n == NULL)                   /* a CollcommError kept for the wait, like own's */
        return d_keep_error(d) > 0 ? 1 : -1;
    if (!PyLong_CheckExact(n)) {     /* False: nothing yet; None: the regular path's */
        Py_DECREF(n);
        return 0;
    }
    int taken = deferred_taken(d, n);
    Py_DECREF(n);
    return taken < 0 ? -1 : 1;
}

/* A Deferred of class ``cls`` (deferred_make) joining the engine's line ``held``, as
 * core/p2p.py defer makes and holds it, unless its message is there already (taken now:
 * batch_take_now); NULL with an exception. */
static PyObject *batch_deferred(PyTypeObject *cls, P2P *s, PyObject *held, PyObject *g,
                                PyObject *arr, PyObject *local, PyObject *tag, PyObject *mask,
                                PyObject *sig, PyObject *rec)
{
    PyObject *w = deferred_make(cls, s, g, arr, local, tag, mask, sig, rec);
    if (w == NULL)
        return NULL;
    int now = batch_take_now(s, (Deferred *)w, held);
    if (now < 0 || (now == 0 && PyList_Append(held, w) < 0))
        Py_CLEAR(w);
    return w;
}

/* The work of send b lent as ``loan`` (lend_write's) to local rank ``local``: made as
 * LentWork.__init__ makes it where ``lent`` is a subclass of the C Lent (lent_make), else
 * ``lent(p2p, g, local, loan, arr, rec)``; NULL with an exception, the loan ended first
 * (no work will wait for it). */
static PyObject *batch_lent(P2P *s, BatchOp *b, PyObject *lent, PyObject *g, PyObject *peer,
                            PyObject *local, PyObject *loan, PyObject *rec)
{
    PyObject *w;
    if (PyType_Check(lent) && PyType_IsSubtype((PyTypeObject *)lent, &LentType))
        w = lent_make((PyTypeObject *)lent, s, g, peer, local, loan, b->arr, b->buf.len, rec);
    else {
        PyObject *args[6] = {(PyObject *)s, g, local, loan, b->arr, rec};
        w = PyObject_Vectorcall(lent, args, 6, NULL);
    }
    if (w == NULL)
        loan_end_unwaited(s, local, loan, b->arr);
    return w;
}

/* Start checked op b (a receive: joining the engine's line ``held``): its work (a new
 * reference), Py_None (new) for a send C could not write (nothing done), NULL with an
 * exception. A send of lend_from bytes or more is lent where ``lent`` (its work's class)
 * is given (a batch's; P2P.one's isend lends no such send). */
static PyObject *batch_run(P2P *s, BatchOp *b, const RecAt *at, PyObject *held,
                           PyObject *g, PyObject *sent, PyObject *received, PyObject *lent)
{
    PyObject *w = NULL, *rec = Py_None, *loan = NULL;
    PyObject *peer = PyLong_FromLong(b->pipe->peer), *local = PyLong_FromLong(b->local);
    if (peer == NULL || local == NULL)
        goto out;
    if (!b->recv) {
        int lend = lent != NULL && s->lend_from > 0 && b->buf.len >= s->lend_from && b->pipe->lends;
        if (lend && (loan = lend_write(s, b->pipe, &b->buf, b->wire_tag, b->wire_sig, b->arr)) == NULL)
            goto out;
        if (loan == Py_None)           /* (not now: a busy lock, a full ring...) */
            Py_CLEAR(loan);
        int wrote = loan != NULL ? 1 : p2p_write(s, b->pipe, &b->buf, b->wire_tag, b->wire_sig);
        if (wrote <= 0) {
            w = wrote < 0 ? NULL : Py_NewRef(Py_None);
            goto out;
        }
    }
    if (at != NULL && (rec = rec_p2p_at(&s->rw, b->recv ? s_rec_irecv : s_rec_isend, b->pipe->peer,
                                        s_rec_entered, at, 0.0)) == NULL) {
        if (loan != NULL)
            loan_end_unwaited(s, local, loan, b->arr);
        goto out;
    }
    if (b->recv)
        w = batch_deferred((PyTypeObject *)received, s, held, g, b->arr, local, b->tag,
                           b_user_mask, b->sig, rec);
    else if (loan != NULL)
        w = batch_lent(s, b, lent, g, peer, local, loan, rec);
    else
        w = batch_sent((PyTypeObject *)sent, g, peer, rec);
    if (at != NULL) {
        if (w == NULL)
            rec_p2p_end(rec, 0);       /* (no work to end it: failed here) */
        Py_DECREF(rec);
    }
out:
    Py_XDECREF(loan);
    Py_XDECREF(peer);
    Py_XDECREF(local);
    return w;
}

/* Are the batch's classes what it needs? (sent, received: types, received a Deferred) */
static int batch_classes(P2P *s, PyObject *ndarray, PyObject *sigs, PyObject *sent,
                         PyObject *received)
{
    return !s->paused && s->engine != NULL && PyDict_Check(sigs) && PyType_Check(ndarray) &&
           PyType_Check(sent) && PyType_Check(received) &&
           PyType_IsSubtype((PyTypeObject *)received, &DeferredType);
}

static PyObject *P2P_batch(P2P *s, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError,
                        "batch(ops, p2pop, irecv, ndarray, sigs, sent, received, g, record, lent)");
        return NULL;
    }
    PyObject *ops = args[0], *p2pop = args[1], *irecv = args[2], *ndarray = args[3],
             *sigs = args[4], *sent = args[5], *received = args[6], *g = args[7];
    PyObject *lent = args[9];
    int record = args[8] == Py_True && rec_on(&s->rw);
    if (!batch_classes(s, ndarray, sigs, sent, received) || !PyCallable_Check(lent) ||
        (!PyList_CheckExact(ops) && !PyTuple_CheckExact(ops)))
        Py_RETURN_NONE;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(ops);
    if (n == 0 || n > BATCH_MAX)
        Py_RETURN_NONE;
    BatchOp o[BATCH_MAX];
    memset(o, 0, sizeof(BatchOp) * (size_t)n);
    PyObject *works = NULL, *held = NULL;
    RecAt at = {0.0, NULL, NULL};     /* (the batch's records share their start and caller) */
    int fit = 1;
    for (Py_ssize_t i = 0; i < n && fit > 0; i++) {
        PyObject *p = PySequence_Fast_GET_ITEM(ops, i);
        fit = Py_TYPE(p) == (PyTypeObject *)p2pop && batch_check(s, p, irecv, ndarray, sigs, &o[i]);
    }
    if (fit && (fit = deferred_line(s, &held)) < 0)
        goto done;
    if (!fit) {
        works = Py_NewRef(Py_None);
        goto done;
    }
    if (record && rec_at_caller(&s->rw, &at, rec_now()) < 0)
        goto fail;
    works = PyList_New(0);
    for (Py_ssize_t i = 0; i < n && works != NULL; i++) {
        PyObject *w = batch_run(s, &o[i], record ? &at : NULL, held, g, sent, received, lent);
        if (w == Py_None) {       /* a send C could not write: the rest op by op (the caller) */
            Py_DECREF(w);
            break;
        }
        if (w == NULL || PyList_Append(works, w) < 0) {
            Py_XDECREF(w);
            goto fail;
        }
        Py_DECREF(w);
    }
    goto done;
fail:
    Py_CLEAR(works);
done:
    rec_at_release(&at);
    for (Py_ssize_t i = 0; i < n; i++)
        batch_release(&o[i]);
    Py_XDECREF(held);
    return works;
}
