/* The fast call's type: construction, garbage-collector support, the method table and
 * the module's part of the init (see _fastcall.c, which includes this file last). */

static int Fast_init(Fast *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"core", "arena", "group", "seq", "hooks", "append", "observer",
                             "obs_index", "algo_ids", "pkg", "tag_base", "seq_mask",
                             "plain_sigs", "dtype_sigs", "limits", "size", "rank", NULL};
    PyObject *core, *arena, *group, *seq, *hooks, *append, *observer, *obs_index, *algo_ids,
        *pkg, *plain, *dts, *limits;
    unsigned long long tag_base, seq_mask;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOOOOOOUKKOOOii", kwlist, &core, &arena,
                                     &group, &seq, &hooks, &append, &observer, &obs_index,
                                     &algo_ids, &pkg, &tag_base, &seq_mask, &plain, &dts,
                                     &limits, &self->size, &self->rank))
        return -1;
    if (core != Py_None && !PyObject_TypeCheck(core, &CoreType)) {
        PyErr_SetString(PyExc_TypeError, "Fast: core must be a Core or None");
        return -1;
    }
    if (!PyTuple_Check(algo_ids) || PyTuple_GET_SIZE(algo_ids) != N_FC ||
        !PyTuple_Check(plain) || PyTuple_GET_SIZE(plain) != N_FC ||
        !PyTuple_Check(limits) || PyTuple_GET_SIZE(limits) != N_FC ||
        !PyTuple_Check(dts) || PyTuple_GET_SIZE(dts) != N_DT) {
        PyErr_SetString(PyExc_TypeError, "Fast: algo_ids, plain_sigs and dtype_sigs are tuples "
                        "of the collectives' and dtypes' sizes");
        return -1;
    }
    for (int i = 0; i < N_FC; i++) {
        self->plain_sig[i] = PyLong_AsUnsignedLongLongMask(PyTuple_GET_ITEM(plain, i));
        self->limit[i] = PyLong_AsSsize_t(PyTuple_GET_ITEM(limits, i));
        Py_INCREF(PyTuple_GET_ITEM(algo_ids, i));
        Py_XSETREF(self->algo_id[i], PyTuple_GET_ITEM(algo_ids, i));
    }
    for (int i = 0; i < N_DT; i++)
        self->dt_sig[i] = PyLong_AsUnsignedLongLongMask(PyTuple_GET_ITEM(dts, i));
    if (PyErr_Occurred())
        return -1;
    if (rec_init(&self->rw, append, obs_index, pkg) < 0)
        return -1;
    PyObject **slots[] = {&self->core, &self->arena, &self->group, &self->seq, &self->hooks,
                          &self->observer};
    PyObject *values[] = {core, arena, group, seq, hooks, observer};
    for (int i = 0; i < 6; i++) {
        Py_INCREF(values[i]);
        Py_XSETREF(*slots[i], values[i]);
    }
    self->tag_base = tag_base;
    self->seq_mask = seq_mask;
    /* the observer's ``done``: a writable object slot (Observer's __slots__) is written
     * directly by fast_set_done; anything else goes through setattr */
    self->obs_type = Py_TYPE(observer);
    self->done_at = observer == Py_None ? 0 : plain_slot_offset(Py_TYPE(observer), s_done);
    return 0;
}

static int Fast_traverse(Fast *self, visitproc visit, void *arg)
{
    Py_VISIT(self->core);
    Py_VISIT(self->arena);
    Py_VISIT(self->group);
    Py_VISIT(self->seq);
    Py_VISIT(self->hooks);
    rec_traverse(&self->rw, visit, arg);
    Py_VISIT(self->observer);
    Py_VISIT(self->exec_tag);
    Py_VISIT(self->exec_rec);
    Py_VISIT(self->scan_parts);
    for (int i = 0; i < 3; i++)
        Py_VISIT(self->a2a_kept[i]);
    for (int i = 0; i < self->n_ops; i++)
        Py_VISIT(self->ops[i].op);
    return parts_traverse(self, visit, arg);
}

