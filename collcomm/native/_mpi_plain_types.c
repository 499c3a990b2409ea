/* The predefined datatypes collcomm.MPI registers with the native core (mpi_plain_types,
 * _mpi_plain.c), kept where the fast call's vector entries read them too (included by
 * _shmcore.c before _fastcall.c): each is one numpy scalar of its dtype, no gaps.
 * ``pl_descr_of(datatype)``: the numpy dtype of a registered datatype's elements, read
 * from its ``_t`` slot, without an attribute look-up; NULL: not one of them (or none
 * registered yet): the caller asks the datatype itself. ``pl_size_of(datatype)``: its item
 * size, the same way. */

#define PLAIN_MAX 128
static PyTypeObject *pl_dt_class;       /* collcomm.MPI.Datatype (strong), NULL until set */
static Py_ssize_t pl_t_at;              /* ... the byte offset of its _t slot */
static PyObject *pl_types[PLAIN_MAX];   /* the predefined _Type objects (strong) */
static PyObject *pl_descrs[PLAIN_MAX];  /* ... and their elements' numpy dtypes (strong) */
static Py_ssize_t pl_sizes[PLAIN_MAX];  /* ... and those dtypes' item sizes */
static int pl_count;

/* The index of a registered datatype among pl_types, read from its ``_t`` slot; -1: not
 * one of them (or none registered yet) */
static int pl_index_of(PyObject *datatype)
{
    if (pl_dt_class == NULL || Py_TYPE(datatype) != pl_dt_class)
        return -1;
    PyObject *t = *(PyObject **)((char *)datatype + pl_t_at);
    for (int i = 0; i < pl_count && t != NULL; i++)
        if (pl_types[i] == t)
            return i;
    return -1;
}

static PyObject *pl_descr_of(PyObject *datatype)   /* borrowed, or NULL */
{
    int i = pl_index_of(datatype);
    return i < 0 ? NULL : pl_descrs[i];
}

/* The item size of a registered datatype's elements (its extent: a resized or derived
 * datatype has a type map of its own, not a registered one); -1: not one of them. */
static Py_ssize_t pl_size_of(PyObject *datatype)
{
    int i = pl_index_of(datatype);
    return i < 0 ? -1 : pl_sizes[i];
}
