/* ``Request.Testall``, ``Waitany`` and ``Waitsome`` in C (collcomm/MPI/_request_many.py's class
 * methods; included by _mpi_request_wait.c, whose setup installs them and whose rw_python,
 * rw_plain and rw_reaped they use; mpi_test_native of _mpi_wait.c, which they call).
 *
 * Each makes the Python method's first look (the C test of a list or tuple of requests,
 * no statuses) without its frame (~0.2 µs), and hands everything else to the Python
 * method (``rw_py_testall`` ...): statuses, keywords, a generator, a request C leaves, one
 * of collcomm's errors (cleared: the Python way tests again and raises it translated),
 * and every wait that must poll. Session 47.
 */

/* A TypeError for a class method called without its class's argument: NULL */
static PyObject *rm_usage(const char *usage)
{
    PyErr_SetString(PyExc_TypeError, usage);
    return NULL;
}

/* The first look of a class method on (cls, requests[, None]) with requests a list or
 * tuple: mpi_test_native's answer for `how` (0 Testall, 1 Waitany's "any", 2 Waitsome's
 * "some"), a new reference; NULL with an exception to raise, or without one where the
 * Python method is to run instead (another form of call, C's None: some request is the
 * Python code's, or one of collcomm's errors, cleared: the Python way tests again and
 * raises it, translated). */
static PyObject *rm_first_look(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, PyObject *how)
{
    if (nargs < 2 || !rw_plain(args + 1, nargs - 1, kwnames, 2) ||
        (!PyList_CheckExact(args[1]) && !PyTuple_CheckExact(args[1])))
        return NULL;
    PyObject *call[4] = {args[1], rw_done, rw_tag_bits, how};
    PyObject *got = mod_mpi_test_native(NULL, call, 4);
    if (got == NULL && !PyErr_ExceptionMatches(rw_error))
        return NULL;
    if (got == NULL || got == Py_None) {
        PyErr_Clear();
        Py_XDECREF(got);
        return NULL;
    }
    return got;
}

/* Python method `py` on the class method's arguments */
#define RM_PYTHON(py) rw_python((py), args[0], args + 1, nargs - 1, kwnames)

/* Testall(cls, requests[, statuses]) (a classmethod of Request): True (every request
 * complete, left null; the orphans reaped) or False (nothing changed); else the Python
 * method, which tests them all again its way. */
static PyObject *mod_rw_testall(PyObject *m, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (nargs < 1)
        return rm_usage("Testall(cls, requests, statuses=None)");
    PyObject *done = rm_first_look(args, nargs, kwnames, rw_all);
    if (done == NULL)
        return PyErr_Occurred() ? NULL : RM_PYTHON(rw_py_testall);
    if (done == Py_True && rw_reaped() < 0) {
        Py_DECREF(done);
        return NULL;
    }
    return done;
}

/* Waitany(cls, requests[, status]) (a classmethod of Request): the index of the first
 * request C completes at once (left null; the orphans reaped); anything else (nothing
 * yet: False) the Python method, which looks again and waits its way. Nothing is
 * completed before it is handed over. */
static PyObject *mod_rw_waitany(PyObject *m, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (nargs < 1)
        return rm_usage("Waitany(cls, requests, status=None)");
    PyObject *got = rm_first_look(args, nargs, kwnames, rw_any);
    if (got == NULL || !PyTuple_Check(got)) {
        Py_XDECREF(got);
        return PyErr_Occurred() ? NULL : RM_PYTHON(rw_py_waitany);
    }
    PyObject *index = Py_NewRef(PyTuple_GET_ITEM(got, 0));
    Py_DECREF(got);
    if (rw_reaped() < 0) {
        Py_DECREF(index);
        return NULL;
    }
    return index;
}

/* Waitsome(cls, requests[, statuses]) (a classmethod of Request): the indices of the
 * requests C completed now (left null; the orphans reaped) where every active one was
 * C's; where C completed some but left others to the Python code, ``waitsome_rest
 * (requests, got)`` goes on from C's answer (as the Python method does: those C completed
 * are null now and would not be seen again); where C completed none, the Python method. */
static PyObject *mod_rw_waitsome(PyObject *m, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (nargs < 1)
        return rm_usage("Waitsome(cls, requests, statuses=None)");
    PyObject *got = rm_first_look(args, nargs, kwnames, rw_some);
    if (got == NULL || PyList_GET_SIZE(PyTuple_GET_ITEM(got, 0)) == 0) {   /* (none completed) */
        Py_XDECREF(got);
        return PyErr_Occurred() ? NULL : RM_PYTHON(rw_py_waitsome);
    }
    if (PyTuple_GET_ITEM(got, 1) != Py_True) {              /* (some left to the Python code) */
        PyObject *rest = PyObject_CallFunctionObjArgs(rw_waitsome_rest, args[1], got, NULL);
        Py_DECREF(got);
        return rest;
    }
    PyObject *pairs = PyTuple_GET_ITEM(got, 0);
    Py_ssize_t count = PyList_GET_SIZE(pairs);
    PyObject *out = PyList_New(count);
    for (Py_ssize_t k = 0; out != NULL && k < count; k++)
        PyList_SET_ITEM(out, k, Py_NewRef(PyTuple_GET_ITEM(PyList_GET_ITEM(pairs, k), 0)));
    Py_DECREF(got);
    if (out != NULL && rw_reaped() < 0)
        Py_CLEAR(out);
    return out;
}

static PyMethodDef rw_waitany_def = {
    "Waitany", (PyCFunction)(void (*)(void))mod_rw_waitany, METH_FASTCALL | METH_KEYWORDS,
    "Waitany(cls, /, requests, status=None)\n--\n\nWait for any request; its index (in C: _mpi_request_many.c)"};
static PyMethodDef rw_testall_def = {
    "Testall", (PyCFunction)(void (*)(void))mod_rw_testall, METH_FASTCALL | METH_KEYWORDS,
    "Testall(cls, /, requests, statuses=None)\n--\n\nWhether every request is complete (in C: _mpi_request_many.c)"};
static PyMethodDef rw_waitsome_def = {
    "Waitsome", (PyCFunction)(void (*)(void))mod_rw_waitsome, METH_FASTCALL | METH_KEYWORDS,
    "Waitsome(cls, /, requests, statuses=None)\n--\n\nWait for some requests; their indices (in C: _mpi_request_many.c)"};
