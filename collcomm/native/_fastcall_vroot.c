/* The fast call's Gatherv and Scatterv (included by _fastcall.c after
 * _fastcall_a2a_parts.c): collcomm.MPI's vector buffer spec read here and the call made as
 * the all_to_all with split sizes the regular path makes of it (the root's block from
 * every rank, or to every rank), through all_to_all_v (_fastcall_v.c) or, for ``Igatherv``/
 * ``Iscatterv`` and their ``…_init``, all_to_all_v_async (_fastcall_a2a_parts.c): the
 * same calls the Python code made, without its ~3 µs of frames.
 *
 * ``gatherv(send, recv_spec, root, name, datatype, aop)`` and ``scatterv(send_spec, recv,
 * root, name, datatype, aop)``: ``send``/``recv`` exact numpy arrays; the root's spec a list
 * or tuple ``[array, counts, displs, datatype]``, ``[array, (counts, displs), datatype]``,
 * ``[array, counts, displs]``, ``[array, counts]`` (mpi4py's forms), its datatype (if any)
 * of the exact class ``datatype`` (MPI.Datatype) whose type map is one item of the array's
 * dtype without gaps; counts n ints, displacements None or their prefix sums (checked by
 * all_to_all_v). The counts are passed as lists (tuples, ``aop``: a call in two parts
 * keeps them until its wait, and the program may reuse its own) made here. Returns what the
 * entry returns (True, the started call's Work, or None); None, having done nothing, for
 * anything else (the caller goes its regular way, which packs, converts and raises).
 * ``aop`` Ellipsis (these two, allgatherv and alltoallv): the entry and arguments of the
 * call, not made (vr_aop: a persistent request's start worked out once).
 */

static PyObject *s_vr_t, *s_vr_mult, *s_vr_gaps, *s_vr_core, *s_vr_dtype, *s_vr_nbytes;

static int vroot_names(void)
{
    return (s_vr_t = PyUnicode_InternFromString("_t")) == NULL ||
           (s_vr_mult = PyUnicode_InternFromString("mult")) == NULL ||
           (s_vr_gaps = PyUnicode_InternFromString("gaps")) == NULL ||
           (s_vr_core = PyUnicode_InternFromString("core")) == NULL ||
           (s_vr_dtype = PyUnicode_InternFromString("dtype")) == NULL ||
           (s_vr_nbytes = PyUnicode_InternFromString("nbytes")) == NULL ? -1 : 0;
}

/* Is Datatype `t` one item of `arr`'s dtype without gaps (its ``_t``: not None, ``mult``
 * 1, no ``gaps``, ``core`` the dtype)? 1, 0, -1 with an exception. A predefined datatype
 * the core knows (pl_descr_of: one of those by construction) whose dtype is the array's
 * own answers without the five attribute look-ups (~15% of an 8-byte Alltoallv, perf). */
static int vr_type_fits(PyObject *t, PyObject *arr)
{
    PyObject *known = pl_descr_of(t);
    if (known != NULL && known == ((NdFields *)arr)->descr)
        return 1;
    PyObject *tt = PyObject_GetAttr(t, s_vr_t);
    if (tt == NULL || tt == Py_None) {
        Py_XDECREF(tt);
        return tt == NULL ? -1 : 0;
    }
    PyObject *mult = PyObject_GetAttr(tt, s_vr_mult);
    PyObject *gaps = mult == NULL ? NULL : PyObject_GetAttr(tt, s_vr_gaps);
    PyObject *core = gaps == NULL ? NULL : PyObject_GetAttr(tt, s_vr_core);
    PyObject *dtype = core == NULL ? NULL : nd_dtype(arr, s_vr_dtype);
    int fits = -1;
    if (dtype != NULL) {
        int no_gaps = PyObject_Not(gaps);
        int over = 0;
        fits = no_gaps < 0 ? -1 : PyLong_CheckExact(mult) && PyLong_AsLongAndOverflow(mult, &over) == 1 &&
                                  !over && no_gaps;
        if (fits == 1 && core != dtype)
            fits = PyObject_RichCompareBool(core, dtype, Py_EQ);
    }
    Py_DECREF(tt);
    Py_XDECREF(mult);
    Py_XDECREF(gaps);
    Py_XDECREF(core);
    Py_XDECREF(dtype);
    return fits;
}

