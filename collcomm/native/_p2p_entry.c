/* BatchCall: the functional API's batch_isend_irecv as a C callable (included by
 * _p2p_type.c after _p2p_batch.c, whose P2P_batch it calls).
 *
 * api_p2p.py keeps the Python function as the reference (``python``) and, where the
 * native core is built, publishes this object under its name instead. A call with one
 * positional argument does what the reference's first lines do, without its frame: the
 * world group (``runtime._world``), its native entry (``g._p2p_native``) and whether it
 * records (``g.observer``), then P2P.batch with the constants the reference passes
 * (``lent``: its lent sends' work class, api_p2p_work.LentWork). All of
 * the batch started: its works. Anything else goes on in Python: no world or no native
 * entry yet, or any other argument shape, to the reference itself; a batch P2P.batch
 * declined or started in part, to ``rest(ops, True, started)`` (api_p2p._batch_rest), the
 * reference's own continuation. Attributes it does not have (``__name__``, ``__doc__``,
 * ``__wrapped__`` ...) are the reference's, so it reads like the function it stands for.
 */

typedef struct {
    PyObject_HEAD
    PyObject *python, *rest, *runtime;                              /* see above */
    PyObject *p2pop, *irecv, *ndarray, *sigs, *sent, *received, *lent;   /* P2P.batch's constants */
    vectorcallfunc vectorcall;
} BatchCall;

static PyObject *s_e_world, *s_e_native, *s_e_observer;

static PyObject *BatchCall_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf,
                                      PyObject *kwnames)
{
    BatchCall *b = (BatchCall *)self;
    if (PyVectorcall_NARGS(nargsf) != 1 || kwnames != NULL)
        return PyObject_Vectorcall(b->python, args, nargsf, kwnames);
    PyObject *ops = args[0];
    PyObject *g = PyObject_GetAttr(b->runtime, s_e_world);
    if (g == NULL)
        return NULL;
    PyObject *f = g == Py_None ? NULL : PyObject_GetAttr(g, s_e_native);
    PyObject *obs = f == NULL || Py_TYPE(f) != &P2PType ? NULL : PyObject_GetAttr(g, s_e_observer);
    PyObject *result = NULL;
    if (obs == NULL) {                  /* (no native entry yet: the reference makes it) */
        PyErr_Clear();
        result = PyObject_Vectorcall(b->python, args, nargsf, kwnames);
        goto done;
    }
    PyObject *bargs[10] = {ops, b->p2pop, b->irecv, b->ndarray, b->sigs, b->sent, b->received, g,
                           obs != Py_None ? Py_True : Py_False, b->lent};
    PyObject *started = P2P_batch((P2P *)f, bargs, 10);
    if (started == NULL)
        goto done;
    if (started != Py_None && PyList_CheckExact(started) &&
        PyList_GET_SIZE(started) == PySequence_Fast_GET_SIZE(ops)) {   /* (ops: a list or tuple) */
        result = started;
        goto done;
    }
    result = PyObject_CallFunctionObjArgs(b->rest, ops, Py_True, started, NULL);
    Py_DECREF(started);
done:
    Py_XDECREF(obs);
    Py_XDECREF(f);
    Py_DECREF(g);
    return result;
}

/* BatchCall(python, rest, runtime, p2pop, irecv, ndarray, sigs, sent, received, lent) */
static PyObject *BatchCall_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    BatchCall *b = (BatchCall *)type->tp_alloc(type, 0);
    if (b == NULL)
        return NULL;
    PyObject **fields[10] = {&b->python, &b->rest, &b->runtime, &b->p2pop, &b->irecv,
                             &b->ndarray, &b->sigs, &b->sent, &b->received, &b->lent};
    if (kwds != NULL || PyTuple_GET_SIZE(args) != 10) {
        PyErr_SetString(PyExc_TypeError, "BatchCall(python, rest, runtime, p2pop, irecv, "
                        "ndarray, sigs, sent, received, lent)");
        Py_DECREF(b);
        return NULL;
    }
    for (int i = 0; i < 10; i++)
        *fields[i] = Py_NewRef(PyTuple_GET_ITEM(args, i));
    if (!PyCallable_Check(b->python) || !PyCallable_Check(b->rest)) {
        PyErr_SetString(PyExc_TypeError, "BatchCall: python and rest must be callable");
        Py_DECREF(b);
        return NULL;
    }
    b->vectorcall = BatchCall_vectorcall;
    return (PyObject *)b;
}

