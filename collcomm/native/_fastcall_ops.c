/* The fast call's collectives (see _fastcall.c, which includes this file after the
 * bookkeeping every call shares: buffers, (op, dtype) rows, records, begin and end).
 *
 * Each entry checks, before anything else, that it can take the call (else returns None
 * having done nothing), packs the call's signature exactly as collcomm/core/collectives.py
 * does, and runs the Core collective of _shmcore.c between fast_begin and fast_end. In a
 * group of one (no Core) it only copies what the collective would leave in the output.
 */

/* ------------------------------------------------ what every entry shares */

/* Two buffers, `a` read and `b` written, either possibly None: their data, bytes and the
 * one native dtype they share (-1: refuse — not buffers, not contiguous, different or
 * unsupported dtypes, overlapping unless `same_ok` and identical). Released by the caller
 * through fast_release; fast_run hands them to the Core call (Handed, _arena_core.c). */
typedef struct {
    Py_buffer v[2];
    int held[2], writable[2];
    PyObject *obj[2];
    char *data[2];
    Py_ssize_t len[2], itemsize;
} Pair;

static void fast_release(Pair *p)
{
    for (int i = 0; i < 2; i++)
        if (p->held[i])
            PyBuffer_Release(&p->v[i]);
}

static int fast_pair(Pair *p, PyObject *a, PyObject *b, int same_ok)
{
    PyObject *obj[2] = {a, b};
    int dt = -2;
    p->held[0] = p->held[1] = p->writable[0] = p->writable[1] = 0;
    p->itemsize = 1;
    for (int i = 0; i < 2; i++) {
        p->data[i] = NULL;
        p->len[i] = 0;
        if (obj[i] == Py_None)
            continue;
        if (i == 1 && obj[1] == obj[0] && same_ok) {
            p->data[1] = p->data[0];
            p->len[1] = p->len[0];
            continue;
        }
        int written = i == 1 || (same_ok && obj[1] == obj[0]);
        if (nd_buffer(obj[i], &p->v[i], PyBUF_C_CONTIGUOUS | PyBUF_FORMAT |
                               (written ? PyBUF_WRITABLE : 0)) < 0) {
            PyErr_Clear();
            return -1;
        }
        p->held[i] = 1;
        p->obj[i] = obj[i];
        p->writable[i] = written;
        int d = fast_dtype(&p->v[i]);
        if (d < 0 || (dt != -2 && d != dt))
            return -1;
        dt = d;
        p->data[i] = p->v[i].buf;
        p->len[i] = p->v[i].len;
        p->itemsize = p->v[i].itemsize ? p->v[i].itemsize : 1;
    }
    if (dt == -2)
        return -1;
    if (p->data[0] != NULL && p->data[1] != NULL &&
        !(same_ok && p->data[0] == p->data[1] && p->len[0] == p->len[1]) &&
        overlaps(p->data[0], p->len[0], p->data[1], p->len[1]))
        return -1;
    return dt;
}

/* Core function `fn` on (arena, cargs...), handed the views `p` holds (released after) */
static PyObject *fast_core_call(Fast *s, PyObject *(*fn)(Core *, PyObject *const *, Py_ssize_t),
                                PyObject **cargs, Py_ssize_t nargs, Py_ssize_t sig_at, uint64_t sig,
                                Pair *p)
{
    Core *core = (Core *)s->core;
    for (int i = 0; i < 2; i++)
        core->handed[i] = (Handed){p->held[i] ? p->obj[i] : NULL, p->data[i], p->len[i],
                                   p->writable[i]};
    PyObject *status = core_call(fn, s, cargs, nargs, sig_at, sig);
    core->handed[0].obj = core->handed[1].obj = NULL;   /* (if it never took them) */
    fast_release(p);
    return status;
}

/* Run Core function `fn` on (arena, cargs...) with the signature at cargs[sig_at] between
 * the bookkeeping of fast_begin and fast_end (a group of one: nothing to run), handing it
 * the views `p` holds, which are released before fast_end; `a`, `b`, `c` are what
 * Hooks.finish gets if the call is handed back. */
static PyObject *fast_run(Fast *s, int fc, PyObject *name, uint64_t sig,
                          PyObject *(*fn)(Core *, PyObject *const *, Py_ssize_t),
                          PyObject **cargs, Py_ssize_t nargs, Py_ssize_t sig_at, PyObject *a,
                          PyObject *b, PyObject *c, Pair *p)
{
    PyObject *rec;
    PyObject *tag = fast_begin(s, name, sig, fc, &rec);
    if (tag == NULL) {
        fast_release(p);
        return NULL;
    }
    PyObject *status;
    if (s->core == Py_None) {
        fast_release(p);
        status = PyLong_FromLong(ST_DONE);
    } else {
        status = fast_core_call(s, fn, cargs, nargs, sig_at, sig, p);
    }
    return fast_end(s, status, rec, tag, sig, fc, name, a, b, c);
}

