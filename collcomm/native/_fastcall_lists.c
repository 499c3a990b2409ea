/* The fast call's list forms: torch's lists of tensors (one buffer per rank) stand for the
 * one contiguous buffer the Core collectives take.
 *
 * all_gather (a list on every rank), gather and scatter (the list only on the root) run
 * the Core protocol of _collectives_move.c step for step here, reading the peers' slots
 * straight into the list's buffers (gather, all_gather) or staging the list's buffers
 * straight into the root's slot (scatter): no scratch, no extra copy. Included by
 * _fastcall.c before the collectives that use it (_fastcall_ops.c).
 */

/* n buffers of a list or tuple, each C-contiguous (writable if asked) with native dtype `dt`
 * and `kb` bytes, held in *views (`stack`, PEERS of them, when they fit; else PyMem); -1
 * (no exception) if any is not. */
static int fast_views(PyObject *seq, int n, int writable, int dt, Py_ssize_t kb, Py_buffer *stack,
                      Py_buffer **views)
{
    *views = NULL;
    if (!(PyList_CheckExact(seq) || PyTuple_CheckExact(seq)) || PySequence_Fast_GET_SIZE(seq) != n)
        return -1;
    Py_buffer *v = n <= PEERS ? stack : PyMem_Malloc(sizeof(Py_buffer) * (size_t)n);
    if (v == NULL) {
        PyErr_Clear();
        return -1;
    }
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (int i = 0; i < n; i++) {
        int bad = nd_buffer(items[i], &v[i], PyBUF_C_CONTIGUOUS | PyBUF_FORMAT |
                                     (writable ? PyBUF_WRITABLE : 0)) < 0;
        if (bad)
            PyErr_Clear();
        else if (fast_dtype(&v[i]) != dt || v[i].len != kb) {
            PyBuffer_Release(&v[i]);
            bad = 1;
        }
        if (bad) {
            while (i-- > 0)
                PyBuffer_Release(&v[i]);
            if (v != stack)
                PyMem_Free(v);
            return -1;
        }
    }
    *views = v;
    return 0;
}

static void fast_views_release(Py_buffer *v, int n, Py_buffer *stack)
{
    if (v == NULL)
        return;
    for (int i = 0; i < n; i++)
        PyBuffer_Release(&v[i]);
    if (v != stack)
        PyMem_Free(v);
}

/* Whether any two of the n buffers overlap: not when they lie in address order, each past
 * the one before (the usual list); else sorted by address, neighbours compared. */
static int cmp_views(const void *a, const void *b)
{
    const char *x = (*(Py_buffer *const *)a)->buf, *y = (*(Py_buffer *const *)b)->buf;
    return x < y ? -1 : x > y;
}

static int views_overlap(Py_buffer *v, int n)
{
    if (n < 2)
        return 0;
    if (n == 2)
        return overlaps(v[0].buf, v[0].len, v[1].buf, v[1].len);
    int in_order = 1;       /* (the usual list: in address order, each past the one before) */
    for (int i = 1; i < n && in_order; i++)
        in_order = (char *)v[i - 1].buf + v[i - 1].len <= (char *)v[i].buf;
    if (in_order)
        return 0;
    Py_buffer *stack[PEERS];
    Py_buffer **order = n <= PEERS ? stack : PyMem_Malloc(sizeof(Py_buffer *) * (size_t)n);
    if (order == NULL)
        return 1;
    for (int i = 0; i < n; i++)
        order[i] = &v[i];
    qsort(order, (size_t)n, sizeof(Py_buffer *), cmp_views);
    int bad = 0;
    for (int i = 1; i < n && !bad; i++)
        bad = (char *)order[i - 1]->buf + order[i - 1]->len > (char *)order[i]->buf;
    if (order != stack)
        PyMem_Free(order);
    return bad;
}

/* Core_gather at the root (or any rank, for all_gather) with the receive side a list of n
 * buffers of kb bytes: the same
 * staging (all_gather only: nobody reads a gather root's block), sync and signature check,
 * the peers' blocks copied into v[r]. Our own block is copied after staging (so a send that
 * overlaps it is read first). Returns the status (DONE, MISMATCH, PYTHON: some rank
 * published in place, Hooks.finish reads the rest) or NULL with an exception. */
