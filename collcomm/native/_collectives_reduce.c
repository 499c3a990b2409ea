/* The native collectives that combine: all_reduce, reduce, reduce_scatter.
 *
 * Included by _shmcore.c. Each one is the single-chunk, staged case of its counterpart in
 * collcomm/algorithms/shm_reduce.py, step for step: stage our data in our slot of the
 * phase, enter (signature check), combine the slots in the Python code's order (rank
 * order; in two-shot, our slice of our own slot first) so every rank gets identical bits.
 * Anything else is refused (ST_REFUSE) before any traffic, or handed back (ST_PYTHON).
 */

/* Two-shot, first half: reduce our slice of every rank's staged data into our own slot
 * (ours first, then the others in rank order, as the Python code does). 0, or -1 with an
 * exception. */
static int reduce_own_slice(Call *k, int phase, kernel_t fn, int isz, char *mine,
                            Py_ssize_t count, Py_ssize_t nbytes)
{
    Py_ssize_t s0, s1;
    split(count, k->c->n, k->c->rank, &s0, &s1);
    for (int r = 0; r < k->c->n; r++) {
        if (r == k->c->rank)
            continue;
        const char *src = peer(k, phase, r, nbytes);
        if (src == NULL)
            return -1;
        fn(mine + s0 * isz, src + s0 * isz, s1 - s0);
    }
    return 0;
}

/* Two-shot, second half (after a sync): every owner's reduced slice into `out`. 0, or -1
 * with an exception. */
static int copy_slices(Call *k, int phase, int isz, const char *mine, char *out,
                       Py_ssize_t count, Py_ssize_t nbytes)
{
    for (int r = 0; r < k->c->n; r++) {
        Py_ssize_t r0, r1;
        split(count, k->c->n, r, &r0, &r1);
        const char *src = r == k->c->rank ? mine : peer(k, phase, r, nbytes);
        if (src == NULL)
            return -1;
        near_copy(out + r0 * isz, src + r0 * isz, (r1 - r0) * isz);
    }
    return 0;
}

/* One-shot: `out` = every rank's staged data of this phase combined in rank order (ours
 * from `mine`), so every rank that does it gets identical bits: the first two in one pass
 * (`fn3`, out = r0 (op) r1: the same bits as a copy then `fn`; NULL: that), then `fn` for
 * each further rank. `out` overlaps no rank's data. 0, or -1 with an exception. */
static int fold_slots(Call *k, int phase, kernel_t fn, kernel3_t fn3, const char *mine, char *out,
                      Py_ssize_t count, Py_ssize_t nbytes)
{
    const char *first = NULL, *at[PEERS];
    for (int r0 = 0; r0 < k->c->n; r0 += PEERS) {
        int m = k->c->n - r0 < PEERS ? k->c->n - r0 : PEERS;
        if (peers_at(k, phase, r0, m, nbytes, mine, at) < 0)
            return -1;
        for (int j = 0; j < m; j++) {
            int r = r0 + j;
            const char *src = at[j];
            if (r == 0)
                first = src;
            else if (r == 1 && fn3 != NULL)
                fn3(out, first, src, count);
            else {
                if (r == 1)
                    near_copy(out, first, nbytes);
                fn(out, src, count);
            }
        }
    }
    if (k->c->n == 1)
        near_copy(out, first, nbytes);
    return 0;
}

/* all_reduce(arena, buf, code, sig): one chunk (nbytes <= slot), staged (no CMA), our
 * buffer not in the shared heap. One-shot while all_reduce_one_step, else two-shot. A one-shot
 * call may run in two parts (Core.part, see enter): stage and arrive, then later the rest. */
