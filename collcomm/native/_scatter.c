/* The native scatter: staged through the root's slot, in steps, or split by cross-memory
 * attach (shm_scatter.scatter, step for step).
 *
 * Included by _shmcore.c after _cma.c. Staged, each step is one step of the Python loop:
 * the root copies the step's piece of every other rank's block into its slot (laid out as
 * n rows of the step's length; its own row is left empty), a sync with the signature
 * check, each other rank copies its row out; the phases alternate, so the root copies
 * step i+1 in while the others copy step i out. The root's own block is copied last,
 * while the others copy their last piece out.
 */

/* scatter(arena, send or None, recv, root, sig[, step]): staged, in steps of `step` bytes
 * of each block (n steps fit a slot; without it, one step: n blocks fit a slot; one step
 * may run in two parts, Core.part).
 * scatter(arena, send or None, recv, root, sig, itemsize, cma_key, pids): split by
 * cross-memory attach (rooted_cma). */
static PyObject *Core_scatter(Core *c, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6 && nargs != 8 && check_args(nargs, 5, "scatter") < 0)
        return NULL;
    PARSE_LONG(root, args[3]);
    PARSE_U64(sig, args[4]);
    Py_ssize_t step = -1;
    uint64_t cma_key = 0;
    if (nargs >= 6) {
        step = PyLong_AsSsize_t(args[5]);
        if (nargs == 8)
            cma_key = PyLong_AsUnsignedLongLongMask(args[6]);
        if (PyErr_Occurred())
            return NULL;
    }
    Call k;
    if (call_begin(&k, c, args[0]) < 0)
        return NULL;
    char *send, *recv;
    Py_ssize_t sbytes, kb;
    if (get_buffer(&k, args[1], 0, &send, &sbytes) < 0 ||
        get_buffer(&k, args[2], 1, &recv, &kb) < 0)
        return call_end(&k, ST_REFUSE);
    int n = c->n, me = c->rank;
    if (kb == 0 || root < 0 || root >= n || (me == root && (send == NULL || sbytes != n * kb)))
        return call_end(&k, ST_REFUSE);
    char *own = me == root ? send + me * kb : NULL;
    int own_apart = own != NULL && !overlaps(own, kb, recv, kb);
    if (nargs == 8) {   /* (..., itemsize, cma_key, pids): split by CMA */
        if (cma_key == 0)
            return call_end(&k, ST_REFUSE);
        return rooted_cma(&k, me == root ? send : recv, kb, root, sig, step, cma_key, args[7],
                          SPLIT_SCATTER, own_apart ? recv : NULL, own);
    }
    if (step < 0)
        step = kb;
    int part = c->part;            /* (a two-part call, one step: see enter) */
    if (step <= 0 || n * step > c->slot || (part != PART_WHOLE && step != kb))
        return call_end(&k, ST_REFUSE);
    if (n * kb > c->one_shot)
        gil_release(&k.gil);
    for (Py_ssize_t lo = 0; lo < kb; lo += step) {
        Py_ssize_t len = kb - lo < step ? kb - lo : step;
        int phase = part == PART_FINISH ? k.phase : next_phase(&k);
        if (me == root && part != PART_FINISH) {   /* the others' pieces, row r of n rows */
            char *slot = slot_at(c, phase, me);
            /* staged: nothing of ours in place or by address (a receiver may leave an
             * eager step early only then: enter; an earlier call's word may say 1) */
            put(c, c->w_shared + phase, 0);
            for (int r = 0; r < n; r++)
                if (r != me)
                    near_copy(slot + r * len, send + r * kb + lo, len);
        }
        if (c->eager && part == PART_WHOLE && len == kb)   /* one step: eager (enter) */
            c->eager_wait = me == root ? -1 : (int)root;
        int e = enter(c, k.arena, phase, sig, &k.gil);
        if (e == 2)
            return call_end(&k, ST_STARTED);
        if (e != 0)
            return call_end(&k, e < 0 ? -1 : ST_MISMATCH);
        if (me != root)
            near_copy(recv + lo, slot_at(c, phase, root) + me * len, len);
    }
    if (own_apart)
        out_copy(c, recv, own, kb);
    return call_end(&k, ST_DONE);
}
