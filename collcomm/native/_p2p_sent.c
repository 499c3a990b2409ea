/* Sent: the native half of api_p2p_work.SentWork, an ``isend`` the native entry completed
 * at once (its bytes are in the peer's ring; included by _p2p_type.c before _p2p_batch.c).
 *
 * The Python class subclasses this type: its four fields are a C struct (the attribute
 * names ``_group``, ``_peer``, ``_rec``, ``_ok`` as before; P2P.batch and P2P.start fill
 * the struct), and
 * its ``wait``, ``is_completed``, ``is_success`` and ``source_rank`` are C: a send's wait
 * only marks its flight-recorder record completed (it stays "entered" until then, as the
 * regular path's does), which took a Python frame and a call of core/p2p.py ``finished``.
 */

typedef struct {
    PyObject_HEAD
    PyObject *group, *peer, *rec;
    char ok;
} Sent;

/* its record "entered" -> "completed" (now), as core/p2p.py finished(rec, True) */
static void sent_finish(Sent *w)
{
    PyObject *rec = w->rec;
    if (rec_is_p2p(rec) && rec_p2p_entered(rec))
        rec_p2p_end(rec, 1);
}

static PyObject *Sent_wait(Sent *w, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    if (nargs + nkw > 1 ||
        (nkw == 1 && PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, 0), "timeout") != 0)) {
        PyErr_SetString(PyExc_TypeError, "wait(timeout=None)");
        return NULL;
    }
    sent_finish(w);
    w->ok = 1;
    Py_RETURN_TRUE;
}

static PyObject *Sent_is_completed(Sent *w, PyObject *unused)
{
    sent_finish(w);
    Py_RETURN_TRUE;
}

static PyObject *Sent_is_success(Sent *w, PyObject *unused)
{
    return PyBool_FromLong(w->ok);
}

static PyObject *Sent_source_rank(Sent *w, PyObject *unused)
{
    sent_finish(w);
    w->ok = 1;
    return Py_NewRef(w->peer != NULL ? w->peer : Py_None);
}

static int Sent_traverse(Sent *w, visitproc visit, void *arg)
{
    Py_VISIT(w->group);
    Py_VISIT(w->peer);
    Py_VISIT(w->rec);
    return 0;
}

static int Sent_clear(Sent *w)
{
    Py_CLEAR(w->group);
    Py_CLEAR(w->peer);
    Py_CLEAR(w->rec);
    return 0;
}

static void Sent_dealloc(Sent *w)
{
    PyObject_GC_UnTrack(w);
    Sent_clear(w);
    Py_TYPE(w)->tp_free((PyObject *)w);
}

static PyMethodDef Sent_methods[] = {
    {"wait", (PyCFunction)(void (*)(void))Sent_wait, METH_FASTCALL | METH_KEYWORDS,
     "wait(timeout=None) -> True: its record marked completed"},
    {"is_completed", (PyCFunction)Sent_is_completed, METH_NOARGS, "is_completed() -> True"},
    {"is_success", (PyCFunction)Sent_is_success, METH_NOARGS, "is_success(): waited for"},
    {"source_rank", (PyCFunction)Sent_source_rank, METH_NOARGS,
     "source_rank(): the global rank it went to"},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef Sent_members[] = {
    {"_group", T_OBJECT_EX, offsetof(Sent, group), 0, NULL},
    {"_peer", T_OBJECT_EX, offsetof(Sent, peer), 0, NULL},
    {"_rec", T_OBJECT_EX, offsetof(Sent, rec), 0, NULL},
    {"_ok", T_BOOL, offsetof(Sent, ok), 0, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject SentType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "collcomm.native._shmcore.Sent",
    .tp_doc = "The fields and methods of api_p2p_work.SentWork (_p2p_sent.c).",
    .tp_basicsize = sizeof(Sent),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_BASETYPE,
    .tp_new = PyType_GenericNew,
    .tp_traverse = (traverseproc)Sent_traverse,
    .tp_clear = (inquiry)Sent_clear,
    .tp_dealloc = (destructor)Sent_dealloc,
    .tp_methods = Sent_methods,
    .tp_members = Sent_members,
};

static int sent_module_init(PyObject *m)
{
    return add_type(m, "Sent", &SentType);
}
