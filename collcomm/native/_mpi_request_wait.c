/* ``Request.Wait``, ``wait``, ``Test`` and ``Waitall`` in C (collcomm/MPI/_request.py; included
 * by _shmcore.c after _mpi_wait.c, whose mw_one, mw_settle and mw_null they call), and the
 * setup of those and of ``Testall``, ``Waitany``, ``Waitsome`` (_mpi_request_many.c).
 *
 * The Python methods' common way is one C call (mpi_wait_native / mpi_test_native) inside
 * a Python frame: the frame, four global look-ups and the serializer's attribute were
 * ~0.25 µs of a persistent collective's ``Start`` + ``Wait`` (~2 µs on the project's VM in
 * its slow state; mpi4py's Wait is C). ``mpi_request_waits(request, (py_wait, py_wait_value,
 * py_test, py_waitall, py_testall, py_waitany, py_waitsome), done, tag_bits, pickle, spare,
 * orphans, reap, error, waitsome_rest)`` returns ``(Wait, wait, Test, Waitall, Testall,
 * Waitany, Waitsome)``: three method descriptors of ``request`` (the class) and four
 * functions for ``classmethod``, which do on the common way what the Python ones do, and
 * call them (``py_wait(self, ...)``, ``py_waitall(cls, ...)``..., the functions themselves)
 * for everything else:
 *
 * - a status given (not None) or keywords: the Python method;
 * - Wait: a null request True; else the op completed by mw_one (a native receive, a send
 *   done, an object irecv with ``pickle.native``, a collective started in two parts), then
 *   the orphans (``orphans``: freed receives to unpack) reaped if any, True, as the
 *   Python method ends; where C declines (0), the Python method;
 * - wait: the same, giving the op's ``value`` (a null request: None);
 * - Test: a null request True; else mw_settle's test: complete (the request left null)
 *   True, nothing yet False; anything else the Python method (one of collcomm's errors,
 *   ``error``, cleared first: the Python way tests again and raises it translated);
 * - Waitall (a list or tuple): every request completed by mw_one in order, True; at the
 *   first it declines, the Python method from there (those completed are null: it passes
 *   over them);
 * - Testall, Waitany, Waitsome: their first look (_mpi_request_many.c).
 *
 * The errors raised are the Python way's: an exception mw_one raises (not collcomm's, which
 * it leaves to the Python code) goes on as the Python method lets it.
 */

static PyObject *rw_py_wait, *rw_py_wait_value, *rw_py_test, *rw_py_waitall, *rw_py_testall,
    *rw_py_waitany, *rw_py_waitsome, *rw_waitsome_rest, *rw_done, *rw_tag_bits, *rw_pickle, *rw_spare,
    *rw_orphans, *rw_reap, *rw_error, *rw_s_native, *rw_s_value, *rw_all, *rw_any,
    *rw_some;                      /* strong, once set up */

/* `fn(first, *args, **kw)` for a method's args (vectorcall form) */
static PyObject *rw_python(PyObject *fn, PyObject *first, PyObject *const *args, Py_ssize_t nargs,
                           PyObject *kwnames)
{
    PyObject *call[8];
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    if (nargs + nkw > 7) {
        PyErr_SetString(PyExc_TypeError, "too many arguments");
        return NULL;
    }
    call[0] = first;
    for (Py_ssize_t i = 0; i < nargs + nkw; i++)
        call[i + 1] = args[i];
    return PyObject_Vectorcall(fn, call, nargs + 1, kwnames);
}

/* The common way applies: no keywords, no status (or None), the request makers registered
 * (rq_ready) */
static int rw_plain(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, Py_ssize_t most)
{
    return rq_ready && (kwnames == NULL || PyTuple_GET_SIZE(kwnames) == 0) && nargs <= most &&
           (nargs < most || args[most - 1] == Py_None);
}

/* `self`'s op where C may read it: a Request or Prequest itself (a subclass may keep `_op`
 * elsewhere, behind a property: the Python method's) whose slot is set (an unset one: the
 * Python method raises AttributeError); NULL else. Borrowed. */
static PyObject *rw_op(PyObject *self)
{
    if (Py_TYPE(self) != rq_req_slots.type && (mw_prequest == NULL || Py_TYPE(self) != mw_prequest))
        return NULL;
    return SLOT_AT(self, rq_req_slots.at[0]);
}