/* MPI/_collv_fast.py quick_vector in C: out[0..2] (new references) the spec's array,
 * counts and displacements (None: absent). 1 taken, 0 not, -1 with an exception. */
static int vr_spec(PyObject *spec, PyObject *dtcls, PyObject **out)
{
    if ((!PyList_CheckExact(spec) && !PyTuple_CheckExact(spec)) || nd_type == NULL)
        return 0;
    Py_ssize_t k = PySequence_Fast_GET_SIZE(spec);
    if (k < 2 || k > 4)
        return 0;
    PyObject *items[4];
    Py_ssize_t held = k;
    for (Py_ssize_t i = 0; i < k; i++)         /* (held: Python code may run below) */
        items[i] = Py_NewRef(PySequence_Fast_GET_ITEM(spec, i));
    int taken = 0;
    PyObject *a = items[0], *last = items[k - 1];
    if (Py_TYPE(a) != nd_type) {
        taken = 0;
    } else if ((PyObject *)Py_TYPE(last) == dtcls) {
        taken = vr_type_fits(last, a);
        k--;
    } else {
        taken = !(k == 4 || last == Py_None || PyUnicode_CheckExact(last));
    }
    if (taken == 1 && k == 3) {
        out[1] = Py_NewRef(items[1]);
        out[2] = Py_NewRef(items[2]);
    } else if (taken == 1 && k == 2 && PyTuple_CheckExact(items[1]) && PyTuple_GET_SIZE(items[1]) == 2) {
        out[1] = Py_NewRef(PyTuple_GET_ITEM(items[1], 0));   /* (counts, displs), mpi4py's way */
        out[2] = Py_NewRef(PyTuple_GET_ITEM(items[1], 1));
    } else if (taken == 1 && k == 2) {
        out[1] = Py_NewRef(items[1]);
        out[2] = Py_NewRef(Py_None);
    } else if (taken == 1) {
        taken = 0;
    }
    if (taken == 1)
        out[0] = Py_NewRef(a);
    for (Py_ssize_t i = 0; i < held; i++)
        Py_DECREF(items[i]);
    return taken;
}

/* n zeros as a list, but `value` at `at` (NULL: none); NULL with an exception */
static PyObject *vr_counts(int n, int at, PyObject *value)
{
    PyObject *l = PyList_New(n);
    if (l == NULL)
        return NULL;
    for (int i = 0; i < n; i++)
        PyList_SET_ITEM(l, i, i == at && value != NULL ? Py_NewRef(value) : PyLong_FromLong(0));
    for (int i = 0; i < n; i++)
        if (PyList_GET_ITEM(l, i) == NULL) {
            Py_DECREF(l);
            return NULL;
        }
    return l;
}

/* An array's element count (a C-contiguous one), -1 not one; with `empty`, a new
 * reference there: its first zero elements, the side of the call a rank that neither
 * sends nor receives passes (the Python code's ``reshape(-1)[:0]``; a 0-d array has no
 * such slice: -1 there) */
static Py_ssize_t vr_array(PyObject *arr, PyObject **empty)
{
    Py_buffer v;
    if (nd_type == NULL || Py_TYPE(arr) != nd_type || nd_buffer(arr, &v, PyBUF_C_CONTIGUOUS) < 0) {
        PyErr_Clear();
        return -1;
    }
    Py_ssize_t count = v.itemsize > 0 ? v.len / v.itemsize : -1;
    PyBuffer_Release(&v);
    if (count >= 0 && empty != NULL && (*empty = PySequence_GetSlice(arr, 0, 0)) == NULL) {
        PyErr_Clear();
        return -1;
    }
    return count;
}

