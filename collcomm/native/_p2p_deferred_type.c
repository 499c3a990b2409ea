/* Deferred's type: its fields for the garbage collector, its methods and members (the
 * same attribute names as core/p2p.py's Deferred), the type object and its module setup
 * (the fields and the native wait: _p2p_deferred.c, included just before by _p2p_type.c).
 */

#define D_FIELDS(X) X(f) X(g) X(eng) X(arr) X(local) X(utag) X(umask) X(sig) X(tag) X(limit) \
    X(rec) X(h) X(req) X(status) X(exc) X(work_exc)

static int Deferred_traverse(Deferred *d, visitproc visit, void *arg)
{
#define D_VISIT(name) Py_VISIT(d->name);
    D_FIELDS(D_VISIT)
    return 0;
}

static int Deferred_clear(Deferred *d)
{
#define D_CLEAR(name) Py_CLEAR(d->name);
    D_FIELDS(D_CLEAR)
    return 0;
}

static void Deferred_dealloc(Deferred *d)
{
    PyObject_GC_UnTrack(d);
    Deferred_clear(d);
    Py_TYPE(d)->tp_free((PyObject *)d);
}

static PyMethodDef Deferred_methods[] = {
    {"wait", (PyCFunction)(void (*)(void))Deferred_wait, METH_FASTCALL | METH_KEYWORDS,
     "wait(timeout=None): the common case in C, else _wait (see _p2p_deferred.c)"},
    {"_setup", (PyCFunction)(void (*)(void))Deferred_setup, METH_FASTCALL | METH_STATIC,
     "_setup(local, error, status): the timeouts' thread-local, CollcommError, Status"},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef Deferred_members[] = {
    {"f", T_OBJECT, offsetof(Deferred, f), 0, NULL},
    {"g", T_OBJECT, offsetof(Deferred, g), 0, NULL},
    {"eng", T_OBJECT, offsetof(Deferred, eng), 0, NULL},
    {"arr", T_OBJECT, offsetof(Deferred, arr), 0, NULL},
    {"local", T_OBJECT, offsetof(Deferred, local), 0, NULL},
    {"utag", T_OBJECT, offsetof(Deferred, utag), 0, NULL},
    {"umask", T_OBJECT, offsetof(Deferred, umask), 0, NULL},
    {"sig", T_OBJECT, offsetof(Deferred, sig), 0, NULL},
    {"tag", T_OBJECT, offsetof(Deferred, tag), 0, NULL},
    {"limit", T_OBJECT, offsetof(Deferred, limit), 0, NULL},
    {"rec", T_OBJECT, offsetof(Deferred, rec), 0, NULL},
    {"h", T_OBJECT, offsetof(Deferred, h), 0, NULL},
    {"req", T_OBJECT, offsetof(Deferred, req), 0, NULL},
    {"status", T_OBJECT, offsetof(Deferred, status), 0, NULL},
    {"exc", T_OBJECT, offsetof(Deferred, exc), 0, NULL},
    {"_exc", T_OBJECT, offsetof(Deferred, work_exc), 0, "(RecvWork) the wait's error, kept"},
    {"waiting", T_BOOL, offsetof(Deferred, waiting), 0, NULL},
    {"_ok", T_BOOL, offsetof(Deferred, ok), 0, NULL},
    {"early", T_BOOL, offsetof(Deferred, early), READONLY, "received when it was started"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject DeferredType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "collcomm.native._shmcore.Deferred",
    .tp_doc = "The fields and the native wait of core/p2p.py's Deferred (_p2p_deferred.c).",
    .tp_basicsize = sizeof(Deferred),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_BASETYPE,
    .tp_new = PyType_GenericNew,
    .tp_traverse = (traverseproc)Deferred_traverse,
    .tp_clear = (inquiry)Deferred_clear,
    .tp_dealloc = (destructor)Deferred_dealloc,
    .tp_methods = Deferred_methods,
    .tp_members = Deferred_members,
};

static int deferred_module_init(PyObject *m)
{
    if ((s_d_wait = PyUnicode_InternFromString("_wait")) == NULL ||
        (s_d_timeout = PyUnicode_InternFromString("timeout")) == NULL ||
        (s_d_end_native = PyUnicode_InternFromString("end_native")) == NULL ||
        (s_d_nbytes = PyUnicode_InternFromString("nbytes")) == NULL ||
        (s_d_is_work = PyUnicode_InternFromString("_IS_WORK")) == NULL ||
        (s_d_ranks = PyUnicode_InternFromString("ranks")) == NULL ||
        (s_d_source = PyUnicode_InternFromString("source")) == NULL)
        return -1;
    return add_type(m, "Deferred", &DeferredType);
}