static int Fast_clear(Fast *self)
{
    Py_CLEAR(self->core);
    Py_CLEAR(self->arena);
    Py_CLEAR(self->group);
    Py_CLEAR(self->seq);
    Py_CLEAR(self->hooks);
    rec_clear(&self->rw);
    Py_CLEAR(self->observer);
    Py_CLEAR(self->exec_tag);
    Py_CLEAR(self->exec_rec);
    Py_CLEAR(self->scan_parts);
    for (int i = 0; i < 3; i++)
        Py_CLEAR(self->a2a_kept[i]);
    self->exec_thread = 0;
    for (int i = 0; i < N_FC; i++)
        Py_CLEAR(self->algo_id[i]);
    for (int i = 0; i < self->n_ops; i++)
        Py_CLEAR(self->ops[i].op);
    self->n_ops = 0;
    parts_clear(self);
    self->paused = 1;     /* a cleared Fast never runs a call again */
    return 0;
}

static PyObject *Fast_close(Fast *self, PyObject *unused)
{
    Fast_clear(self);
    Py_RETURN_NONE;
}

static void Fast_dealloc(Fast *self)
{
    PyObject_GC_UnTrack(self);
    if (fc_wait_hint == self)
        fc_wait_hint = NULL;
    Fast_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* timeout_scope(delta): call_timeout scopes opened (+1) and closed (-1), all threads */
static PyObject *mod_timeout_scope(PyObject *m, PyObject *arg)
{
    long d = PyLong_AsLong(arg);
    if (d == -1 && PyErr_Occurred())
        return NULL;
    fast_timeout_scopes += (int)d;
    return PyLong_FromLong(fast_timeout_scopes);
}

/* record(tag, name, sig, algo_id): a collective's record made and appended now, as the
 * fast call makes its own (the caller found by the C walk), or None when records are
 * off: what a queued asynchronous call records when it is made (core/group.py). */
static PyObject *Fast_record(Fast *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "record(tag, name, sig, algo_id)");
        return NULL;
    }
    if (!rec_on(&self->rw))
        Py_RETURN_NONE;
    uint64_t sig = PyLong_AsUnsignedLongLongMask(args[2]);
    if (sig == (uint64_t)-1 && PyErr_Occurred())
        return NULL;
    return rec_collective(&self->rw, args[0], args[1], sig, args[3]);
}

/* the entries that may run in two parts, whole (fast_X takes the part) */
#define WHOLE_ENTRY(name)                                                                    \
    static PyObject *Fast_##name(Fast *s, PyObject *const *args, Py_ssize_t nargs)          \
    {                                                                                        \
        return fast_##name(s, args, nargs, PART_WHOLE);                                      \
    }
WHOLE_ENTRY(all_reduce)
WHOLE_ENTRY(broadcast)
WHOLE_ENTRY(barrier)
WHOLE_ENTRY(all_gather)
WHOLE_ENTRY(gather)
WHOLE_ENTRY(scatter)
WHOLE_ENTRY(reduce_scatter)
WHOLE_ENTRY(reduce)

