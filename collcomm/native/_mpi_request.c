/* collcomm.MPI's requests of non-blocking and persistent collectives made in C (included
 * by _shmcore.c after _p2p_type.c, whose SlotsOf / slots_of / SLOT_AT it uses).
 *
 * Every ``I…`` call the fast call starts in two parts (native/_fastcall_parts.c) returns
 * a ``Request`` holding a ``WorkOp`` holding the call's Work (MPI/_request.py). Made in
 * Python (``WorkOp.__new__`` and four slot stores, ``Request.__new__`` and one, through
 * two helper frames) that cost ~0.8 µs a call on the project's VM beside ~2.5 µs for the
 * two C parts. Here both are made with tp_alloc and their slots written, no __init__, as
 * Python would leave them:
 *
 * ``mpi_request_types(workop, request, error, reraise)``: the classes, collcomm's error
 * class and the function that raises one as MPI.Exception; False (nothing kept) unless
 * both classes keep those fields in plain slots; the functions below refuse until then.
 * Kept once for good (a later call answers whether it names the same classes).
 * ``mpi_request(work, finish=None)``: Request(WorkOp(work, finish)) (_coll_impl._request).
 * ``mpi_started(entry, *args)``: ``entry(*args)`` (a fast call's two-part entry); None if
 * it declined, else its Work as mpi_request makes it (_coll._started). An error of
 * collcomm's class is handed to ``reraise``, which raises ``translate(exc) from exc``.
 * ``mpi_workop_started(entry, *args)``: the same, the WorkOp alone (a persistent
 * collective's Start: _coll_persistent._Prepared).
 */

static PyObject *rq_names[5];          /* WorkOp's _work, _finish, _done, value; Request's _op */
static SlotsOf rq_op_slots, rq_req_slots;
static PyObject *rq_error, *rq_reraise;  /* strong references, once registered */
static int rq_ready;

static int rq_init_names(void)
{
    const char *names[5] = {"_work", "_finish", "_done", "value", "_op"};
    for (int i = 0; i < 5; i++)
        if (rq_names[i] == NULL && (rq_names[i] = PyUnicode_InternFromString(names[i])) == NULL)
            return -1;
    return 0;
}

static PyObject *mod_mpi_request_types(PyObject *m, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !PyType_Check(args[0]) || !PyType_Check(args[1]) || !PyType_Check(args[2]) ||
        !PyCallable_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "mpi_request_types(workop, request, error, reraise)");
        return NULL;
    }
    if (rq_init_names() < 0)
        return NULL;
    /* Once kept, kept for good: the makers write slots at these offsets, and Python code
     * they run (the entry, a finalizer) could otherwise register other classes midway.
     * Checked on copies, so a refusal changes nothing. */
    if (rq_ready)
        return Py_NewRef(rq_op_slots.type == (PyTypeObject *)args[0] &&
                         rq_req_slots.type == (PyTypeObject *)args[1] ? Py_True : Py_False);
    SlotsOf op = {NULL, {0}, 0}, req = {NULL, {0}, 0};
    int ok = slots_of(&op, (PyTypeObject *)args[0], rq_names, 4) &&
             slots_of(&req, (PyTypeObject *)args[1], rq_names + 4, 1);
    if (ok) {
        rq_op_slots = op;             /* (the type references move along) */
        rq_req_slots = req;
        rq_error = Py_NewRef(args[2]);
        rq_reraise = Py_NewRef(args[3]);
        rq_ready = 1;
    } else {
        Py_XDECREF(op.type);
        Py_XDECREF(req.type);
    }
    return Py_NewRef(ok ? Py_True : Py_False);
}

/* A WorkOp that nobody else holds, its slots emptied (rq_op_drop): the next rq_workop's,
 * so a loop of persistent collectives' Start + Wait allocates and frees none (~5% of the
 * loop, session 47) */
static PyObject *rq_spare_op;

/* A new WorkOp holding `work` and `finish` (borrowed), as WorkOp.__init__ leaves it */
static PyObject *rq_workop(PyObject *work, PyObject *finish)
{
    PyTypeObject *t = rq_op_slots.type;
    PyObject *op = rq_spare_op;
    rq_spare_op = NULL;
    if (op == NULL && (op = t->tp_alloc(t, 0)) == NULL)
        return NULL;
    PyObject *v[4] = {work, finish, Py_False, Py_None};
    for (int i = 0; i < 4; i++)
        SLOT_AT(op, rq_op_slots.at[i]) = Py_NewRef(v[i]);
    return op;
}

