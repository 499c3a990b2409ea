/* The native collectives that only move data: broadcast, gather (and all_gather),
 * scatter, all_to_all; and barrier and sync.
 *
 * Included by _shmcore.c (scatter is in _scatter.c). Like _collectives_reduce.c, each is
 * the single-chunk staged case of shm_move.py, step for step (the large broadcast and
 * gather also their CMA form); all_to_all first agrees on the largest block (checking
 * every pair of split sizes), then moves rounds of pieces through the slots.
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
            memcpy(buf + lo, src, len);
        }
    }
    return call_end(&k, ST_DONE);
}

/* gather(arena, send, recv or None, root (-1: all_gather), sig): one chunk, staged (but
 * for a gather's root, whose block nobody reads); it may run in two parts (Core.part).
 * gather(..., itemsize, cma_key, pids): a gather (root >= 0) split by cross-memory attach
 * (rooted_cma). */
static PyObject *Core_gather(Core *c, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 8 && check_args(nargs, 5, "gather") < 0)
        return NULL;
    PARSE_LONG(root, args[3]);
    PARSE_U64(sig, args[4]);
    long itemsize = 0;
    uint64_t cma_key = 0;
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
    if (kb > c->slot || kb == 0 || root >= n || (receiver && (recv == NULL || rbytes != n * kb)))
        return call_end(&k, ST_REFUSE);
    int part = c->part;            /* (a two-part call: see enter; its second part stages nothing) */
    if (receiver && recv != NULL && part != PART_FINISH) {
        char *own = recv + me * kb;
        if (!overlaps(own, kb, send, kb))
            memcpy(own, send, kb);
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
        for (int r = 0; r < n; r++) {
            if (r == me)
                continue;
            const char *src = peer(&k, phase, r, kb);
            if (src == NULL)
                return call_end(&k, -1);
            memcpy(recv + r * kb, src, kb);
        }
    }
    return call_end(&k, ST_DONE);
}

/* all_to_all(arena, send, send_counts, recv, recv_counts, itemsize, sig, cma_limit[, pids]):
 * agree on the largest block (and check the split sizes pair by pair), then rounds of
 * staged pieces. cma_limit >= 0: past the agreement, if largest * itemsize > cma_limit
 * the call ends by cross-memory attach: with `pids` (every rank's) here, as
 * shm_move._all_to_all_cma does it (the same words and syncs), else the Python code
 * finishes it (ST_PYTHON).
 *
 * Eager (shm_move.a2a_eager_at / a2a_eager): a rank whose whole send buffer is at most
 * one_shot bytes (and fits its slot after the table) also stages it in the agreement's
 * slot, at a2a_eager_at(n), laid out as in its buffer (its own block left out). When
 * every rank did (each rank works that out from the tables, so all decide alike), the
 * call ends with that one sync: each reads its blocks from there, after the checks.
 * Nothing is read before the signature and every split size are checked. */
static inline Py_ssize_t a2a_eager_at(int n)
{
    return ((Py_ssize_t)2 * n * 8 + 63) / 64 * 64;
}

static inline int a2a_eager(Core *c, Py_ssize_t bytes)
{
    return bytes <= c->one_shot && a2a_eager_at(c->n) + bytes <= c->slot;
}
static int read_counts(PyObject *seq, int n, Py_ssize_t *out)
{
    PyObject *fast = PySequence_Fast(seq, "counts must be a sequence");
    if (fast == NULL)
        return -1;
    if (PySequence_Fast_GET_SIZE(fast) != n) {
        Py_DECREF(fast);
        return 1;
    }
    PyObject **items = PySequence_Fast_ITEMS(fast);
    for (int i = 0; i < n; i++) {
        out[i] = PyLong_AsSsize_t(items[i]);
        if (out[i] == -1 && PyErr_Occurred()) {
            Py_DECREF(fast);
            return -1;
        }
        if (out[i] < 0) {
            Py_DECREF(fast);
            return 1;
        }
    }
    Py_DECREF(fast);
    return 0;
}

/* all_to_all past the argument parsing (Core_all_to_all's and the fast call's): `tab`
 * (4n, the caller's) holds the send then the receive counts (`bad`: they were not n
 * non-negative counts: refuse), and gets the displacements; `pids_obj` NULL: none. */
