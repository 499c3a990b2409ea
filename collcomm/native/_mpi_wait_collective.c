/* collcomm.MPI's waits and tests of a collective's request (included by _shmcore.c after
 * _mpi_request.c, whose WorkOp and Request slots it uses, and _fastcall.c, whose two-part
 * calls it finishes; before _mpi_wait.c, whose mw_settle calls it).
 *
 * An ``I…`` collective or a persistent collective's ``Start`` that the fast call started
 * in two parts (native/_fastcall_parts.c) leaves a Request holding a WorkOp holding the
 * call's Work; waiting for it, or testing it, runs the call's second part
 * (part_finish_here), as Request.Wait's Python way (Fast.wait_part) and Work.is_completed
 * (Fast.test_part) do. Here it runs inside mpi_wait_native / mpi_test_native, so a Test
 * loop of such a request, or a Waitall of one beside point-to-point requests, is one C
 * call; anything else about a collective's request is left to the Python code.
 */

/* WorkOp `op` (a non-blocking or persistent collective's), its call started in two parts
 * by the fast call (_fastcall_parts.c), settled as Request.Wait (`test` 0) or
 * Work.is_completed (`test` 1) settle it, without their frames: its second part run here
 * (part_finish_here; testing, only once every rank has arrived), the op then marked done.
 * 1 complete (done before, or now, without an error), 2 (testing) not yet, 0 the Python
 * code's (a `finish` to run, another kind of Work, the call still queued behind another
 * or failed: Work.wait raises its error), -1 an exception (Ctrl-C in the wait). */
static PyObject *s_mw_fast;

static int mw_workop(PyObject *op, int test)
{
    if (SLOT_AT(op, rq_op_slots.at[2]) == Py_True)           /* _done */
        return 1;
    PyObject *work = SLOT_AT(op, rq_op_slots.at[0]);
    if (SLOT_AT(op, rq_op_slots.at[1]) != Py_None || fc_work_type == NULL || work == NULL ||
        Py_TYPE(work) != fc_work_type)
        return 0;
    PyObject *group = *(PyObject **)((char *)work + fc_work_group_at);
    if (group == NULL || group == Py_None)
        return 0;
    if (s_mw_fast == NULL && (s_mw_fast = PyUnicode_InternFromString("fast")) == NULL)
        return -1;
    Py_INCREF(op);                /* (the second part lets the GIL go and may run Python code) */
    Py_INCREF(work);
    Fast *hint = fc_wait_hint;    /* (group.fast, where the hint's pending call is this one) */
    PyObject *fast = hint != NULL && hint->part_work == work && hint->group == group
                         ? Py_NewRef((PyObject *)hint) : PyObject_GetAttr(group, s_mw_fast);
    int rc = fast == NULL ? -1 : 0;
    if (fast != NULL && Py_TYPE(fast) == &FastType &&
        ((Fast *)fast)->work_type == (PyObject *)fc_work_type) {
        Fast *s = (Fast *)fast;
        fc_wait_hint = s;
        int finished = 1;
        if (WORK_SLOT(s, work, W_DONE) != Py_True) {
            finished = s->part_work != work ? 0 : part_finish_here(s, work, test);
            if (finished == 0 && test && s->part_work == work)
                rc = 2;           /* (Fast.test_part's False: nothing to run for it meanwhile) */
        }
        if (finished < 0)
            rc = -1;
        else if (finished > 0 && WORK_SLOT(s, work, W_DONE) == Py_True &&
                 WORK_SLOT(s, work, W_EXC) == Py_None) {
            PyObject **at = &SLOT_AT(op, rq_op_slots.at[2]), *old = *at;
            *at = Py_NewRef(Py_True);
            Py_XDECREF(old);
            rc = 1;
        }
    }
    Py_XDECREF(fast);
    Py_DECREF(work);
    Py_DECREF(op);
    return rc;
}

