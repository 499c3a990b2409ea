/* The fast call's Alltoallw (included by _fastcall.c after _fastcall_vroot.c, whose
 * vr_call it uses): MPI/_collv_fast.py's alltoallw in C. Blocks of datatypes without gaps
 * whose byte displacements lie back to back from 0 are the all_to_all with split sizes of
 * the arrays' bytes the regular path makes (each block count x extent bytes), through
 * all_to_all_v (or all_to_all_v_async for ``Ialltoallw``/``Alltoallw_init``).
 *
 * ``alltoallw(send_spec, recv_spec, name, datatype, aop, uint8)``: each spec a list or
 * tuple ``[array, counts, displs, types]`` or ``[array, (counts, displs), types]``, the
 * array an exact C-contiguous numpy array (the receive's writable), n int counts (not
 * negative), n displacements in bytes back to back from 0, ``types`` one Datatype (the
 * exact class ``datatype``) or n of them, each with a type map (``_t``) without ``gaps``,
 * its extent ``_t.layout.extent``. The arrays (not 0-d) go as their ``view(uint8)`` (the
 * same bytes as the Python code's ``reshape(-1).view(uint8)``), the counts as lists of bytes. True | Work | None as all_to_all_v(_async); None, having done nothing,
 * for anything else (the regular path packs, converts and raises).
 */

static PyObject *s_vw_layout, *s_vw_extent, *s_vw_view;

static int vw_names(void)
{
    return (s_vw_layout = PyUnicode_InternFromString("layout")) == NULL ||
           (s_vw_extent = PyUnicode_InternFromString("extent")) == NULL ||
           (s_vw_view = PyUnicode_InternFromString("view")) == NULL ? -1 : 0;
}

/* A datatype's block of `count` as bytes (count x its extent), -1 not one of ours (or a
 * datatype with gaps), -2 with an exception. A predefined datatype the core knows
 * (pl_size_of: no gaps, its extent its item size) answers without the four attribute
 * look-ups (~10% of an 8-byte Alltoallw of DOUBLE blocks at n = 2, perf). */
static Py_ssize_t vw_block(PyObject *t, PyObject *dtcls, Py_ssize_t count)
{
    if ((PyObject *)Py_TYPE(t) != dtcls)
        return -1;
    Py_ssize_t known = pl_size_of(t);
    if (known > 0)
        return count <= PY_SSIZE_T_MAX / 16 / known ? count * known : -1;
    PyObject *tt = PyObject_GetAttr(t, s_vr_t);
    if (tt == NULL)
        return -2;
    Py_ssize_t b = -1;
    if (tt != Py_None) {
        PyObject *gaps = PyObject_GetAttr(tt, s_vr_gaps);
        int has = gaps == NULL ? -1 : PyObject_IsTrue(gaps);
        PyObject *layout = has != 0 ? NULL : PyObject_GetAttr(tt, s_vw_layout);
        PyObject *ext = layout == NULL ? NULL : PyObject_GetAttr(layout, s_vw_extent);
        Py_ssize_t e = ext == NULL ? -1 : PyLong_AsSsize_t(ext);
        if (has < 0 || (has == 0 && (ext == NULL || (e == -1 && PyErr_Occurred()))))
            b = -2;
        else if (has == 0 && e >= 0 && (e == 0 || count <= PY_SSIZE_T_MAX / 16 / e))
            b = count * e;
        Py_XDECREF(gaps);
        Py_XDECREF(layout);
        Py_XDECREF(ext);
    }
    Py_DECREF(tt);
    return b;
}

/* MPI/_collv_fast.py _bytes_w: out[0] the array's byte view, out[1] the list of byte
 * counts (new references). 1 taken, 0 not, -1 with an exception. */
