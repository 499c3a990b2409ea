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
 * ``mpi_plain_types(datatype_class, triples, frombuffer, asarray)``: the Datatype class
 * (its ``_t`` slot) and, for each predefined datatype whose element is one numpy scalar,
 * ``(its _Type, the numpy dtype of its elements, that dtype's item size)``, and numpy's
 * frombuffer and asarray; kept once for good (a later call answers whether it names the
 * same class). ``mpi_plain(spec, per, writable)``: the array ``spec`` stands for as it is,
 * else ``spec`` itself (any other form, buffer or datatype; nothing raised for them: the
 * Python code parses and judges them). Buffers that are no numpy array (a ``bytearray``,
 * an ``array.array``, ``MPI.buffer``, a ``memoryview``), alone or in such a spec of a
 * registered datatype (a count, a displacement), give the array over the message's
 * elements made by numpy.asarray / numpy.frombuffer (no copy): the OSU benchmarks of
 * mpi4py's demos send ``[buf, size, MPI.BYTE]`` of ``MPI.Alloc_mem`` memory. So do specs
 * of part of a numpy array (a count, a displacement) or of its bytes read as another
 * datatype (``[x, MPI.INT64_T]`` of a float64 array). ``per``: the count is per rank (a block
 * spec of ``per`` blocks: ``Gather``'s receive buffer) and must cover the array ``per``
 * times; ``writable``: the call writes the buffer (a read-only array is not taken).
 */

/* (the registered datatypes themselves: _mpi_plain_types.c) */
static PyObject *pl_frombuffer, *pl_asarray;   /* numpy.frombuffer, numpy.asarray (strong) */

static PyObject *mod_mpi_plain_types(PyObject *m, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !PyType_Check(args[0]) || !PyList_Check(args[1]) || !PyCallable_Check(args[2]) ||
        !PyCallable_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "mpi_plain_types(datatype_class, [(type, dtype, itemsize), ...], "
                        "numpy.frombuffer, numpy.asarray)");
        return NULL;
    }
    if (pl_dt_class != NULL)
        return Py_NewRef(pl_dt_class == (PyTypeObject *)args[0] ? Py_True : Py_False);
    PyObject *name = PyUnicode_InternFromString("_t");
    if (name == NULL)
        return NULL;
    Py_ssize_t at = plain_slot_offset((PyTypeObject *)args[0], name);
    Py_DECREF(name);
    Py_ssize_t k = PyList_GET_SIZE(args[1]);
    if (at <= 0 || k > PLAIN_MAX)
        Py_RETURN_FALSE;
    for (Py_ssize_t i = 0; i < k; i++) {
        PyObject *pair = PyList_GET_ITEM(args[1], i);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 3 || !PyLong_Check(PyTuple_GET_ITEM(pair, 2)))
            Py_RETURN_FALSE;
        Py_ssize_t size = PyLong_AsSsize_t(PyTuple_GET_ITEM(pair, 2));
        if (size <= 0) {             /* (an item size out of range: not kept) */
            PyErr_Clear();
            Py_RETURN_FALSE;
        }
    }
    for (Py_ssize_t i = 0; i < k; i++) {
        PyObject *pair = PyList_GET_ITEM(args[1], i);
        pl_types[i] = Py_NewRef(PyTuple_GET_ITEM(pair, 0));
        pl_descrs[i] = Py_NewRef(PyTuple_GET_ITEM(pair, 1));
        pl_sizes[i] = PyLong_AsSsize_t(PyTuple_GET_ITEM(pair, 2));
    }
    pl_frombuffer = Py_NewRef(args[2]);
    pl_asarray = Py_NewRef(args[3]);
    nd_view_init();                  /* (the views' quick way: _nd_view.c; else frombuffer) */
    pl_count = (int)k;
    pl_t_at = at;
    pl_dt_class = (PyTypeObject *)Py_NewRef(args[0]);
    Py_RETURN_TRUE;
}

/* An error met while trying: cleared if it is an ordinary one (the Python code meets it
 * again and says what is wrong); 1 when one that must go on remains (KeyboardInterrupt,
 * SystemExit raised by a buffer's own code), 0 else. */
static int pl_clear(void)
{
    if (PyErr_Occurred() && PyErr_ExceptionMatches(PyExc_Exception))
        PyErr_Clear();
    return PyErr_Occurred() != NULL;
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
        PyErr_Clear();         /* (an int too large: an OverflowError) */
        return 0;
    }
    return v == want;
}

/* A displacement item: 1 it is 0 (or None), 0 not */
static int pl_zero(PyObject *d)
{
    return pl_count_is(d, 0);
}

/* A count item as a number of elements: >= 0, -1 None (the whole buffer), -2 neither */
static Py_ssize_t pl_count_of(PyObject *c)
{
    if (c == Py_None)
        return -1;
    if (!PyLong_CheckExact(c))
        return -2;
    Py_ssize_t v = PyLong_AsSsize_t(c);
    if (v < 0) {
        PyErr_Clear();
        return -2;
    }
    return v;
}

