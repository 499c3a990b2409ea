/* collcomm.MPI's Waitall (and Wait) of the common requests in one call (included by
 * _shmcore.c after _mpi_request.c, which registers the Request class, and _p2p_type.c,
 * whose _p2p_mpi.c registers the op of a native Irecv and _p2p_obj_irecv.c that of an
 * object irecv).
 *
 * ``mpi_wait_native(requests, done, tag_bits[, native, spare]) -> n``: ``requests`` a list
 * or tuple; it completes them in order, as MPI/_request.py's Waitall does without
 * statuses, while each is an exact Request whose op is null, a ``done`` (an op complete
 * from the start: sends written at once), a native Irecv's op (MPI/_p2p_ops.py
 * _NativeRecv) whose deferred receive takes its message in C (Deferred.wait's fast way,
 * d_fast: the same checks, the receive's timeout scope among them), or, given the
 * serializer's ``native`` and the ``spare`` buffers, an object irecv's op that obj_wait
 * completes (MPI/_pobj.py _ObjRecv.wait's common case); a native Irecv's op gets the tag
 * (``& tag_bits``) and byte count _NativeRecv.wait gives it, and the request is left
 * null. It stops at the first request it cannot complete that way, leaving it as the
 * Python code expects it (obj_wait's declining is its own), and returns how many it
 * completed (0 until the classes are registered): the Python code does the rest from
 * there, raising what it raises. A single Request instead of a sequence: True
 * (completed) or False. An exception only from the receive or ``loads`` itself (anything
 * but collcomm's errors, which the Python code raises with their context).
 */

static PyObject *s_mw_tag, *s_mw_nbytes;

/* `op`'s slot at byte offset `off` set to `v` (a new reference, stolen) */
static void mw_set(PyObject *op, Py_ssize_t off, PyObject *v)
{
    PyObject **at = &SLOT_AT(op, off);
    PyObject *old = *at;
    *at = v;
    Py_XDECREF(old);
}

/* Complete request `r` the quick way: 1 done, 0 not this way (nothing done), -1 error. */
static int mw_one(PyObject *r, PyObject *done, PyObject *tag_bits, PyObject *native,
                  PyObject *spare)
{
    if (Py_TYPE(r) != rq_req_slots.type)
        return 0;
    PyObject **slot = &SLOT_AT(r, rq_req_slots.at[0]);
    PyObject *op = *slot;
    if (op == NULL || op == Py_None)
        return 1;
    if ((PyObject *)Py_TYPE(op) == done) {
        *slot = Py_NewRef(Py_None);
        Py_DECREF(op);
        return 1;
    }
    if (native != NULL && os_slots.ok && Py_TYPE(op) == os_slots.type) {   /* an object irecv */
        Py_INCREF(op);
        PyObject *call[3] = {op, native, spare};
        PyObject *got = mod_obj_wait(NULL, call, 3);
        int rc = got == NULL ? -1 : got == Py_True;
        Py_XDECREF(got);
        PyObject **at = &SLOT_AT(r, rq_req_slots.at[0]);
        if (rc == 1 && *at == op) {
            *at = Py_NewRef(Py_None);
            Py_DECREF(op);
        }
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
    int rc = 0;
    if (SLOT_AT(op, at_done) != Py_True) {      /* not _done */
        PyObject *h = SLOT_AT(op, at_h);
        int work = h == NULL || !PyObject_TypeCheck(h, &DeferredType) ? 1 : d_is_work((Deferred *)h);
        if (work != 0) {                 /* (the Python code's way, whatever it finds) */
            rc = work < 0 ? -1 : 0;
            goto out;
        }
        Py_INCREF(h);
        PyObject *st = d_fast((Deferred *)h);
        Py_DECREF(h);
        if (st == NULL) {
            rc = PyErr_Occurred() ? -1 : 0;
            goto out;
        }
        PyObject *tag = PyObject_GetAttr(st, s_mw_tag);
        PyObject *nbytes = tag == NULL ? NULL : PyObject_GetAttr(st, s_mw_nbytes);
        PyObject *masked = nbytes == NULL ? NULL : PyNumber_And(tag, tag_bits);
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
    slot = &SLOT_AT(r, rq_req_slots.at[0]);   /* (read again: Python code may have run) */
    if (*slot == op) {
        *slot = Py_NewRef(Py_None);
        Py_DECREF(op);                   /* (the request's reference) */
    }
    rc = 1;
out:
    Py_DECREF(op);
    return rc;
}

static PyObject *mod_mpi_wait_native(PyObject *m, PyObject *const *args, Py_ssize_t nargs)
{
    if ((nargs != 3 && nargs != 5) || !PyType_Check(args[1]) || !PyLong_Check(args[2]) ||
        (nargs == 5 && !PyList_CheckExact(args[4]))) {
        PyErr_SetString(PyExc_TypeError, "mpi_wait_native(requests, done, tag_bits[, native, spare])");
        return NULL;
    }
    if (s_mw_nbytes == NULL) {           /* (both names, or neither: tried again) */
        if (s_mw_tag == NULL && (s_mw_tag = PyUnicode_InternFromString("tag")) == NULL)
            return NULL;
        if ((s_mw_nbytes = PyUnicode_InternFromString("nbytes")) == NULL)
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