/* (_fastcall_parts.c: fast_run for one part of a call in two parts) */
static PyObject *fast_run_part(Fast *s, int part, int fc, PyObject *name, uint64_t sig,
                               PyObject *(*fn)(Core *, PyObject *const *, Py_ssize_t),
                               PyObject **cargs, Py_ssize_t nargs, Py_ssize_t sig_at, PyObject *a,
                               PyObject *b, PyObject *c, Pair *p);

/* all_reduce(send, recv, op, name) -> True | None: recv = op over every rank's send
 * (send may be recv: in place). In `part` of a call in two parts (_fastcall_parts.c), False
 * when the first part is done. */
static PyObject *fast_all_reduce(Fast *s, PyObject *const *args, Py_ssize_t nargs, int part)
{
    if (check_args(nargs, 4, "all_reduce") < 0)
        return NULL;
    if (!fast_open_part(s, part))
        Py_RETURN_NONE;
    Pair p;
    int dt = fast_pair(&p, args[0], args[1], 1);
    Py_ssize_t nbytes = p.len[1], count = nbytes / p.itemsize;
    int fits = dt >= 0 && nbytes > 0 && nbytes <= s->limit[FC_ALL_REDUCE] && p.len[0] == nbytes &&
               (part == PART_WHOLE || all_reduce_one_step((Core *)s->core, nbytes));
    FastOp *e = fits ? fast_op(s, args[2], dt) : NULL;
    if (e != NULL && p.data[0] != p.data[1] && part != PART_FINISH)
        near_copy(p.data[1], p.data[0], nbytes);
    PyObject *code = e == NULL ? NULL : PyLong_FromLong(e->code[dt]);
    if (code == NULL) {
        fast_release(&p);
        if (e != NULL || PyErr_Occurred())
            return NULL;
        Py_RETURN_NONE;
    }
    uint64_t sig = e->sig[dt] | ((uint64_t)0x3FFF << 36) | COUNT_BITS(count);
    PyObject *cargs[4] = {NULL, args[1], code, NULL};
    PyObject *r = fast_run_part(s, part, FC_ALL_REDUCE, args[3], sig, Core_all_reduce, cargs, 4, 3,
                                args[1], args[2], Py_None, &p);
    Py_DECREF(code);
    return r;
}

/* broadcast(buf, root, name) -> True | None (False: as all_reduce) */
static PyObject *fast_broadcast(Fast *s, PyObject *const *args, Py_ssize_t nargs, int part)
{
    if (check_args(nargs, 3, "broadcast") < 0)
        return NULL;
    long root = fast_root(s, args[1]);
    if (!fast_open_part(s, part) || root < 0)
        Py_RETURN_NONE;
    Pair p;
    int dt = fast_pair(&p, Py_None, args[0], 0);
    Py_ssize_t nbytes = p.len[1], count = nbytes / p.itemsize;
    int split = s->bcast_cma > 0 && nbytes >= s->bcast_cma;   /* else staged, one chunk */
    if (dt < 0 || nbytes == 0 || (!split && nbytes > s->limit[FC_BROADCAST]) ||
        (split && part != PART_WHOLE) || !part_size_ok(s, part, nbytes)) {
        fast_release(&p);
        Py_RETURN_NONE;
    }
    uint64_t sig = s->plain_sig[FC_BROADCAST] | (s->dt_sig[dt] << 55) |
                   ((uint64_t)(root & 0x3FFF) << 36) | COUNT_BITS(count);
    PyObject *cargs[7] = {NULL, args[0], args[1], NULL, NULL, NULL, NULL};
    if (split && fast_bcast_cma_args(s, p.itemsize, cargs + 4) < 0) {
        fast_release(&p);
        return NULL;
    }
    PyObject *r = fast_run_part(s, part, FC_BROADCAST, args[2], sig, Core_broadcast, cargs,
                                split ? 7 : 4, 3, args[0], args[1], Py_None, &p);
    for (int i = 4; i < 7; i++)
        Py_XDECREF(cargs[i]);
    return r;
}

/* all_gather(send, recv, name[, sig]) -> True | None: recv holds every rank's send, in rank
 * order; `sig` (a whole call of a flat buffer only) is the call's signature instead of an
 * all_gather's: a collective made of one all_gather, as the regular path makes it with that
 * signature (core/scan.py: a small scan, all-gathered then folded) */