#define FASTM(name, doc) {#name, (PyCFunction)(void (*)(void))Fast_##name, METH_FASTCALL, doc}
static PyMethodDef Fast_methods[] = {
    FASTM(all_reduce, "all_reduce(send, recv, op, name) -> True | None"),
    FASTM(broadcast, "broadcast(buf, root, name) -> True | None"),
    FASTM(all_gather, "all_gather(send, recv, name[, sig]) -> True | None"),
    FASTM(barrier, "barrier(name) -> True | None"),
    FASTM(reduce, "reduce(send, recv or None, op, root, name) -> True | None"),
    FASTM(reduce_scatter, "reduce_scatter(send, recv, op, name) -> True | None"),
    FASTM(gather, "gather(send, recv or None, root, name) -> True | None"),
    FASTM(scatter, "scatter(send or None, recv, root, name) -> True | None"),
    FASTM(all_to_all, "all_to_all(send, recv, name) -> True | None (equal blocks)"),
    FASTM(all_to_all_v, "all_to_all_v(send, send_counts, send_displs, recv, recv_counts, recv_displs, name) "
                        "-> True | None (split sizes)"),
    FASTM(record, "record(tag, name, sig, algo_id) -> the record appended, or None (records off)"),
    FASTM(all_reduce_async, "all_reduce_async(send, recv, op, name) -> Work | None (in two parts)"),
    FASTM(broadcast_async, "broadcast_async(buf, root, name) -> Work | None (in two parts)"),
    FASTM(barrier_async, "barrier_async(name) -> Work | None (in two parts)"),
    FASTM(all_gather_async, "all_gather_async(send, recv, name) -> Work | None (in two parts)"),
    FASTM(gather_async, "gather_async(send, recv or None, root, name) -> Work | None"),
    FASTM(scatter_async, "scatter_async(send or None, recv, root, name) -> Work | None"),
    FASTM(reduce_scatter_async, "reduce_scatter_async(send, recv, op, name) -> Work | None"),
    FASTM(reduce_async, "reduce_async(send, recv or None, op, root, name) -> Work | None"),
    FASTM(all_to_all_async, "all_to_all_async(send, recv, name) -> Work | None (in two parts)"),
    FASTM(all_to_all_v_async, "all_to_all_v_async(send, send_counts, send_displs, recv, "
                              "recv_counts, recv_displs, name) -> Work | None (in two parts)"),
    FASTM(gatherv, "gatherv(send, recv_spec, root, name, datatype, aop) -> True | Work | None "
                   "(MPI's Gatherv / Igatherv; see _fastcall_vroot.c)"),
    FASTM(scatterv, "scatterv(send_spec, recv, root, name, datatype, aop) -> True | Work | None "
                    "(MPI's Scatterv / Iscatterv; see _fastcall_vroot.c)"),
    FASTM(allgatherv, "allgatherv(send, recv_spec, name, datatype, aop, tile) -> True | Work | None "
                      "(MPI's Allgatherv / Iallgatherv; see _fastcall_vroot.c)"),
    FASTM(alltoallv, "alltoallv(send_spec, recv_spec, name, datatype, aop) -> True | Work | None "
                     "(MPI's Alltoallv / Ialltoallv; see _fastcall_vroot.c)"),
    FASTM(alltoallw, "alltoallw(send_spec, recv_spec, name, datatype, aop, uint8) -> True | Work | "
                     "None (MPI's Alltoallw / Ialltoallw of gapless blocks; see _fastcall_vw.c)"),
    FASTM(scan, "scan(send, recv, op, exclusive, name) -> True | None (up to SCAN_GATHERED_MAX bytes)"),
    FASTM(obj_bcast, "obj_bcast(obj, root, name, native) -> (True, obj) | (False, slot, pickle) | None"),
    FASTM(obj_gathered, "obj_gathered(obj, root or -1, name, native) -> (True, list or None) | "
                        "(False, slots, pickle) | None"),
    FASTM(obj_scatter, "obj_scatter(objs or None, root, name, native) -> (True, obj) | "
                       "(False, slot, pickles) | None"),
    FASTM(obj_alltoall, "obj_alltoall(objs, name, native) -> (True, list) | (False, table, pickles) | None"),
    FASTM(set_async, "set_async(work_type, lock_type, items, exec_lock, group_lock, async_calls): "
          "what the two-part calls need"),
    {"part_age", (PyCFunction)Fast_part_age, METH_NOARGS,
     "seconds since the pending call in two parts started, or -1.0: none"},
    {"wait_part", (PyCFunction)Fast_wait_part, METH_O,
     "wait_part(work) -> True: its call (in two parts) finished here; False: not here"},
    {"test_part", (PyCFunction)Fast_test_part, METH_O,
     "test_part(work) -> True: finished here; False: in two parts, not yet; None: not such a call"},
    {"finish_part", (PyCFunction)Fast_finish_part, METH_NOARGS,
     "the second part of the call started in two parts (queued by its entry)"},
    {"close", (PyCFunction)Fast_close, METH_NOARGS,
     "drop every reference; later calls take the regular path"},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef Fast_members[] = {
    {"paused", T_INT, offsetof(Fast, paused), 0, "> 0: calls take the regular path"},
    {"exec_thread", T_ULONG, offsetof(Fast, exec_thread), 0,
     "the thread (threading.get_ident()) whose calls run while paused (0: none)"},
    {"exec_tag", T_OBJECT, offsetof(Fast, exec_tag), 0,
     "the tag the exec_thread's next call takes instead of the group's next (None: that)"},
    {"exec_rec", T_OBJECT, offsetof(Fast, exec_rec), 0,
     "... and the record it completes instead of appending one (None: it appends one)"},
    {"a2a_cma", T_PYSSIZET, offsetof(Fast, a2a_cma), 0,
     "all_to_all's cross-memory-attach limit (shm_large.a2a_cma_limit, as shm_direct's; -1: never)"},
    {"bcast_cma", T_PYSSIZET, offsetof(Fast, bcast_cma), 0,
     "> 0: broadcasts of this many bytes or more go split by cross-memory attach (shm_large)"},
    {"scatter_cma", T_PYSSIZET, offsetof(Fast, scatter_cma), 0,
     "> 0: scatters of this many bytes or more (n blocks) go split by cross-memory attach"},
    {"gather_cma", T_PYSSIZET, offsetof(Fast, gather_cma), 0,
     "> 0: gathers of this many bytes or more (n blocks) go split by cross-memory attach"},
    {"ag_cma", T_PYSSIZET, offsetof(Fast, ag_cma), 0,
     "> 0: all_gathers of this many bytes or more (n blocks) read by cross-memory attach "
     "unless rank 0 votes (the fixed rule, shm_large.reads_peers; they take the voted way "
     "from the core's ag_vote_min)"},
    {"cma_key", T_ULONGLONG, offsetof(Fast, cma_key), 0, "the SHARED word of a CMA buffer"},
    {"calls", T_ULONGLONG, offsetof(Fast, calls), READONLY, "calls completed here"},
    {"records", T_INT, offsetof(Fast, rw.on), 0,
     "1 (default): append flight-recorder records; 0: not (to measure their cost)"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject FastType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "collcomm.native._shmcore.Fast",
    .tp_basicsize = sizeof(Fast),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A group's fast call (see collcomm/native/_fastcall.c).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Fast_init,
    .tp_dealloc = (destructor)Fast_dealloc,
    .tp_traverse = (traverseproc)Fast_traverse,
    .tp_clear = (inquiry)Fast_clear,
    .tp_methods = Fast_methods,
    .tp_members = Fast_members,
};

static int fast_module_init(PyObject *m)
{
    s_done = PyUnicode_InternFromString("done");
    s_learn = PyUnicode_InternFromString("learn");
    s_failed = PyUnicode_InternFromString("failed");
    s_finish = PyUnicode_InternFromString("finish");
    if (rec_module_init() < 0 || parts_names() < 0 || obj_names() < 0 || vroot_names() < 0 || vw_names() < 0 || s_done == NULL ||
        s_learn == NULL || s_failed == NULL || s_finish == NULL)
        return -1;
    if (PyModule_AddIntConstant(m, "OBJ_SLOT", OBJ_SLOT) < 0 ||
        PyModule_AddIntConstant(m, "OBJ_HEADER", OBJ_HEADER) < 0 ||
        PyModule_AddIntConstant(m, "OBJ_SMALL_MAX", (long)OBJ_SMALL_MAX) < 0 ||
        PyModule_AddIntConstant(m, "OBJ_INLINE", OBJ_INLINE) < 0 ||
        PyModule_AddIntConstant(m, "OBJ_BIG", OBJ_BIG) < 0 ||
        PyModule_AddIntConstant(m, "OBJ_DONE", OBJ_DONE) < 0 ||
        PyModule_AddIntConstant(m, "OBJ_OVERFLOW", OBJ_OVERFLOW) < 0 ||
        PyModule_AddIntConstant(m, "OBJ_GENERAL", OBJ_GENERAL) < 0 ||
        PyModule_AddIntConstant(m, "SCAN_GATHERED_MAX", SCAN_GATHERED_MAX) < 0 ||
        PyModule_AddIntConstant(m, "SIG_SCAN", SIG_SCAN) < 0 ||
        PyModule_AddIntConstant(m, "SIG_EXSCAN", SIG_EXSCAN) < 0)
        return -1;
    return add_type(m, "Fast", &FastType);
}
