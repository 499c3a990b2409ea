/* scan(send, recv, op, exclusive, name) -> True | None: the fast call's small Scan / Exscan
 * (included by _fastcall.c after _fastcall_obj.c): what collcomm/core/scan.py does for a
 * message of up to SCAN_GATHERED_MAX bytes on one host (its GATHERED_MAX; a test compares
 * them), without its Python: every rank's ``send`` all-gathered through the fast call's
 * all_gather, signed as the scan (collective, dtype, count, op: the all_reduce signature
 * base of (op, dtype) with the scan's collective code), then folded in rank order with the
 * op's kernel, ``recv = x0 op x1 op ... op x_r`` (Exscan: up to x_{r-1}; rank 0's ``recv``
 * left as it is), as algorithms/scan.py fold does with the same kernels numpy's ufuncs
 * match. ``send`` may be ``recv`` (in place). Anything the fast call's all_reduce would not
 * take (a dtype or op without a kernel, non-contiguous buffers, sizes that differ), a larger
 * message, or an all_gather the fast call declines: None, nothing done (the Python code
 * then makes the same all_gather, or, from its bound on, the recursive doubling). */

#define SCAN_GATHERED_MAX 4096
enum { SIG_SCAN = 10, SIG_EXSCAN = 11 };   /* signature.py: the index in COLLECTIVES + 1 */

static PyObject *np_empty;                  /* numpy.empty, found on the first scan */

static PyObject *Fast_scan(Fast *s, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_args(nargs, 5, "scan") < 0)
        return NULL;
    int exclusive = PyObject_IsTrue(args[3]);
    if (exclusive < 0)
        return NULL;
    if (!fast_open(s))
        Py_RETURN_NONE;
    Pair p;
    int dt = fast_pair(&p, args[0], args[1], 1);
    Py_ssize_t nbytes = p.len[1], isz = p.itemsize, count = nbytes / isz;
    FastOp *e = dt >= 0 && nbytes > 0 && nbytes <= SCAN_GATHERED_MAX && p.len[0] == nbytes
                ? fast_op(s, args[2], dt) : NULL;
    int ksz, op_bits = e == NULL ? 0 : (int)((e->sig[dt] >> 50) & 0x1F);
    /* (AVG and PREMUL_SUM, signature.OPS 5 and 12, are no prefix reductions: the Python
     * code refuses them) */
    kernel_t fn = e == NULL || op_bits == 5 || op_bits == 12 ? NULL : kernel_for(e->code[dt], &ksz);
    if (fn == NULL) {
        fast_release(&p);
        return PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
    }
    fast_release(&p);                      /* (the all_gather takes its own views) */
    if (np_empty == NULL) {
        PyObject *np = PyImport_ImportModule("numpy");
        np_empty = np == NULL ? NULL : PyObject_GetAttrString(np, "empty");
        Py_XDECREF(np);
        if (np_empty == NULL)
            return NULL;
    }
    int n = s->size;
    PyObject *dtype = nd_dtype(args[1], s_vr_dtype);
    if (dtype == NULL)
        return NULL;
    /* the blocks' array: the last call's when it fits (taken: no other call shares it),
     * else a new one */
    PyObject *parts = s->scan_parts;
    s->scan_parts = NULL;
    if (parts != NULL) {
        PyObject *pd = nd_dtype(parts, s_vr_dtype);
        if (pd != dtype || nd_nbytes(parts, s_vr_nbytes) != (Py_ssize_t)n * nbytes)
            Py_CLEAR(parts);
        Py_XDECREF(pd);
        PyErr_Clear();             /* (a kept array is ours: nothing there fails) */
    }
    if (parts == NULL) {
        PyObject *len = PyLong_FromSsize_t((Py_ssize_t)n * count);
        parts = len == NULL ? NULL : PyObject_CallFunctionObjArgs(np_empty, len, dtype, NULL);
        Py_XDECREF(len);
    }
    Py_XDECREF(dtype);
    uint64_t sig = (e->sig[dt] & ~TOP4) | ((uint64_t)(exclusive ? SIG_EXSCAN : SIG_SCAN) << 60) |
                   ((uint64_t)0x3FFF << 36) | COUNT_BITS(count);
    PyObject *sigobj = parts == NULL ? NULL : PyLong_FromUnsignedLongLong(sig);
    if (sigobj == NULL) {
        Py_XDECREF(parts);
        return NULL;
    }
    PyObject *call[4] = {args[0], parts, args[4], sigobj};
    PyObject *r = fast_all_gather(s, call, 4, PART_WHOLE);
    Py_DECREF(sigobj);
    if (r != Py_True) {                    /* declined (nothing moved) or failed */
        Py_DECREF(parts);
        return r;
    }
    Py_DECREF(r);
    int upto = exclusive ? s->rank : s->rank + 1;
    if (upto > 0) {
        Py_buffer pv, rv;
        if (nd_buffer(parts, &pv, PyBUF_C_CONTIGUOUS) < 0) {
            Py_DECREF(parts);
            return NULL;
        }
        if (nd_buffer(args[1], &rv, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
            PyBuffer_Release(&pv);
            Py_DECREF(parts);
            return NULL;
        }
        if (rv.len < nbytes) {         /* (resized by another thread while the GIL was let go) */
            PyBuffer_Release(&rv);
            PyBuffer_Release(&pv);
            Py_DECREF(parts);
            PyErr_SetString(PyExc_BufferError, "scan: the receive buffer shrank during the call");
            return NULL;
        }
        memcpy(rv.buf, pv.buf, (size_t)nbytes);
        for (int j = 1; j < upto; j++)     /* recv op x_j, lower ranks on the left */
            fn(rv.buf, (const char *)pv.buf + (Py_ssize_t)j * nbytes, count);
        PyBuffer_Release(&rv);
        PyBuffer_Release(&pv);
    }
    if (s->scan_parts == NULL)             /* (kept for the next call) */
        s->scan_parts = parts;
    else
        Py_DECREF(parts);
    Py_RETURN_TRUE;
}