/* The caller's reference to op `op` dropped: kept as the spare (its slots emptied) where it
 * is the last one, of WorkOp itself, nobody refers to it weakly and no spare is kept; else
 * released. */
static void rq_op_drop(PyObject *op)
{
#ifndef Py_GIL_DISABLED          /* (without the GIL a reference count of 1 proves nothing) */
    if (rq_spare_op == NULL && Py_TYPE(op) == rq_op_slots.type && Py_REFCNT(op) == 1 &&
        no_weakrefs(op)) {       /* (rq_op_slots.type is set once the slots are known) */
        PyObject *old[4];
        for (int i = 0; i < 4; i++) {
            old[i] = SLOT_AT(op, rq_op_slots.at[i]);
            SLOT_AT(op, rq_op_slots.at[i]) = NULL;
        }
        rq_spare_op = op;
        for (int i = 0; i < 4; i++)        /* (only now: a dealloc may run Python code) */
            Py_XDECREF(old[i]);
        return;
    }
#endif
    Py_DECREF(op);
}

/* A new Request holding `op` (a reference stolen, also on failure) */
static PyObject *rq_request(PyObject *op)
{
    PyTypeObject *t = rq_req_slots.type;
    PyObject *req = t->tp_alloc(t, 0);
    if (req == NULL) {
        Py_DECREF(op);
        return NULL;
    }
    SLOT_AT(req, rq_req_slots.at[0]) = op;
    return req;
}

static int rq_refuse(const char *name)
{
    if (rq_ready)
        return 0;
    PyErr_Format(PyExc_RuntimeError, "%s: mpi_request_types was not called (or refused)", name);
    return -1;
}

static PyObject *mod_mpi_request(PyObject *m, PyObject *const *args, Py_ssize_t nargs)
{
    if (rq_refuse("mpi_request") < 0)
        return NULL;
    if (nargs != 1 && nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "mpi_request(work, finish=None)");
        return NULL;
    }
    PyObject *op = rq_workop(args[0], nargs == 2 ? args[1] : Py_None);
    return op == NULL ? NULL : rq_request(op);
}

/* entry(*args[1:]) with collcomm's error translated: the Work (new reference), None, or
 * NULL with an exception. The translation is the registered Python function's (it raises
 * ``translate(exc) from exc`` from an ``except`` block of its own), so the new error's
 * context, the caller's handled exception and a generator's exception state are what
 * Python makes them; only errors pay for it. */
static PyObject *rq_start(PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *work = PyObject_Vectorcall(args[0], args + 1, (size_t)(nargs - 1), NULL);
    if (work != NULL || !PyErr_ExceptionMatches(rq_error))
        return work;
    PyObject *type, *exc, *tb;
    PyErr_Fetch(&type, &exc, &tb);
    PyErr_NormalizeException(&type, &exc, &tb);
    if (tb != NULL)
        PyException_SetTraceback(exc, tb);
    Py_XDECREF(type);
    Py_XDECREF(tb);
    PyObject *r = PyObject_CallOneArg(rq_reraise, exc);
    Py_DECREF(exc);
    if (r != NULL) {
        Py_DECREF(r);
        PyErr_SetString(PyExc_TypeError, "mpi_started: the translating function returned");
    }
    return NULL;
}

static PyObject *rq_started(const char *name, PyObject *const *args, Py_ssize_t nargs, int request)
{
    if (rq_refuse(name) < 0)
        return NULL;
    if (nargs < 1) {
        PyErr_Format(PyExc_TypeError, "%s(entry, *args)", name);
        return NULL;
    }
    PyObject *work = rq_start(args, nargs);
    if (work == NULL || work == Py_None)
        return work;
    PyObject *op = rq_workop(work, Py_None);
    Py_DECREF(work);
    if (op == NULL || !request)
        return op;
    return rq_request(op);
}

static PyObject *mod_mpi_started(PyObject *m, PyObject *const *args, Py_ssize_t nargs)
{
    return rq_started("mpi_started", args, nargs, 1);
}

static PyObject *mod_mpi_workop_started(PyObject *m, PyObject *const *args, Py_ssize_t nargs)
{
    return rq_started("mpi_workop_started", args, nargs, 0);
}
