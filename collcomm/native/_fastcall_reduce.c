/* The fast call's reduce and reduce_scatter (the other collectives: _fastcall_ops.c, whose
 * fast_pair, fast_run_part and the rest they use; gather and scatter: _fastcall_rooted.c).
 *
 * Included by _fastcall.c after _fastcall_ops.c.
 */

/* reduce(send, recv or None, op, root, name) -> True | None: recv (root only; may be send)
 * gets op over every rank's send */
static PyObject *fast_reduce(Fast *s, PyObject *const *args, Py_ssize_t nargs, int part)
{
    if (check_args(nargs, 5, "reduce") < 0)
        return NULL;
    long root = fast_root(s, args[3]);
    if (!fast_open_part(s, part) || root < 0 || (s->rank == root) != (args[1] != Py_None))
        Py_RETURN_NONE;
    Pair p;
    int dt = fast_pair(&p, args[0], args[1], 1);
    Py_ssize_t nbytes = p.len[0], count = nbytes / p.itemsize;
    /* in two parts only as one staged step, never where the whole call goes by CMA (a
     * peer making it whole would read our buffer after we left): declined here, before
     * anything starts, so the call is queued, not run at once */
    int fits = dt >= 0 && nbytes > 0 && nbytes <= s->limit[FC_REDUCE] &&
               (args[1] == Py_None || p.len[1] == nbytes) &&
               (part == PART_WHOLE || (s->core != Py_None &&
                                       nbytes * s->size <= ((Core *)s->core)->reduce_one_shot &&
                                       !reduce_goes_by_cma((Core *)s->core, nbytes)));
    FastOp *e = fits ? fast_op(s, args[2], dt) : NULL;
    PyObject *code = e == NULL ? NULL : PyLong_FromLong(e->code[dt]);
    if (code == NULL) {
        fast_release(&p);
        if (e != NULL || PyErr_Occurred())
            return NULL;
        Py_RETURN_NONE;
    }
    if (s->core == Py_None && p.data[1] != p.data[0])   /* (taken: a group of one's result) */
        near_copy(p.data[1], p.data[0], nbytes);
    uint64_t sig = s->plain_sig[FC_REDUCE] | (e->sig[dt] & ~TOP4) |
                   ((uint64_t)(root & 0x3FFF) << 36) | COUNT_BITS(count);
    PyObject *cargs[6] = {NULL, args[0], args[1], code, args[3], NULL};
    PyObject *r = fast_run_part(s, part, FC_REDUCE, args[4], sig, Core_reduce, cargs, 6, 5, args[0],
                                args[1], args[2], &p);
    Py_DECREF(code);
    return r;
}

/* reduce_scatter(send, recv, op, name) -> True | None: block i of op over every rank's
 * send (n blocks of recv's size) into rank i's recv */
static PyObject *fast_reduce_scatter(Fast *s, PyObject *const *args, Py_ssize_t nargs, int part)
{
    if (check_args(nargs, 4, "reduce_scatter") < 0)
        return NULL;
    if (!fast_open_part(s, part) || args[0] == args[1])
        Py_RETURN_NONE;
    Pair p;
    int dt = fast_pair(&p, args[0], args[1], 0);
    Py_ssize_t kb = p.len[1], count = kb / p.itemsize;
    int fits = dt >= 0 && kb > 0 && p.len[0] == kb * s->size && p.len[0] <= s->limit[FC_REDUCE_SCATTER] &&
               part_size_ok(s, part, p.len[0]);
    FastOp *e = fits ? fast_op(s, args[2], dt) : NULL;
    PyObject *code = e == NULL ? NULL : PyLong_FromLong(e->code[dt]);
    if (code == NULL) {
        fast_release(&p);
        if (e != NULL || PyErr_Occurred())
            return NULL;
        Py_RETURN_NONE;
    }
    if (s->core == Py_None)        /* (taken: a group of one's result) */
        near_copy(p.data[1], p.data[0], kb);
    uint64_t sig = s->plain_sig[FC_REDUCE_SCATTER] | (e->sig[dt] & ~TOP4) |
                   ((uint64_t)0x3FFF << 36) | COUNT_BITS(count);
    PyObject *cargs[5] = {NULL, args[0], args[1], code, NULL};
    PyObject *r = fast_run_part(s, part, FC_REDUCE_SCATTER, args[3], sig, Core_reduce_scatter,
                                cargs, 5, 4, args[0], args[1], args[2], &p);
    Py_DECREF(code);
    return r;
}
