/* The native collectives that only move data: broadcast, gather (and all_gather); and
 * barrier, settle and sync.
 *
 * Included by _shmcore.c (scatter is in _scatter.c, all_to_all in _collectives_a2a.c).
 * Like _collectives_reduce.c, each is the single-chunk staged case of shm_move.py, step
 * for step (the large broadcast and gather also their CMA form).
 */

/* broadcast(arena, buf, root, sig[, step[, cma_key, pids]]): with `cma_key` (arena_layout.CMA)
 * and `pids` (every rank's), by cross-memory attach, split (rooted_cma; `step` is then
 * the itemsize). Else staged by the root; without `step`, one chunk (at most a slot); with it, in steps of `step` bytes (at most a slot, a multiple of the
 * itemsize: shm_large.pipeline_elems), each step exactly one step of shm_direct.broadcast's
 * Python loop (copy in, sync with the signature check, copy out), so the root copies step
 * i+1 in while the others copy step i out, all in one call with the GIL released. A root
 * whose buffer is published in place (shared heap) does so at the first step: the others
 * then return ST_PYTHON there, as in the one-chunk case. A one-step call may run in two
 * parts (Core.part, see enter): the root stages, everybody arrives; later the rest. */
static PyObject *Core_broadcast(Core *c, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5 && nargs != 7 && check_args(nargs, 4, "broadcast") < 0)
        return NULL;
    PARSE_LONG(root, args[2]);
    PARSE_U64(sig, args[3]);
    Py_ssize_t step = -1;
    uint64_t cma_key = 0;
    if (nargs == 7) {
        cma_key = PyLong_AsUnsignedLongLongMask(args[5]);
        if (cma_key == (uint64_t)-1 && PyErr_Occurred())
            return NULL;
    }
    if (nargs >= 5) {
        step = PyLong_AsSsize_t(args[4]);
        if (step == -1 && PyErr_Occurred())
            return NULL;
    }
    Call k;
    if (call_begin(&k, c, args[0]) < 0)
        return NULL;
    char *buf;
    Py_ssize_t nbytes;
    if (get_buffer(&k, args[1], 1, &buf, &nbytes) < 0)
        return call_end(&k, ST_REFUSE);
    int me = c->rank;
    if (nargs == 7) {   /* (..., itemsize, cma_key, pids): by cross-memory attach, split */
        if (nbytes == 0 || root < 0 || root >= c->n || cma_key == 0)
            return call_end(&k, ST_REFUSE);
        return rooted_cma(&k, buf, nbytes, root, sig, step, cma_key, args[6], SPLIT_BCAST, NULL, NULL);
    }
    if (step < 0)
        step = nbytes;
    int part = c->part;
    if (step > c->slot || step <= 0 || nbytes == 0 || root < 0 || root >= c->n ||
        (part != PART_WHOLE && step != nbytes)) {     /* (a two-part call is one step) */
        return call_end(&k, ST_REFUSE);
    }
    for (Py_ssize_t lo = 0; lo < nbytes; lo += step) {
        Py_ssize_t len = nbytes - lo < step ? nbytes - lo : step;
        int phase = part == PART_FINISH ? k.phase : next_phase(&k);
        if (me == root && part != PART_FINISH)
            stage(&k, phase, buf + lo, len, 1);
        else if (nbytes > c->one_shot)
            gil_release(&k.gil);
        if (c->eager && part == PART_WHOLE && len == nbytes)   /* one step: eager (enter) */
            c->eager_wait = me == root ? -1 : (int)root;
        int e = enter(c, k.arena, phase, sig, &k.gil);
        if (e == 2)
            return call_end(&k, ST_STARTED);
        if (e != 0)
            return call_end(&k, e < 0 ? -1 : ST_MISMATCH);
        if (me != root) {
            if (get(c, root, c->w_shared + phase)) {
                if (lo == 0)
                    return call_end(&k, ST_PYTHON);
                gil_take(&k.gil);
                PyErr_SetString(PyExc_RuntimeError, "collcomm native core: the broadcast's root "
                                "published its buffer in place after the first step");
                return call_end(&k, -1);
            }
            const char *src = peer(&k, phase, root, len);
            if (src == NULL)
                return call_end(&k, -1);
            near_copy(buf + lo, src, len);
        }
    }
    return call_end(&k, ST_DONE);
}

/* gather(arena, send, recv or None, root (-1: all_gather), sig): one chunk, staged (but
 * for a gather's root, whose block nobody reads); it may run in two parts (Core.part).
 * An all_gather of ag_vote_min bytes or more goes the voted way (all_gather_voted, whole
 * calls only); gather(arena, send, recv, -1, sig, fixed_cma, itemsize): such an
 * all_gather of any size, `fixed_cma` the fixed rule's answer should rank 0 not vote.
 * gather(..., itemsize, cma_key, pids): a gather (root >= 0) split by cross-memory attach
 * (rooted_cma). */