static PyObject *list_gather(Fast *s, const char *send, Py_buffer *v, Py_ssize_t kb, uint64_t sig,
                             int all)
{
    int me = s->rank;
    if (s->core == Py_None) {
        memmove(v[me].buf, send, kb);
        return PyLong_FromLong(ST_DONE);
    }
    Core *c = (Core *)s->core;
    Call k;
    call_begin(&k, c, s->arena);
    int phase = next_phase(&k);
    if (all)
        stage(&k, phase, send, kb, 1);
    else
        put(c, c->w_shared + phase, 0);
    out_copy(c, v[me].buf, send, kb);
    int e = enter(c, k.arena, phase, sig, &k.gil);
    if (e != 0)
        return call_end(&k, e < 0 ? -1 : ST_MISMATCH);
    if (any_shared(c, phase))
        return call_end(&k, ST_PYTHON);
    const char *src[PEERS];
    for (int i = 1; i < c->n; i += PEERS) {   /* from the next rank on, as Core_gather */
        int m = c->n - i < PEERS ? c->n - i : PEERS;
        if (peers_at(&k, phase, me + i, m, kb, NULL, src) < 0)
            return call_end(&k, -1);
        for (int j = 0; j < m; j++)
            near_copy(v[(me + i + j) % c->n].buf, src[j], kb);
    }
    return call_end(&k, ST_DONE);
}

/* An all_gather into a list of n buffers from the core's ag_vote_min: the voted way
 * (_all_gather_voted.c), each block straight into its buffer, the fixed rule's answer
 * from Fast.ag_cma as the flat form's (the caller checked that `send` overlaps no buffer
 * of the list but, exactly, our own). */
static PyObject *list_voted(Fast *s, const char *send, Py_buffer *v, Py_ssize_t kb,
                            Py_ssize_t itemsize, uint64_t sig)
{
    Core *c = (Core *)s->core;
    Call k;
    call_begin(&k, c, s->arena);
    int fixed = s->ag_cma > 0 && kb * c->n >= s->ag_cma;
    return call_end(&k, all_gather_voted(&k, send, kb, NULL, v, sig, fixed,
                                         c->slot / itemsize * itemsize));
}

/* Core_scatter at the root with the send side a list of n buffers of kb bytes: the others'
 * buffers staged into our slot (row r of n rows of kb bytes; our own row left empty), the
 * sync and signature check, then our own block copied out (after the staging, so a
 * receive buffer that overlaps the list changes nothing; while the others copy theirs). */
static PyObject *list_scatter(Fast *s, Py_buffer *v, char *recv, Py_ssize_t kb, uint64_t sig)
{
    int me = s->rank;
    if (s->core == Py_None) {
        memmove(recv, v[me].buf, kb);
        return PyLong_FromLong(ST_DONE);
    }
    Core *c = (Core *)s->core;
    Call k;
    call_begin(&k, c, s->arena);
    int phase = next_phase(&k);
    if (c->n * kb > c->one_shot)
        gil_release(&k.gil);
    char *slot = slot_at(c, phase, me);
    put(c, c->w_shared + phase, 0);   /* staged (as _scatter.c's root says it) */
    for (int r = 0; r < c->n; r++)
        if (r != me)
            near_copy(slot + r * kb, v[r].buf, kb);
    if (c->eager)                  /* the root needs nobody's data: eager (enter) */
        c->eager_wait = -1;
    int e = enter(c, k.arena, phase, sig, &k.gil);
    if (e == 0)
        out_copy(c, recv, v[me].buf, kb);
    return call_end(&k, e < 0 ? -1 : e ? ST_MISMATCH : ST_DONE);
}

/* A split scatter or gather at the root with a list whose buffers lie back to back in
 * memory (one buffer of n blocks, as shm_move's regular path would use): rooted_cma with it,
 * the root's own block copied after its transfers (scatter: into `one`, the receive
 * buffer; gather: from `one`, the send buffer). NULL with an exception, or the status
 * (DONE, MISMATCH, PYTHON: Hooks.finish completes it; a gather on the list's memory). */
static PyObject *list_split(Fast *s, Py_buffer *v, char *one, Py_ssize_t kb, long root,
                            uint64_t sig, Py_ssize_t itemsize, int gather)
{
    Core *c = (Core *)s->core;
    PyObject *pids = PyObject_GetAttrString(s->arena, "pids");
    if (pids == NULL)
        return NULL;
    Call k;
    call_begin(&k, c, s->arena);
    char *own = (char *)v[s->rank].buf;
    PyObject *status = rooted_cma(&k, (char *)v[0].buf, kb, root, sig, itemsize, s->cma_key, pids,
                                  gather ? SPLIT_GATHER : SPLIT_SCATTER,
                                  own == one ? NULL : gather ? own : one, gather ? one : own);
    Py_DECREF(pids);
    return status;
}

