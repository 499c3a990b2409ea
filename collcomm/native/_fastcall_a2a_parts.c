/* all_to_all and all_to_all_v in two parts (included by _fastcall.c after _fastcall_parts.c).
 *
 * ``all_to_all_async(send, recv, name)`` and ``all_to_all_v_async(send, send_counts,
 * send_displs, recv, recv_counts, recv_displs, name)`` take the arguments of the fast call
 * of the same name (MPI's Ialltoall; Ialltoallv, Igatherv, Iscatterv, Iallgatherv and
 * Ialltoallw put as one all_to_all by collcomm/MPI/_collv_fast.py) and start the call as
 * part_start does the others', when this rank's whole send buffer goes eager (a2a_eager:
 * staged beside the agreement's table, within one_shot). Its first part is then the
 * agreement: table and blocks staged, arrival published; a rank whose peers all went eager
 * can finish without it. Its second part (a2a_run, Core.part PART_FINISH) checks the
 * signatures and every split size as staged by the first parts (its own counts taken from
 * its staged row, not the caller's lists read again; collcomm/MPI/_collv_fast.py passes
 * tuples anyway), and reads this rank's blocks, or, when some rank's buffer
 * was too large to go eager (that rank ran the call whole, natively or, over the fast
 * call's limit, on the Python path, which moves the same words), goes on with everybody as
 * a whole call does from its agreement: staged rounds, or cross-memory reads by the size
 * rule (rank 0 does not vote in two parts), or the Python code's ending (ST_PYTHON).
 * Anything else is declined (None, before any traffic): the regular path queues the call. */

/* The counts the part's entry parsed (4n: the send, then the receive counts, then room
 * for a2a_run's displacements), read by Core_all_to_all_parsed instead of the Python lists
 * again (NULL: none), and the argument array of the Core call they are for (the caller's
 * own, alive through the call). Set by a2a_part just before the call and cleared after
 * it; taken only by the call given that very array: another call that comes between
 * (another thread's while this one waits without the GIL in fast_settle, or one nested in
 * a wait) sets its own or finds them not its, and reads the lists as Core_all_to_all
 * does. */
static Py_ssize_t *a2a_part_tab;
static PyObject *const *a2a_part_args;

/* Core_all_to_all on the counts a2a_part parsed for this call, where it left them */
static PyObject *Core_all_to_all_parsed(Core *c, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t *tab = a2a_part_args == args ? a2a_part_tab : NULL;
    if (tab != NULL)
        a2a_part_tab = NULL, a2a_part_args = NULL;
    if (tab == NULL || nargs != 8)
        return Core_all_to_all(c, args, nargs);
    PARSE_LONG(isz, args[5]);
    PARSE_U64(sig, args[6]);
    PARSE_LONG(cma_limit, args[7]);
    return a2a_run(c, args[0], args[1], args[3], tab, 0, isz, sig, cma_limit, NULL);
}

/* s->a2a_kept[0] if it is the tuple (a, b), else a new one kept there: a new reference,
 * NULL with an exception */
static PyObject *a2a_kept_pair(Fast *s, PyObject *a, PyObject *b)
{
    PyObject *t = s->a2a_kept[0];
    if (t == NULL || PyTuple_GET_ITEM(t, 0) != a || PyTuple_GET_ITEM(t, 1) != b) {
        if ((t = PyTuple_Pack(2, a, b)) == NULL)
            return NULL;
        Py_XSETREF(s->a2a_kept[0], t);
    }
    return Py_NewRef(t);
}

/* Start or finish (`part`) an all_to_all of `send` (n counts `sc`, summing to `ssum`) into
 * `recv` (counts `rc`), the views in `p` (released here), dtype `dt`; `tab` holds the
 * counts as numbers (4n, see a2a_part_tab); (sc, rc), a tuple, is what Hooks.finish gets. */
static PyObject *a2a_part(Fast *s, int part, PyObject *send, PyObject *sc, PyObject *recv,
                          PyObject *rc, PyObject *name, Pair *p, int dt, Py_ssize_t ssum,
                          Py_ssize_t *tab)
{
    Core *core = (Core *)s->core;
    Py_ssize_t isz = p->itemsize;
    if (!a2a_eager(core, ssum * isz) || 2 * (Py_ssize_t)s->size * 8 > core->slot ||
        core->slot / isz < s->size) {
        fast_release(p);
        Py_RETURN_NONE;
    }
    uint64_t sig = s->plain_sig[FC_ALL_TO_ALL] | (s->dt_sig[dt] << 55);
    PyObject *cma = s->a2a_kept[2];     /* (the limit as an int, made again while it holds) */
    if (cma == NULL || PyLong_AsSsize_t(cma) != s->a2a_cma) {
        if ((cma = PyLong_FromSsize_t(s->a2a_cma)) == NULL) {
            fast_release(p);
            return NULL;
        }
        Py_XSETREF(s->a2a_kept[2], cma);
    }
    PyObject *pair = a2a_kept_pair(s, sc, rc);
    PyObject *cargs[8] = {NULL, send, sc, recv, rc, PyLong_FromSsize_t(isz), NULL, Py_NewRef(cma)};
    PyObject *r = NULL;           /* (the limit held: a close while the call waits clears the kept one) */
    if (cargs[5] != NULL && pair != NULL) {
        a2a_part_tab = tab;
        a2a_part_args = cargs;
        r = fast_run_part(s, part, FC_ALL_TO_ALL, name, sig, Core_all_to_all_parsed, cargs, 8, 6,
                          send, recv, pair, p);
        a2a_part_tab = NULL;
        a2a_part_args = NULL;
    } else {
        fast_release(p);
    }
    Py_XDECREF(cargs[5]);
    Py_DECREF(cargs[7]);
    Py_XDECREF(pair);
    return r;
}