static PyObject *fast_all_gather(Fast *s, PyObject *const *args, Py_ssize_t nargs, int part)
{
    if (!(nargs == 4 && part == PART_WHOLE) && check_args(nargs, 3, "all_gather") < 0)
        return NULL;
    if (!fast_open_part(s, part) || args[0] == args[1])
        Py_RETURN_NONE;
    if (nargs == 4 && (PyList_CheckExact(args[1]) || PyTuple_CheckExact(args[1])))
        Py_RETURN_NONE;
    if (PyList_CheckExact(args[1]) || PyTuple_CheckExact(args[1]))
        return part == PART_WHOLE ? fast_list(s, args, FC_ALL_GATHER, -1, args[2])
                                  : Py_NewRef(Py_None);
    Pair p = {.held = {0, 0}, .writable = {0, 1}, .obj = {args[0], args[1]}};
    Py_buffer *sv = &p.v[0], *rv = &p.v[1];
    if (nd_buffer(args[1], rv, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    p.held[1] = 1;
    if (nd_buffer(args[0], sv, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyErr_Clear();
        fast_release(&p);
        Py_RETURN_NONE;
    }
    p.held[0] = 1;
    int dt = fast_dtype(sv);
    Py_ssize_t kb = sv->len, count = sv->len / (sv->itemsize ? sv->itemsize : 1);
    int fits = dt >= 0 && fast_dtype(rv) == dt && kb > 0 && rv->len <= s->limit[FC_ALL_GATHER] &&
               part_size_ok(s, part, rv->len) &&
               rv->len == kb * s->size &&
               (s->size == 1 || !overlaps(sv->buf, kb, rv->buf, rv->len) ||
                sv->buf == (char *)rv->buf + s->rank * kb);
    if (fits && s->core == Py_None && sv->buf != rv->buf)   /* (a group of one: may overlap) */
        memmove(rv->buf, sv->buf, (size_t)kb);
    if (!fits) {
        fast_release(&p);
        Py_RETURN_NONE;
    }
    for (int i = 0; i < 2; i++) {
        p.data[i] = p.v[i].buf;
        p.len[i] = p.v[i].len;
    }
    uint64_t sig = s->plain_sig[FC_ALL_GATHER] | (s->dt_sig[dt] << 55) |
                   ((uint64_t)0x3FFF << 36) | COUNT_BITS(count);
    if (nargs == 4) {
        sig = PyLong_AsUnsignedLongLong(args[3]);
        if (sig == (uint64_t)-1 && PyErr_Occurred()) {
            fast_release(&p);
            return NULL;
        }
    }
    /* Core_gather's 5-argument form, or from the core's ag_vote_min (the voted way, whole
     * calls only: a part of one goes the regular way) its 7-argument form with the fixed
     * rule's answer, as shm_move's native call passes it (reads_peers: from ag_cma) */
    Core *core = s->core == Py_None ? NULL : (Core *)s->core;
    int voted = core != NULL && core->ag_vote_min > 0 && rv->len >= core->ag_vote_min;
    if (voted && part != PART_WHOLE) {
        fast_release(&p);
        Py_RETURN_NONE;
    }
    PyObject *all = PyLong_FromLong(-1);   /* Core_gather's root for all_gather (a cached int) */
    PyObject *isz = voted ? PyLong_FromSsize_t(sv->itemsize) : NULL;
    PyObject *fixed = s->ag_cma > 0 && rv->len >= s->ag_cma ? Py_True : Py_False;
    PyObject *cargs[7] = {NULL, args[0], args[1], all, NULL, fixed, isz};
    if (all == NULL || (voted && isz == NULL)) {
        Py_XDECREF(all);
        Py_XDECREF(isz);
        fast_release(&p);
        return NULL;
    }
    PyObject *r = fast_run_part(s, part, FC_ALL_GATHER, args[2], sig, Core_gather, cargs,
                                voted ? 7 : 5, 4, args[0], args[1], Py_None, &p);
    Py_XDECREF(isz);
    Py_DECREF(all);
    return r;
}

/* ------------------------------------------------ all_to_all, barrier (reduce, reduce_scatter:
 * _fastcall_reduce.c; gather, scatter: _fastcall_rooted.c) */
/* all_to_all(send, recv, name) -> True | None: equal blocks along the first dimension
 * (all_to_all_single without split sizes): block j of send to rank j, rank j's block into
 * block j of recv */
static PyObject *Fast_all_to_all(Fast *s, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_args(nargs, 3, "all_to_all") < 0)
        return NULL;
    if (!fast_open(s) || args[0] == args[1])
        Py_RETURN_NONE;
    Pair p;
    int dt = fast_pair(&p, args[0], args[1], 0);
    int n = s->size, fits = dt >= 0;
    for (int i = 0; fits && i < 2; i++)   /* rows divisible by n, the same row size */
        fits = p.v[i].ndim >= 1 && p.v[i].shape[0] > 0 && p.v[i].shape[0] % n == 0;
    Py_ssize_t nbytes = p.len[0], count = nbytes / p.itemsize / n;
    fits = fits && nbytes > 0 && p.len[1] == nbytes && p.v[0].shape[0] == p.v[1].shape[0] &&
           nbytes <= s->limit[FC_ALL_TO_ALL];
    if (fits && s->core == Py_None)
        near_copy(p.data[1], p.data[0], nbytes);
    if (!fits) {
        fast_release(&p);
        Py_RETURN_NONE;
    }
    uint64_t sig = s->plain_sig[FC_ALL_TO_ALL] | (s->dt_sig[dt] << 55);
    PyObject *rec;
    PyObject *tag = fast_begin(s, args[2], sig, FC_ALL_TO_ALL, &rec);
    if (tag == NULL) {
        fast_release(&p);
        return NULL;
    }
    PyObject *status;
    if (s->core == Py_None) {
        status = PyLong_FromLong(ST_DONE);
    } else {   /* a2a_run straight away: no lists of counts, no argument objects */
        Core *core = (Core *)s->core;
        int settled = fast_settle(s);
        Py_ssize_t stack[4 * 16], *tab = settled != 0 ? NULL : n <= 16 ? stack
                                       : PyMem_Malloc(sizeof(Py_ssize_t) * 4 * (size_t)n);
        if (settled != 0) {
            status = settled < 0 ? NULL : PyLong_FromLong(ST_REFUSE);
        } else if (tab == NULL) {
            status = PyErr_NoMemory();
        } else {
            for (int i = 0; i < 2 * n; i++)
                tab[i] = count;
            for (int i = 0; i < 2; i++)
                core->handed[i] = (Handed){p.obj[i], p.data[i], p.len[i], p.writable[i]};
            status = a2a_run(core, s->arena, args[0], args[1], tab, 0, (long)p.itemsize, sig,
                             (long)s->a2a_cma, NULL);
            core->handed[0].obj = core->handed[1].obj = NULL;
            if (tab != stack)
                PyMem_Free(tab);
        }
    }
    fast_release(&p);
    /* Hooks.finish (a call not done here) takes the counts as a list */
    PyObject *counts = Py_NewRef(Py_None);
    if (status != NULL && PyLong_AsLong(status) != ST_DONE) {
        PyObject *k = PyErr_Occurred() ? NULL : PyLong_FromSsize_t(count);
        Py_SETREF(counts, k == NULL ? NULL : PyList_New(n));
        for (int i = 0; counts != NULL && i < n; i++)
            PyList_SET_ITEM(counts, i, Py_NewRef(k));
        Py_XDECREF(k);
        if (counts == NULL)
            Py_CLEAR(status);
    }
    PyObject *r = fast_end(s, status, rec, tag, sig, FC_ALL_TO_ALL, args[2], args[0], args[1],
                           counts == NULL ? Py_None : counts);
    Py_XDECREF(counts);
    return r;
}

/* barrier(name) -> True | None */
static PyObject *fast_barrier(Fast *s, PyObject *const *args, Py_ssize_t nargs, int part)
{
    if (check_args(nargs, 1, "barrier") < 0)
        return NULL;
    if (!fast_open_part(s, part) || s->limit[FC_BARRIER] == 0)
        Py_RETURN_NONE;
    uint64_t sig = s->plain_sig[FC_BARRIER];
    if (part != PART_WHOLE) {      /* Core_barrier, through fast_run_part (no buffers) */
        Pair none = {.held = {0, 0}, .obj = {NULL, NULL}, .data = {NULL, NULL}, .len = {0, 0}};
        PyObject *cargs[2] = {NULL, NULL};
        return fast_run_part(s, part, FC_BARRIER, args[0], sig, Core_barrier, cargs, 2, 1,
                             Py_None, Py_None, Py_None, &none);
    }
    PyObject *rec;
    PyObject *tag = fast_begin(s, args[0], sig, FC_BARRIER, &rec);
    if (tag == NULL)
        return NULL;
    /* Core_barrier's call without its argument objects */
    int settled = s->core == Py_None ? 0 : fast_settle(s);
    PyObject *status = s->core == Py_None ? PyLong_FromLong(ST_DONE)
                       : settled < 0 ? NULL : settled ? PyLong_FromLong(ST_REFUSE)
                                     : barrier_call((Core *)s->core, s->arena, sig);
    return fast_end(s, status, rec, tag, sig, FC_BARRIER, args[0], Py_None, Py_None, Py_None);
}
