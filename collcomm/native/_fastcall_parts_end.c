/* Small asynchronous collectives in two parts, their end (included by _fastcall.c after
 * _fastcall_parts.c, which starts them): the queued second part finished on the thread
 * that waits for or tests its Work (part_finish_here), and the Work marked done here when
 * nobody waits on it and it has no callback (part_done; else Work._finish does it).
 */

/* lock.acquire(False) (`acquire`: the lock's, see _cmethod.c; directly where it is a plain
 * RLock or Lock: _thread_locks.c): 1 taken, 0 busy, -1 error */
static int try_lock(CMethod *acquire, PyObject *lock)
{
    TRLock *rl = rlock_direct(lock);
    if (rl != NULL)
        return rlock_take(rl);
    TLock *tl = tlock_direct(lock);
    if (tl != NULL)
        return tlock_take(tl);
    PyObject *r = cmethod_call(acquire, lock, Py_False);
    if (r == NULL)
        return -1;
    int got = r == Py_True;
    Py_DECREF(r);
    return got;
}

/* lock.locked() (`locked`: its method; read directly from a plain Lock): 1, 0, -1 error */
static int lock_held(CMethod *locked, PyObject *lock)
{
    int held = tlock_held(lock);
    if (held != -2)
        return held;
    PyObject *r = cmethod_call(locked, lock, NULL);
    if (r == NULL)
        return -1;
    held = r != Py_False;
    Py_DECREF(r);
    return held;
}

/* group._pending = value: straight into its slot where its class is the one set_async
 * found the slot of (ProcessGroup's __slots__), else by setattr */
static int set_pending(Fast *s, PyObject *group, PyObject *value)
{
    if (s->pending_at <= 0 || (PyObject *)Py_TYPE(group) != s->pending_type)
        return PyObject_SetAttr(group, s_pending, value);
    PyObject **at = (PyObject **)((char *)group + s->pending_at);
    PyObject *old = *at;
    *at = Py_NewRef(value);
    Py_XDECREF(old);
    return 0;
}