static PyObject *Core_all_reduce(Core *c, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_args(nargs, 4, "all_reduce") < 0)
        return NULL;
    PARSE_LONG(code, args[2]);
    PARSE_U64(sig, args[3]);
    int isz;
    kernel_t fn = kernel_for(code, &isz);
    Call k;
    if (call_begin(&k, c, args[0]) < 0)
        return NULL;
    char *buf;
    Py_ssize_t nbytes;
    if (get_buffer(&k, args[1], 1, &buf, &nbytes) < 0)
        return call_end(&k, ST_REFUSE);
    if (fn == NULL || nbytes % isz || nbytes > c->slot || nbytes == 0)
        return call_end(&k, ST_REFUSE);
    Py_ssize_t count = nbytes / isz;
    int me = c->rank, part = c->part;
    int one_step = all_reduce_one_step(c, nbytes);
    if (part == PART_START && !one_step)     /* (two syncs: never in two parts) */
        return call_end(&k, ST_REFUSE);
    /* a two-part call's second part: the phase and the staged copy of its first */
    int phase = part == PART_FINISH ? k.phase : next_phase(&k);
    char *mine = part == PART_FINISH ? peer(&k, phase, me, nbytes) : stage(&k, phase, buf, nbytes, 1);
    if (mine == NULL)
        return call_end(&k, -1);
    int e = enter(c, k.arena, phase, sig, &k.gil);
    if (e == 2)
        return call_end(&k, ST_STARTED);
    if (e != 0)
        return call_end(&k, e < 0 ? -1 : ST_MISMATCH);
    if (any_shared(c, phase))
        return call_end(&k, ST_PYTHON);
    if (one_step)     /* every rank reduces all n slots */
        return call_end(&k, fold_slots(&k, phase, fn, kernel3_for(code), mine, buf, count, nbytes) < 0
                                ? -1 : ST_DONE);
    /* two-shot: our slice of every slot reduced into our slot, sync, every slice out */
    if (reduce_own_slice(&k, phase, fn, isz, mine, count, nbytes) < 0 ||
        sync_all(c, k.arena, &k.gil) < 0 || copy_slices(&k, phase, isz, mine, buf, count, nbytes) < 0)
        return call_end(&k, -1);
    return call_end(&k, ST_DONE);
}

/* reduce between two ranks past reduce_pair_from bytes or a slot (shm_reduce._reduce_pair,
 * step for step; shm_reduce.reduce_in_pair says when): in steps
 * of shm_large.pipeline_elems, the other rank stages each step and the root folds it into
 * recv in rank order as it arrives, while the other stages the next; a signature check at
 * every step. Rank 0 as the root copies its own step into recv before the step's sync
 * (while the other stages); rank 1 folds rank 0's data first, then its own (in place, a
 * block at a time, its own block kept aside first in `aside`, which stays in the L2: at
 * 32 MiB 4.4 ms against the Python loop's 7.4, which copies each whole step aside). Each byte is copied once by the other rank and reduced once by the root; the
 * two-shot call had both stage everything, reduce half each, sync, and the root copy it
 * all out again. (Session 18 found the two-shot call faster within a slot; session 23
 * measured the pair faster than it and than CMA from 768 KiB: the figures at
 * arena_layout.REDUCE_PAIR_FROM.) A status, or -1 with an exception. */
#define PAIR_BLOCK (128 << 10)

static int reduce_pair_steps(Call *k, kernel_t fn, int isz, const char *send, char *recv,
                             Py_ssize_t nbytes, long root, uint64_t sig, Py_ssize_t step,
                             int in_place, char *aside)
{
    Core *c = k->c;
    int me = c->rank;
    for (Py_ssize_t lo = 0; lo < nbytes; lo += step) {
        Py_ssize_t len = nbytes - lo < step ? nbytes - lo : step;
        int phase = next_phase(k);
        if (me != root)
            stage(k, phase, send + lo, len, 0);
        else {
            put(c, c->w_offset + phase, 0);    /* (nothing staged: nobody reads the root's slot) */
            if (me == 0 && !in_place)
                near_copy(recv + lo, send + lo, len);
        }
        int e = enter(c, k->arena, phase, sig, &k->gil);
        if (e != 0)
            return e < 0 ? -1 : ST_MISMATCH;
        if (me != root)
            continue;
        const char *other = peer(k, phase, 1 - me, len);
        if (other == NULL)
            return -1;
        if (me == 0) {
            fn(recv + lo, other, len / isz);
            continue;
        }
        /* (out of place in one go: measured faster than by blocks at 8 MiB) */
        Py_ssize_t block = in_place ? PAIR_BLOCK / isz * isz : len;
        for (Py_ssize_t b = 0; b < len; b += block) {
            Py_ssize_t blen = len - b < block ? len - b : block;
            const char *mine = send + lo + b;
            if (in_place) {
                near_copy(aside, mine, blen);
                mine = aside;
            }
            near_copy(recv + lo + b, other + b, blen);
            fn(recv + lo + b, mine, blen / isz);
        }
    }
    return ST_DONE;
}

