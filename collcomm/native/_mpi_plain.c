/* collcomm.MPI's buffer specs that stand for their array as it is (included by _shmcore.c
 * after _ndarray.c and _fastcall.c, whose nd_direct and plain_slot_offset it uses).
 *
 * mpi4py programs pass buffers as specs: ``[data, MPI.DOUBLE]``, ``[data, count, MPI.INT]``,
 * ``[data, (count, displ), MPI.INT]``, ``[data, count, displ, MPI.INT]``. Where ``data`` is
 * a C-contiguous numpy array of native byte order whose elements are the datatype's, the
 * count covers the whole array and the displacement is 0, the spec means exactly the
 * array: the fast calls then take it as they take the array (without this, every such
 * call took the general path: an ``Allreduce([x, MPI.DOUBLE], [y, MPI.DOUBLE])`` of
 * 8 bytes cost 12 µs on the project's VM against 0.4 for ``Allreduce(x, y)``).
 *
 * ``mpi_plain_types(datatype_class, pairs)``: the Datatype class (its ``_t`` slot) and, for
 * each predefined datatype whose element is one numpy scalar, ``(its _Type, the numpy
 * dtype of its elements)``; kept once for good (a later call answers whether it names
 * the same class). ``mpi_plain(spec, per, writable)``: the array ``spec`` stands for as
 * it is, else ``spec`` itself (any other form, buffer or datatype; nothing raised for
 * them: the Python code parses and judges them). ``per``: the count is per rank (a block
 * spec of ``per`` blocks: ``Gather``'s receive buffer) and must cover the array ``per``
 * times; ``writable``: the call writes the buffer (a read-only array is not taken).
 */

#define PLAIN_MAX 64
static PyTypeObject *pl_dt_class;       /* collcomm.MPI.Datatype (strong), NULL until set */
static Py_ssize_t pl_t_at;              /* ... the byte offset of its _t slot */
static PyObject *pl_types[PLAIN_MAX];   /* the predefined _Type objects (strong) */
static PyObject *pl_descrs[PLAIN_MAX];  /* ... and their elements' numpy dtypes (strong) */
static int pl_count;

static PyObject *mod_mpi_plain_types(PyObject *m, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyType_Check(args[0]) || !PyList_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "mpi_plain_types(datatype_class, [(type, dtype), ...])");
        return NULL;
    }
    if (pl_dt_class != NULL)
        return Py_NewRef(pl_dt_class == (PyTypeObject *)args[0] ? Py_True : Py_False);
    PyObject *name = PyUnicode_InternFromString("_t");
    Py_ssize_t at = name == NULL ? 0 : plain_slot_offset((PyTypeObject *)args[0], name);
    Py_XDECREF(name);
    Py_ssize_t k = PyList_GET_SIZE(args[1]);
    if (at <= 0 || k > PLAIN_MAX)
        Py_RETURN_FALSE;
    for (Py_ssize_t i = 0; i < k; i++) {
        PyObject *pair = PyList_GET_ITEM(args[1], i);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2)
            Py_RETURN_FALSE;
    }
    for (Py_ssize_t i = 0; i < k; i++) {
        PyObject *pair = PyList_GET_ITEM(args[1], i);
        pl_types[i] = Py_NewRef(PyTuple_GET_ITEM(pair, 0));
        pl_descrs[i] = Py_NewRef(PyTuple_GET_ITEM(pair, 1));
    }
    pl_count = (int)k;
    pl_t_at = at;
    pl_dt_class = (PyTypeObject *)Py_NewRef(args[0]);
    Py_RETURN_TRUE;
}

/* A count item: 1 it is `want` (an int, or None: the whole buffer), 0 not */
static int pl_count_is(PyObject *c, Py_ssize_t want)
{
    if (c == Py_None)
        return 1;
    if (!PyLong_CheckExact(c))
        return 0;
    Py_ssize_t v = PyLong_AsSsize_t(c);
    if (v == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return v == want;
}

/* A displacement item: 1 it is 0 (or None), 0 not */
static int pl_zero(PyObject *d)
{
    return pl_count_is(d, 0);
}

static PyObject *mod_mpi_plain(PyObject *m, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "mpi_plain(spec, per, writable)");
        return NULL;
    }
    PyObject *spec = args[0];
    int list = PyList_CheckExact(spec);
    if (pl_dt_class == NULL || (!list && !PyTuple_CheckExact(spec)))
        return Py_NewRef(spec);
    Py_ssize_t k = list ? PyList_GET_SIZE(spec) : PyTuple_GET_SIZE(spec);
    PyObject *const *item = list ? ((PyListObject *)spec)->ob_item : ((PyTupleObject *)spec)->ob_item;
    if (k < 2 || k > 4 || !PyObject_TypeCheck(item[k - 1], pl_dt_class))
        return Py_NewRef(spec);
    Py_ssize_t per = PyLong_AsSsize_t(args[1]);
    if (per < 1) {
        if (PyErr_Occurred())
            return NULL;
        return Py_NewRef(spec);
    }
    PyObject *t = *(PyObject **)((char *)item[k - 1] + pl_t_at);
    PyObject *descr = NULL;
    for (int i = 0; i < pl_count && t != NULL; i++)
        if (pl_types[i] == t) {
            descr = pl_descrs[i];
            break;
        }
    Py_buffer v;
    int flags = PyBUF_C_CONTIGUOUS | (args[2] == Py_True ? PyBUF_WRITABLE : 0);
    if (descr == NULL || !nd_direct(item[0], &v, flags))
        return Py_NewRef(spec);
    PyObject *array = (PyObject *)v.obj;       /* (item[0]; the view's reference dropped below) */
    int same = ((NdFields *)array)->descr == descr && v.itemsize > 0 && v.len % (v.itemsize * per) == 0;
    Py_ssize_t count = same ? v.len / v.itemsize / per : 0;
    PyBuffer_Release(&v);
    if (same && k == 3) {
        PyObject *c = item[1];
        if (PyTuple_CheckExact(c) || PyList_CheckExact(c)) {    /* (count, displ) */
            Py_ssize_t n = PySequence_Fast_GET_SIZE(c);
            PyObject *const *cd = PySequence_Fast_ITEMS(c);
            same = n == 2 && pl_count_is(cd[0], count) && pl_zero(cd[1]);
        } else {
            same = pl_count_is(c, count);
        }
    } else if (same && k == 4) {
        same = pl_count_is(item[1], count) && pl_zero(item[2]);
    }
    return Py_NewRef(same ? item[0] : spec);
}
