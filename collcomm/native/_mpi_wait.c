/* collcomm.MPI's Waitall, Wait, Test and Testall of the common requests in one call
 * (included by _shmcore.c after _mpi_request.c, which registers the Request class, and
 * _p2p_type.c, whose _p2p_mpi.c registers the op of a native Irecv and _p2p_obj_irecv.c
 * that of an object irecv).
 *
 * ``mpi_wait_native(requests, done, tag_bits[, native, spare]) -> n``: ``requests`` a list
 * or tuple; it completes them in order, as MPI/_request.py's Waitall does without
 * statuses, while each is an exact Request whose op is null, a ``done`` (an op complete
 * from the start: sends written at once), a native Irecv's op (MPI/_p2p_ops.py
 * _NativeRecv) whose deferred receive takes its message in C (Deferred.wait's fast way,
 * d_fast: the same checks, the receive's timeout scope among them), or, given the
 * serializer's ``native`` and the ``spare`` buffers, an object irecv's op that obj_wait
 * completes (MPI/_pobj.py _ObjRecv.wait's common case), or a collective's op (WorkOp)
 * whose call the fast call started in two parts (mw_workop: its second part run here);
 * a native Irecv's op gets the tag
 * (``& tag_bits``) and byte count _NativeRecv.wait gives it, and the request is left
 * null. It stops at the first request it cannot complete that way, leaving it as the
 * Python code expects it (obj_wait's declining is its own), and returns how many it
 * completed (0 until the classes are registered): the Python code does the rest from
 * there, raising what it raises. A single Request instead of a sequence: True
 * (completed) or False. An exception only from the receive or ``loads`` itself (anything
 * but collcomm's errors, which the Python code raises with their context).
 *
 * ``mpi_test_native`` (at the end) is the same without waiting: a native receive whose
 * message is there is taken as Deferred.test takes it (own_test, _p2p_own.c).
 */

static PyObject *s_mw_tag, *s_mw_nbytes;   /* (made at the module's init: mpi_waits_init) */
static PyTypeObject *mw_prequest;      /* Prequest (mpi_wait_types): completed as a Request */

/* mpi_wait_types(prequest) -> whether C completes the persistent requests too: the class
 * MPI/_prequest.py registers once, kept if its ``_op`` is Request's slot (its
 * ``_completed`` leaves ``_op`` None, as Request's does: inactive, not null). */
static PyObject *mod_mpi_wait_types(PyObject *m, PyObject *cls)
{
    if (!rq_ready || !PyType_Check(cls) || !PyType_IsSubtype((PyTypeObject *)cls, rq_req_slots.type))
        Py_RETURN_FALSE;
    PyObject *name = PyUnicode_InternFromString("_op");
    Py_ssize_t at = name == NULL ? 0 : plain_slot_offset((PyTypeObject *)cls, name);
    Py_XDECREF(name);
    if (at != rq_req_slots.at[0])
        Py_RETURN_FALSE;
    Py_XSETREF(mw_prequest, (PyTypeObject *)Py_NewRef(cls));
    Py_RETURN_TRUE;
}

/* `op`'s slot at byte offset `off` set to `v` (a new reference, stolen) */
static void mw_set(PyObject *op, Py_ssize_t off, PyObject *v)
{
    PyObject **at = &SLOT_AT(op, off);
    PyObject *old = *at;
    *at = v;
    Py_XDECREF(old);
}

enum { MW_WAIT, MW_TEST };

/* tag & tag_bits (a new reference; NULL with an exception): in C where both are ints of
 * 64 bits, not negative (the message's tag with its context bits above, the common case) */
static PyObject *mw_masked(PyObject *tag, PyObject *tag_bits)
{
    int o1 = 1, o2 = 1;
    long long t = PyLong_CheckExact(tag) ? PyLong_AsLongLongAndOverflow(tag, &o1) : -1;
    long long b = PyLong_CheckExact(tag_bits) ? PyLong_AsLongLongAndOverflow(tag_bits, &o2) : -1;
    if (!o1 && !o2 && t >= 0 && b >= 0)
        return PyLong_FromLongLong(t & b);
    if (PyErr_Occurred())
        return NULL;
    return PyNumber_And(tag, tag_bits);
}

/* Request `r`'s op settled the quick way (``mode`` MW_WAIT: waited for; MW_TEST: only if
 * its message is there, as Deferred.test tries it, own_test), the request itself left as
 * it is: 1 its op complete (or no op: *held NULL), 2 (MW_TEST) not yet, 0 not this way
 * (nothing done), -1 with an exception. *held: a new reference to the op settled (the
 * caller nulls the request if it still holds it: mw_null). */