static int reduce_pair(Call *k, kernel_t fn, int isz, const char *send, char *recv,
                       Py_ssize_t nbytes, long root, uint64_t sig)
{
    Core *c = k->c;
    int me = c->rank;
    int in_place = me == root && overlaps(recv, nbytes, send, nbytes);
    if (in_place && recv != send)
        return ST_REFUSE;                  /* (partly overlapping: the Python path) */
    Py_ssize_t step = nbytes / c->pipe_steps;
    step = step < c->pipe_min ? c->pipe_min : step;
    step = step > c->slot ? c->slot : step;
    step = step / isz < 1 ? isz : step / isz * isz;
    char *aside = NULL;
    if (me == 1 && in_place && (aside = PyMem_RawMalloc(PAIR_BLOCK)) == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    if (nbytes > c->one_shot)
        gil_release(&k->gil);
    int status = reduce_pair_steps(k, fn, isz, send, recv, nbytes, root, sig, step, in_place, aside);
    PyMem_RawFree(aside);
    return status;
}

static PyObject *reduce_cma(Call *k, long code, const char *send, char *recv, Py_ssize_t nbytes,
                            long root, uint64_t sig);   /* (_cma.c) */

/* Does a reduce of `nbytes` a rank go by cross-memory attach (reduce_cma)? As
 * shm_reduce.reduce_by_cma decides: the same answer on every rank. Such a call is never
 * started in two parts (the fast call declines it first: fast_reduce). */
static int reduce_goes_by_cma(const Core *c, Py_ssize_t nbytes)
{
    return c->reduce_cma_min > 0 && nbytes >= c->reduce_cma_min && nbytes <= c->reduce_cma_max &&
           c->pids != NULL;
}

/* reduce(arena, send, recv or None, code, root, sig): between two ranks of
 * reduce_cma_min..reduce_cma_max bytes by cross-memory attach (reduce_cma, _cma.c); else
 * always staged; up to
 * reduce_one_shot bytes of all ranks' data in one step (the root combines every slot; it
 * may then run in two parts), else between two ranks past reduce_pair_from bytes or a
 * slot in steps (reduce_pair),
 * else one chunk in two (each rank reduces its slice, a sync, the root collects the
 * slices). */
static PyObject *Core_reduce(Core *c, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_args(nargs, 6, "reduce") < 0)
        return NULL;
    PARSE_LONG(code, args[3]);
    PARSE_LONG(root, args[4]);
    PARSE_U64(sig, args[5]);
    int isz;
    kernel_t fn = kernel_for(code, &isz);
    Call k;
    if (call_begin(&k, c, args[0]) < 0)
        return NULL;
    char *send, *recv;
    Py_ssize_t nbytes, rbytes;
    if (get_buffer(&k, args[1], 0, &send, &nbytes) < 0 ||
        get_buffer(&k, args[2], 1, &recv, &rbytes) < 0)
        return call_end(&k, ST_REFUSE);
    int n = c->n, me = c->rank;
    int one_step = nbytes * n <= c->reduce_one_shot;
    Py_ssize_t pair_past = c->reduce_pair_from > 0 && c->reduce_pair_from < c->slot
                           ? c->reduce_pair_from : c->slot;
    int pair = n == 2 && nbytes > pair_past && c->pipe_min > 0;   /* (in steps; as
                                                                    * shm_reduce.reduce_in_pair) */
    if (fn == NULL || nbytes % isz || (nbytes > c->slot && !pair) || nbytes == 0 || root < 0 ||
        root >= n || (me == root && (recv == NULL || rbytes != nbytes)))
        return call_end(&k, ST_REFUSE);
    Py_ssize_t count = nbytes / isz;
    int cma = reduce_goes_by_cma(c, nbytes);
    int part = c->part;            /* (one step: it may run in two parts, see enter) */
    /* never in two parts where the whole call goes another way (by CMA or in pair steps):
     * whether a call starts in two parts is this rank's affair (an async call, the group's
     * queue empty), the way a call goes must be every rank's. (A backstop: the fast call
     * declines such a part before it starts anything, fast_reduce; refused here, its first
     * part would run the whole call at once, blocking) */
    if (part != PART_WHOLE && (!one_step || pair || cma))
        return call_end(&k, ST_REFUSE);
    if (pair)
        return call_end(&k, reduce_pair(&k, fn, isz, send, recv, nbytes, root, sig));
    if (cma)
        return reduce_cma(&k, code, send, recv, nbytes, root, sig);
    int phase = part == PART_FINISH ? k.phase : next_phase(&k);
    /* one step in one part: only the root reads the slots, so the root stages nothing and
     * combines its send buffer where it is (in place, recv overlapping it: staged, as before) */
    int direct = one_step && part == PART_WHOLE && me == root && !overlaps(recv, nbytes, send, nbytes);
    char *mine = direct ? send : part == PART_FINISH ? peer(&k, phase, me, nbytes)
                                                     : stage(&k, phase, send, nbytes, 0);
    if (mine == NULL)
        return call_end(&k, -1);
    int e = enter(c, k.arena, phase, sig, &k.gil);
    if (e == 2)
        return call_end(&k, ST_STARTED);
    if (e != 0)
        return call_end(&k, e < 0 ? -1 : ST_MISMATCH);
    if (one_step)     /* the root combines all n slots */
        return call_end(&k, me == root && fold_slots(&k, phase, fn, kernel3_for(code), mine, recv,
                                                     count, nbytes) < 0 ? -1 : ST_DONE);
    if (reduce_own_slice(&k, phase, fn, isz, mine, count, nbytes) < 0 ||
        sync_all(c, k.arena, &k.gil) < 0 ||
        (me == root && copy_slices(&k, phase, isz, mine, recv, count, nbytes) < 0))
        return call_end(&k, -1);
    return call_end(&k, ST_DONE);
}

