/* The native point-to-point types: construction, garbage-collector support, method
 * tables and the module's part of the init (see _p2p.c; _shmcore.c includes this file
 * after _p2p.c and _p2p_calls.c). */

#include "_p2p_deferred.c"      /* Deferred: a deferred receive's fields and native wait */
#include "_p2p_deferred_type.c" /* ... its type: gc, methods, members, module setup */
#include "_p2p_own.c"           /* P2P.own: a deferred receive's native wait in one call */
#include "_p2p_sent.c"          /* Sent: SentWork's fields and methods in C */
#include "_p2p_lend.c"          /* P2P.lend, P2P.loan_wait: a send lent from C */
#include "_p2p_lent.c"          /* Lent: LentWork's fields and common wait in C */
#include "_p2p_batch.c"         /* P2P.batch: batch_isend_irecv's start in one call */
#include "_p2p_one.c"           /* P2P.one, P2P.start: one isend / irecv in one call */
#include "_p2p_entry.c"         /* BatchCall: batch_isend_irecv itself in C */
#include "_p2p_mpi.c"           /* P2P.mpi_irecv: collcomm.MPI Irecv in one call */
#include "_p2p_probe.c"         /* P2P.probe: collcomm.MPI Probe / Iprobe in one call */
#include "_p2p_obj.c"           /* P2P.obj_send / obj_recv: collcomm.MPI send / recv of objects */
#include "_p2p_obj_irecv.c"     /* P2P.obj_irecv, obj_wait: collcomm.MPI irecv of an object, its wait */
#include "_p2p_exchange.c"      /* P2P.exchange: a blocking neighbourhood collective's messages */

/* Pipe(channel, out_view, out_base, out_ring, in_view, in_base, in_ring, eager, peer):
 * the views are writable memoryviews of the two inboxes, the bases the rings' control
 * lines (head at word 0, tail at word 8, data after 128 bytes); ``eager`` the largest
 * message written inline (the channel's inline limit: a send the ring has no room for is
 * declined, and the Python path stages it or waits, as shm.py says). */
static int Pipe_init(Pipe *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"channel", "out_view", "out_base", "out_ring", "in_view", "in_base",
                             "in_ring", "eager", "peer", NULL};
    PyObject *channel, *out_view, *in_view;
    Py_ssize_t out_base, in_base, out_ring, in_ring, eager;
    if (self->channel != NULL) {
        PyErr_SetString(PyExc_TypeError, "Pipe: already initialised");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOnnOnnnl", kwlist, &channel, &out_view,
                                     &out_base, &out_ring, &in_view, &in_base, &in_ring, &eager,
                                     &self->peer))
        return -1;
    if (PyObject_GetBuffer(out_view, &self->out, PyBUF_WRITABLE) < 0)
        return -1;
    self->has_out = 1;
    if (PyObject_GetBuffer(in_view, &self->in, PyBUF_WRITABLE) < 0)
        return -1;
    self->has_in = 1;
    if (out_base < 0 || out_ring <= 0 || out_ring % 64 || out_base + 128 + out_ring > self->out.len ||
        in_base < 0 || in_ring <= 0 || in_ring % 64 || in_base + 128 + in_ring > self->in.len ||
        out_base % 8 || in_base % 8 || eager < 0) {
        PyErr_SetString(PyExc_ValueError, "Pipe: the rings do not fit their views");
        return -1;
    }
    self->out_ctl = (uint64_t *)((char *)self->out.buf + out_base);
    self->out_data = (uint8_t *)self->out.buf + out_base + 128;
    self->in_ctl = (uint64_t *)((char *)self->in.buf + in_base);
    self->in_data = (uint8_t *)self->in.buf + in_base + 128;
    self->out_ring = (uint64_t)out_ring;
    self->in_ring = (uint64_t)in_ring;
    self->eager = (uint64_t)eager;
    PyObject *send_lock = PyObject_GetAttrString(channel, "send_lock");
    PyObject *poll_lock = PyObject_GetAttrString(channel, "poll_lock");
    if (send_lock != NULL && poll_lock != NULL) {
        self->send_acquire = PyObject_GetAttrString(send_lock, "acquire");
        self->send_release = PyObject_GetAttrString(send_lock, "release");
        self->poll_acquire = PyObject_GetAttrString(poll_lock, "acquire");
        self->poll_release = PyObject_GetAttrString(poll_lock, "release");
        self->take_one = PyObject_GetAttrString(channel, "_take_one");
    }
    Py_XDECREF(send_lock);
    Py_XDECREF(poll_lock);
    PyObject *closed = PyErr_Occurred() ? NULL : PyObject_GetAttr(channel, s_p2p_chclosed);
    self->closed = closed == NULL ? 1 : PyObject_IsTrue(closed);
    Py_XDECREF(closed);
    if (PyErr_Occurred() || self->closed < 0)
        return -1;
    Py_INCREF(channel);
    self->channel = channel;
    return 0;
}