/* (counts, displs) kept for a call in two parts: tuples of the program's lists */
static int vr_keep(PyObject **counts, PyObject **displs)
{
    if (PyList_CheckExact(*counts))
        Py_SETREF(*counts, PyList_AsTuple(*counts));
    if (*counts != NULL && PyList_CheckExact(*displs))
        Py_SETREF(*displs, PyList_AsTuple(*displs));
    return *counts == NULL || *displs == NULL ? -1 : 0;
}

/* ``aop`` of gatherv, scatterv, allgatherv and alltoallv: True a call in two parts (1),
 * Ellipsis (2) its arguments worked out for a persistent request's every start and
 * returned, not called: ``(entry name, args)`` for ``fast.<entry>(*args)``, or None where they cannot be
 * fixed at ``…_init`` (Allgatherv's tiled send copies the send's contents each call):
 * MPI/_coll_persistent.py _Prepared, on its first start */
static int vr_aop(PyObject *flag)
{
    return flag == Py_True ? 1 : flag == Py_Ellipsis ? 2 : 0;
}

static PyObject *vr_prepared(const char *entry, PyObject **a, Py_ssize_t k)
{
    PyObject *args = PyTuple_New(k);
    if (args == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < k; i++)
        PyTuple_SET_ITEM(args, i, Py_NewRef(a[i]));
    return Py_BuildValue("(sN)", entry, args);
}

static PyObject *vr_call(Fast *s, PyObject **a, int aop)
{
    if (aop == 2)
        return vr_prepared("all_to_all_v_async", a, 7);
    return aop ? Fast_all_to_all_v_async(s, a, 7) : Fast_all_to_all_v(s, a, 7);
}

static PyObject *Fast_gatherv(Fast *s, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_args(nargs, 6, "gatherv") < 0)
        return NULL;
    PyObject *send = args[0], *spec = args[1], *name = args[3], *dtcls = args[4];
    int aop = vr_aop(args[5]), n = s->size, root = (int)fast_root(s, args[2]);
    PyObject *empty = NULL, *count, *q[3] = {NULL, NULL, NULL};
    Py_ssize_t k = root < 0 ? -1 : vr_array(send, s->rank == root ? NULL : &empty);
    if (k < 0)
        Py_RETURN_NONE;
    PyObject *r = NULL, *sc = NULL, *rc = NULL;
    if (s->rank == root) {
        int taken = vr_spec(spec, dtcls, q);
        if (taken <= 0)
            return taken < 0 ? NULL : Py_NewRef(Py_None);
        if (!(PyList_CheckExact(q[1]) || PyTuple_CheckExact(q[1]))) {
            r = Py_NewRef(Py_None);    /* (before the entry: a start would queue work first) */
            goto out;
        }
        if (aop && vr_keep(&q[1], &q[2]) < 0)
            goto out;
        rc = Py_NewRef(q[1]);
    } else {
        q[0] = empty;             /* (nothing received) */
        q[2] = Py_NewRef(Py_None);
        if ((rc = vr_counts(n, -1, NULL)) == NULL)
            goto out;
    }
    count = PyLong_FromSsize_t(k);
    sc = count == NULL ? NULL : vr_counts(n, root, count);
    Py_XDECREF(count);
    if (sc != NULL) {
        PyObject *a[7] = {send, sc, Py_None, q[0], rc, q[2], name};
        r = vr_call(s, a, aop);
    }
out:
    Py_XDECREF(sc);
    Py_XDECREF(rc);
    for (int i = 0; i < 3; i++)
        Py_XDECREF(q[i]);
    return r;
}