/* reduce_scatter(arena, send, recv, code, sig): one chunk (n blocks fit a slot), staged;
 * it may run in two parts (Core.part, see enter). */
static PyObject *Core_reduce_scatter(Core *c, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_args(nargs, 5, "reduce_scatter") < 0)
        return NULL;
    PARSE_LONG(code, args[3]);
    PARSE_U64(sig, args[4]);
    int isz;
    kernel_t fn = kernel_for(code, &isz);
    Call k;
    if (call_begin(&k, c, args[0]) < 0)
        return NULL;
    char *send, *recv;
    Py_ssize_t sbytes, kb;
    if (get_buffer(&k, args[1], 0, &send, &sbytes) < 0 ||
        get_buffer(&k, args[2], 1, &recv, &kb) < 0)
        return call_end(&k, ST_REFUSE);
    int n = c->n, me = c->rank;
    if (fn == NULL || kb % isz || kb == 0 || sbytes != n * kb || kb / isz > c->slot / (isz * n))
        return call_end(&k, ST_REFUSE);
    Py_ssize_t count = kb / isz;
    int part = c->part;            /* (a two-part call: see enter) */
    int phase = part == PART_FINISH ? k.phase : next_phase(&k);
    if (sbytes > c->one_shot)
        gil_release(&k.gil);
    if (part != PART_FINISH)
        near_copy(slot_at(c, phase, me), send, sbytes);
    int e = enter(c, k.arena, phase, sig, &k.gil);
    if (e == 2)
        return call_end(&k, ST_STARTED);
    if (e != 0)
        return call_end(&k, e < 0 ? -1 : ST_MISMATCH);
    near_copy(recv, slot_at(c, phase, 0) + me * kb, kb);
    for (int r = 1; r < n; r++)
        fn(recv, slot_at(c, phase, r) + me * kb, count);
    return call_end(&k, ST_DONE);
}