static int Pipe_traverse(Pipe *self, visitproc visit, void *arg)
{
    Py_VISIT(self->channel);
    Py_VISIT(self->send_acquire);
    Py_VISIT(self->send_release);
    Py_VISIT(self->poll_acquire);
    Py_VISIT(self->poll_release);
    Py_VISIT(self->take_one);
    return 0;
}

static int Pipe_clear(Pipe *self)
{
    /* the buffers stay until dealloc: a cleared Pipe is never used (has_* kept) */
    Py_CLEAR(self->channel);
    Py_CLEAR(self->send_acquire);
    Py_CLEAR(self->send_release);
    Py_CLEAR(self->poll_acquire);
    Py_CLEAR(self->poll_release);
    Py_CLEAR(self->take_one);
    return 0;
}

static void Pipe_dealloc(Pipe *self)
{
    PyObject_GC_UnTrack(self);
    Pipe_clear(self);
    if (self->has_out)
        PyBuffer_Release(&self->out);
    if (self->has_in)
        PyBuffer_Release(&self->in);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef Pipe_members[] = {
    {"closed", T_INT, offsetof(Pipe, closed), 0,
     "non-zero once the channel is closed: nothing more is written to its ring"},
    {"backlog", T_INT, offsetof(Pipe, backlog), 0,
     "non-zero while the channel's backlog holds sends: no record is written natively"},
    {"peer_pid", T_LONG, offsetof(Pipe, peer_pid), 0,
     "the peer's pid: a native receive reads LENT records from its memory (0: never)"},
    {"lends", T_INT, offsetof(Pipe, lends), 0,
     "non-zero: the peer takes LENT records (P2P.lend may lend it a buffer)"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject PipeType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "collcomm.native._shmcore.Pipe",
    .tp_doc = "One shared-memory channel's rings, seen from C (see _p2p.c).",
    .tp_basicsize = sizeof(Pipe),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Pipe_init,
    .tp_traverse = (traverseproc)Pipe_traverse,
    .tp_clear = (inquiry)Pipe_clear,
    .tp_dealloc = (destructor)Pipe_dealloc,
    .tp_members = Pipe_members,
};

/* P2P(engine, check, pipes, tag_base, spin_ns, yields, append=None, obs_index=0, pkg=""):
 * append, obs_index, pkg: the flight recorder's (see _record.c; None: no records) */
static int P2P_init(P2P *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"engine", "check", "pipes", "tag_base", "spin_ns", "yields",
                             "append", "obs_index", "pkg", NULL};
    PyObject *engine, *check, *pipes, *append = Py_None, *obs_index = NULL, *pkg = NULL;
    unsigned long long tag_base;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOO!KLi|OOO", kwlist, &engine, &check,
                                     &PyTuple_Type, &pipes, &tag_base, &self->spin_ns,
                                     &self->yields, &append, &obs_index, &pkg))
        return -1;
    PyObject *zero = PyLong_FromLong(0), *empty = PyUnicode_FromString("");
    int bad = zero == NULL || empty == NULL ||
              rec_init(&self->rw, append, obs_index ? obs_index : zero, pkg ? pkg : empty) < 0;
    Py_XDECREF(zero);
    Py_XDECREF(empty);
    if (bad)
        return -1;
    if (tag_base == 0 || (tag_base & P2P_USER)) {
        PyErr_SetString(PyExc_ValueError, "P2P: tag_base must be non-zero, its 35 user bits clear");
        return -1;
    }
    PyObject **slots[] = {&self->engine, &self->check, &self->pipes};
    PyObject *values[] = {engine, check, pipes};
    for (int i = 0; i < 3; i++) {
        Py_INCREF(values[i]);
        Py_XSETREF(*slots[i], values[i]);
    }
    self->tag_base = tag_base;
    self->take_now = 1;
    /* optional (another engine type: the attribute path); a health byte of any other kind
     * is not trusted */
    PyObject *health = PyObject_GetAttrString(engine, "health");
    if (health != NULL && !PyByteArray_CheckExact(health))
        Py_CLEAR(health);
    Py_XSETREF(self->health, health);
    Py_XSETREF(self->defer_mutex, PyObject_GetAttr(engine, s_own_mutex));
    PyObject **lists[] = {&self->deferred, &self->posted, &self->unexpected};
    PyObject *list_names[] = {s_p2p_deferred, s_p2p_posted, s_p2p_unexpected};
    for (int i = 0; i < 3; i++) {     /* (anything but a list: the attribute path) */
        PyObject *lst = PyObject_GetAttr(engine, list_names[i]);
        if (lst != NULL && !PyList_CheckExact(lst))
            Py_CLEAR(lst);
        Py_XSETREF(*lists[i], lst);
    }
    PyErr_Clear();
    return 0;
}