static int unlock(CMethod *release, PyObject *lock)
{
    TRLock *rl = rlock_direct(lock);
    if (rl != NULL)
        return rlock_give(rl);
    TLock *tl = tlock_direct(lock);
    if (tl != NULL && tl->locked) {
        tlock_give(tl);
        return 0;
    }
    PyObject *r = cmethod_call(release, lock, NULL);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

/* work.done = True with its result or error, as Work._finish sets them, where nobody can
 * be waiting on it or have added a callback (else 0: Work._finish must run). 1 done.
 * Not by taking the Work's lock but by finding it free (lock.locked()): this thread holds
 * the GIL from that look to the last store, runs no Python code in between, and nobody
 * takes a free lock without the GIL, so nobody is inside Work's `with self._lock` blocks
 * meanwhile (taking and releasing it cost ~1.2k instructions a call). */
static int part_done(Fast *s, PyObject *work, PyObject *exc)
{
    int busy = lock_held(&s->work_locked, WORK_SLOT(s, work, W_LOCK));
    if (busy < 0)
        return -1;
    if (busy)
        return 0;
    int plain = WORK_SLOT(s, work, W_CALLBACKS) == Py_None && WORK_SLOT(s, work, W_EVENT) == Py_None;
    if (plain) {
        PyObject *old_exc = WORK_SLOT(s, work, W_EXC), *old_done = WORK_SLOT(s, work, W_DONE);
        WORK_SLOT(s, work, W_EXC) = Py_NewRef(exc != NULL ? exc : Py_None);
        WORK_SLOT(s, work, W_DONE) = Py_NewRef(Py_True);
        Py_XDECREF(old_exc);       /* (only now: a dealloc may run Python code) */
        Py_XDECREF(old_done);
    }
    return plain;
}

/* Finish `work`'s call (started in two parts) on this thread, its error, if any, left in
 * it for Work.wait to raise: what AsyncCalls.run_through(work) and ProcessGroup._settled
 * do, without their Python frames. `test`: only if every rank has arrived (the second part
 * then waits for nothing). 1 finished; 0 not here (another call is before it, another
 * thread runs the queue, or, testing, a rank has not arrived); -1 an exception. */
static int part_finish_here(Fast *s, PyObject *work, int test)
{
    if (s->part_work != work || s->async_items == NULL)
        return 0;
    Py_ssize_t queued = PyObject_Length(s->async_items);
    if (queued < 1)
        return queued < 0 ? -1 : 0;
    if (test) {
        Core *c = (Core *)s->core;    /* our counter is still the started call's target */
        if (first_late(c, get(c, c->rank, c->w_counter), 0) >= 0)
            return 0;
    }
    PyObject *head = PySequence_GetItem(s->async_items, 0);
    if (head == NULL)
        return -1;
    int ours = PyTuple_Check(head) && PyTuple_GET_SIZE(head) == 2 && PyTuple_GET_ITEM(head, 0) == work;
    Py_DECREF(head);
    int got = ours ? try_lock(&s->exec_acquire, s->exec_lock) : 0;
    if (got <= 0)
        return got;
    /* our own references: the queue's and part_work's go below, and a callback the Work
     * runs may close the group (Fast_clear) */
    PyObject *items = Py_NewRef(s->async_items), *exec_lock = Py_NewRef(s->exec_lock),
             *group_lock = Py_NewRef(s->group_lock), *group = Py_NewRef(s->group);
    Py_INCREF(work);
    PyObject *item = cmethod_call(&s->items_popleft, items, NULL);
    if (item != NULL)
        part_item_spare(s, item);
    PyObject *r = item == NULL ? NULL : Fast_finish_part(s, NULL);
    PyObject *type = NULL, *exc = NULL, *tb = NULL;
    if (r == NULL) {
        PyErr_Fetch(&type, &exc, &tb);
        PyErr_NormalizeException(&type, &exc, &tb);
        if (tb != NULL)
            PyException_SetTraceback(exc, tb);
    }
    Py_XDECREF(r);
    int plain = part_done(s, work, exc);
    if (plain > 0 && exc == NULL && s->work_type != NULL)
        Py_XSETREF(s->spare_work, Py_NewRef(work));   /* (made again by the next call if free) */
    if (plain == 0) {              /* a waiter or callbacks: Work._finish(None, exc) */
        PyObject *fin = PyObject_CallMethod(work, "_finish", "OO", Py_None, exc != NULL ? exc : Py_None);
        plain = fin == NULL ? -1 : 1;
        Py_XDECREF(fin);
    }
    /* the queue empty: the group's fast call takes blocking calls again (ProcessGroup._settled,
     * under the group's lock: left to the next drain if another thread holds it). Not by
     * taking the lock but by finding it free (lock.locked()), as part_done does: this
     * thread holds the GIL from that look to the last store and runs no Python code in
     * between (a plain attribute), so nobody is inside a `with group._lock` block meanwhile */
    if (plain > 0 && PyObject_Length(items) == 0) {
        int held = lock_held(&s->group_locked, group_lock);
        if (held < 0) {
            plain = -1;
        } else if (!held && PyObject_Length(items) == 0 && s->work_type != NULL) {
            if (set_pending(s, group, Py_False) == 0)
                s->paused = 0;
            else
                plain = -1;
        }
    }
    if (plain < 0 && !PyErr_Occurred())
        PyErr_SetString(PyExc_RuntimeError, "collcomm fast call: finishing a call failed");
    int bad = unlock(&s->exec_release, exec_lock) < 0 || plain < 0;
    Py_DECREF(work);
    Py_DECREF(items);
    Py_DECREF(exec_lock);
    Py_DECREF(group_lock);
    Py_DECREF(group);
    int interrupt = exc != NULL && !PyErr_GivenExceptionMatches(exc, PyExc_Exception);
    if (interrupt && !bad) {       /* Ctrl-C in the wait: recorded, and raised (Work._run) */
        PyErr_Restore(type, exc, tb);
        return -1;
    }
    Py_XDECREF(type);
    Py_XDECREF(exc);
    Py_XDECREF(tb);
    return bad ? -1 : 1;
}

/* wait_part(work) -> True: `work`'s call (in two parts) finished here; False: not here
 * (Work.wait takes the queue's way). */
static PyObject *Fast_wait_part(Fast *s, PyObject *work)
{
    int done = part_finish_here(s, work, 0);
    return done < 0 ? NULL : Py_NewRef(done ? Py_True : Py_False);
}

/* test_part(work) -> True: finished here (every rank had arrived); False: its call is in
 * two parts and not finished (nobody needs to run anything for it to progress: polling
 * again will do); None: not such a call (Work.is_completed hands it to the worker). */
static PyObject *Fast_test_part(Fast *s, PyObject *work)
{
    if (s->part_work != work)
        Py_RETURN_NONE;
    int done = part_finish_here(s, work, 1);
    return done < 0 ? NULL : Py_NewRef(done ? Py_True : Py_False);
}

/* part_age() -> seconds since the pending call in two parts started, or -1.0: none
 * (the worker leaves it to its caller for a while: core/async_calls.py PART_GRACE).
 * (Tried, session 43: timing it from the worker's first look, to spare the start its
 * clock read; an idle worker polls every 4 ms and a watcher looks twice first, so the
 * safety net came up to ~4 ms later: reverted.) */
static PyObject *Fast_part_age(Fast *s, PyObject *unused)
{
    return PyFloat_FromDouble(s->part_work == NULL ? -1.0 : rec_now() - s->part_since);
}
