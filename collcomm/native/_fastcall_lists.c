/* The fast call's list forms: torch's lists of tensors (one buffer per rank) stand for the
 * one contiguous buffer the Core collectives take. The call runs on a per-Fast scratch
 * bytearray, viewed with the list's struct format, and the result is copied into the list
 * (or the list into the scratch first, for scatter). Included by _fastcall.c before the
 * collectives that use it (_fastcall_ops.c).
 */

/* n buffers of a list or tuple, each C-contiguous (writable if asked) with native dtype `dt`
 * and `kb` bytes, held in *views (PyMem); -1 (no exception) if any is not. */
static int fast_views(PyObject *seq, int n, int writable, int dt, Py_ssize_t kb, Py_buffer **views)
{
    *views = NULL;
    if (!(PyList_CheckExact(seq) || PyTuple_CheckExact(seq)) || PySequence_Fast_GET_SIZE(seq) != n)
        return -1;
    Py_buffer *v = PyMem_Malloc(sizeof(Py_buffer) * (size_t)n);
    if (v == NULL) {
        PyErr_Clear();
        return -1;
    }
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (int i = 0; i < n; i++) {
        int bad = PyObject_GetBuffer(items[i], &v[i], PyBUF_C_CONTIGUOUS | PyBUF_FORMAT |
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
            PyMem_Free(v);
            return -1;
        }
    }
    *views = v;
    return 0;
}

static void fast_views_release(Py_buffer *v, int n)
{
    if (v == NULL)
        return;
    for (int i = 0; i < n; i++)
        PyBuffer_Release(&v[i]);
    PyMem_Free(v);
}

/* The Fast's scratch bytearray, resized to exactly `nbytes` (borrowed; a fresh one when the
 * old one is still exported); NULL on error. */
static PyObject *fast_scratch(Fast *s, Py_ssize_t nbytes)
{
    if (s->scratch != NULL && PyByteArray_GET_SIZE(s->scratch) != nbytes &&
        PyByteArray_Resize(s->scratch, nbytes) < 0) {
        PyErr_Clear();
        Py_CLEAR(s->scratch);
    }
    if (s->scratch == NULL)
        s->scratch = PyByteArray_FromStringAndSize(NULL, nbytes);
    return s->scratch;
}

/* Copy between the scratch and the list's buffers (to_list: scratch -> list). */
static void fast_views_copy(PyObject *scratch, Py_buffer *v, int n, Py_ssize_t kb, int to_list)
{
    char *base = PyByteArray_AS_STRING(scratch);
    for (int i = 0; i < n; i++) {
        if (to_list)
            memcpy(v[i].buf, base + i * kb, kb);
        else
            memcpy(base + i * kb, v[i].buf, kb);
    }
}

/* The list form of all_gather / gather / scatter: `list` (n buffers of `kb` bytes, struct
 * format `fmt`) stands for the contiguous buffer at position `at` of args (1: the receive
 * side, 0: the send side); the call runs with the scratch there (a memoryview cast to
 * `fmt`), and the result is copied into the list. */
static PyObject *fast_list_call(Fast *s, PyObject *const *args, Py_ssize_t nargs, int at, int fc,
                                PyObject *(*entry)(Fast *, PyObject *const *, Py_ssize_t),
                                int dt, Py_ssize_t kb, const char *fmt)
{
    Py_buffer *v;
    int n = s->size;
    if (kb <= 0 || kb * n > s->limit[fc] || fast_views(args[at], n, at == 1, dt, kb, &v) < 0)
        Py_RETURN_NONE;
    PyObject *scratch = fast_scratch(s, kb * n);
    PyObject *raw = scratch == NULL ? NULL : PyMemoryView_FromObject(scratch);
    PyObject *mv = raw == NULL ? NULL : PyObject_CallMethod(raw, "cast", "s", fmt);
    Py_XDECREF(raw);
    if (mv == NULL) {          /* a format memoryview cannot take (complex): the regular path */
        PyErr_Clear();
        fast_views_release(v, n);
        Py_RETURN_NONE;
    }
    if (at == 0)
        fast_views_copy(scratch, v, n, kb, 0);
    PyObject *margs[5];
    for (Py_ssize_t i = 0; i < nargs && i < 5; i++)
        margs[i] = args[i];
    margs[at] = mv;
    s->list = args[at];
    PyObject *r = entry(s, margs, nargs);
    s->list = NULL;
    if (r == Py_True && at == 1)
        fast_views_copy(scratch, v, n, kb, 1);
    fast_views_release(v, n);
    /* let the scratch resize later: release the view, keeping the call's own error (if
     * any) as it is (an export still alive in it makes release fail: then a fresh scratch
     * is made next time) */
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *rel = PyObject_CallMethod(mv, "release", NULL);
    if (rel == NULL)
        PyErr_Clear();
    Py_XDECREF(rel);
    PyErr_Restore(type, value, tb);
    Py_DECREF(mv);
    return r;
}

/* The native dtype, bytes and struct format of one buffer (-1: not one the fast call takes). */
static int fast_one(PyObject *obj, Py_ssize_t *nbytes, char *fmt)
{
    Py_buffer v;
    if (PyObject_GetBuffer(obj, &v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyErr_Clear();
        return -1;
    }
    int dt = fast_dtype(&v);
    *nbytes = v.len;
    const char *f = v.format != NULL ? v.format : "B";
    if (strlen(f) >= 8)
        dt = -1;
    else
        strcpy(fmt, f);
    PyBuffer_Release(&v);
    return dt;
}