static int P2P_traverse(P2P *self, visitproc visit, void *arg)
{
    Py_VISIT(self->engine);
    Py_VISIT(self->check);
    Py_VISIT(self->pipes);
    Py_VISIT(self->health);
    Py_VISIT(self->deferred);
    Py_VISIT(self->defer_mutex);
    Py_VISIT(self->posted);
    Py_VISIT(self->unexpected);
    return rec_traverse(&self->rw, visit, arg);
}

static int P2P_clear(P2P *self)
{
    Py_CLEAR(self->engine);
    Py_CLEAR(self->check);
    Py_CLEAR(self->pipes);
    Py_CLEAR(self->health);
    Py_CLEAR(self->deferred);
    Py_CLEAR(self->defer_mutex);
    Py_CLEAR(self->posted);
    Py_CLEAR(self->unexpected);
    rec_clear(&self->rw);
    self->paused = 1;     /* a cleared P2P never runs a call again */
    return 0;
}

static void P2P_dealloc(P2P *self)
{
    PyObject_GC_UnTrack(self);
    P2P_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *P2P_close(P2P *self, PyObject *unused)
{
    P2P_clear(self);
    Py_RETURN_NONE;
}

#define P2PM(name, doc) {#name, (PyCFunction)(void (*)(void))P2P_##name, METH_FASTCALL, doc}
static PyMethodDef P2P_methods[] = {
    P2PM(send, "send(buf, dst, tag, sig[, record]) -> True | None"),
    P2PM(recv, "recv(buf, src, tag, mask, sig[, record[, own[, block]]]) -> nbytes | None | "
               "False (block False: nothing yet) | the record "
               "(left to the regular path after it was recorded); own: the native wait of a "
               "deferred receive (the receives deferred after it do not stop it)"),
    P2PM(obj_send, "obj_send(obj, dst, tag, native) -> True | None | the pickle (not sent)"),
    P2PM(obj_recv, "obj_recv(src, tag, mask, native) -> (True, obj, tag, size) | "
                   "(False, body id, tag, size) | None"),
    P2PM(obj_sendrecv, "obj_sendrecv(obj, dst, stag, src, rtag, rmask, native) -> obj_recv's tuple | "
                       "True (sent; the receive not done) | None | the pickle (not sent)"),
    P2PM(obj_irecv, "obj_irecv(g, first, local, tag, mask, deferred, op, request, init) -> "
                    "collcomm.MPI irecv's Request | None (nothing done); see _p2p_obj_irecv.c"),
    P2PM(exchange, "exchange(send, recv, sends, recvs, base, mask) -> (i, j): the first i sends and "
                   "j receives of a neighbourhood exchange done; see _p2p_exchange.c"),
    P2PM(note, "note(recv, peer) -> the 'entered' record of an isend/irecv, or None"),
    P2PM(batch, "batch(ops, p2pop, irecv, ndarray, sigs, sent, received, g, record, lent) -> the "
                "works of the ops started (all, or those before a send C could not write) | "
                "None (not a batch C takes: nothing done); see _p2p_batch.c"),
    P2PM(one, "one(recv, arr, peer, tag, ndarray, sigs, sent, received, g, record) -> the work "
              "of the functional API's isend / irecv on the world group | None (nothing done); "
              "see _p2p_batch.c"),
    P2PM(start, "start(recv, cls, g, arr, local, tag, sig, record[, mask]) -> the work of an isend "
                "written at once or of an irecv deferred | None (nothing done); see _p2p_batch.c"),
    P2PM(mpi_isend, "mpi_isend(buf, dst, tag, ndarray, request, op) -> collcomm.MPI Isend's "
                    "Request (sent) | None (nothing done); see _p2p_mpi.c"),
    P2PM(probe, "probe(src, tag, mask, block) -> the byte count of the first message a receive "
                "would match, left in the ring (last_tag: its tag) | False (none yet) | None "
                "(the Python probe's); see _p2p_probe.c"),
    P2PM(mpi_irecv, "mpi_irecv(g, arr, local, tag, mask, ndarray, deferred, op, request) -> "
                    "collcomm.MPI Irecv's Request | None (nothing done); see _p2p_mpi.c"),
    P2PM(lend, "lend(buf, dst, tag, sig) -> (ident, start): a LENT record written | None "
               "(nothing done); see _p2p_lend.c"),
    P2PM(loan_wait, "loan_wait(dst, ident, start, buf[, since[, spin[, patience]]]) -> True once "
                    "the loan is released or withdrawn; see _p2p_lend.c"),
    {"own", (PyCFunction)P2P_own, METH_O,
     "own(d) -> nbytes | None (left to the regular path: d posted) | False (not first in "
     "line: nothing done): the native wait of deferred receive d (see _p2p_own.c)"},
    {"close", (PyCFunction)P2P_close, METH_NOARGS,
     "drop every reference; later calls take the regular path"},
    {NULL, NULL, 0, NULL},
};

static PyObject *P2P_last_tag(P2P *s, void *unused)
{
    return PyLong_FromUnsignedLongLong(p2p_last_tag);
}

static PyGetSetDef P2P_getset[] = {
    {"exchanged", (getter)P2P_exchanged, NULL,
     "(i, j): the sends and receives done by this thread's last exchange (also when it raised)",
     NULL},
    {"last_tag", (getter)P2P_last_tag, NULL,
     "the wire tag of the last message a native receive took on this thread (its user tag: "
     "& MAX_USER_TAG)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef P2P_members[] = {
    {"paused", T_INT, offsetof(P2P, paused), 0, "non-zero: calls take the regular path"},
    {"take_now", T_INT, offsetof(P2P, take_now), 0,
     "non-zero (the default): a receive whose message is there when it starts is taken then"},
    {"steal", T_INT, offsetof(P2P, steal), 0,
     "non-zero: a receive waiting on an empty ring leaves (another thread must post first)"},
    {"lend_from", T_PYSSIZET, offsetof(P2P, lend_from), 0,
     "> 0: batch sends of this many bytes or more to a rank that takes loans are lent "
     "(P2P.batch; an isend past the channel's inline limit too: api_p2p_work.lend_native); 0: never"},
    {"sends", T_ULONGLONG, offsetof(P2P, sends), READONLY, "sends completed here"},
    {"recvs", T_ULONGLONG, offsetof(P2P, recvs), READONLY, "receives completed here"},
    {"record", T_INT, offsetof(P2P, rw.on), 0,
     "1 (default): calls asked to record append flight-recorder records; 0: not (to measure)"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject P2PType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "collcomm.native._shmcore.P2P",
    .tp_doc = "A process group's native point-to-point calls over shared memory (see _p2p.c).",
    .tp_basicsize = sizeof(P2P),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)P2P_init,
    .tp_traverse = (traverseproc)P2P_traverse,
    .tp_clear = (inquiry)P2P_clear,
    .tp_dealloc = (destructor)P2P_dealloc,
    .tp_methods = P2P_methods,
    .tp_members = P2P_members,
    .tp_getset = P2P_getset,
};

static int p2p_module_init(PyObject *m)
{
    struct { PyObject **slot; const char *name; } names[] = {
        {&s_p2p_aborted, "_aborted"}, {&s_p2p_closed, "_closed"}, {&s_p2p_lost, "lost"},
        {&s_p2p_posted, "_posted"}, {&s_p2p_unexpected, "_unexpected"}, {&s_p2p_peer, "peer"},
        {&s_p2p_tag, "tag"}, {&s_p2p_mask, "mask"}, {&s_p2p_source, "source"},
        {&s_p2p_waiter, "waiter"},
        {&s_p2p_chclosed, "closed"}, {&s_p2p_deferred, "_deferred"},
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if ((*names[i].slot = PyUnicode_InternFromString(names[i].name)) == NULL)
            return -1;
    if (own_names() < 0 || batch_names() < 0 || mpi_names() < 0 || obj_irecv_names() < 0 || lend_names() < 0 || deferred_module_init(m) < 0 || sent_module_init(m) < 0 || lent_module_init(m) < 0 || rec_p2p_module_init(m) < 0 || entry_module_init(m) < 0 ||
        PyModule_AddIntConstant(m, "P2P_DIRECT_LOCKS", tlock_type != NULL) < 0)
        return -1;
    return add_type(m, "Pipe", &PipeType) < 0 ? -1 : add_type(m, "P2P", &P2PType);
}