/* The view pl_raw_view makes, by numpy's C table (_nd_view.c) where it can: `total`
 * elements of `descr` (`isz` bytes each) from byte `at` of `obj`'s memory, based on `obj`
 * itself where it is a numpy array (as its slice would be), else on a memoryview of it
 * (which holds its buffer, as numpy.frombuffer's view does); NULL (nothing raised): not
 * this way. */
static PyObject *pl_nd_view(PyObject *obj, PyObject *descr, Py_ssize_t at, Py_ssize_t total,
                            Py_ssize_t isz, int writable)
{
    if (nd_new_from_descr == NULL)
        return NULL;
    if (Py_TYPE(obj) == nd_type) {
        Py_buffer v;                 /* (an exact array, C-contiguous: its own fields) */
        if (!nd_direct(obj, &v, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)))
            return NULL;
        char *data = (char *)v.buf;
        int ok = v.len >= at + total * isz, w = !v.readonly;
        PyBuffer_Release(&v);
        return ok ? nd_view(descr, total, data + at, w, obj) : NULL;
    }
    PyObject *mv = PyMemoryView_FromObject(obj);
    if (mv == NULL) {
        PyErr_Clear();
        return NULL;
    }
    Py_buffer *v = PyMemoryView_GET_BUFFER(mv);
    PyObject *a = NULL;
    if (PyBuffer_IsContiguous(v, 'C') && v->len >= at + total * isz && (!writable || !v->readonly))
        a = nd_view(descr, total, (char *)v->buf + at, !v->readonly, mv);
    Py_DECREF(mv);
    return a;
}

/* ``[obj, ..., dt]`` (`obj` the spec's first item, held by the caller: its getbuffer may
 * run code that changes the list) of memory numpy.frombuffer can view: a numpy array, a
 * bytearray, an array.array, a memoryview, MPI.buffer...: the view over the message's
 * elements (the count, per rank `per` times, from the displacement on), checked to be
 * that memory; or NULL, with nothing raised when it does not apply (the Python code parses
 * it and says what is wrong), or with an error that must go on (pl_clear). */
static PyObject *pl_raw_view(PyObject *obj, PyObject *const *item, Py_ssize_t k, PyObject *descr,
                             Py_ssize_t isz, Py_ssize_t per, int writable)
{
    Py_ssize_t count = -1, displ = 0;
    if (k == 3) {
        PyObject *c = item[1];
        if (PyTuple_CheckExact(c) || PyList_CheckExact(c)) {
            if (PySequence_Fast_GET_SIZE(c) != 2)
                return NULL;
            count = pl_count_of(PySequence_Fast_ITEMS(c)[0]);
            displ = pl_count_of(PySequence_Fast_ITEMS(c)[1]);
        } else {
            count = pl_count_of(c);
        }
    } else if (k == 4) {
        count = pl_count_of(item[1]);
        displ = pl_count_of(item[2]);
    }
    if (displ == -1)
        displ = 0;
    if (count < -1 || displ < 0 || isz <= 0 || per < 1)
        return NULL;
    Py_buffer v;
    int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (nd_buffer(obj, &v, flags) < 0) {      /* (an array's own fields: no getbuffer) */
        pl_clear();
        return NULL;
    }
    char *base = v.buf;
    Py_ssize_t len = v.len;
    PyBuffer_Release(&v);
    /* bounded by division first: no product below can overflow (a count or displacement
     * near 2**63 must not wrap into a view of the start of the buffer) */
    Py_ssize_t cap = len / isz, total;
    if (displ > cap)
        return NULL;
    Py_ssize_t room = cap - displ;
    if (count < 0) {                 /* (the whole buffer: in `per` equal blocks) */
        if ((len - displ * isz) % isz || room % per)
            return NULL;
        total = room;
    } else {
        if (count > room / per)
            return NULL;
        total = count * per;
    }
    PyObject *a = pl_nd_view(obj, descr, displ * isz, total, isz, writable);
    if (a != NULL || PyErr_Occurred()) {
        /* (made over that memory: checked below as the others are) */
    } else if (Py_TYPE(obj) == nd_type && ((NdFields *)obj)->nd == 1 && ((NdFields *)obj)->descr == descr) {
        /* part of a 1-D array of the datatype's own dtype: the slice (a view, as
         * frombuffer's; ~55 ns less a spec: `Sendrecv([buf, 8, MPI.BYTE], ...)`) */
        a = PySequence_GetSlice(obj, displ, displ + total);
    } else {
        PyObject *n = PyLong_FromSsize_t(total), *off = PyLong_FromSsize_t(displ * isz);
        PyObject *call[4] = {obj, descr, n, off};
        a = n == NULL || off == NULL ? NULL : PyObject_Vectorcall(pl_frombuffer, call, 4, NULL);
        Py_XDECREF(n);
        Py_XDECREF(off);
    }
    if (a == NULL) {
        pl_clear();
        return NULL;
    }
    /* that memory, not a copy (numpy.frombuffer wrapped by something else?) */
    Py_buffer got;
    int ok = Py_TYPE(a) == nd_type && nd_direct(a, &got, flags);
    if (ok) {
        ok = got.buf == base + displ * isz && got.len == total * isz && ((NdFields *)a)->descr == descr;
        PyBuffer_Release(&got);
    }
    if (!ok)
        Py_CLEAR(a);
    return a;
}

