/* The fast call's all_to_all with split sizes (included by _fastcall.c after
 * _fastcall_ops.c): MPI's Alltoallv, and Gatherv / Scatterv / Allgatherv put as one
 * all_to_all (collcomm/MPI/_collv_fast.py), in the one native call the regular path makes
 * for them (a2a_run), without its 10-30 µs of Python.
 *
 * all_to_all_v(send, send_counts, send_displs, recv, recv_counts, recv_displs, name)
 * -> True | None: n counts a side (elements; exact ints in a list or tuple), the
 * displacements None or the counts' prefix sums (blocks back to back from the start),
 * send and recv C-contiguous buffers of one native dtype holding at least the counts' sum,
 * the larger sum within the fast call's all_to_all limit. Anything else is declined
 * (None, before any traffic): the caller's regular path packs, checks and reports it.
 * Split sizes that do not pair up between ranks are found by a2a_run's agreement (every
 * rank sees it: ST_PAIRS), reported by the hooks as the regular path reports them. */

/* 0: `counts` are n non-negative exact ints and `displs` None or their prefix sums (in
 * out[0..n), their sum in *sum); 1: not so (declined) */
static int v_counts(PyObject *counts, PyObject *displs, int n, Py_ssize_t *out, Py_ssize_t *sum)
{
    if (!(PyList_CheckExact(counts) || PyTuple_CheckExact(counts)) ||
        PySequence_Fast_GET_SIZE(counts) != n)
        return 1;
    int with_displs = displs != Py_None;
    if (with_displs && (!(PyList_CheckExact(displs) || PyTuple_CheckExact(displs)) ||
                        PySequence_Fast_GET_SIZE(displs) != n))
        return 1;
    PyObject **ci = PySequence_Fast_ITEMS(counts);
    PyObject **di = with_displs ? PySequence_Fast_ITEMS(displs) : NULL;
    Py_ssize_t pos = 0;
    for (int i = 0; i < n; i++) {
        if (!PyLong_CheckExact(ci[i]) || (with_displs && !PyLong_CheckExact(di[i])))
            return 1;
        Py_ssize_t c = PyLong_AsSsize_t(ci[i]);
        if (c < 0 || c > PY_SSIZE_T_MAX / 16 - pos ||
            (with_displs && PyLong_AsSsize_t(di[i]) != pos)) {
            PyErr_Clear();     /* (an int past Py_ssize_t: declined, the regular path says so) */
            return 1;
        }
        out[i] = c;
        pos += c;
    }
    *sum = pos;
    return 0;
}

static PyObject *Fast_all_to_all_v(Fast *s, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_args(nargs, 7, "all_to_all_v") < 0)
        return NULL;
    if (!fast_open(s) || args[0] == args[3])
        Py_RETURN_NONE;
    int n = s->size;
    Py_ssize_t stack[4 * 16], *tab = n <= 16 ? stack : PyMem_Malloc(sizeof(Py_ssize_t) * 4 * (size_t)n);
    if (tab == NULL)
        return PyErr_NoMemory();
    Py_ssize_t ssum = 0, rsum = 0;
    if (v_counts(args[1], args[2], n, tab, &ssum) != 0 || v_counts(args[4], args[5], n, tab + n, &rsum) != 0 ||
        (s->core == Py_None && tab[0] != tab[n])) {
        if (tab != stack)
            PyMem_Free(tab);
        Py_RETURN_NONE;
    }
    Pair p;
    int dt = fast_pair(&p, args[0], args[3], 0);
    Py_ssize_t isz = p.itemsize, most = ssum > rsum ? ssum : rsum;
    if (dt < 0 || ssum * isz > p.len[0] || rsum * isz > p.len[1] || most * isz > s->limit[FC_ALL_TO_ALL]) {
        fast_release(&p);
        if (tab != stack)
            PyMem_Free(tab);
        Py_RETURN_NONE;
    }
    uint64_t sig = s->plain_sig[FC_ALL_TO_ALL] | (s->dt_sig[dt] << 55);
    PyObject *rec;
    PyObject *tag = fast_begin(s, args[6], sig, FC_ALL_TO_ALL, &rec);
    PyObject *status;
    if (tag == NULL) {
        status = NULL;
    } else if (s->core == Py_None) {     /* a group of one: our block to ourselves */
        near_copy(p.data[1], p.data[0], ssum * isz);
        status = PyLong_FromLong(ST_DONE);
    } else {
        Core *core = (Core *)s->core;
        int settled = fast_settle(s);
        if (settled != 0) {
            status = settled < 0 ? NULL : PyLong_FromLong(ST_REFUSE);
        } else {
            for (int i = 0; i < 2; i++)
                core->handed[i] = (Handed){p.obj[i], p.data[i], p.len[i], p.writable[i]};
            status = a2a_run(core, s->arena, args[0], args[3], tab, 0, (long)isz, sig,
                             (long)s->a2a_cma, NULL);
            core->handed[0].obj = core->handed[1].obj = NULL;
        }
    }
    fast_release(&p);
    if (tab != stack)
        PyMem_Free(tab);
    if (tag == NULL)
        return NULL;
    /* Hooks.finish (a call not done here) takes the two lists of counts as a tuple */
    PyObject *counts = PyTuple_Pack(2, args[1], args[4]);
    if (counts == NULL)
        Py_CLEAR(status);
    PyObject *r = fast_end(s, status, rec, tag, sig, FC_ALL_TO_ALL, args[6], args[0], args[3],
                           counts == NULL ? Py_None : counts);
    Py_XDECREF(counts);
    return r;
}