static int mw_settle(PyObject *r, int mode, PyObject *done, PyObject *tag_bits, PyObject *native,
                     PyObject *spare, PyObject **held)
{
    *held = NULL;
    if (Py_TYPE(r) != rq_req_slots.type && (mw_prequest == NULL || Py_TYPE(r) != mw_prequest))
        return 0;
    PyObject *op = SLOT_AT(r, rq_req_slots.at[0]);
    if (op == NULL || op == Py_None)
        return 1;
    if ((PyObject *)Py_TYPE(op) == done) {
        *held = Py_NewRef(op);
        return 1;
    }
    if (Py_TYPE(op) == rq_op_slots.type) {      /* a collective's (rq_ready: r is a Request) */
        Py_INCREF(op);
        int rc = mw_workop(op, mode == MW_TEST);
        if (rc == 1)
            *held = op;
        else
            Py_DECREF(op);
        return rc;
    }
    if (mode == MW_WAIT && native != NULL && os_slots.ok && Py_TYPE(op) == os_slots.type) {
        Py_INCREF(op);                  /* (an object irecv: loads runs Python code) */
        PyObject *call[3] = {op, native, spare};
        PyObject *got = mod_obj_wait(NULL, call, 3);
        int rc = got == NULL ? -1 : got == Py_True;
        Py_XDECREF(got);
        if (rc == 1)
            *held = op;
        else
            Py_DECREF(op);
        return rc;
    }
    if (m_op_slots.type == NULL || !m_op_slots.ok || Py_TYPE(op) != m_op_slots.type)
        return 0;
    /* the op, and its slots' offsets, held: the receive may let the GIL go and run Python
     * code (another mpi_irecv could register another class meanwhile) */
    Py_ssize_t at_h = m_op_slots.at[1], at_done = m_op_slots.at[2], at_tag = m_op_slots.at[4],
               at_nbytes = m_op_slots.at[5];
    Py_INCREF(op);
    int rc = 1;
    if (SLOT_AT(op, at_done) != Py_True) {      /* not _done */
        PyObject *h = SLOT_AT(op, at_h);
        int work = h == NULL || !PyObject_TypeCheck(h, &DeferredType) ? 1 : d_is_work((Deferred *)h);
        if (work != 0) {                 /* (the Python code's way, whatever it finds) */
            rc = work < 0 ? -1 : 0;
            goto out;
        }
        Deferred *d = (Deferred *)Py_NewRef(h);
        if (mode == MW_TEST && d_none(d->status)) {       /* nothing received yet: try */
            int t = d->f != NULL && Py_TYPE(d->f) == &P2PType ? own_test((P2P *)d->f, d) : 2;
            rc = t < 0 ? -1 : t == 0 ? 2 : t == 2 || d_none(d->status) ? 0 : 1;
        }                                /* (1: received; posted, or not C's: Python's) */
        PyObject *st = rc == 1 ? d_fast(d) : NULL;
        Py_DECREF(d);
        if (rc != 1)
            goto out;
        if (st == NULL) {
            rc = PyErr_Occurred() ? -1 : 0;
            goto out;
        }
        PyObject *tag, *nbytes;
        if (Py_TYPE(st) == status_slots.type && status_slots.ok && SLOT_AT(st, status_slots.at[2]) &&
            SLOT_AT(st, status_slots.at[1])) {   /* (p2p_status's: its slots read) */
            tag = Py_NewRef(SLOT_AT(st, status_slots.at[2]));
            nbytes = Py_NewRef(SLOT_AT(st, status_slots.at[1]));
        } else {
            tag = PyObject_GetAttr(st, s_mw_tag);
            nbytes = tag == NULL ? NULL : PyObject_GetAttr(st, s_mw_nbytes);
        }
        PyObject *masked = tag == NULL || nbytes == NULL ? NULL : mw_masked(tag, tag_bits);
        Py_DECREF(st);
        Py_XDECREF(tag);
        if (masked == NULL) {
            Py_XDECREF(nbytes);
            rc = -1;
            goto out;
        }
        mw_set(op, at_tag, masked);
        mw_set(op, at_nbytes, nbytes);
        mw_set(op, at_done, Py_NewRef(Py_True));
    }
out:
    if (rc == 1)
        *held = op;
    else
        Py_DECREF(op);
    return rc;
}

/* Request `r` left null if it still holds `op` (the reference mw_settle gave, dropped) */
static void mw_null(PyObject *r, PyObject *op)
{
    if (op == NULL)
        return;
    PyObject **slot = &SLOT_AT(r, rq_req_slots.at[0]);
    if (*slot == op) {
        *slot = Py_NewRef(Py_None);
        Py_DECREF(op);                   /* (the request's reference) */
    }
    rq_op_drop(op);                      /* (a collective's WorkOp: kept for the next Start) */
}