static PyObject *fast_a2a_v_part(Fast *s, PyObject *const *args, Py_ssize_t nargs, int part)
{
    if (part == PART_WHOLE)        /* (a group of one: part_start runs it whole) */
        return Fast_all_to_all_v(s, args, nargs);
    if (check_args(nargs, 7, "all_to_all_v_async") < 0)
        return NULL;
    if (!fast_open_part(s, part) || args[0] == args[3])
        Py_RETURN_NONE;
    int n = s->size;
    Py_ssize_t stack[4 * 16], *tab = n <= 16 ? stack : PyMem_Malloc(sizeof(Py_ssize_t) * 4 * (size_t)n);
    if (tab == NULL)
        return PyErr_NoMemory();
    Py_ssize_t ssum = 0, rsum = 0;
    PyObject *r = NULL;
    int tried = 0;                 /* (a2a_part's answer, a new reference; else declined: None) */
    if (v_counts(args[1], args[2], n, tab, &ssum) == 0 && v_counts(args[4], args[5], n, tab + n, &rsum) == 0) {
        Pair p;
        int dt = fast_pair(&p, args[0], args[3], 0);
        Py_ssize_t most = ssum > rsum ? ssum : rsum;
        if (dt < 0 || ssum * p.itemsize > p.len[0] || rsum * p.itemsize > p.len[1] ||
            most * p.itemsize > s->limit[FC_ALL_TO_ALL]) {
            fast_release(&p);
        } else {
            r = a2a_part(s, part, args[0], args[1], args[3], args[4], args[6], &p, dt, ssum, tab);
            tried = 1;
        }
    }
    if (tab != stack)
        PyMem_Free(tab);
    return tried ? r : Py_NewRef(Py_None);
}

static PyObject *fast_a2a_part(Fast *s, PyObject *const *args, Py_ssize_t nargs, int part)
{
    if (part == PART_WHOLE)
        return Fast_all_to_all(s, args, nargs);
    if (check_args(nargs, 3, "all_to_all_async") < 0)
        return NULL;
    if (!fast_open_part(s, part) || args[0] == args[1])
        Py_RETURN_NONE;
    Pair p;
    int dt = fast_pair(&p, args[0], args[1], 0);
    int n = s->size, fits = dt >= 0;
    for (int i = 0; fits && i < 2; i++)   /* rows divisible by n, the same row size (as whole) */
        fits = p.v[i].ndim >= 1 && p.v[i].shape[0] > 0 && p.v[i].shape[0] % n == 0;
    Py_ssize_t nbytes = p.len[0], count = nbytes / p.itemsize / n;
    if (!fits || nbytes <= 0 || p.len[1] != nbytes || p.v[0].shape[0] != p.v[1].shape[0] ||
        nbytes > s->limit[FC_ALL_TO_ALL]) {
        fast_release(&p);
        Py_RETURN_NONE;
    }
    /* the list of n counts (what Hooks.finish gets, twice): the last one made again while
     * it still holds n of this count (nothing else holds it but a hook handed it) */
    PyObject *counts = s->a2a_kept[1];
    int same = counts != NULL && PyList_GET_SIZE(counts) == n;
    for (int i = 0; same && i < n; i++)
        same = PyLong_CheckExact(PyList_GET_ITEM(counts, i)) &&
               PyLong_AsSsize_t(PyList_GET_ITEM(counts, i)) == count;
    PyErr_Clear();
    if (!same) {
        PyObject *k = PyLong_FromSsize_t(count);
        counts = k == NULL ? NULL : PyList_New(n);
        for (int i = 0; counts != NULL && i < n; i++)
            PyList_SET_ITEM(counts, i, Py_NewRef(k));
        Py_XDECREF(k);
        if (counts == NULL) {
            fast_release(&p);
            return NULL;
        }
        Py_XSETREF(s->a2a_kept[1], counts);
    }
    Py_ssize_t stack[4 * 16], *tab = n <= 16 ? stack : PyMem_Malloc(sizeof(Py_ssize_t) * 4 * (size_t)n);
    if (tab == NULL) {
        fast_release(&p);
        return PyErr_NoMemory();
    }
    for (int i = 0; i < 2 * n; i++)
        tab[i] = count;
    Py_INCREF(counts);
    PyObject *r = a2a_part(s, part, args[0], counts, args[1], counts, args[2], &p, dt,
                           count * n, tab);
    Py_DECREF(counts);
    if (tab != stack)
        PyMem_Free(tab);
    return r;
}

static PyObject *Fast_all_to_all_async(Fast *s, PyObject *const *args, Py_ssize_t nargs)
{
    return part_start(s, fast_a2a_part, args, nargs);
}

static PyObject *Fast_all_to_all_v_async(Fast *s, PyObject *const *args, Py_ssize_t nargs)
{
    return part_start(s, fast_a2a_v_part, args, nargs);
}