/* the reference's attributes for those it lacks (its name, doc, module, __wrapped__) */
static PyObject *BatchCall_getattro(PyObject *self, PyObject *name)
{
    if (PyUnicode_Check(name) && (PyUnicode_CompareWithASCIIString(name, "__doc__") == 0 ||
                                  PyUnicode_CompareWithASCIIString(name, "__module__") == 0))
        return PyObject_GetAttr(((BatchCall *)self)->python, name);
    PyObject *v = PyObject_GenericGetAttr(self, name);
    if (v != NULL || !PyErr_ExceptionMatches(PyExc_AttributeError))
        return v;
    PyErr_Clear();
    if (PyUnicode_Check(name) && PyUnicode_CompareWithASCIIString(name, "__wrapped__") == 0)
        return Py_NewRef(((BatchCall *)self)->python);
    return PyObject_GetAttr(((BatchCall *)self)->python, name);
}

static PyObject *BatchCall_repr(PyObject *self)
{
    return PyUnicode_FromFormat("<native %R>", ((BatchCall *)self)->python);
}

static int BatchCall_traverse(BatchCall *b, visitproc visit, void *arg)
{
    Py_VISIT(b->python);
    Py_VISIT(b->rest);
    Py_VISIT(b->runtime);
    Py_VISIT(b->p2pop);
    Py_VISIT(b->irecv);
    Py_VISIT(b->ndarray);
    Py_VISIT(b->sigs);
    Py_VISIT(b->sent);
    Py_VISIT(b->received);
    Py_VISIT(b->lent);
    return 0;
}

static int BatchCall_clear(BatchCall *b)
{
    Py_CLEAR(b->python);
    Py_CLEAR(b->rest);
    Py_CLEAR(b->runtime);
    Py_CLEAR(b->p2pop);
    Py_CLEAR(b->irecv);
    Py_CLEAR(b->ndarray);
    Py_CLEAR(b->sigs);
    Py_CLEAR(b->sent);
    Py_CLEAR(b->received);
    Py_CLEAR(b->lent);
    return 0;
}

static void BatchCall_dealloc(BatchCall *b)
{
    PyObject_GC_UnTrack(b);
    BatchCall_clear(b);
    Py_TYPE(b)->tp_free((PyObject *)b);
}

static PyTypeObject BatchCallType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "collcomm.native._shmcore.BatchCall",
    .tp_basicsize = sizeof(BatchCall),
    .tp_vectorcall_offset = offsetof(BatchCall, vectorcall),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "batch_isend_irecv in C (api_p2p.py; the Python function is the reference)",
    .tp_new = BatchCall_new,
    .tp_call = PyVectorcall_Call,
    .tp_getattro = BatchCall_getattro,
    .tp_repr = BatchCall_repr,
    .tp_traverse = (traverseproc)BatchCall_traverse,
    .tp_clear = (inquiry)BatchCall_clear,
    .tp_dealloc = (destructor)BatchCall_dealloc,
};

static int entry_module_init(PyObject *m)
{
    if ((s_e_world = PyUnicode_InternFromString("_world")) == NULL ||
        (s_e_native = PyUnicode_InternFromString("_p2p_native")) == NULL ||
        (s_e_observer = PyUnicode_InternFromString("observer")) == NULL)
        return -1;
    return add_type(m, "BatchCall", &BatchCallType);
}