/* Complete request `r` the quick way: 1 done, 0 not this way (nothing done), -1 error. */
static int mw_one(PyObject *r, PyObject *done, PyObject *tag_bits, PyObject *native,
                  PyObject *spare)
{
    PyObject *held;
    int rc = mw_settle(r, MW_WAIT, done, tag_bits, native, spare, &held);
    if (rc == 1)
        mw_null(r, held);
    return rc;
}

static PyObject *mod_mpi_wait_native(PyObject *m, PyObject *const *args, Py_ssize_t nargs)
{
    if ((nargs != 3 && nargs != 5) || !PyType_Check(args[1]) || !PyLong_Check(args[2]) ||
        (nargs == 5 && !PyList_CheckExact(args[4]))) {
        PyErr_SetString(PyExc_TypeError, "mpi_wait_native(requests, done, tag_bits[, native, spare])");
        return NULL;
    }
    PyObject *reqs = args[0], *native = nargs == 5 ? args[3] : NULL, *spare = nargs == 5 ? args[4] : NULL;
    int list = PyList_CheckExact(reqs);
    if (!list && !PyTuple_CheckExact(reqs)) {       /* one Request: True or False */
        int rc = rq_ready ? mw_one(reqs, args[1], args[2], native, spare) : 0;
        return rc < 0 ? NULL : Py_NewRef(rc ? Py_True : Py_False);
    }
    if (!rq_ready)
        return PyLong_FromLong(0);
    Py_ssize_t i = 0;
    Py_INCREF(reqs);
    for (;; i++) {                       /* (a list may change while a receive runs) */
        Py_ssize_t n = list ? PyList_GET_SIZE(reqs) : PyTuple_GET_SIZE(reqs);
        if (i >= n)
            break;
        PyObject *r = list ? PyList_GET_ITEM(reqs, i) : PyTuple_GET_ITEM(reqs, i);
        Py_INCREF(r);
        int rc = mw_one(r, args[1], args[2], native, spare);
        Py_DECREF(r);
        if (rc < 0) {
            Py_DECREF(reqs);
            return NULL;
        }
        if (rc == 0)
            break;
    }
    Py_DECREF(reqs);
    return PyLong_FromSsize_t(i);
}

/* Testany / Waitany's test of a list or tuple (``some`` 0): (i, op) for the first request
 * C completes (left null), else False (every active one is C's and has nothing yet) or
 * None (some are not C's: the Python code tests them all). Testsome / Waitsome's
 * (``some`` 1): ([(i, op) for every request C completed now, left null], whether every
 * active one was C's: if not, the Python code tests the others, still active); the
 * requests are left null only once the whole scan went through: an exception midway
 * (the receive's, or Ctrl-C in Python code it ran) leaves every request active, the ops
 * C completed complete in themselves, as a test leaves them (nothing lost). */
static PyObject *mw_test_any(PyObject *reqs, int list, PyObject *done, PyObject *tag_bits, int some)
{
    PyObject *result = Py_False, *held, *pairs = some ? PyList_New(0) : NULL;
    if (some && pairs == NULL)
        return NULL;
    Py_INCREF(reqs);
    for (Py_ssize_t i = 0;; i++) {
        Py_ssize_t n = list ? PyList_GET_SIZE(reqs) : PyTuple_GET_SIZE(reqs);
        if (i >= n)
            break;
        PyObject *r = Py_NewRef(list ? PyList_GET_ITEM(reqs, i) : PyTuple_GET_ITEM(reqs, i));
        int rc = mw_settle(r, MW_TEST, done, tag_bits, NULL, NULL, &held);
        if (rc == 1 && held != NULL && !some) {  /* Testany: this one, left null now */
            PyObject *pair = Py_BuildValue("nO", i, held);
            if (pair != NULL)
                mw_null(r, held);
            else
                Py_DECREF(held);
            Py_DECREF(r);
            Py_DECREF(reqs);
            return pair;
        }
        if (rc == 1 && held != NULL) {           /* (a null request is not one completed) */
            PyObject *t = Py_BuildValue("nOO", i, held, r);   /* (the request: nulled after) */
            Py_DECREF(held);
            if (t == NULL || PyList_Append(pairs, t) < 0) {
                Py_XDECREF(t);
                Py_DECREF(r);
                Py_DECREF(reqs);
                Py_DECREF(pairs);
                return NULL;
            }
            Py_DECREF(t);
        }
        Py_DECREF(r);
        if (rc < 0) {
            Py_DECREF(reqs);
            Py_XDECREF(pairs);
            return NULL;
        }
        if (rc == 0)
            result = Py_None;
    }
    Py_DECREF(reqs);
    if (!some)
        return Py_NewRef(result);
    /* the scan went through: the answer [(i, op)] made first, then each request left
     * null (an out-of-memory failure nulls nothing: nothing lost) */
    Py_ssize_t count = PyList_GET_SIZE(pairs);
    PyObject *out = PyList_New(count);
    for (Py_ssize_t k = 0; out != NULL && k < count; k++) {
        PyObject *t = PyList_GET_ITEM(pairs, k);
        PyObject *pair = PyTuple_Pack(2, PyTuple_GET_ITEM(t, 0), PyTuple_GET_ITEM(t, 1));
        if (pair == NULL)
            Py_CLEAR(out);
        else
            PyList_SET_ITEM(out, k, pair);
    }
    for (Py_ssize_t k = 0; out != NULL && k < count; k++) {
        PyObject *t = PyList_GET_ITEM(pairs, k);
        mw_null(PyTuple_GET_ITEM(t, 2), Py_NewRef(PyTuple_GET_ITEM(t, 1)));
    }
    Py_DECREF(pairs);
    if (out == NULL)
        return NULL;
    pairs = out;
    return Py_BuildValue("NO", pairs, result == Py_None ? Py_False : Py_True);
}

