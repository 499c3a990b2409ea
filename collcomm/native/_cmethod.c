/* A C method of a built-in object called straight (included by _shmcore.c before the
 * flight recorder and the fast call, which use it).
 *
 * The two-part asynchronous calls (_fastcall_parts*.c) take and release the group's
 * locks, look at a Work's lock and push to and pop from the group's deque on every call;
 * the flight recorder (_record.c) pops a record from its ring and appends one per call.
 * ``PyObject_CallMethod*`` does each by looking the name up, making a bound method and,
 * for a lock's ``acquire(False)`` (METH_VARARGS | METH_KEYWORDS), an argument tuple: about
 * 500 instructions a call, five to seven of them a call. A CMethod is the method's C
 * function, found once on the object's type (only where the type's attribute is the C
 * method descriptor itself, so a subclass that overrides it in Python is called the
 * usual way), and called with the calling convention its flags give: ~60-120
 * instructions. Anything else (an unusual flag, no such method) falls back to the
 * regular call, so the result is always what the method returns.
 */

typedef struct {
    PyObject *name;        /* the method's name (interned; borrowed) */
    PyCFunction fn;        /* NULL: call it the regular way */
    int flags;             /* its METH_ flags */
    PyTypeObject *type;    /* the type it was found on (borrowed: the object holds it) */
} CMethod;

/* Find `name` on `obj`'s type (never fails: at worst the regular call is used) */
static void cmethod_find(CMethod *m, PyObject *obj, PyObject *name)
{
    m->name = name;
    m->fn = NULL;
    m->flags = 0;
    m->type = Py_TYPE(obj);
    PyObject *descr = PyObject_GetAttr((PyObject *)Py_TYPE(obj), name);
    if (descr == NULL) {
        PyErr_Clear();
        return;
    }
    if (Py_IS_TYPE(descr, &PyMethodDescr_Type)) {
        PyMethodDef *def = ((PyMethodDescrObject *)descr)->d_method;
        int flags = def->ml_flags & ~(METH_COEXIST);
        if (flags == METH_NOARGS || flags == METH_O || flags == (METH_VARARGS | METH_KEYWORDS) ||
            flags == METH_VARARGS || flags == METH_FASTCALL ||
            flags == (METH_FASTCALL | METH_KEYWORDS)) {
            m->fn = def->ml_meth;
            m->flags = flags;
        }
    }
    Py_DECREF(descr);
}

/* obj.<m>() or obj.<m>(arg) (arg NULL: no argument); a new reference, NULL on error */
static PyObject *cmethod_call(CMethod *m, PyObject *obj, PyObject *arg)
{
    int nargs = arg != NULL;
    if (m->fn == NULL || Py_TYPE(obj) != m->type)
        goto regular;
    PyObject *r;
    switch (m->flags) {
    case METH_NOARGS:
        if (nargs)
            goto regular;
        r = m->fn(obj, NULL);
        break;
    case METH_O:
        if (!nargs)
            goto regular;
        r = m->fn(obj, arg);
        break;
    case METH_FASTCALL:
        r = ((PyObject *(*)(PyObject *, PyObject *const *, Py_ssize_t))(void (*)(void))m->fn)(
            obj, &arg, nargs);
        break;
    case METH_FASTCALL | METH_KEYWORDS:
        r = ((PyObject *(*)(PyObject *, PyObject *const *, Py_ssize_t, PyObject *))(void (*)(void))
             m->fn)(obj, &arg, nargs, NULL);
        break;
    default: {                 /* METH_VARARGS, with or without METH_KEYWORDS */
        static PyObject *false_args;   /* (False,): a lock's acquire(False), every call */
        if (false_args == NULL && (false_args = PyTuple_Pack(1, Py_False)) == NULL)
            return NULL;
        PyObject *tuple = arg == Py_False ? Py_NewRef(false_args)
                          : nargs ? PyTuple_Pack(1, arg) : PyTuple_New(0);
        if (tuple == NULL)
            return NULL;
        r = m->flags & METH_KEYWORDS
                ? ((PyCFunctionWithKeywords)(void (*)(void))m->fn)(obj, tuple, NULL)
                : m->fn(obj, tuple);
        Py_DECREF(tuple);
    }
    }
    return r;
regular:
    return nargs ? PyObject_CallMethodOneArg(obj, m->name, arg) : PyObject_CallMethodNoArgs(obj, m->name);
}
