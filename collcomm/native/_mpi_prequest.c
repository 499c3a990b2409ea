/* ``Prequest.Start`` in C (collcomm/MPI/_prequest.py; included by _shmcore.c after
 * _mpi_request.c, using SlotsOf / slots_of / SLOT_AT of _p2p.c).
 *
 * A persistent collective's Start is its quick start (``_Persistent.quick[0]``, the fast
 * call's two-part entry bound to the arguments worked out at ``…_init``) and one slot
 * store; as a Python method the frame, the attribute reads and the checks were ~0.1-0.15 µs
 * of a ~0.5 µs Start (mpi4py's Start: 0.16 µs). ``mpi_prequest_start(prequest, persistent,
 * start)`` returns a method descriptor of ``prequest`` (the class) that does what the
 * Python ``start`` does on the common way, in C:
 *
 * - the request live (its ``_persist`` a ``persistent`` whose ``start`` is set), inactive
 *   (``_op`` None) and its quick start set: ``_op = quick[0]()``, or, for a tuple
 *   ``(entry, *args)`` (a persistent collective's, _coll_persistent._Prepared),
 *   ``mpi_workop_started(entry, *args)`` without the call through a partial; where that
 *   declines (None), ``_op = _persist.start()`` (the ``I…`` form), as the Python method does;
 * - anything else (freed, still active, no quick start, slots it cannot read): the Python
 *   ``start`` itself, which raises or takes its regular way.
 *
 * None (and the Python method stays) where either class keeps those fields elsewhere than
 * in plain slots.
 */

static PyObject *pq_names[4];          /* Prequest's _persist, _op; _Persistent's start, quick */
static SlotsOf pq_req_slots, pq_persist_slots;
static PyObject *pq_python_start;      /* the Python Start (strong reference) */

static PyObject *pq_start(PyObject *self, PyObject *unused)
{
    PyObject *persist = SLOT_AT(self, pq_req_slots.at[0]);
    PyObject *op = SLOT_AT(self, pq_req_slots.at[1]);
    if (persist == NULL || Py_TYPE(persist) != pq_persist_slots.type || op != Py_None)
        return PyObject_CallOneArg(pq_python_start, self);
    PyObject *start = SLOT_AT(persist, pq_persist_slots.at[0]);
    PyObject *quick = SLOT_AT(persist, pq_persist_slots.at[1]);
    if (start == NULL || start == Py_None || quick == NULL || !PyList_CheckExact(quick) ||
        PyList_GET_SIZE(quick) < 1 || PyList_GET_ITEM(quick, 0) == Py_None ||
        (PyTuple_CheckExact(PyList_GET_ITEM(quick, 0)) && !rq_ready))
        return PyObject_CallOneArg(pq_python_start, self);
    PyObject *fn = Py_NewRef(PyList_GET_ITEM(quick, 0));
    Py_INCREF(persist);                 /* (the call may run Python code: keep what we read) */
    PyObject *r;
    if (PyTuple_CheckExact(fn)) {
        fc_args_tuple = fn;             /* (part_start keeps it, not a copy: _fastcall_parts.c) */
        r = rq_started("Start", &PyTuple_GET_ITEM(fn, 0), PyTuple_GET_SIZE(fn), 0);
        fc_args_tuple = NULL;
    } else {
        r = PyObject_CallNoArgs(fn);
    }
    Py_DECREF(fn);
    if (r == Py_None) {                 /* declined: the I… form, as the Python method */
        Py_DECREF(r);
        PyObject *st = SLOT_AT(persist, pq_persist_slots.at[0]);
        if (st == NULL || st == Py_None) {     /* (freed meanwhile: the Python method says so) */
            Py_DECREF(persist);
            return PyObject_CallOneArg(pq_python_start, self);
        }
        Py_INCREF(st);
        r = PyObject_CallNoArgs(st);
        Py_DECREF(st);
    }
    Py_DECREF(persist);
    if (r == NULL)
        return NULL;
    PyObject *old = SLOT_AT(self, pq_req_slots.at[1]);
    SLOT_AT(self, pq_req_slots.at[1]) = r;
    Py_XDECREF(old);
    Py_RETURN_NONE;
}

static PyMethodDef pq_start_def = {
    "Start", (PyCFunction)pq_start, METH_NOARGS,
    "Start() -> None: begin the persistent request's operation again (in C: _mpi_prequest.c)"};

static PyObject *mod_mpi_prequest_start(PyObject *m, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyType_Check(args[0]) || !PyType_Check(args[1]) || !PyCallable_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "mpi_prequest_start(prequest, persistent, start)");
        return NULL;
    }
    const char *names[4] = {"_persist", "_op", "start", "quick"};
    for (int i = 0; i < 4; i++)
        if (pq_names[i] == NULL && (pq_names[i] = PyUnicode_InternFromString(names[i])) == NULL)
            return NULL;
    if (pq_req_slots.type != NULL)     /* (once: the descriptor reads these offsets) */
        Py_RETURN_NONE;
    SlotsOf req = {NULL, {0}, 0}, persist = {NULL, {0}, 0};
    if (!slots_of(&req, (PyTypeObject *)args[0], pq_names, 2) ||
        !slots_of(&persist, (PyTypeObject *)args[1], pq_names + 2, 2)) {
        Py_XDECREF(req.type);
        Py_XDECREF(persist.type);
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_NONE;
    }
    PyObject *descr = PyDescr_NewMethod((PyTypeObject *)args[0], &pq_start_def);
    if (descr == NULL) {
        Py_DECREF(req.type);
        Py_DECREF(persist.type);
        return NULL;
    }
    pq_req_slots = req;
    pq_persist_slots = persist;
    pq_python_start = Py_NewRef(args[2]);
    return descr;
}