static PyObject *a2a_run(Core *c, PyObject *arena, PyObject *send_obj, PyObject *recv_obj,
                         Py_ssize_t *tab, int bad, long isz, uint64_t sig, long cma_limit,
                         PyObject *pids_obj)
{
    int n = c->n, me = c->rank;
    Py_ssize_t *sc = tab, *rc = tab + n, *sd = tab + 2 * n, *rd = tab + 3 * n;
    Call k;
    if (call_begin(&k, c, arena) < 0)
        return NULL;
    char *send, *recv;
    Py_ssize_t sbytes, rbytes;
    if (get_buffer(&k, send_obj, 0, &send, &sbytes) < 0 ||
        get_buffer(&k, recv_obj, 1, &recv, &rbytes) < 0)
        return call_end(&k, ST_REFUSE);
    Py_ssize_t ssum = 0, rsum = 0, largest = 0;
    if (!bad) {
        for (int j = 0; j < n; j++) {
            sd[j] = ssum;
            rd[j] = rsum;
            ssum += sc[j];
            rsum += rc[j];
            if (j != me && sc[j] > largest)
                largest = sc[j];
        }
    }
    Py_ssize_t slot_elems = isz > 0 ? c->slot / isz : 0;
    if (bad || isz <= 0 || ssum * isz > sbytes || rsum * isz > rbytes || 2 * n * 8 > c->slot ||
        slot_elems < n)
        return call_end(&k, ST_REFUSE);
    int agree = next_phase(&k);
    put(c, c->w_size + agree, (uint64_t)largest);
    int64_t *table = (int64_t *)slot_at(c, agree, me);
    for (int j = 0; j < n; j++) {
        table[j] = sc[j];
        table[n + j] = rc[j];
    }
    if (ssum > 0 && a2a_eager(c, ssum * isz)) {   /* our send buffer but our own block, as it lies */
        char *eager = (char *)table + a2a_eager_at(n);
        Py_ssize_t own = sd[me] * isz, past = (sd[me] + sc[me]) * isz;
        memcpy(eager, send, own);
        memcpy(eager + past, send + past, ssum * isz - past);
    }
    int e = enter(c, k.arena, agree, sig, &k.gil);
    if (e != 0)
        return call_end(&k, e < 0 ? -1 : ST_MISMATCH);
    /* every rank checks the whole matrix: what i sends j is what j expects from i */
    for (int i = 0; i < n; i++) {
        const int64_t *ti = (const int64_t *)slot_at(c, agree, i);
        for (int j = 0; j < n; j++) {
            const int64_t *tj = (const int64_t *)slot_at(c, agree, j);
            if (ti[j] != tj[n + i])
                return call_end(&k, ST_PAIRS);
        }
    }
    /* our block to ourselves (the check above covered it: sc[me] == rc[me]) */
    if (sc[me])
        memmove(recv + rd[me] * isz, send + sd[me] * isz, (size_t)sc[me] * isz);
    int eager = 1;
    for (int r = 0; r < n && eager; r++) {
        const int64_t *tr = (const int64_t *)slot_at(c, agree, r);
        int64_t total = 0;
        for (int j = 0; j < n; j++)
            total += tr[j];
        eager = a2a_eager(c, (Py_ssize_t)total * isz);
    }
    if (eager) {   /* every rank staged its whole buffer with the tables: read ours */
        for (int r = 0; r < n; r++) {
            if (r == me || rc[r] == 0)
                continue;
            const int64_t *tr = (const int64_t *)slot_at(c, agree, r);
            int64_t at = 0;
            for (int j = 0; j < me; j++)
                at += tr[j];
            memcpy(recv + rd[r] * isz, (const char *)tr + a2a_eager_at(n) + at * isz,
                   (size_t)rc[r] * isz);
        }
        return call_end(&k, ST_DONE);
    }
    Py_ssize_t all_largest = 0;
    for (int r = 0; r < n; r++) {
        Py_ssize_t v = (Py_ssize_t)get(c, r, c->w_size + agree);
        if (v > all_largest)
            all_largest = v;
    }
    if (cma_limit >= 0 && all_largest * isz > cma_limit) {
        pid_t pids[64];
        int got = pids_obj != NULL ? read_pids(pids_obj, n, pids) : 1;
        if (got != 0)
            return call_end(&k, got < 0 ? -1 : ST_PYTHON);
        /* shm_move._all_to_all_cma: our send displacements in our slot, our send
         * buffer's address (SHARED = arena_layout.CMA = 1), sync, read our block from each
         * sender, sync (nobody touches a send buffer until all have read it) */
        int phase = next_phase(&k);
        int64_t *disp = (int64_t *)slot_at(c, phase, me);
        for (int j = 0; j < n; j++)
            disp[j] = sd[j];
        put(c, c->w_shared + phase, 1);
        put(c, c->w_offset + phase, ssum ? (uint64_t)(uintptr_t)send : 0);
        gil_release(&k.gil);
        if (sync_all(c, k.arena, &k.gil) < 0)
            return call_end(&k, -1);
        for (int r = 0; r < n; r++) {
            if (r == me || rc[r] == 0)
                continue;
            int64_t start = ((const int64_t *)slot_at(c, phase, r))[me];
            if (cma_move(pids[r], recv + rd[r] * isz, get(c, r, c->w_offset + phase) +
                         (uint64_t)(start * isz), rc[r] * isz, 0) < 0) {
                int err = errno;
                cma_raise(&k, r, "read", err);
                return call_end(&k, -1);
            }
        }
        if (sync_all(c, k.arena, &k.gil) < 0)
            return call_end(&k, -1);
        return call_end(&k, ST_DONE);
    }
    Py_ssize_t piece = c->slot / (isz * n);
    if (all_largest * isz * n > c->one_shot)
        gil_release(&k.gil);
    for (Py_ssize_t lo = 0; lo < all_largest; lo += piece) {
        int phase = next_phase(&k);
        char *staged = slot_at(c, phase, me);
        for (int j = 0; j < n; j++) {
            if (j == me)
                continue;
            Py_ssize_t cnt = sc[j] - lo;
            cnt = cnt < 0 ? 0 : cnt > piece ? piece : cnt;
            if (cnt)
                memcpy(staged + (Py_ssize_t)j * piece * isz, send + (sd[j] + lo) * isz, cnt * isz);
        }
        if (sync_all(c, k.arena, &k.gil) < 0)
            return call_end(&k, -1);
        for (int r = 0; r < n; r++) {
            if (r == me)
                continue;
            Py_ssize_t cnt = rc[r] - lo;
            cnt = cnt < 0 ? 0 : cnt > piece ? piece : cnt;
            if (cnt)
                memcpy(recv + (rd[r] + lo) * isz, slot_at(c, phase, r) + (Py_ssize_t)me * piece * isz,
                       cnt * isz);
        }
    }
    return call_end(&k, ST_DONE);
}

