/* A 1-D numpy array over memory another object holds, made through numpy's own C API
 * table (included by _shmcore.c after _ndarray.c, whose nd_type and NdFields it uses).
 *
 * A buffer spec of part of an array or of a bytearray (``[buf, 8, MPI.BYTE]``,
 * ``[bytearray, MPI.DOUBLE]``: _mpi_plain.c) needs an array over those elements. Made by
 * slicing (~0.23 µs on the project's VM) or numpy.frombuffer (~0.7: its argument parsing
 * and a memoryview), it was most of what such a spec cost over the array itself (a
 * ``Sendrecv`` of two such specs 0.8x Open MPI's). numpy exports its C functions as a
 * table in a capsule (``numpy._core._multiarray_umath._ARRAY_API``; ``numpy.core`` before
 * numpy 2), which its headers index; this file reads the same three entries the headers
 * name, at the indices numpy has kept since 1.7: ``PyArray_Type`` (2),
 * ``PyArray_NewFromDescr`` (94) and ``PyArray_SetBaseObject`` (282), without building
 * against numpy. The table is trusted only where its ``PyArray_GetNDArrayCVersion`` (0)
 * answers numpy 1.x's or 2.x's ABI and its ``PyArray_Type`` is the ndarray type
 * set_ndarray checked; otherwise nd_view declines (NULL, nothing raised) and the caller
 * makes the array as before.
 *
 * nd_view(descr, count, data, writable, base): the array of `count` elements of dtype
 * `descr` at `data`, C-contiguous, writable if asked, its base `base` (a new reference
 * taken): the array the data belongs to, or a memoryview that holds the exporter's buffer
 * (as numpy.frombuffer's does). NULL with an exception only where numpy raised one.
 */

#define ND_ABI_1 0x01000009u             /* NPY_ABI_VERSION of numpy 1.x */
#define ND_ABI_2 0x02000000u             /* ... of numpy 2.x */
#define ND_C_CONTIGUOUS 0x0001
#define ND_WRITEABLE 0x0400

typedef PyObject *(*nd_new_from_descr_fn)(PyTypeObject *, PyObject *, int, const Py_ssize_t *,
                                          const Py_ssize_t *, void *, int, PyObject *);
typedef int (*nd_set_base_fn)(PyObject *, PyObject *);

static nd_new_from_descr_fn nd_new_from_descr;   /* NULL: not checked, or not numpy's */
static nd_set_base_fn nd_set_base;

/* Read numpy's table once nd_type is known (set_ndarray): 1 usable, 0 not (nothing raised) */
static int nd_view_init(void)
{
    if (nd_new_from_descr != NULL)
        return 1;
    const char *env = getenv("COLLCOMM_ND_VIEW");      /* (0: off: the views as before) */
    if (nd_type == NULL || (env != NULL && strcmp(env, "0") == 0))
        return 0;
    const char *where[2] = {"numpy._core._multiarray_umath", "numpy.core._multiarray_umath"};
    void **api = NULL;
    for (int i = 0; i < 2 && api == NULL; i++) {
        PyObject *mod = PyImport_ImportModule(where[i]);
        PyObject *cap = mod == NULL ? NULL : PyObject_GetAttrString(mod, "_ARRAY_API");
        if (cap != NULL && PyCapsule_CheckExact(cap))
            api = (void **)PyCapsule_GetPointer(cap, NULL);
        Py_XDECREF(cap);          /* (the module keeps the capsule and its table) */
        Py_XDECREF(mod);
        PyErr_Clear();
    }
    if (api == NULL || api[0] == NULL || (PyTypeObject *)api[2] != nd_type)
        return 0;
    unsigned int abi = ((unsigned int (*)(void))api[0])();
    if (abi != ND_ABI_1 && abi != ND_ABI_2)
        return 0;
    nd_set_base = (nd_set_base_fn)api[282];
    nd_new_from_descr = (nd_new_from_descr_fn)api[94];
    return 1;
}

/* nd_views(on=None) -> bool: whether views are made this way now; True: read the table
 * again (the answer says if it could), False: make them as before (the tests run both ways) */
static PyObject *mod_nd_views(PyObject *m, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs > 1) {
        PyErr_SetString(PyExc_TypeError, "nd_views(on=None)");
        return NULL;
    }
    if (nargs == 1 && args[0] != Py_None) {
        int on = PyObject_IsTrue(args[0]);
        if (on < 0)
            return NULL;
        if (!on)
            nd_new_from_descr = NULL;
        else
            nd_view_init();
    }
    return Py_NewRef(nd_new_from_descr != NULL ? Py_True : Py_False);
}

static PyObject *nd_view(PyObject *descr, Py_ssize_t count, char *data, int writable, PyObject *base)
{
    if (nd_new_from_descr == NULL)
        return NULL;
    Py_ssize_t dims[1] = {count};
    Py_INCREF(descr);                    /* (NewFromDescr takes a reference, also on failure) */
    PyObject *a = nd_new_from_descr(nd_type, descr, 1, dims, NULL, data,
                                    ND_C_CONTIGUOUS | (writable ? ND_WRITEABLE : 0), NULL);
    if (a == NULL)
        return NULL;
    if (nd_set_base(a, Py_NewRef(base)) < 0) {    /* (takes the reference, also on failure) */
        Py_DECREF(a);
        return NULL;
    }
    return a;
}
