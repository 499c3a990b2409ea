/* all_to_all and all_to_all_v in two parts (included by _fastcall.c after _fastcall_parts.c).
 *
 * ``all_to_all_async(send, recv, name)`` and ``all_to_all_v_async(send, send_counts,
 * send_displs, recv, recv_counts, recv_displs, name)`` take the arguments of the fast call
 * of the same name (MPI's Ialltoall; Ialltoallv, Igatherv, Iscatterv, Iallgatherv and
 * Ialltoallw put as one all_to_all by collcomm/MPI/_collv_fast.py) and start the call as
 * part_start does the others', when this rank's whole send buffer goes eager (a2a_eager:
 * staged beside the agreement's table, within one_shot). Its first part is then the
 * agreement: table and blocks staged, arrival published; a rank whose peers all went eager
 * can finish without it. Its second part (a2a_run, Core.part PART_FINISH) checks the
 * signatures and every split size as staged by the first parts (its own counts taken from
 * its staged row, not the caller's lists read again; collcomm/MPI/_collv_fast.py passes
 * tuples anyway), and reads this rank's blocks, or, when some rank's buffer
 * was too large to go eager (that rank ran the call whole, natively or, over the fast
 * call's limit, on the Python path, which moves the same words), goes on with everybody as
 * a whole call does from its agreement: staged rounds, or cross-memory reads by the size
 * rule (rank 0 does not vote in two parts), or the Python code's ending (ST_PYTHON).
 * Anything else is declined (None, before any traffic): the regular path queues the call. */

/* Start or finish (`part`) an all_to_all of `send` (n counts `sc`, summing to `ssum`) into
 * `recv` (counts `rc`), the views in `p` (released here), dtype `dt`; `pair` (the two
 * lists of counts, a tuple) is what Hooks.finish gets. */
static PyObject *a2a_part(Fast *s, int part, PyObject *send, PyObject *sc, PyObject *recv,
                          PyObject *rc, PyObject *pair, PyObject *name, Pair *p, int dt,
                          Py_ssize_t ssum)
{
    Core *core = (Core *)s->core;
    Py_ssize_t isz = p->itemsize;
    if (!a2a_eager(core, ssum * isz) || 2 * (Py_ssize_t)s->size * 8 > core->slot ||
        core->slot / isz < s->size) {
        fast_release(p);
        Py_RETURN_NONE;
    }
    uint64_t sig = s->plain_sig[FC_ALL_TO_ALL] | (s->dt_sig[dt] << 55);
    PyObject *cargs[8] = {NULL, send, sc, recv, rc, PyLong_FromSsize_t(isz), NULL,
                          PyLong_FromSsize_t(s->a2a_cma)};
    PyObject *r = NULL;
    if (cargs[5] != NULL && cargs[7] != NULL)
        r = fast_run_part(s, part, FC_ALL_TO_ALL, name, sig, Core_all_to_all, cargs, 8, 6, send,
                          recv, pair, p);
    else
        fast_release(p);
    Py_XDECREF(cargs[5]);
    Py_XDECREF(cargs[7]);
    return r;
}

static PyObject *fast_a2a_v_part(Fast *s, PyObject *const *args, Py_ssize_t nargs, int part)
{
    if (part == PART_WHOLE)        /* (a group of one: part_start runs it whole) */
        return Fast_all_to_all_v(s, args, nargs);
    if (check_args(nargs, 7, "all_to_all_v_async") < 0)
        return NULL;
    if (!fast_open_part(s, part) || args[0] == args[3])
        Py_RETURN_NONE;
    int n = s->size;
    Py_ssize_t stack[2 * 16], *tab = n <= 16 ? stack : PyMem_Malloc(sizeof(Py_ssize_t) * 2 * (size_t)n);
    if (tab == NULL)
        return PyErr_NoMemory();
    Py_ssize_t ssum = 0, rsum = 0;
    int ok = v_counts(args[1], args[2], n, tab, &ssum) == 0 && v_counts(args[4], args[5], n, tab + n, &rsum) == 0;
    if (tab != stack)
        PyMem_Free(tab);
    if (!ok)
        Py_RETURN_NONE;
    Pair p;
    int dt = fast_pair(&p, args[0], args[3], 0);
    Py_ssize_t most = ssum > rsum ? ssum : rsum;
    if (dt < 0 || ssum * p.itemsize > p.len[0] || rsum * p.itemsize > p.len[1] ||
        most * p.itemsize > s->limit[FC_ALL_TO_ALL]) {
        fast_release(&p);
        Py_RETURN_NONE;
    }
    PyObject *pair = PyTuple_Pack(2, args[1], args[4]);
    if (pair == NULL) {
        fast_release(&p);
        return NULL;
    }
    PyObject *r = a2a_part(s, part, args[0], args[1], args[3], args[4], pair, args[6], &p, dt, ssum);
    Py_DECREF(pair);
    return r;
}

static PyObject *fast_a2a_part(Fast *s, PyObject *const *args, Py_ssize_t nargs, int part)
{
    if (part == PART_WHOLE)
        return Fast_all_to_all(s, args, nargs);
    if (check_args(nargs, 3, "all_to_all_async") < 0)
        return NULL;
    if (!fast_open_part(s, part) || args[0] == args[1])
        Py_RETURN_NONE;
    Pair p;
    int dt = fast_pair(&p, args[0], args[1], 0);
    int n = s->size, fits = dt >= 0;
    for (int i = 0; fits && i < 2; i++)   /* rows divisible by n, the same row size (as whole) */
        fits = p.v[i].ndim >= 1 && p.v[i].shape[0] > 0 && p.v[i].shape[0] % n == 0;
    Py_ssize_t nbytes = p.len[0], count = nbytes / p.itemsize / n;
    if (!fits || nbytes <= 0 || p.len[1] != nbytes || p.v[0].shape[0] != p.v[1].shape[0] ||
        nbytes > s->limit[FC_ALL_TO_ALL]) {
        fast_release(&p);
        Py_RETURN_NONE;
    }
    PyObject *k = PyLong_FromSsize_t(count), *counts = k == NULL ? NULL : PyList_New(n);
    for (int i = 0; counts != NULL && i < n; i++)
        PyList_SET_ITEM(counts, i, Py_NewRef(k));
    PyObject *pair = counts == NULL ? NULL : PyTuple_Pack(2, counts, counts);
    Py_XDECREF(k);
    if (pair == NULL) {
        Py_XDECREF(counts);
        fast_release(&p);
        return NULL;
    }
    PyObject *r = a2a_part(s, part, args[0], counts, args[1], counts, pair, args[2], &p, dt,
                           count * n);
    Py_DECREF(counts);
    Py_DECREF(pair);
    return r;
}

static PyObject *Fast_all_to_all_async(Fast *s, PyObject *const *args, Py_ssize_t nargs)
{
    return part_start(s, fast_a2a_part, args, nargs);
}

static PyObject *Fast_all_to_all_v_async(Fast *s, PyObject *const *args, Py_ssize_t nargs)
{
    return part_start(s, fast_a2a_v_part, args, nargs);
}
