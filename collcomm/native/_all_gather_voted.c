/* all_gather from ag_vote_min bytes: staged or by cross-memory attach as rank 0 votes
 * (_a2a_choice.c has why and how rank 0 chooses); included by _shmcore.c after
 * _collectives_move.c, whose Core_gather calls it. shm_move._gather_voted is the same in
 * Python, step for step, so native and Python ranks can meet in one call:
 *
 * - the agreement step (one phase): every rank announces its send buffer's address
 *   (SHARED = arena_layout.CMA, OFFSET = the address), rank 0 its vote in the top bits of
 *   its SIZE word; our own block copied; the sync with the signature check;
 * - by CMA (rank 0 voted so, or did not vote and the fixed rule, `fixed_cma`, says so):
 *   each rank reads every other's block from its buffer, then a closing sync (nobody
 *   touches a send buffer before all have read it);
 * - staged: in chunks of the slot (whole elements), each staged, a plain sync, copied out;
 *   a call rank 0 voted for ends with a sync too, so its timing covers the same work
 *   either way.
 *
 * Against the fixed rule this costs one sync more per staged call (~1 µs on calls of
 * 256 KiB and up). Rank r's block goes to recv + r * kb, or with `views` (the fast call's
 * list form, _fastcall_lists.c) to views[r].buf. Returns a status, or -1 with an
 * exception. */
static int all_gather_voted(Call *k, const char *send, Py_ssize_t kb, char *recv,
                            const Py_buffer *views, uint64_t sig, int fixed_cma, Py_ssize_t chunk)
{
#define AG_BLOCK(r) (views != NULL ? (char *)views[r].buf : recv + (r) * kb)
    Core *c = k->c;
    int n = c->n, me = c->rank;
    Py_ssize_t total = kb * n;
    /* the pids first, before any traffic: should they not do (more than 64 ranks), the
     * Python code runs the same steps, and no peer is left waiting mid-call */
    pid_t pids[64];
    PyObject *held = PyObject_GetAttrString(k->arena, "pids");
    int got = held == NULL ? -1 : read_pids(held, n, pids);
    Py_XDECREF(held);
    if (got != 0)
        return got < 0 ? -1 : ST_REFUSE;
    int vote = way_vote(c, c->ag_choice, total, 1);
    int phase = next_phase(k);
    put(c, c->w_shared + phase, 1);                     /* arena_layout.CMA */
    put(c, c->w_offset + phase, (uint64_t)(uintptr_t)send);
    put(c, c->w_size + phase, (uint64_t)vote << A2A_VOTE_SHIFT);
    if (total > c->one_shot)
        gil_release(&k->gil);
    char *own = AG_BLOCK(me);
    if (!overlaps(own, kb, send, kb))
        out_copy(c, own, send, kb);
    int e = enter(c, k->arena, phase, sig, &k->gil);
    if (e != 0)
        return e < 0 ? -1 : ST_MISMATCH;
    int voted = (int)(get(c, 0, c->w_size + phase) >> A2A_VOTE_SHIFT);
    long long t0 = vote != A2A_VOTE_NONE ? now_ns() : 0;
    if (voted == A2A_VOTE_CMA || (voted == A2A_VOTE_NONE && fixed_cma)) {
        for (int i = 1; i < n; i++) {   /* from the next rank on: no peer read by all at once */
            int r = (me + i) % n;
            if (cma_move(pids[r], AG_BLOCK(r), get(c, r, c->w_offset + phase), kb, 0) < 0) {
                int err = errno;
                cma_raise(k, r, "read", err);
                return -1;
            }
        }
        if (sync_all(c, k->arena, &k->gil) < 0)
            return -1;
        c->ag_read++;
    } else {
        for (Py_ssize_t lo = 0; lo < kb; lo += chunk) {
            Py_ssize_t len = kb - lo < chunk ? kb - lo : chunk;
            int step = next_phase(k);
            stage(k, step, send + lo, len, 1);
            if (sync_all(c, k->arena, &k->gil) < 0)
                return -1;
            for (int i = 1; i < n; i++) {
                int r = (me + i) % n;
                const char *src = peer(k, step, r, len);
                if (src == NULL)
                    return -1;
                near_copy(AG_BLOCK(r) + lo, src, len);
            }
        }
        if (voted == A2A_VOTE_STAGED && sync_all(c, k->arena, &k->gil) < 0)
            return -1;
    }
    way_record(c->ag_choice, c->ag_by, total, vote, t0);
    return ST_DONE;
#undef AG_BLOCK
}
