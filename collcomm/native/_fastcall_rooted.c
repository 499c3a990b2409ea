/* The fast call's rooted data moves: gather and scatter, plain buffers or (at the root)
 * lists (_fastcall_lists.c), staged in one chunk, or split by cross-memory attach
 * (Core_scatter's and Core_gather's split forms, rooted_cma) where shm_large splits every
 * scatter or gather from some size up (Fast.scatter_cma, Fast.gather_cma, set by
 * core/fastpath.py; at the root from a list lying back to back: _fastcall_lists.c).
 *
 * Included by _fastcall.c after _fastcall_lists.c, _fastcall_ops.c and _fastcall_reduce.c.
 */

/* gather(send, recv or None, root, name) / scatter(send or None, recv, root, name):
 * blocks of n × the one rank's size at the root */
static PyObject *fast_rooted(Fast *s, PyObject *const *args, Py_ssize_t nargs, int fc, int part)
{
    int gather = fc == FC_GATHER;
    if (check_args(nargs, 4, gather ? "gather" : "scatter") < 0)
        return NULL;
    long root = fast_root(s, args[2]);
    PyObject *big = gather ? args[1] : args[0];
    if (!fast_open_part(s, part) || root < 0 || (s->rank == root) != (big != Py_None))
        Py_RETURN_NONE;
    if (PyList_CheckExact(big) || PyTuple_CheckExact(big))
        return part == PART_WHOLE ? fast_list(s, args, fc, root, args[3]) : Py_NewRef(Py_None);
    Pair p;
    int dt = fast_pair(&p, args[0], args[1], 0);
    Py_ssize_t kb = p.len[gather ? 0 : 1], count = kb / p.itemsize;
    Py_ssize_t split_from = gather ? s->gather_cma : s->scatter_cma;
    int split = split_from > 0 && kb * s->size >= split_from;
    int fits = dt >= 0 && kb > 0 && (split || kb * s->size <= s->limit[fc]) &&
               !(split && part != PART_WHOLE) && part_size_ok(s, part, kb * s->size) &&
               (big == Py_None || p.len[gather ? 1 : 0] == kb * s->size);
    if (fits && !gather && big != Py_None && overlaps(p.data[1], kb, p.data[0], kb * s->size) &&
        p.data[1] != p.data[0] + s->rank * kb)
        fits = 0;   /* a receive buffer inside another block: the regular path copies first */
    if (fits && s->core == Py_None)
        near_copy(p.data[1], p.data[0], kb);
    if (!fits) {
        fast_release(&p);
        Py_RETURN_NONE;
    }
    uint64_t sig = s->plain_sig[fc] | (s->dt_sig[dt] << 55) |
                   ((uint64_t)(root & 0x3FFF) << 36) | COUNT_BITS(count);
    PyObject *cargs[8] = {NULL, args[0], args[1], args[2], NULL, NULL, NULL, NULL};
    if (split && fast_bcast_cma_args(s, p.itemsize, cargs + 5) < 0) {
        fast_release(&p);
        return NULL;
    }
    PyObject *r = fast_run_part(s, part, fc, args[3], sig, gather ? Core_gather : Core_scatter,
                                cargs, split ? 8 : 5, 4, args[0], args[1], args[2], &p);
    for (int i = 5; i < 8; i++)
        Py_XDECREF(cargs[i]);
    return r;
}

static PyObject *fast_gather(Fast *s, PyObject *const *args, Py_ssize_t nargs, int part)
{
    return fast_rooted(s, args, nargs, FC_GATHER, part);
}

static PyObject *fast_scatter(Fast *s, PyObject *const *args, Py_ssize_t nargs, int part)
{
    return fast_rooted(s, args, nargs, FC_SCATTER, part);
}