static PyObject *Core_all_to_all(Core *c, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 9 && check_args(nargs, 8, "all_to_all") < 0)
        return NULL;
    PARSE_LONG(isz, args[5]);
    PARSE_U64(sig, args[6]);
    PARSE_LONG(cma_limit, args[7]);
    int n = c->n;
    Py_ssize_t *tab = PyMem_Malloc(sizeof(Py_ssize_t) * 4 * (size_t)n);
    if (tab == NULL)
        return PyErr_NoMemory();
    int bad = read_counts(args[2], n, tab);
    if (bad == 0)
        bad = read_counts(args[4], n, tab + n);
    PyObject *r = bad < 0 ? NULL : a2a_run(c, args[0], args[1], args[3], tab, bad, isz, sig,
                                           cma_limit, nargs == 9 ? args[8] : NULL);
    PyMem_Free(tab);
    return r;
}

/* barrier(arena, sig): one sync with the signature check (barrier_call: the fast call's too). */
static PyObject *barrier_call(Core *c, PyObject *arena, uint64_t sig)
{
    Call k;
    call_begin(&k, c, arena);
    int phase = c->part == PART_FINISH ? k.phase : next_phase(&k);   /* (Core.part: see enter) */
    int e = enter(c, k.arena, phase, sig, &k.gil);
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