static PyObject *Fast_scatterv(Fast *s, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_args(nargs, 6, "scatterv") < 0)
        return NULL;
    PyObject *spec = args[0], *recv = args[1], *name = args[3], *dtcls = args[4];
    int aop = vr_aop(args[5]), n = s->size, root = (int)fast_root(s, args[2]);
    PyObject *empty = NULL, *q[3] = {NULL, NULL, NULL}, *r = NULL, *rc = NULL;
    Py_ssize_t k = root < 0 ? -1 : vr_array(recv, s->rank == root ? NULL : &empty);
    if (k < 0)
        Py_RETURN_NONE;
    if (s->rank == root) {
        int taken = vr_spec(spec, dtcls, q);
        if (taken <= 0)
            return taken < 0 ? NULL : Py_NewRef(Py_None);
        if (!(PyList_CheckExact(q[1]) || PyTuple_CheckExact(q[1])) ||
            PySequence_Fast_GET_SIZE(q[1]) != n) {
            r = Py_NewRef(Py_None);
            goto out;
        }
        if (aop && vr_keep(&q[1], &q[2]) < 0)
            goto out;
        /* the root's own block: its count (as the regular path) */
        rc = vr_counts(n, root, PySequence_Fast_GET_ITEM(q[1], root));
    } else {
        q[0] = empty;             /* (nothing sent) */
        q[2] = Py_NewRef(Py_None);
        PyObject *count = PyLong_FromSsize_t(k);
        q[1] = count == NULL ? NULL : vr_counts(n, -1, NULL);
        rc = q[1] == NULL ? NULL : vr_counts(n, root, count);
        Py_XDECREF(count);
    }
    if (rc != NULL) {
        PyObject *a[7] = {q[0], q[1], q[2], recv, rc, Py_None, name};
        r = vr_call(s, a, aop);
    }
out:
    Py_XDECREF(rc);
    for (int i = 0; i < 3; i++)
        Py_XDECREF(q[i]);
    return r;
}

/* Are the n items of `seq` (a list or tuple) each equal to i * step (`step` 0: to `k`)?
 * 1, 0 (or not such a sequence), -1 with an exception. */
static int vr_all_equal(PyObject *seq, int n, Py_ssize_t k, Py_ssize_t step)
{
    if (!(PyList_CheckExact(seq) || PyTuple_CheckExact(seq)) || PySequence_Fast_GET_SIZE(seq) != n)
        return 0;
    /* (a snapshot: an item's __eq__ may change the list) */
    PyObject *items = PyList_CheckExact(seq) ? PyList_AsTuple(seq) : Py_NewRef(seq);
    if (items == NULL)
        return -1;
    int eq = 1;
    for (int i = 0; i < n && eq == 1; i++) {
        PyObject *want = PyLong_FromSsize_t(step ? i * step : k);
        eq = want == NULL ? -1 : PyObject_RichCompareBool(PyTuple_GET_ITEM(items, i), want, Py_EQ);
        Py_XDECREF(want);                     /* (as Python's ==: numpy ints too) */
    }
    Py_DECREF(items);
    return eq;
}

/* allgatherv(send, recv_spec, name, datatype, aop, tile): MPI's Allgatherv / Iallgatherv
 * as MPI/_collv_fast.py's allgatherv makes it: equal blocks (every count the send's
 * element count, displacements absent or back to back) an all_gather into the spec's array
 * (its first n blocks, a 1-D array larger than that), others an all_to_all with split
 * sizes of ``tile(send, n)`` (numpy.tile: the block once for every rank; a 1-D send).
 * True | Work | None, as gatherv; None also where that Python function may still take it
 * (a send of other shapes, displacements in another kind of sequence): the caller tries it. */