static int vw_spec(PyObject *spec, int n, PyObject *dtcls, PyObject *uint8, int writable,
                   PyObject **out)
{
    if ((!PyList_CheckExact(spec) && !PyTuple_CheckExact(spec)) || nd_type == NULL)
        return 0;
    Py_ssize_t k = PySequence_Fast_GET_SIZE(spec);
    if (k != 3 && k != 4)
        return 0;
    PyObject *items[4], *a, *counts, *displs, *types;
    for (Py_ssize_t i = 0; i < k; i++)          /* (held: Python code may run below) */
        items[i] = Py_NewRef(PySequence_Fast_GET_ITEM(spec, i));
    int taken = 0;
    a = items[0];
    types = items[k - 1];
    counts = displs = NULL;
    if (k == 4) {
        counts = items[1];
        displs = items[2];
    } else if ((PyList_CheckExact(items[1]) || PyTuple_CheckExact(items[1])) &&
               PySequence_Fast_GET_SIZE(items[1]) == 2) {
        counts = PySequence_Fast_GET_ITEM(items[1], 0);
        displs = PySequence_Fast_GET_ITEM(items[1], 1);
    }
    Py_buffer v;
    PyObject *bytes = NULL;
    if (counts == NULL || Py_TYPE(a) != nd_type ||
        nd_buffer(a, &v, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) < 0) {
        PyErr_Clear();
        goto done;
    }
    int ndim = v.ndim;
    PyBuffer_Release(&v);
    if (ndim == 0)                    /* (a 0-d array has no byte view: the regular path's) */
        goto done;
    /* snapshots of the lists (a pair's items held as the spec's are): an item's __eq__ or
     * a datatype's attributes may change the program's lists while they are read */
    counts = PyList_CheckExact(counts) ? PyList_AsTuple(counts) : Py_NewRef(counts);
    displs = counts == NULL ? NULL : PyList_CheckExact(displs) ? PyList_AsTuple(displs) : Py_NewRef(displs);
    types = displs == NULL ? NULL : PyList_CheckExact(types) ? PyList_AsTuple(types) : Py_NewRef(types);
    if (types == NULL) {
        Py_XDECREF(counts);
        Py_XDECREF(displs);
        taken = -1;
        goto done;
    }
    int one_type = (PyObject *)Py_TYPE(types) == dtcls;
    if ((PyList_CheckExact(counts) || PyTuple_CheckExact(counts)) && PySequence_Fast_GET_SIZE(counts) == n &&
        (PyList_CheckExact(displs) || PyTuple_CheckExact(displs)) && PySequence_Fast_GET_SIZE(displs) == n &&
        (one_type || ((PyList_CheckExact(types) || PyTuple_CheckExact(types)) &&
                      PySequence_Fast_GET_SIZE(types) == n)) &&
        (bytes = PyList_New(n)) != NULL) {
        Py_ssize_t pos = 0;
        taken = 1;
        for (int i = 0; i < n && taken == 1; i++) {
            PyObject *c = PySequence_Fast_GET_ITEM(counts, i), *d = PySequence_Fast_GET_ITEM(displs, i);
            PyObject *t = one_type ? types : PySequence_Fast_GET_ITEM(types, i);
            Py_ssize_t cv = PyLong_CheckExact(c) ? PyLong_AsSsize_t(c) : -1;
            if (cv < 0) {
                PyErr_Clear();
                taken = 0;
                break;
            }
            Py_INCREF(t);
            Py_INCREF(d);
            Py_ssize_t b = vw_block(t, dtcls, cv);
            int at;
            if (b >= 0 && PyLong_CheckExact(d)) {      /* (d == pos, without a new int) */
                int over = 0;
                long long dv = PyLong_AsLongLongAndOverflow(d, &over);
                at = dv == -1 && PyErr_Occurred() ? -1 : !over && dv == (long long)pos;
            } else {
                PyObject *posobj = b < 0 ? NULL : PyLong_FromSsize_t(pos);
                at = posobj == NULL ? (b == -2 || PyErr_Occurred() ? -1 : 0)
                                    : PyObject_RichCompareBool(d, posobj, Py_EQ);
                Py_XDECREF(posobj);
            }
            Py_DECREF(t);
            Py_DECREF(d);
            PyObject *bo = at == 1 ? PyLong_FromSsize_t(b) : NULL;
            if (bo == NULL) {
                taken = at == 1 || at < 0 ? -1 : 0;
                break;
            }
            PyList_SET_ITEM(bytes, i, bo);
            pos += b;
        }
    } else if (PyErr_Occurred()) {
        taken = -1;
    }
    Py_DECREF(counts);
    Py_DECREF(displs);
    Py_DECREF(types);
    if (taken == 1) {
        out[0] = PyObject_CallMethodOneArg(a, s_vw_view, uint8);
        out[1] = bytes;
        bytes = NULL;
        if (out[0] == NULL) {
            Py_CLEAR(out[1]);
            taken = -1;
        }
    }
done:
    Py_XDECREF(bytes);
    for (Py_ssize_t i = 0; i < k; i++)
        Py_DECREF(items[i]);
    return taken;
}

static PyObject *Fast_alltoallw(Fast *s, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_args(nargs, 6, "alltoallw") < 0)
        return NULL;
    PyObject *name = args[2], *dtcls = args[3], *uint8 = args[5];
    int aop = args[4] == Py_True, n = s->size;
    PyObject *r[2] = {NULL, NULL}, *w[2] = {NULL, NULL};
    int taken = vw_spec(args[1], n, dtcls, uint8, 1, r);
    if (taken == 1)
        taken = vw_spec(args[0], n, dtcls, uint8, 0, w);
    PyObject *res = NULL;
    if (taken == 1) {
        PyObject *a[7] = {w[0], w[1], Py_None, r[0], r[1], Py_None, name};
        res = vr_call(s, a, aop);
    } else if (taken == 0) {
        res = Py_NewRef(Py_None);
    }
    for (int i = 0; i < 2; i++) {
        Py_XDECREF(r[i]);
        Py_XDECREF(w[i]);
    }
    return res;
}
