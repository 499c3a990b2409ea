/* Cross-memory attach for the native collectives: moving bytes to or from a peer process
 * (process_vm_readv/writev), every rank's pid, the arena's error for a failed transfer,
 * and the rooted calls split by CMA (broadcast, scatter, gather: shm_large.rooted_split).
 * all_to_all's CMA exchange, in _collectives_a2a.c, uses the same helpers.
 *
 * Included by _shmcore.c after _cma_move.c (cma_move), before _collectives_move.c.
 */

#define CMA_KEY 1   /* arena_layout.CMA: a SHARED value, the data at the OFFSET word's address */

/* Every rank's pid from `obj` (a sequence of n ints) into pids[64]: 0; 1 if it does not
 * fit (the caller hands the call to the Python code); -1 with an exception. */
static int read_pids(PyObject *obj, int n, pid_t *pids)
{
    PyObject *fast = PySequence_Fast(obj, "pids must be a sequence");
    if (fast == NULL)
        return -1;
    if (PySequence_Fast_GET_SIZE(fast) != n || n > 64) {
        Py_DECREF(fast);
        return 1;
    }
    for (int r = 0; r < n; r++) {
        long v = PyLong_AsLong(PySequence_Fast_GET_ITEM(fast, r));
        if (v == -1 && PyErr_Occurred()) {
            Py_DECREF(fast);
            return -1;
        }
        pids[r] = (pid_t)v;
    }
    Py_DECREF(fast);
    return 0;
}

/* A cross-memory transfer with rank r failed (errno `err`): raise the arena's error for it
 * (Arena.cma_failed: PeerLostError if r died). Returns -1 with the exception set. */
static int cma_raise(Call *k, int r, const char *what, int err)
{
    gil_take(&k->gil);
    PyObject *res = PyObject_CallMethod(k->arena, "cma_failed", "isi", r, what, err);
    if (res != NULL) {
        Py_DECREF(res);
        PyErr_Format(PyExc_RuntimeError, "collcomm native core: could not %s rank %d's memory", what, r);
    }
    return -1;
}

/* What a rooted call split by cross-memory attach moves (shm_large.rooted_split). */
#define SPLIT_BCAST 0      /* every rank's buffer is the root's whole buffer */
#define SPLIT_SCATTER 1    /* rank r's block is block r of the root's buffer; the root writes */
#define SPLIT_GATHER 2     /* ... and the root reads its share; the others write the rest */

/* The root's share (elements) of each other rank's block in a split scatter or gather
 * (shm_large.split_head): 1/n, or 1/(2n) where the root also copies its own block. */
static inline Py_ssize_t split_head(Py_ssize_t elems, int n, int root_copies_own)
{
    return root_copies_own ? elems / (2 * n) : elems / n;
}

/* A rooted call by cross-memory attach, split between the root and the others
 * (shm_large.rooted_split; only where every rank may write every other's memory): the
 * Python code's one CMA step, then its closing sync. Every rank announces its buffer's
 * address with SHARED = `cma_key` (the root of a scatter or gather also its share,
 * split_head's, in bytes, in its SIZE word), sync with the signature check; then, for each
 * rank r but the root, the first (block / itemsize) / n elements of r's block (a scatter's
 * or gather's: the root's share) move by the root
 * (broadcast, scatter: it writes them into r's buffer; gather: it reads them from r's)
 * and the rest by r (reads them from the root's buffer; gather: writes them into it);
 * sync. `block` is the bytes one rank gets (gather: sends); the root's buffer holds n
 * blocks, r's at r * block, except for a broadcast (one, shared by all). After the first
 * sync, anything else (a peer's buffer published in place, a failed transfer) is handed
 * back (ST_PYTHON): the Python code finishes from there (a transfer redone moves the same
 * bytes). With `own_to`, the root copies its own block (`block` bytes from `own_from`)
 * after its transfers, before the closing sync (the Python code does the same). */
