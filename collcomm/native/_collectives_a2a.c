/* The native all_to_all (included by _shmcore.c after _collectives_move.c, whose
 * barrier and sync it does not need): the single-chunk staged case of shm_a2a.py's
 * all_to_all, step for step, and its cross-memory-attach ending.
 */

/* all_to_all(arena, send, send_counts, recv, recv_counts, itemsize, sig, cma_limit[, pids]):
 * agree on the largest block (and check the split sizes pair by pair), then rounds of
 * staged pieces. In two parts (Core.part, see enter; only a rank whose send buffer goes
 * eager, below): the first stages and arrives at the agreement, the second does the rest
 * (reads the eager blocks, or, when some rank's buffer did not go eager, goes on with
 * everybody as a whole call does: staged rounds or cross-memory reads by the size rule,
 * rank 0 not voting). cma_limit >= 0: past the agreement, if rank 0 voted so (_a2a_choice.c)
 * or, without its vote, if largest * itemsize > cma_limit, the call ends by cross-memory
 * attach: with every rank's pids (`pids`, else the arena's) here, as
 * shm_a2a._all_to_all_cma does it (the same words and syncs), else the Python code
 * finishes it (ST_PYTHON).
 *
 * Eager (shm_a2a.a2a_eager_at / a2a_eager): a rank whose whole send buffer is at most
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
    if (c->part == PART_FINISH) {
        /* the counts as the first part staged them (the agreement's row of ours), not the
         * caller's lists read again: MPI reads them at the call, and the checks below and
         * every copy must use the counts the others checked against */
        const int64_t *row = (const int64_t *)slot_at(c, k.phase, me);
        for (int j = 0; j < n; j++) {
            sc[j] = (Py_ssize_t)row[j];
            rc[j] = (Py_ssize_t)row[n + j];
        }
        bad = 0;
    }
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
    int part = c->part;   /* a call in two parts (see enter): only one whose data goes eager */
    if (bad || isz <= 0 || ssum * isz > sbytes || rsum * isz > rbytes || 2 * n * 8 > c->slot ||
        slot_elems < n || (part != PART_WHOLE && !a2a_eager(c, ssum * isz)))
        return call_end(&k, ST_REFUSE);
    /* its first part stages the agreement's words, table and eager copy and arrives; its
     * second stages nothing (the phase of the first) and goes on from the agreement */
    int agree = part == PART_FINISH ? k.phase : next_phase(&k);
    int vote = part != PART_WHOLE ? A2A_VOTE_NONE   /* (rank 0's: _a2a_choice.c) */
             : way_vote(c, c->a2a_choice, ssum * isz, cma_limit >= 0);
    if (part != PART_FINISH) {
        put(c, c->w_size + agree, (uint64_t)largest | ((uint64_t)vote << A2A_VOTE_SHIFT));
        /* our send buffer's address, for a call that goes by CMA (SHARED = arena_layout.CMA) */
        put(c, c->w_shared + agree, 1);
        put(c, c->w_offset + agree, ssum ? (uint64_t)(uintptr_t)send : 0);
        int64_t *table = (int64_t *)slot_at(c, agree, me);
        for (int j = 0; j < n; j++) {
            table[j] = sc[j];
            table[n + j] = rc[j];
        }
        if (ssum > 0 && a2a_eager(c, ssum * isz)) {   /* our send buffer but our own block, as it lies */
            char *eager = (char *)table + a2a_eager_at(n);
            Py_ssize_t own = sd[me] * isz, past = (sd[me] + sc[me]) * isz;
            near_copy(eager, send, own);
            near_copy(eager + past, send + past, ssum * isz - past);
        }
    }
    int e = enter(c, k.arena, agree, sig, &k.gil);
    if (e == 2)
        return call_end(&k, ST_STARTED);
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
        out_copy(c, recv + rd[me] * isz, send + sd[me] * isz, (Py_ssize_t)sc[me] * isz);
    int eager = 1;
    for (int r = 0; r < n && eager; r++) {
        const int64_t *tr = (const int64_t *)slot_at(c, agree, r);
        int64_t total = 0;
        for (int j = 0; j < n; j++)
            total += tr[j];
        eager = a2a_eager(c, (Py_ssize_t)total * isz);
    }
    if (eager) {   /* every rank staged its whole buffer with the tables: read ours */
        for (int i = 1; i < n; i++) {   /* from the next rank on: no slot read by all at once */
            int r = (me + i) % n;
            if (rc[r] == 0)
                continue;
            const int64_t *tr = (const int64_t *)slot_at(c, agree, r);
            int64_t at = 0;
            for (int j = 0; j < me; j++)
                at += tr[j];
            near_copy(recv + rd[r] * isz, (const char *)tr + a2a_eager_at(n) + at * isz,
                   (size_t)rc[r] * isz);
        }
        return call_end(&k, ST_DONE);
    }
    Py_ssize_t all_largest = 0;
    for (int r = 0; r < n; r++) {
        Py_ssize_t v = (Py_ssize_t)(get(c, r, c->w_size + agree) & A2A_COUNT_MASK);
        if (v > all_largest)
            all_largest = v;
    }
    int voted = (int)(get(c, 0, c->w_size + agree) >> A2A_VOTE_SHIFT);
    long long t0 = vote != A2A_VOTE_NONE ? now_ns() : 0;
    if (cma_limit >= 0 && (voted == A2A_VOTE_CMA ||
                           (voted == A2A_VOTE_NONE && all_largest * isz > cma_limit))) {
        pid_t pids[64];
        gil_take(&k.gil);      /* (the agreement's wait may have let it go) */
        PyObject *held = pids_obj == NULL ? PyObject_GetAttrString(k.arena, "pids") : NULL;
        int got = pids_obj != NULL ? read_pids(pids_obj, n, pids)
                : held != NULL ? read_pids(held, n, pids) : (PyErr_Clear(), 1);
        Py_XDECREF(held);
        if (got != 0)
            return call_end(&k, got < 0 ? -1 : ST_PYTHON);
        /* shm_a2a._all_to_all_cma: read our block from each sender's buffer (its address
         * announced in the agreement, our block's place in it from its table), sync
         * (nobody touches a send buffer until all have read it) */
        gil_release(&k.gil);
        for (int i = 1; i < n; i++) {   /* from the next rank on: no peer read by all at once
                                         * (all at rank 0 first took 1.3-1.5x as long: BENCHMARKS.md) */
            int r = (me + i) % n;
            if (rc[r] == 0)
                continue;
            const int64_t *tr = (const int64_t *)slot_at(c, agree, r);
            int64_t start = 0;
            for (int j = 0; j < me; j++)
                start += tr[j];
            if (cma_move(pids[r], recv + rd[r] * isz, get(c, r, c->w_offset + agree) +
                         (uint64_t)(start * isz), rc[r] * isz, 0) < 0) {
                int err = errno;
                cma_raise(&k, r, "read", err);
                return call_end(&k, -1);
            }
        }
        if (sync_all(c, k.arena, &k.gil) < 0)
            return call_end(&k, -1);
        c->a2a_read++;
        way_record(c->a2a_choice, c->a2a_by, ssum * isz, vote, t0);
        return call_end(&k, ST_DONE);
    }
    /* blocks packed at the largest one's size (rounded up to 64 / isz elements), not a slot's n-th: spread
     * over the slot (a 64 KiB block every 512 KiB at n = 8) they sat on the same cache sets
     * (shm_a2a.a2a_piece, the same number) */
    Py_ssize_t piece = c->slot / (isz * n), line = isz < 64 ? 64 / isz : 1;
    Py_ssize_t packed = (all_largest + line - 1) / line * line;
    if (packed < piece)
        piece = packed > 0 ? packed : 1;
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
                near_copy(staged + (Py_ssize_t)j * piece * isz, send + (sd[j] + lo) * isz, cnt * isz);
        }
        if (sync_all(c, k.arena, &k.gil) < 0)
            return call_end(&k, -1);
        for (int i = 1; i < n; i++) {   /* from the next rank's slot on, as above */
            int r = (me + i) % n;
            Py_ssize_t cnt = rc[r] - lo;
            cnt = cnt < 0 ? 0 : cnt > piece ? piece : cnt;
            if (cnt)
                near_copy(recv + (rd[r] + lo) * isz, slot_at(c, phase, r) + (Py_ssize_t)me * piece * isz,
                       cnt * isz);
        }
    }
    /* a staged call rank 0 voted for ends with everybody's sync, as one by CMA does: its
     * timing then covers the others' last copies too (without, it favoured staging by up
     * to a piece's copy: 16 MiB staged at 1.3x the time of CMA, which it measured faster) */
    if (voted == A2A_VOTE_STAGED && sync_all(c, k.arena, &k.gil) < 0)
        return call_end(&k, -1);
    way_record(c->a2a_choice, c->a2a_by, ssum * isz, vote, t0);
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
