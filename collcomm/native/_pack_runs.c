/* Packing a message of a derived datatype (collcomm/MPI/_typemap.py, which is the
 * reference and the fallback): `count` elements, element i at byte first + i * extent of
 * the memory, each the runs (byte offset, byte length) of its type map, copied in order
 * to or from a contiguous buffer. One memcpy a run: a column of doubles, a struct's
 * fields, an indexed type's blocks alike, without the index arrays numpy needs.
 *
 * pack_runs(memory, runs, count, extent, first, packed, to_packed) -> None
 *   runs: a C-contiguous int64 buffer of (offset, length) pairs; to_packed: copy memory
 *   -> packed (else packed -> memory). Every run of every element must lie inside
 *   `memory` and `packed` must be exactly the message's bytes, or ValueError: the Python
 *   side checked already; this never reads or writes outside a buffer. The GIL is
 *   released for messages of 256 KiB and more. */

static PyObject *mod_pack_runs(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "pack_runs(memory, runs, count, extent, first, packed, to_packed)");
        return NULL;
    }
    int to_packed = PyObject_IsTrue(args[6]);
    long long count = PyLong_AsLongLong(args[2]);
    long long extent = PyLong_AsLongLong(args[3]);
    long long first = PyLong_AsLongLong(args[4]);
    if (to_packed < 0 || PyErr_Occurred())
        return NULL;
    if (count < 0) {
        PyErr_SetString(PyExc_ValueError, "pack_runs: negative count");
        return NULL;
    }
    Py_buffer mem, runs, packed;
    if (PyObject_GetBuffer(args[0], &mem, to_packed ? PyBUF_SIMPLE : PyBUF_WRITABLE) < 0)
        return NULL;
    if (PyObject_GetBuffer(args[1], &runs, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&mem);
        return NULL;
    }
    if (PyObject_GetBuffer(args[5], &packed, to_packed ? PyBUF_WRITABLE : PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&runs);
        PyBuffer_Release(&mem);
        return NULL;
    }
    const long long *r = (const long long *)runs.buf;
    Py_ssize_t nruns = runs.len / (Py_ssize_t)(2 * sizeof(long long));
    long long per = 0;
    const char *why = NULL;
    for (Py_ssize_t j = 0; j < nruns && why == NULL; j++) {
        long long off = r[2 * j], len = r[2 * j + 1];
        if (len < 0) {
            why = "a run of negative length";
            break;
        }
        if (__builtin_add_overflow(per, len, &per)) {
            why = "the sizes overflow";
            break;
        }
        if (count == 0 || len == 0)
            continue;
        long long span, lo, hi;                       /* elements may go either way */
        if (__builtin_mul_overflow(count - 1, extent, &span) ||
            __builtin_add_overflow(first, off, &lo) || __builtin_add_overflow(lo, len, &hi) ||
            __builtin_add_overflow(lo, span < 0 ? span : 0, &lo) ||
            __builtin_add_overflow(hi, span > 0 ? span : 0, &hi))
            why = "the offsets overflow";
        else if (lo < 0 || hi > (long long)mem.len)
            why = "a run lies outside the memory";
    }
    long long total;
    if (why == NULL && (__builtin_mul_overflow(per, count, &total) || total != (long long)packed.len))
        why = "the packed buffer is not the message's size";
    if (why != NULL) {
        PyBuffer_Release(&packed);
        PyBuffer_Release(&runs);
        PyBuffer_Release(&mem);
        PyErr_Format(PyExc_ValueError, "pack_runs: %s", why);
        return NULL;
    }
    char *m = (char *)mem.buf, *p = (char *)packed.buf;
    int release = (long long)packed.len >= (256 << 10);
    PyThreadState *ts = release ? PyEval_SaveThread() : NULL;
    for (long long i = 0; i < count; i++) {
        char *base = m + first + i * extent;
        for (Py_ssize_t j = 0; j < nruns; j++) {
            long long len = r[2 * j + 1];
            if (to_packed)
                memcpy(p, base + r[2 * j], (size_t)len);
            else
                memcpy(base + r[2 * j], p, (size_t)len);
            p += len;
        }
    }
    if (release)
        PyEval_RestoreThread(ts);
    PyBuffer_Release(&packed);
    PyBuffer_Release(&runs);
    PyBuffer_Release(&mem);
    Py_RETURN_NONE;
}