/* ``mpi_test_native(requests, done, tag_bits[, how]) -> True | False | None``: Test (one
 * Request) or Testall (a list or tuple) of the same requests without waiting: True, every
 * one complete and left null; False, one has nothing yet (the native receives whose
 * message came are complete in their ops, as Deferred.test leaves them, their requests
 * still active); None, one is not C's (an object irecv, a collective's, a receive the
 * engine holds, another class...): the Python code decides, from the ops' states.
 * ``how`` (a list or tuple): 0 that (Testall), 1 Testany's test, 2 Testsome's (mw_test_any). */
static PyObject *mod_mpi_test_native(PyObject *m, PyObject *const *args, Py_ssize_t nargs)
{
    if ((nargs != 3 && nargs != 4) || !PyType_Check(args[1]) || !PyLong_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "mpi_test_native(requests, done, tag_bits[, how])");
        return NULL;
    }
    PyObject *reqs = args[0], *held;
    if (!rq_ready)
        Py_RETURN_NONE;
    int list = PyList_CheckExact(reqs);
    if (!list && !PyTuple_CheckExact(reqs)) {
        int rc = mw_settle(reqs, MW_TEST, args[1], args[2], NULL, NULL, &held);
        if (rc == 1)
            mw_null(reqs, held);
        return rc < 0 ? NULL : Py_NewRef(rc == 1 ? Py_True : rc == 2 ? Py_False : Py_None);
    }
    long how = nargs == 4 ? PyLong_AsLong(args[3]) : 0;      /* 0 all, 1 any, 2 some */
    if (how == -1 && PyErr_Occurred())
        return NULL;
    if (how < 0 || how > 2) {
        PyErr_SetString(PyExc_ValueError, "mpi_test_native: how must be 0 (all), 1 (any) or 2 (some)");
        return NULL;
    }
    if (how == 1 || how == 2)
        return mw_test_any(reqs, list, args[1], args[2], how == 2);
    Py_INCREF(reqs);
    PyObject *result = Py_True, *settled = PyList_New(0);   /* [(request, op)] */
    if (settled == NULL)
        result = NULL;
    for (Py_ssize_t i = 0; result == Py_True; i++) {   /* every op settled first (a list may change) */
        Py_ssize_t n = list ? PyList_GET_SIZE(reqs) : PyTuple_GET_SIZE(reqs);
        if (i >= n)
            break;
        PyObject *r = Py_NewRef(list ? PyList_GET_ITEM(reqs, i) : PyTuple_GET_ITEM(reqs, i));
        int rc = mw_settle(r, MW_TEST, args[1], args[2], NULL, NULL, &held);
        if (rc == 1 && held != NULL) {
            PyObject *t = PyTuple_Pack(2, r, held);
            if (t == NULL || PyList_Append(settled, t) < 0)
                rc = -1;
            Py_XDECREF(t);
        }
        Py_XDECREF(held);
        Py_DECREF(r);
        if (rc != 1)
            result = rc < 0 ? NULL : rc == 2 ? Py_False : Py_None;
    }
    for (Py_ssize_t k = 0; result == Py_True && k < PyList_GET_SIZE(settled); k++) {
        PyObject *t = PyList_GET_ITEM(settled, k);      /* all complete: each request null */
        mw_null(PyTuple_GET_ITEM(t, 0), Py_NewRef(PyTuple_GET_ITEM(t, 1)));  /* (if it still holds that op) */
    }
    Py_XDECREF(settled);
    Py_DECREF(reqs);
    return result == NULL ? NULL : Py_NewRef(result);
}