static PyObject *rooted_cma(Call *k, char *buf, Py_ssize_t block, long root, uint64_t sig,
                            Py_ssize_t itemsize, uint64_t cma_key, PyObject *pids_obj, int mode,
                            char *own_to, const char *own_from)
{
    Core *c = k->c;
    int n = c->n, me = c->rank;
    pid_t pids[64];
    int bad = read_pids(pids_obj, n, pids);
    if (bad < 0)
        return call_end(k, -1);
    if (bad || itemsize <= 0 || block % itemsize)
        return call_end(k, ST_REFUSE);
    int phase = next_phase(k);
    if (me == root || mode != SPLIT_BCAST)
        put(c, c->w_shared + phase, cma_key);
    put(c, c->w_offset + phase, (uint64_t)(uintptr_t)buf);
    Py_ssize_t elems = block / itemsize;
    if (me == root && mode != SPLIT_BCAST)    /* our share of the others' blocks, for them all */
        put(c, c->w_size + phase, (uint64_t)(split_head(elems, n, own_to != NULL) * itemsize));
    gil_release(&k->gil);
    int e = enter(c, k->arena, phase, sig, &k->gil);
    if (e != 0)
        return call_end(k, e < 0 ? -1 : ST_MISMATCH);
    for (int r = 0; r < n; r++)
        if ((r == root || mode != SPLIT_BCAST) && get(c, r, c->w_shared + phase) != cma_key)
            return call_end(k, ST_PYTHON);
    Py_ssize_t head = elems / n * itemsize;
    if (mode != SPLIT_BCAST) {                /* the root's published share (bytes) */
        uint64_t h = get(c, root, c->w_size + phase);
        if (h > (uint64_t)block || h % (uint64_t)itemsize)
            return call_end(k, ST_PYTHON);    /* (rooted_split raises: not a share of a block) */
        head = (Py_ssize_t)h;
    }
    int root_writes = mode != SPLIT_GATHER;
    if (me == root) {
        for (int i = 1; i < n; i++) {
            int r = (int)((root + i) % n);
            char *mine = buf + (mode == SPLIT_BCAST ? 0 : (Py_ssize_t)r * block);
            if (head && cma_move(pids[r], mine, get(c, r, c->w_offset + phase), head, root_writes) < 0)
                return call_end(k, ST_PYTHON);
        }
        if (own_to != NULL)
            out_copy(c, own_to, own_from, block);
    } else {
        uint64_t at = get(c, root, c->w_offset + phase) +
                      (uint64_t)(mode == SPLIT_BCAST ? 0 : (Py_ssize_t)me * block) + (uint64_t)head;
        if (cma_move(pids[root], buf + head, at, block - head, !root_writes) < 0)
            return call_end(k, ST_PYTHON);
    }
    if (sync_all(c, k->arena, &k->gil) < 0)
        return call_end(k, -1);
    return call_end(k, ST_DONE);
}

/* Core_reduce's step between two ranks by cross-memory attach (shm_reduce._reduce_cma,
 * step for step), for calls of c->reduce_cma_min..reduce_cma_max bytes (set by
 * Arena.build with c->pids where CMA works and n = 2). The other rank announces its send
 * buffer's address (SHARED = CMA), the root nothing; a sync with the signature check;
 * the root reads the other's data into its own slot of the phase and writes recv = rank
 * 0's data (op) rank 1's in one pass (the three-operand kernel, the Python code's order
 * and bits); a closing sync keeps the other's buffer untouched until the root has read
 * it. Past the first sync the root hands back (ST_PYTHON) a peer that announced anything
 * else (its buffer in the shared heap) or a failed read: the Python code finishes from
 * there, closing sync included (shm_reduce.reduce_cma_after). */
static PyObject *reduce_cma(Call *k, long code, const char *send, char *recv, Py_ssize_t nbytes,
                            long root, uint64_t sig)
{
    Core *c = k->c;
    int isz, me = c->rank;
    kernel_t fn = kernel_for(code, &isz);
    kernel3_t fn3 = kernel3_for(code);
    pid_t pids[64];
    int bad = read_pids(c->pids, c->n, pids);
    if (bad < 0)
        return call_end(k, -1);
    if (bad || fn == NULL || fn3 == NULL)
        return call_end(k, ST_REFUSE);
    int phase = next_phase(k);
    put(c, c->w_shared + phase, me == root ? 0 : CMA_KEY);
    put(c, c->w_offset + phase, me == root ? 0 : (uint64_t)(uintptr_t)send);
    gil_release(&k->gil);
    int e = enter(c, k->arena, phase, sig, &k->gil);
    if (e != 0)
        return call_end(k, e < 0 ? -1 : ST_MISMATCH);
    if (me == root) {
        int other = 1 - me;
        char *scratch = slot_at(c, phase, me);      /* nobody reads the root's slot */
        if (get(c, other, c->w_shared + phase) != CMA_KEY ||
            cma_move(pids[other], scratch, get(c, other, c->w_offset + phase), nbytes, 0) < 0)
            return call_end(k, ST_PYTHON);
        Py_ssize_t count = nbytes / isz;
        if (me == 0)
            fn3(recv, send, scratch, count);
        else
            fn3(recv, scratch, send, count);
    }
    if (sync_all(c, k->arena, &k->gil) < 0)
        return call_end(k, -1);
    return call_end(k, ST_DONE);
}