static PyObject *Core_gather(Core *c, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 8 && nargs != 7 && check_args(nargs, 5, "gather") < 0)
        return NULL;
    PARSE_LONG(root, args[3]);
    PARSE_U64(sig, args[4]);
    long itemsize = 0;
    uint64_t cma_key = 0;
    int fixed_cma = 0;
    if (nargs == 7) {     /* (..., fixed_cma, itemsize): an all_gather the Python code hands over */
        fixed_cma = PyObject_IsTrue(args[5]);
        itemsize = PyLong_AsLong(args[6]);
        if (fixed_cma < 0 || PyErr_Occurred())
            return NULL;
    }
    if (nargs == 8) {
        itemsize = PyLong_AsLong(args[5]);
        cma_key = PyLong_AsUnsignedLongLongMask(args[6]);
        if (PyErr_Occurred())
            return NULL;
    }
    Call k;
    if (call_begin(&k, c, args[0]) < 0)
        return NULL;
    char *send, *recv;
    Py_ssize_t kb, rbytes;
    if (get_buffer(&k, args[1], 0, &send, &kb) < 0 ||
        get_buffer(&k, args[2], 1, &recv, &rbytes) < 0)
        return call_end(&k, ST_REFUSE);
    int n = c->n, me = c->rank;
    int receiver = root < 0 || me == root;
    if (nargs == 8) {
        if (kb == 0 || root < 0 || root >= n || cma_key == 0 || (receiver && rbytes != n * kb))
            return call_end(&k, ST_REFUSE);
        int apart = receiver && !overlaps(recv + me * kb, kb, send, kb);
        return rooted_cma(&k, receiver ? recv : send, kb, root, sig, itemsize, cma_key, args[7],
                          SPLIT_GATHER, apart ? recv + me * kb : NULL, send);
    }
    if (root < 0 && c->ag_vote_min > 0 && kb * n >= c->ag_vote_min && kb > 0) {
        /* the voted all_gather (_all_gather_voted.c): whole calls only; chunks of whole
         * elements (without the itemsize, one chunk: a slot at most) */
        Py_ssize_t chunk = itemsize > 0 ? c->slot / itemsize * itemsize : c->slot;
        if (c->part != PART_WHOLE || recv == NULL || rbytes != n * kb || chunk <= 0 ||
            (itemsize <= 0 && kb > c->slot))
            return call_end(&k, ST_REFUSE);
        int st = all_gather_voted(&k, send, kb, recv, NULL, sig, fixed_cma, chunk);
        return call_end(&k, st);
    }
    if (nargs == 7 || kb > c->slot || kb == 0 || root >= n ||
        (receiver && (recv == NULL || rbytes != n * kb)))
        return call_end(&k, ST_REFUSE);
    int part = c->part;            /* (a two-part call: see enter; its second part stages nothing) */
    if (receiver && recv != NULL && part != PART_FINISH) {
        char *own = recv + me * kb;
        if (!overlaps(own, kb, send, kb))
            out_copy(c, own, send, kb);
    }
    int phase = part == PART_FINISH ? k.phase : next_phase(&k);
    if (part != PART_FINISH) {
        if (root >= 0 && me == root)   /* nobody reads a gather root's block */
            put(c, c->w_shared + phase, 0);
        else
            stage(&k, phase, send, kb, 1);
    }
    int e = enter(c, k.arena, phase, sig, &k.gil);
    if (e == 2)
        return call_end(&k, ST_STARTED);
    if (e != 0)
        return call_end(&k, e < 0 ? -1 : ST_MISMATCH);
    if (any_shared(c, phase))
        return call_end(&k, ST_PYTHON);
    if (receiver) {
        const char *src[PEERS];
        for (int i = 1; i < n; i += PEERS) {   /* from the next rank on: no slot read by all at once */
            int m = n - i < PEERS ? n - i : PEERS;
            if (peers_at(&k, phase, me + i, m, kb, NULL, src) < 0)
                return call_end(&k, -1);
            for (int j = 0; j < m; j++)
                near_copy(recv + (Py_ssize_t)((me + i + j) % n) * kb, src[j], kb);
        }
    }
    return call_end(&k, ST_DONE);
}

/* barrier(arena, sig): one sync with the signature check (barrier_call: the fast call's too). */
static PyObject *barrier_call(Core *c, PyObject *arena, uint64_t sig)
{
    Call k;
    call_begin(&k, c, arena);
    int phase = c->part == PART_FINISH ? k.phase : next_phase(&k);   /* (Core.part: see enter) */
    int last = c->eager && c->rank == 0 && c->part == PART_WHOLE && c->eager_wait == EAGER_NO;
    int e = last ? enter_last(c, k.arena, phase, sig, &k.gil) : enter(c, k.arena, phase, sig, &k.gil);
    return call_end(&k, e < 0 ? -1 : e == 2 ? ST_STARTED : e ? ST_MISMATCH : ST_DONE);
}

static PyObject *Core_barrier(Core *c, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_args(nargs, 2, "barrier") < 0)
        return NULL;
    PARSE_U64(sig, args[1]);
    return barrier_call(c, args[0], sig);
}

/* sync(arena): the plain counter barrier (Arena.sync). */
/* settle(arena[, block]) -> None: the call left early (see enter) settled, or none
 * pending; or that call's signature when some rank's differs (no longer pending: the
 * caller raises the mismatch, the arena's words of that call, phase lag_phase, still in
 * place). block False: no wait (a rank not there yet: None, nothing pending any more). */
static PyObject *Core_settle(Core *c, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 1 && nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "settle(arena[, block])");
        return NULL;
    }
    int block = nargs == 1 ? 1 : PyObject_IsTrue(args[1]);
    if (block < 0)
        return NULL;
    Gil gil = {NULL};
    int e = settle(c, args[0], &gil, block);
    gil_take(&gil);
    if (e < 0)
        return NULL;
    if (e == 0)
        Py_RETURN_NONE;
    c->lag_target = 0;
    return PyLong_FromUnsignedLongLong(c->lag_sig);
}

static PyObject *Core_sync(Core *c, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_args(nargs, 1, "sync") < 0)
        return NULL;
    Call k;
    if (call_begin(&k, c, args[0]) < 0)
        return NULL;
    int e = sync_all(c, k.arena, &k.gil);
    return call_end(&k, e < 0 ? -1 : ST_DONE);
}
