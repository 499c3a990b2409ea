/* ``Request.Testall``, ``Waitany`` and ``Waitsome`` in C (collcomm/MPI/_request_many.py's class
 * methods; included by _mpi_request_wait.c, whose setup installs them and whose rw_python,
 * rw_plain and rw_reaped they use; mw_test_any and mpi_test_native of _mpi_wait.c).
 *
 * Each makes the Python method's first look (the C test of a list or tuple of requests,
 * no statuses) without its frame (~0.2 µs), and hands everything else to the Python
 * method (``rw_py_testall`` ...): statuses, keywords, a generator, a request C leaves, one
 * of collcomm's errors (cleared: the Python way tests again and raises it translated),
 * and every wait that must poll. Session 47.
 */

/* Testall(cls, requests[, statuses]) (a classmethod of Request): mpi_test_native's test of
 * all of a list or tuple, as the Python method's first way: True (every request complete,
 * left null; the orphans reaped) or False (nothing changed); where C leaves some request
 * to the Python code (None), or raised one of collcomm's errors (cleared), the Python
 * method, which tests them all again its way. */
static PyObject *mod_rw_testall(PyObject *m, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (nargs < 1) {
        PyErr_SetString(PyExc_TypeError, "Testall(cls, requests, statuses=None)");
        return NULL;
    }
    if (nargs < 2 || !rw_plain(args + 1, nargs - 1, kwnames, 2) ||
        (!PyList_CheckExact(args[1]) && !PyTuple_CheckExact(args[1])))
        return rw_python(rw_py_testall, args[0], args + 1, nargs - 1, kwnames);
    PyObject *call[4] = {args[1], rw_done, rw_tag_bits, rw_all};
    PyObject *done = mod_mpi_test_native(NULL, call, 4);
    if (done == NULL && !PyErr_ExceptionMatches(rw_error))
        return NULL;
    if (done == NULL || done == Py_None) {
        PyErr_Clear();             /* (the Python way tests again and raises it, translated) */
        Py_XDECREF(done);
        return rw_python(rw_py_testall, args[0], args + 1, nargs - 1, kwnames);
    }
    if (done == Py_True && rw_reaped() < 0) {
        Py_DECREF(done);
        return NULL;
    }
    return done;
}

/* Waitany(cls, requests[, status]) (a classmethod of Request): the Python method's first
 * look, in C (mw_test_any of a list or tuple, no status): the index of the first request C
 * completes now (left null; the orphans reaped); anything else (nothing yet, a request C
 * leaves, one of collcomm's errors, cleared) the Python method, which looks again and
 * waits its way. Nothing is completed before it is handed over. */
static PyObject *mod_rw_waitany(PyObject *m, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (nargs < 1) {
        PyErr_SetString(PyExc_TypeError, "Waitany(cls, requests, status=None)");
        return NULL;
    }
    if (nargs < 2 || !rw_plain(args + 1, nargs - 1, kwnames, 2) ||
        (!PyList_CheckExact(args[1]) && !PyTuple_CheckExact(args[1])))
        return rw_python(rw_py_waitany, args[0], args + 1, nargs - 1, kwnames);
    PyObject *got = mw_test_any(args[1], PyList_CheckExact(args[1]), rw_done, rw_tag_bits, 0);
    if (got == NULL && !PyErr_ExceptionMatches(rw_error))
        return NULL;
    if (got == NULL || !PyTuple_Check(got)) {
        PyErr_Clear();             /* (the Python way looks again and raises it, translated) */
        Py_XDECREF(got);
        return rw_python(rw_py_waitany, args[0], args + 1, nargs - 1, kwnames);
    }
    PyObject *index = Py_NewRef(PyTuple_GET_ITEM(got, 0));
    Py_DECREF(got);
    if (rw_reaped() < 0) {
        Py_DECREF(index);
        return NULL;
    }
    return index;
}

/* Waitsome(cls, requests[, statuses]) (a classmethod of Request): the Python method's first
 * look, in C (mw_test_any's "some" of a list or tuple, no statuses): the indices of the
 * requests C completed now (left null; the orphans reaped) where every active one was
 * C's; where C completed some but left others to the Python code, ``waitsome_rest
 * (requests, got)`` goes on from C's answer (as the Python method does: those C completed
 * are null now and would not be seen again); where C completed none, the Python method. */
static PyObject *mod_rw_waitsome(PyObject *m, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (nargs < 1) {
        PyErr_SetString(PyExc_TypeError, "Waitsome(cls, requests, statuses=None)");
        return NULL;
    }
    if (nargs < 2 || !rw_plain(args + 1, nargs - 1, kwnames, 2) ||
        (!PyList_CheckExact(args[1]) && !PyTuple_CheckExact(args[1])))
        return rw_python(rw_py_waitsome, args[0], args + 1, nargs - 1, kwnames);
    PyObject *got = mw_test_any(args[1], PyList_CheckExact(args[1]), rw_done, rw_tag_bits, 1);
    if (got == NULL && !PyErr_ExceptionMatches(rw_error))
        return NULL;
    PyObject *pairs = got != NULL ? PyTuple_GET_ITEM(got, 0) : NULL;
    if (pairs == NULL || PyList_GET_SIZE(pairs) == 0) {     /* (none completed: nothing lost) */
        PyErr_Clear();
        Py_XDECREF(got);
        return rw_python(rw_py_waitsome, args[0], args + 1, nargs - 1, kwnames);
    }
    if (PyTuple_GET_ITEM(got, 1) != Py_True) {              /* (some left to the Python code) */
        PyObject *rest = PyObject_CallFunctionObjArgs(rw_waitsome_rest, args[1], got, NULL);
        Py_DECREF(got);
        return rest;
    }
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