static PyObject *Fast_allgatherv(Fast *s, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_args(nargs, 6, "allgatherv") < 0)
        return NULL;
    PyObject *send = args[0], *name = args[2], *tile = args[5];
    int aop = vr_aop(args[4]), n = s->size;
    Py_buffer v;
    if (nd_type == NULL || Py_TYPE(send) != nd_type || nd_buffer(send, &v, PyBUF_C_CONTIGUOUS) < 0) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    Py_ssize_t k = v.itemsize > 0 ? v.len / v.itemsize : -1;
    int ndim = v.ndim;
    PyBuffer_Release(&v);
    PyObject *q[3] = {NULL, NULL, NULL}, *r = NULL, *recv = NULL, *sc = NULL, *tiled = NULL;
    int taken = k < 0 ? 0 : vr_spec(args[1], args[3], q);
    if (taken <= 0)
        return taken < 0 ? NULL : Py_NewRef(Py_None);
    int equal = vr_all_equal(q[1], n, k, 0);
    if (equal < 0 || (aop && vr_keep(&q[1], &q[2]) < 0))
        goto out;
    if (!(PyList_CheckExact(q[1]) || PyTuple_CheckExact(q[1])) || PySequence_Fast_GET_SIZE(q[1]) != n) {
        r = Py_NewRef(Py_None);
        goto out;
    }
    if (equal) {
        int regular = q[2] == Py_None ? 1 : vr_all_equal(q[2], n, 0, k);
        if (regular < 0)
            goto out;
        if (regular == 0 || nd_buffer(q[0], &v, PyBUF_C_CONTIGUOUS) < 0) {
            PyErr_Clear();
            r = Py_NewRef(Py_None);
            goto out;
        }
        Py_ssize_t m = v.itemsize > 0 ? v.len / v.itemsize : -1, want = (Py_ssize_t)n * k;
        int rdim = v.ndim;
        PyBuffer_Release(&v);
        if (m == want)
            recv = Py_NewRef(q[0]);
        else if (m > want && rdim == 1 && (recv = PySequence_GetSlice(q[0], 0, want)) == NULL)
            PyErr_Clear();
        if (recv == NULL) {
            r = Py_NewRef(Py_None);
            goto out;
        }
        PyObject *a[3] = {send, recv, name};
        r = aop == 2 ? vr_prepared("all_gather_async", a, 3)
                     : aop ? Fast_all_gather_async(s, a, 3) : fast_all_gather(s, a, 3, PART_WHOLE);
        goto out;
    }
    if (ndim != 1 || aop == 2) {      /* (the tiled send: made anew at every start) */
        r = Py_NewRef(Py_None);
        goto out;
    }
    PyObject *count = PyLong_FromSsize_t(k), *times = PyLong_FromLong(n);
    if (count != NULL && times != NULL && (sc = PyList_New(n)) != NULL)
        for (int i = 0; i < n; i++)
            PyList_SET_ITEM(sc, i, Py_NewRef(count));
    if (sc != NULL)
        tiled = PyObject_CallFunctionObjArgs(tile, send, times, NULL);
    Py_XDECREF(count);
    Py_XDECREF(times);
    if (tiled != NULL) {
        PyObject *a[7] = {tiled, sc, Py_None, q[0], q[1], q[2], name};
        r = vr_call(s, a, aop);
    }
out:
    Py_XDECREF(recv);
    Py_XDECREF(sc);
    Py_XDECREF(tiled);
    for (int i = 0; i < 3; i++)
        Py_XDECREF(q[i]);
    return r;
}

/* alltoallv(send_spec, recv_spec, name, datatype, aop): MPI's Alltoallv / Ialltoallv as
 * MPI/_collv_fast.py hands them over: both specs read (vr_spec), the all_to_all_v(_async)
 * made with their counts and displacements (tuples of the program's lists for ``aop``).
 * True | Work | None, as gatherv. */
static PyObject *Fast_alltoallv(Fast *s, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_args(nargs, 5, "alltoallv") < 0)
        return NULL;
    int aop = vr_aop(args[4]);
    PyObject *sq[3] = {NULL, NULL, NULL}, *rq[3] = {NULL, NULL, NULL}, *r = NULL;
    int taken = vr_spec(args[0], args[3], sq);
    if (taken == 1)
        taken = vr_spec(args[1], args[3], rq);
    if (taken == 1 && aop && (vr_keep(&sq[1], &sq[2]) < 0 || vr_keep(&rq[1], &rq[2]) < 0))
        taken = -1;
    if (taken == 1) {
        PyObject *a[7] = {sq[0], sq[1], sq[2], rq[0], rq[1], rq[2], args[2]};
        r = vr_call(s, a, aop);
    } else if (taken == 0) {
        r = Py_NewRef(Py_None);
    }
    for (int i = 0; i < 3; i++) {
        Py_XDECREF(sq[i]);
        Py_XDECREF(rq[i]);
    }
    return r;
}