static PyObject *mod_mpi_plain(PyObject *m, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "mpi_plain(spec, per, writable)");
        return NULL;
    }
    PyObject *spec = args[0];
    int list = PyList_CheckExact(spec);
    if (pl_dt_class == NULL)
        return Py_NewRef(spec);
    if (!list && !PyTuple_CheckExact(spec)) {
        /* a buffer that is no numpy array (bytearray, array.array, memoryview...): the
         * array over it, of the dtype its format says (numpy.asarray: no copy) */
        if (Py_TYPE(spec) == nd_type || !PyObject_CheckBuffer(spec))
            return Py_NewRef(spec);
        int flags = PyBUF_C_CONTIGUOUS | (args[2] == Py_True ? PyBUF_WRITABLE : 0);
        Py_buffer own, v;
        if (PyObject_GetBuffer(spec, &own, flags) < 0) {    /* (read only where written: the
                                                             * Python code says so) */
            return pl_clear() ? NULL : Py_NewRef(spec);
        }
        void *at = own.buf;
        Py_ssize_t len = own.len;
        PyBuffer_Release(&own);
        PyObject *a = PyObject_CallOneArg(pl_asarray, spec);
        if (a == NULL)
            return pl_clear() ? NULL : Py_NewRef(spec);
        /* the same memory, not a copy (numpy.asarray copies a numpy scalar) */
        int ok = Py_TYPE(a) == nd_type && nd_direct(a, &v, flags);
        if (ok) {
            ok = v.buf == at && v.len == len;
            PyBuffer_Release(&v);
        }
        if (!ok) {
            Py_DECREF(a);
            return Py_NewRef(spec);
        }
        return a;
    }
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
    Py_ssize_t isz = 0;
    for (int i = 0; i < pl_count && t != NULL; i++)
        if (pl_types[i] == t) {
            descr = pl_descrs[i];
            isz = pl_sizes[i];
            break;
        }
    if (descr == NULL)
        return Py_NewRef(spec);
    if (Py_TYPE(item[0]) != nd_type && PyObject_CheckBuffer(item[0])) {
        PyObject *obj = Py_NewRef(item[0]);     /* (its getbuffer may run code that changes the list) */
        PyObject *a = pl_raw_view(obj, item, k, descr, isz, per, args[2] == Py_True);
        Py_DECREF(obj);
        return a != NULL || PyErr_Occurred() ? a : Py_NewRef(spec);
    }
    Py_buffer v;
    int flags = PyBUF_C_CONTIGUOUS | (args[2] == Py_True ? PyBUF_WRITABLE : 0);
    if (!nd_direct(item[0], &v, flags))
        return Py_NewRef(spec);
    PyObject *array = (PyObject *)v.obj;       /* (item[0]; the view's reference dropped below) */
    int same = ((NdFields *)array)->descr == descr && v.itemsize > 0 && v.len % v.itemsize == 0 &&
               (v.len / v.itemsize) % per == 0;
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
    if (same)
        return Py_NewRef(item[0]);
    /* part of the array, or its bytes read as another dtype: a view made by frombuffer */
    PyObject *obj = Py_NewRef(item[0]);
    PyObject *a = pl_raw_view(obj, item, k, descr, isz, per, args[2] == Py_True);
    Py_DECREF(obj);
    return a != NULL || PyErr_Occurred() ? a : Py_NewRef(spec);
}

/* mpi_plain2(sendbuf, recvbuf, send_per, recv_per) -> (mpi_plain(sendbuf, send_per, False),
 * mpi_plain(recvbuf, recv_per, True)): what a method runs on its two buffers before its
 * fast path when one is not an array (collcomm/MPI/_coll_reduce.py _plain2), in one call */
static PyObject *mod_mpi_plain2(PyObject *m, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "mpi_plain2(sendbuf, recvbuf, send_per, recv_per)");
        return NULL;
    }
    PyObject *send_args[3] = {args[0], args[2], Py_False}, *recv_args[3] = {args[1], args[3], Py_True};
    PyObject *send = mod_mpi_plain(m, send_args, 3);
    if (send == NULL)
        return NULL;
    PyObject *recv = mod_mpi_plain(m, recv_args, 3);
    if (recv == NULL) {
        Py_DECREF(send);
        return NULL;
    }
    PyObject *pair = PyTuple_Pack(2, send, recv);
    Py_DECREF(send);
    Py_DECREF(recv);
    return pair;
}
