/* A numpy array's buffer read from the array itself (included by _shmcore.c).
 *
 * Every call gets its buffers with PyObject_GetBuffer. For a numpy array that is numpy's
 * getbuffer, which builds the format string and compares it with the array's cached
 * buffer info each time: ~600 instructions, three times in a point-to-point exchange,
 * twice in a small all_reduce (measured with callgrind). nd_buffer fills the same
 * Py_buffer from the array's fields for the arrays the calls take (an exact
 * numpy.ndarray, C-contiguous, native byte order, a built-in numeric dtype; writable when
 * asked) and hands everything else to PyObject_GetBuffer.
 *
 * The fields read are numpy's public struct layout (PyArrayObject_fields: data, nd,
 * dimensions, strides, descr, flags; PyArray_Descr: byteorder, type_num), the same in
 * numpy 1.x and 2.x. It is trusted only after set_ndarray has compared nd_buffer's
 * answer with numpy's own getbuffer on probe arrays the package makes at import (every
 * dtype, read-only, strided, 0-d, 2-d): any difference and nd_buffer never reads an
 * array directly in this process.
 *
 * The view holds a reference to the array (obj), as numpy's would, and no export:
 * PyBuffer_Release drops the reference (numpy.ndarray has no releasebuffer slot, which
 * set_ndarray checks); an array with references cannot be resized (ndarray.resize checks).
 * The reference matters where a caller's own does not last: a list-form call reads its
 * arrays out of the user's list, which another thread may change while it waits.
 */

typedef struct {
    PyObject_HEAD
    char *data;
    int nd;
    Py_ssize_t *dimensions;
    Py_ssize_t *strides;
    PyObject *base;
    PyObject *descr;
    int flags;
} NdFields;

typedef struct {
    PyObject_HEAD
    PyTypeObject *typeobj;
    char kind, type, byteorder, former_flags;
    int type_num;
} NdDescrFields;

#define ND_C_CONTIGUOUS 0x0001
#define ND_WRITEABLE 0x0400
#define ND_WARN_ON_WRITE ((int)0x80000000u)   /* writing warns (numpy's getbuffer says so) */

static PyTypeObject *nd_type;   /* numpy.ndarray once set_ndarray has checked the layout */
static PyObject *nd_type_ref;   /* the strong reference that keeps it (the last one trusted) */

/* numpy's built-in type numbers 0..23 -> (item size, PEP 3118 format); size 0: not ours */
static const struct { int size; const char *format; } nd_types[24] = {
    [0] = {1, "?"}, [1] = {1, "b"}, [2] = {1, "B"}, [3] = {2, "h"}, [4] = {2, "H"},
    [5] = {4, "i"}, [6] = {4, "I"}, [7] = {sizeof(long), "l"}, [8] = {sizeof(long), "L"},
    [9] = {8, "q"}, [10] = {8, "Q"}, [11] = {4, "f"}, [12] = {8, "d"},
    [14] = {8, "Zf"}, [15] = {16, "Zd"}, [23] = {2, "e"},
};

/* 1: `v` filled from the array's fields; 0: not an array this reads (use GetBuffer). */
static int nd_direct(PyObject *o, Py_buffer *v, int flags)
{
    if (Py_TYPE(o) != nd_type || nd_type == NULL)
        return 0;
    NdFields *a = (NdFields *)o;
    NdDescrFields *d = (NdDescrFields *)a->descr;
    int t = d->type_num;
    if (t < 0 || t >= 24 || nd_types[t].size == 0 || d->byteorder == '>' ||
        !(a->flags & ND_C_CONTIGUOUS) ||
        ((flags & PyBUF_WRITABLE) && (!(a->flags & ND_WRITEABLE) || (a->flags & ND_WARN_ON_WRITE))))
        return 0;
    Py_ssize_t len = nd_types[t].size;
    for (int i = 0; i < a->nd; i++)
        len *= a->dimensions[i];
    *v = (Py_buffer){
        .buf = a->data, .obj = Py_NewRef(o), .len = len, .itemsize = nd_types[t].size,
        .readonly = !(a->flags & ND_WRITEABLE), .ndim = a->nd,
        .format = (flags & PyBUF_FORMAT) ? (char *)nd_types[t].format : NULL,
        .shape = a->dimensions, .strides = a->strides, .suboffsets = NULL, .internal = NULL,
    };
    return 1;
}

/* o.dtype (a new reference): an array's descr read directly where nd_direct reads it */
static PyObject *nd_dtype(PyObject *o, PyObject *name)
{
    if (Py_TYPE(o) == nd_type && nd_type != NULL)
        return Py_NewRef(((NdFields *)o)->descr);
    return PyObject_GetAttr(o, name);
}

/* o.nbytes as a C number, -1 with an exception */
static Py_ssize_t nd_nbytes(PyObject *o, PyObject *name)
{
    Py_buffer v;
    if (nd_direct(o, &v, PyBUF_C_CONTIGUOUS)) {
        Py_ssize_t len = v.len;
        PyBuffer_Release(&v);
        return len;
    }
    PyObject *n = PyObject_GetAttr(o, name);
    Py_ssize_t r = n == NULL ? -1 : PyLong_AsSsize_t(n);
    Py_XDECREF(n);
    return r;
}

