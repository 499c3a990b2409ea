/* What the two-part entries of the fast call (_fastcall_parts.c) are given once by the
 * Python code (core/fastpath.py: set_async), and the references they hold for the garbage
 * collector (parts_traverse, parts_clear: the Fast type's tp_traverse / tp_clear).
 * Included by _fastcall.c after _fastcall_parts_end.c.
 */

/* set_async(work_type, lock_type, items, exec_lock, group_lock, async_calls): what the
 * two-part entries need (core/fastpath.py): the Work class (whose slots they fill), what
 * makes its lock, the group's queue, the lock of its runner, the group's lock, and the
 * queue's owner (whose watch_part starts or wakes the worker). */
static PyObject *Fast_set_async(Fast *s, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_args(nargs, 6, "set_async") < 0)
        return NULL;
    if (!PyType_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "set_async: work_type must be a class");
        return NULL;
    }
    for (int i = 0; i < W_N; i++) {
        PyObject *key = PyUnicode_FromString(work_slot_names[i]);
        if (key == NULL)
            return NULL;
        s->work_at[i] = plain_slot_offset((PyTypeObject *)args[0], key);
        Py_DECREF(key);
        if (s->work_at[i] == 0) {
            PyErr_Format(PyExc_TypeError, "set_async: %R has no plain slot %s", args[0],
                         work_slot_names[i]);
            return NULL;
        }
    }
    PyObject *a_lock = PyObject_CallNoArgs(args[1]);   /* (the type of a Work's lock) */
    if (a_lock == NULL)
        return NULL;
    cmethod_find(&s->work_locked, a_lock, s_locked);
    Py_DECREF(a_lock);
    cmethod_find(&s->items_append, args[2], s_append);
    cmethod_find(&s->items_popleft, args[2], s_popleft);
    cmethod_find(&s->exec_acquire, args[3], s_acquire);
    cmethod_find(&s->exec_release, args[3], s_release);
    cmethod_find(&s->group_locked, args[4], s_locked);
    if (s->group_locked.fn == NULL) {
        PyErr_Format(PyExc_TypeError, "set_async: the group's lock (%R) has no C locked()", args[4]);
        return NULL;
    }
    PyObject *finish = PyObject_GetAttr((PyObject *)s, s_finish_part);
    if (finish == NULL)
        return NULL;
    Py_XSETREF(s->finish_bound, finish);
    s->worker_at = plain_slot_offset(Py_TYPE(args[5]), s_worker);
    s->sleeping_at = plain_slot_offset(Py_TYPE(args[5]), s_sleeping);
    if (fc_work_type == NULL) {
        fc_work_type = (PyTypeObject *)Py_NewRef(args[0]);
        fc_work_group_at = s->work_at[W_GROUP];
    }
    Py_XSETREF(s->work_type, Py_NewRef(args[0]));
    Py_XSETREF(s->lock_type, Py_NewRef(args[1]));
    Py_XSETREF(s->async_items, Py_NewRef(args[2]));
    Py_XSETREF(s->exec_lock, Py_NewRef(args[3]));
    Py_XSETREF(s->group_lock, Py_NewRef(args[4]));
    Py_XSETREF(s->async_calls, Py_NewRef(args[5]));
    /* the group's _pending stored straight into its slot (no setattr's look-ups) where
     * that is all a setattr does: the generic one, a plain slot */
    Py_CLEAR(s->pending_type);
    s->pending_at = 0;
    if (s->group != NULL && s->group != Py_None &&
        Py_TYPE(s->group)->tp_setattro == PyObject_GenericSetAttr &&
        (s->pending_at = plain_slot_offset(Py_TYPE(s->group), s_pending)) > 0)
        s->pending_type = Py_NewRef((PyObject *)Py_TYPE(s->group));
    Py_RETURN_NONE;
}

static int parts_traverse(Fast *s, visitproc visit, void *arg)
{
    Py_VISIT(s->work_type);
    Py_VISIT(s->lock_type);
    Py_VISIT(s->async_items);
    Py_VISIT(s->exec_lock);
    Py_VISIT(s->group_lock);
    Py_VISIT(s->async_calls);
    Py_VISIT(s->pending_type);
    Py_VISIT(s->finish_bound);
    Py_VISIT(s->part_work);
    Py_VISIT(s->spare_work);
    Py_VISIT(s->part_args);
    Py_VISIT(s->spare_item);
    Py_VISIT(s->part_tag);
    Py_VISIT(s->part_rec);
    return 0;
}

static void parts_clear(Fast *s)
{
    Py_CLEAR(s->work_type);
    Py_CLEAR(s->lock_type);
    Py_CLEAR(s->async_items);
    Py_CLEAR(s->exec_lock);
    Py_CLEAR(s->group_lock);
    Py_CLEAR(s->async_calls);
    Py_CLEAR(s->pending_type);
    s->pending_at = 0;
    Py_CLEAR(s->finish_bound);
    Py_CLEAR(s->part_work);
    Py_CLEAR(s->spare_work);
    Py_CLEAR(s->part_args);
    Py_CLEAR(s->spare_item);
    Py_CLEAR(s->part_tag);
    Py_CLEAR(s->part_rec);
}