/* The n list buffers lie back to back, in order (the first block's address + r * kb). */
static int views_back_to_back(Py_buffer *v, int n, Py_ssize_t kb)
{
    for (int r = 1; r < n; r++)
        if ((char *)v[r].buf != (char *)v[0].buf + r * kb)
            return 0;
    return 1;
}

/* all_gather(send, list, name) / gather(send, list, root, name) at the root /
 * scatter(list, recv, root, name) at the root: one call straight between the list's
 * buffers and the arena. None (nothing done) unless the one buffer is C-contiguous
 * (writable for scatter) of a native dtype, the list (or tuple) holds exactly n
 * C-contiguous buffers (writable for the gathers) of that dtype and size, a gather's list
 * buffers do not overlap one another, and n blocks fit the limit (or, a scatter or gather
 * split by CMA, the list lies back to back: list_split): else the regular path
 * runs and raises every error with its text. A call handed back (mismatch, a peer's buffer
 * read in place) gets the list as its receive (gathers) or send (scatter) side:
 * Hooks.finish completes it. `root` is -1 for all_gather. */
static PyObject *fast_list(Fast *s, PyObject *const *args, int fc, long root, PyObject *name)
{
    int gather = fc != FC_SCATTER, n = s->size;
    PyObject *list = gather ? args[1] : args[0];
    Py_buffer one, *v, stack[PEERS];
    if (nd_buffer(gather ? args[0] : args[1], &one, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT |
                           (gather ? 0 : PyBUF_WRITABLE)) < 0) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    int dt = fast_dtype(&one);
    Py_ssize_t kb = one.len, count = kb / (one.itemsize ? one.itemsize : 1);
    Py_ssize_t split_at = fc == FC_SCATTER ? s->scatter_cma : fc == FC_GATHER ? s->gather_cma : 0;
    int split = split_at > 0 && kb * n >= split_at;
    Core *core = s->core == Py_None ? NULL : (Core *)s->core;
    int voted = fc == FC_ALL_GATHER && core != NULL && core->ag_vote_min > 0 &&
                kb * n >= core->ag_vote_min;     /* (_all_gather_voted.c: list_voted) */
    if (dt < 0 || kb <= 0 || (!split && kb * n > s->limit[fc]) ||
        fast_views(list, n, gather, dt, kb, stack, &v) < 0) {
        PyBuffer_Release(&one);
        Py_RETURN_NONE;
    }
    /* (a voted call refused, the regular path finishing it from the list would leave our
     * own element: more than 64 ranks, or a slot that holds no element, go that way whole) */
    if (voted && (n > 64 || core->slot < one.itemsize)) {
        fast_views_release(v, n, stack);
        PyBuffer_Release(&one);
        Py_RETURN_NONE;
    }
    for (int r = 0; voted && r < n; r++) {   /* (peers read `one` while we fill the list) */
        if (overlaps(one.buf, kb, v[r].buf, kb) && !(r == s->rank && one.buf == v[r].buf)) {
            fast_views_release(v, n, stack);
            PyBuffer_Release(&one);
            Py_RETURN_NONE;
        }
    }
    if (split && (!views_back_to_back(v, n, kb) ||   /* the regular path concatenates them */
                  (overlaps(one.buf, kb, v[0].buf, n * kb) && one.buf != v[s->rank].buf))) {
        fast_views_release(v, n, stack);
        PyBuffer_Release(&one);
        Py_RETURN_NONE;
    }
    if (gather && views_overlap(v, n)) {
        fast_views_release(v, n, stack);
        PyBuffer_Release(&one);
        Py_RETURN_NONE;
    }
    uint64_t sig = s->plain_sig[fc] | (s->dt_sig[dt] << 55) |
                   ((uint64_t)(root & 0x3FFF) << 36) | COUNT_BITS(count);
    PyObject *rec, *r = NULL;
    PyObject *tag = fast_begin(s, name, sig, fc, &rec);
    if (tag != NULL) {
        int settled = s->core == Py_None ? 0 : fast_settle(s);
        PyObject *status = settled < 0 ? NULL : settled ? PyLong_FromLong(ST_REFUSE)
                           : split ? list_split(s, v, one.buf, kb, root, sig, one.itemsize, gather)
                           : voted ? list_voted(s, one.buf, v, kb, one.itemsize, sig)
                           : gather ? list_gather(s, one.buf, v, kb, sig, fc == FC_ALL_GATHER)
                                   : list_scatter(s, v, one.buf, kb, sig);
        r = fast_end(s, status, rec, tag, sig, fc, name, args[0], args[1], list);
    }
    fast_views_release(v, n, stack);
    PyBuffer_Release(&one);
    return r;
}