/* The orphans reaped where the completion made some (as the Python methods end): 0, -1 */
static int rw_reaped(void)
{
    if (PyList_GET_SIZE(rw_orphans) == 0)
        return 0;
    PyObject *r = PyObject_CallNoArgs(rw_reap);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

/* Request `self` (its op set) completed by mw_one with the serializer's native loads (a
 * program may set its own), then the orphans reaped: 1 done, 0 not C's (nothing done),
 * -1 an exception. */
static int rw_complete(PyObject *self)
{
    /* (the serializer read only for an object irecv's op, the one mw_settle gives it to:
     * ~3% of a persistent collective's Start + Wait loop, session 47) */
    PyObject *op = SLOT_AT(self, rq_req_slots.at[0]), *native = NULL;
    if (op != NULL && os_slots.ok && Py_TYPE(op) == os_slots.type &&
        (native = PyObject_GetAttr(rw_pickle, rw_s_native)) == NULL)
        return -1;
    int rc = mw_one(self, rw_done, rw_tag_bits, native, rw_spare);
    Py_XDECREF(native);
    return rc == 1 && rw_reaped() < 0 ? -1 : rc;
}

static PyObject *rw_wait(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *op = rw_plain(args, nargs, kwnames, 1) ? rw_op(self) : NULL;
    if (op == NULL)
        return rw_python(rw_py_wait, self, args, nargs, kwnames);
    if (op == Py_None)
        Py_RETURN_TRUE;
    int rc = rw_complete(self);
    if (rc == 0)
        return rw_python(rw_py_wait, self, args, nargs, kwnames);
    return rc < 0 ? NULL : Py_NewRef(Py_True);
}

/* wait(status=None) -> the op's value (mpi4py's lower case: an object irecv's object) */
static PyObject *rw_wait_value(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *op = rw_plain(args, nargs, kwnames, 1) ? rw_op(self) : NULL;
    if (op == NULL)
        return rw_python(rw_py_wait_value, self, args, nargs, kwnames);
    if (op == Py_None)
        Py_RETURN_NONE;
    Py_INCREF(op);                /* (its value is read once it is complete: the request null) */
    int rc = rw_complete(self);
    PyObject *value = rc == 1 ? PyObject_GetAttr(op, rw_s_value) : NULL;
    Py_DECREF(op);
    if (rc == 0)
        return rw_python(rw_py_wait_value, self, args, nargs, kwnames);
    return value;
}

static PyObject *rw_test(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *op = rw_plain(args, nargs, kwnames, 1) ? rw_op(self) : NULL, *held;
    if (op == NULL)
        return rw_python(rw_py_test, self, args, nargs, kwnames);
    if (op == Py_None)
        Py_RETURN_TRUE;
    int rc = mw_settle(self, MW_TEST, rw_done, rw_tag_bits, NULL, NULL, &held);
    if (rc == 1)
        mw_null(self, held);
    if (rc < 0 && PyErr_ExceptionMatches(rw_error)) {
        PyErr_Clear();            /* (the Python way tests again and raises it, translated) */
        rc = 0;
    }
    if (rc < 0)
        return NULL;
    if (rc == 0)
        return rw_python(rw_py_test, self, args, nargs, kwnames);
    if (rc == 2)
        Py_RETURN_FALSE;
    if (rw_reaped() < 0)
        return NULL;
    Py_RETURN_TRUE;
}

/* Waitall(cls, requests[, statuses]) (a classmethod of Request) */
static PyObject *mod_rw_waitall(PyObject *m, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (nargs < 1) {
        PyErr_SetString(PyExc_TypeError, "Waitall(cls, requests, statuses=None)");
        return NULL;
    }
    if (nargs < 2 || !rw_plain(args + 1, nargs - 1, kwnames, 2) ||
        (!PyList_CheckExact(args[1]) && !PyTuple_CheckExact(args[1])))
        return rw_python(rw_py_waitall, args[0], args + 1, nargs - 1, kwnames);
    PyObject *native = PyObject_GetAttr(rw_pickle, rw_s_native);
    if (native == NULL)
        return NULL;
    PyObject *reqs = Py_NewRef(args[1]);
    int list = PyList_CheckExact(reqs), rc = 1;
    for (Py_ssize_t i = 0; rc == 1; i++) {      /* (a list may change while a receive runs) */
        if (i >= (list ? PyList_GET_SIZE(reqs) : PyTuple_GET_SIZE(reqs)))
            break;
        PyObject *r = Py_NewRef(list ? PyList_GET_ITEM(reqs, i) : PyTuple_GET_ITEM(reqs, i));
        rc = mw_one(r, rw_done, rw_tag_bits, native, rw_spare);
        Py_DECREF(r);
    }
    Py_DECREF(reqs);
    Py_DECREF(native);
    if (rc < 0)
        return NULL;
    if (rc == 0)                 /* (the Python way from the start: those done are null) */
        return rw_python(rw_py_waitall, args[0], args + 1, nargs - 1, kwnames);
    if (rw_reaped() < 0)
        return NULL;
    Py_RETURN_TRUE;
}

static PyMethodDef rw_wait_def = {
    "Wait", (PyCFunction)(void (*)(void))rw_wait, METH_FASTCALL | METH_KEYWORDS,
    "Wait($self, /, status=None)\n--\n\nWait for the request to complete; True (in C: _mpi_request_wait.c)"};
static PyMethodDef rw_wait_value_def = {
    "wait", (PyCFunction)(void (*)(void))rw_wait_value, METH_FASTCALL | METH_KEYWORDS,
    "wait($self, /, status=None)\n--\n\nThe operation's value, once complete (in C: _mpi_request_wait.c)"};
static PyMethodDef rw_test_def = {
    "Test", (PyCFunction)(void (*)(void))rw_test, METH_FASTCALL | METH_KEYWORDS,
    "Test($self, /, status=None)\n--\n\nWhether the request is complete (in C: _mpi_request_wait.c)"};
static PyMethodDef rw_waitall_def = {
    "Waitall", (PyCFunction)(void (*)(void))mod_rw_waitall, METH_FASTCALL | METH_KEYWORDS,
    "Waitall(cls, /, requests, statuses=None)\n--\n\nWait for every request; True (in C: _mpi_request_wait.c)"};
#include "_mpi_request_many.c"   /* Testall, Waitany, Waitsome (their defs, used below) */

static PyObject *mod_mpi_request_waits(PyObject *m, PyObject *const *args, Py_ssize_t nargs)
{
    int ok = nargs == 10 && PyType_Check(args[0]) && PyTuple_CheckExact(args[1]) &&
             PyTuple_GET_SIZE(args[1]) == 7 && PyType_Check(args[2]) && PyLong_Check(args[3]) &&
             PyList_CheckExact(args[5]) && PyList_CheckExact(args[6]) && PyCallable_Check(args[7]) &&
             PyType_Check(args[8]) && PyCallable_Check(args[9]);
    for (int i = 0; ok && i < 7; i++)
        ok = PyCallable_Check(PyTuple_GET_ITEM(args[1], i));
    if (!ok) {
        PyErr_SetString(PyExc_TypeError, "mpi_request_waits(request, (py_wait, py_wait_value, py_test, "
                        "py_waitall, py_testall, py_waitany, py_waitsome), done, tag_bits, pickle, spare, "
                        "orphans, reap, error, waitsome_rest)");
        return NULL;
    }
    if (!rq_ready || (PyTypeObject *)args[0] != rq_req_slots.type)
        Py_RETURN_NONE;           /* (the slots these read are Request's, registered first) */
    if (rw_py_wait == NULL) {     /* (once: later calls make the same methods) */
        PyObject **python[7] = {&rw_py_wait, &rw_py_wait_value, &rw_py_test, &rw_py_waitall,
                                &rw_py_testall, &rw_py_waitany, &rw_py_waitsome};
        for (int i = 0; i < 7; i++)
            *python[i] = Py_NewRef(PyTuple_GET_ITEM(args[1], i));
        PyObject **keep[8] = {&rw_done, &rw_tag_bits, &rw_pickle, &rw_spare, &rw_orphans, &rw_reap,
                              &rw_error, &rw_waitsome_rest};
        for (int i = 0; i < 8; i++)
            *keep[i] = Py_NewRef(args[i + 2]);
    }
    PyMethodDef *defs[3] = {&rw_wait_def, &rw_wait_value_def, &rw_test_def};
    PyMethodDef *classmethods[4] = {&rw_waitall_def, &rw_testall_def, &rw_waitany_def, &rw_waitsome_def};
    PyObject *made = PyTuple_New(7);
    for (int i = 0; made != NULL && i < 7; i++) {
        PyObject *f = i < 3 ? PyDescr_NewMethod((PyTypeObject *)args[0], defs[i])
                            : PyCFunction_New(classmethods[i - 3], NULL);
        if (f == NULL)
            Py_CLEAR(made);
        else
            PyTuple_SET_ITEM(made, i, f);
    }
    return made;
}

/* The names the waits read (mw_settle's, these methods'): made once, at the module's init,
 * so every entry that may come first (mpi_wait_native, mpi_test_native, these) has them. */
static int mpi_waits_init(void)
{
    return (s_mw_tag = PyUnicode_InternFromString("tag")) == NULL ||
           (s_mw_nbytes = PyUnicode_InternFromString("nbytes")) == NULL ||
           (rw_s_native = PyUnicode_InternFromString("native")) == NULL ||
           (rw_s_value = PyUnicode_InternFromString("value")) == NULL ||
           (rw_all = PyLong_FromLong(0)) == NULL || (rw_any = PyLong_FromLong(1)) == NULL ||
           (rw_some = PyLong_FromLong(2)) == NULL ? -1 : 0;
}
