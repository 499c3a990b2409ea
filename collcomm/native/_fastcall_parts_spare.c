/* What a call in two parts makes again instead of anew (included by _fastcall_parts.c, whose
 * WORK_SLOT and W_ slots it uses): its Work (the last one finished here, s->spare_work,
 * where nobody else holds it: part_work) and its queue item ``(work, finish_bound)``
 * (s->spare_item: part_item, part_item_spare). A loop of non-blocking or persistent calls,
 * each waited for, allocates neither (with the request's op kept by the C waits,
 * _mpi_request.c rq_op_drop, ~0.5 µs of a persistent Start + Wait, session 47).
 */

/* Does nobody refer to `o` weakly? A list at tp_weaklistoffset, none while it is NULL. From
 * Python 3.12 a class with __weakref__ in its __slots__ keeps it before the object (a
 * managed weakref: tp_weaklistoffset -4 pointers), where CPython's own _PyObject_GET_
 * WEAKREFS_LISTPTR reads it at that same offset. (Until session 43 a Work was never made
 * again there: every call in two parts allocated a Work and a lock on 3.12/3.13, ~0.2 us
 * of a persistent Bcast's Start + Wait.) Also the C waits' spare op's test (_mpi_request.c). */
static inline int no_weakrefs(PyObject *o)
{
    Py_ssize_t at = Py_TYPE(o)->tp_weaklistoffset;
    return at == 0 || *(PyObject **)((char *)o + at) == NULL;
}

/* Can the spare Work `w` be made again? Only this Fast holds it and its lock (so nobody
 * waits on it, holds its lock or can see it change), nobody refers to it weakly, and it
 * ended as part_done leaves a call that nobody waited on (no event, no callbacks). */
static int spare_free(Fast *s, PyObject *w)
{
#ifdef Py_GIL_DISABLED
    return 0;        /* (no GIL: a reference count of 1 proves nothing without it) */
#endif
    if (Py_REFCNT(w) != 1 || Py_TYPE(w) != (PyTypeObject *)s->work_type || !no_weakrefs(w))
        return 0;
    PyObject *lock = WORK_SLOT(s, w, W_LOCK);
    return lock != NULL && Py_REFCNT(lock) == 1 && WORK_SLOT(s, w, W_DONE) == Py_True &&
           WORK_SLOT(s, w, W_EVENT) == Py_None && WORK_SLOT(s, w, W_CALLBACKS) == Py_None;
}

/* A Work of work_type as Work.__init__(name, group) leaves it (_started True: its first
 * part runs now), its tag None until set; only C code runs. The spare Work (the last one
 * finished here, s->spare_work) is made again when nobody else holds it: a loop of
 * non-blocking or persistent calls, each waited for, allocates no Work nor lock. */
static PyObject *part_work(Fast *s, PyObject *name)
{
    PyObject *w = s->spare_work;
    if (w != NULL && spare_free(s, w)) {
        s->spare_work = NULL;                /* (its reference is the caller's now) */
        PyObject *v[W_N] = {name, s->group, Py_None, Py_True, NULL, Py_False, Py_None, Py_None,
                            Py_None, Py_None};
        PyObject *old[W_N] = {NULL};
        for (int i = 0; i < W_N; i++) {
            if (i == W_LOCK)
                continue;
            old[i] = WORK_SLOT(s, w, i);
            WORK_SLOT(s, w, i) = Py_NewRef(v[i]);
        }
        for (int i = 0; i < W_N; i++)          /* (only now: a dealloc may run Python code) */
            Py_XDECREF(old[i]);
        return w;
    }
    PyObject *lock = PyObject_CallNoArgs(s->lock_type);
    if (lock == NULL)
        return NULL;
    PyTypeObject *t = (PyTypeObject *)s->work_type;
    w = t->tp_alloc(t, 0);
    if (w == NULL) {
        Py_DECREF(lock);
        return NULL;
    }
    PyObject *v[W_N] = {name, s->group, Py_None, Py_True, lock, Py_False, Py_None, Py_None,
                        Py_None, Py_None};
    for (int i = 0; i < W_N; i++)
        WORK_SLOT(s, w, i) = i == W_LOCK ? lock : Py_NewRef(v[i]);
    return w;
}

/* The queue's item (work, finish_bound) for `work`: the spare one made again (part_item_
 * spare), else a new tuple; NULL with an exception */
static PyObject *part_item(Fast *s, PyObject *work)
{
    PyObject *item = s->spare_item;
    if (item == NULL)
        return PyTuple_Pack(2, work, s->finish_bound);
    s->spare_item = NULL;
    PyObject *old = PyTuple_GET_ITEM(item, 0);
    PyTuple_SET_ITEM(item, 0, Py_NewRef(work));
    Py_DECREF(old);                /* (None) */
    if (!PyObject_GC_IsTracked(item))
        PyObject_GC_Track(item);   /* (the collector may untrack a tuple of None and a method) */
    return item;
}

/* The queue's item `item` (a reference the caller gives up), popped: kept as the spare
 * where it is (work, finish_bound) and nobody else holds it (its Work let go, None in
 * its place), else released. Tuples are immutable to Python code; only this code sees
 * the spare. */
static void part_item_spare(Fast *s, PyObject *item)
{
#ifndef Py_GIL_DISABLED
    if (s->spare_item == NULL && s->finish_bound != NULL && PyTuple_CheckExact(item) &&
        Py_REFCNT(item) == 1 && PyTuple_GET_SIZE(item) == 2 &&
        PyTuple_GET_ITEM(item, 1) == s->finish_bound) {
        PyObject *old = PyTuple_GET_ITEM(item, 0);
        PyTuple_SET_ITEM(item, 0, Py_NewRef(Py_None));
        s->spare_item = item;
        Py_DECREF(old);            /* (only now: a dealloc may run Python code) */
        return;
    }
#endif
    Py_DECREF(item);
}