/* PyObject_GetBuffer(o, v, flags) for the calls' flags (C-contiguous, maybe writable and
 * format): 0, or -1 with GetBuffer's exception. */
static int nd_buffer(PyObject *o, Py_buffer *v, int flags)
{
    return nd_direct(o, v, flags) ? 0 : PyObject_GetBuffer(o, v, flags);
}

/* Before anything behind `descr` is read: do the fields where nd_direct looks hold the
 * probe's data pointer (__array_interface__), dimension count and dtype object? 1 yes,
 * 0 no, -1 an exception. */
static int nd_fields_match(PyObject *probe)
{
    NdFields *a = (NdFields *)probe;
    PyObject *dtype = PyObject_GetAttrString(probe, "dtype");
    PyObject *ndim = dtype == NULL ? NULL : PyObject_GetAttrString(probe, "ndim");
    PyObject *face = ndim == NULL ? NULL : PyObject_GetAttrString(probe, "__array_interface__");
    PyObject *data = face == NULL || !PyDict_Check(face) ? NULL : PyDict_GetItemString(face, "data");
    int ok = face == NULL ? -1
           : data != NULL && PyTuple_Check(data) && PyTuple_GET_SIZE(data) >= 1 &&
             PyLong_AsVoidPtr(PyTuple_GET_ITEM(data, 0)) == (void *)a->data &&
             PyLong_AsLong(ndim) == a->nd && dtype == a->descr;
    if (ok >= 0 && PyErr_Occurred()) {
        PyErr_Clear();
        ok = 0;
    }
    Py_XDECREF(dtype);
    Py_XDECREF(ndim);
    Py_XDECREF(face);
    return ok;
}

/* Does nd_direct read `probe` as numpy's getbuffer does (or decline it)? 1 yes, 0 no,
 * -1 an exception. `must`: it has to read it directly (a plain array of a built-in dtype). */
static int nd_agrees(PyObject *probe, int flags, int must)
{
    Py_buffer mine, theirs;
    if (Py_TYPE(probe) == nd_type) {
        int fields = nd_fields_match(probe);
        if (fields <= 0)
            return fields;
    }
    if (!nd_direct(probe, &mine, flags))
        return !must;
    if (PyObject_GetBuffer(probe, &theirs, flags) < 0) {
        PyErr_Clear();
        PyBuffer_Release(&mine);
        return 0;                        /* numpy refuses what nd_direct took */
    }
    const char *f = theirs.format;
    if (f != NULL && (*f == '=' || *f == '<' || *f == '@'))
        f++;
    int same = mine.buf == theirs.buf && mine.len == theirs.len &&
               mine.itemsize == theirs.itemsize && mine.readonly == theirs.readonly &&
               mine.ndim == theirs.ndim &&
               (!(flags & PyBUF_FORMAT) || (f != NULL && strcmp(f, mine.format) == 0));
    for (int i = 0; same && i < mine.ndim; i++)
        same = mine.shape[i] == theirs.shape[i];
    PyBuffer_Release(&theirs);
    PyBuffer_Release(&mine);
    return same;
}

/* set_ndarray(ndarray, probes): read numpy.ndarray's buffers directly from now on if, for
 * every probe array and every flag set the calls use, nd_direct agrees with numpy, and it
 * read the first probe (a plain writable array of a built-in dtype) itself. Returns True
 * if it does. */
static PyObject *mod_set_ndarray(PyObject *module, PyObject *args)
{
    PyObject *type, *probes;
    if (!PyArg_ParseTuple(args, "O!O!", &PyType_Type, &type, &PyList_Type, &probes))
        return NULL;
    nd_type = NULL;
    PyTypeObject *candidate = (PyTypeObject *)type;
    if (PyList_GET_SIZE(probes) == 0 ||
        candidate->tp_basicsize < (Py_ssize_t)sizeof(NdFields) || candidate->tp_as_buffer == NULL ||
        candidate->tp_as_buffer->bf_releasebuffer != NULL)   /* (PyBuffer_Release would call it) */
        Py_RETURN_FALSE;
    const int flag_sets[] = {PyBUF_C_CONTIGUOUS, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE,
                             PyBUF_C_CONTIGUOUS | PyBUF_FORMAT,
                             PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE};
    nd_type = candidate;                 /* (nd_direct reads only while this is set) */
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(probes); i++)
        for (size_t j = 0; j < sizeof(flag_sets) / sizeof(flag_sets[0]); j++) {
            int ok = nd_agrees(PyList_GET_ITEM(probes, i), flag_sets[j], i == 0);
            if (ok <= 0) {
                nd_type = NULL;
                if (ok < 0)
                    return NULL;
                Py_RETURN_FALSE;
            }
        }
    Py_INCREF(candidate);                /* kept until another is trusted */
    Py_XSETREF(nd_type_ref, (PyObject *)candidate);
    Py_RETURN_TRUE;
}
