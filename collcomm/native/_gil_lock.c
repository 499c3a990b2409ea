/* GilLock: a lock whose word only threads holding the GIL read or write, so taking and
 * releasing it are a plain load and store: no locked instruction. The shared-memory
 * channels' send_lock and poll_lock (transport/shm.py) are GilLocks where the interpreter
 * has a GIL.
 *
 * Why: a _thread.lock's release is glibc's sem_post, whose `lock cmpxchg` drains the
 * store buffer. Released right after a record was written into the peer's ring (lines the
 * peer's core owns: it read them last), the CPU stalled until those lines were ours:
 * 8-15% of an 8-byte exchange loop sat on that one instruction (perf, 2-vCPU VM). A plain
 * store lets the drain overlap what comes next (the wait for the peer's reply).
 *
 * Correct because every acquire and release runs holding the GIL (Python code, and the
 * native point-to-point calls, which take and give these locks only with the GIL held:
 * _p2p.c p2p_try / p2p_release); a holder may let the GIL go while it holds the lock
 * (the native receive waits so), the word stays 1 meanwhile. A blocked acquire lets the
 * GIL go while it waits (sched_yield, then naps up to 1 ms), so the holder can run and
 * release. Not for a free-threaded build (no GIL): shm.py uses _thread locks there.
 *
 * Included by _shmcore.c before _p2p.c.
 */

typedef struct {
    PyObject_HEAD
    int locked;
} GilLock;

static PyTypeObject GilLockType;

/* Take the lock, waiting up to `timeout` s (< 0: no limit, 0: not at all): 1 taken,
 * 0 not, -1 with an exception (a signal handler raised). */
static int gil_lock_take(GilLock *l, double timeout)
{
    if (!l->locked) {
        l->locked = 1;
        return 1;
    }
    if (timeout == 0)
        return 0;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    long nap_ns = 20000;
    for (int round = 0; l->locked; round++) {
        Py_BEGIN_ALLOW_THREADS
        if (round < 64) {
            sched_yield();
        } else {
            struct timespec ts = {0, nap_ns};
            nanosleep(&ts, NULL);
            nap_ns = nap_ns * 2 > 1000000 ? 1000000 : nap_ns * 2;
        }
        Py_END_ALLOW_THREADS
        if (PyErr_CheckSignals() < 0)
            return -1;
        if (timeout > 0 && l->locked) {
            struct timespec now;
            clock_gettime(CLOCK_MONOTONIC, &now);
            if ((double)(now.tv_sec - t0.tv_sec) + (now.tv_nsec - t0.tv_nsec) / 1e9 >= timeout)
                return 0;
        }
    }
    l->locked = 1;
    return 1;
}

static PyObject *GilLock_acquire(GilLock *l, PyObject *args, PyObject *kwds)
{
    static char *names[] = {"blocking", "timeout", NULL};
    int blocking = 1;
    double timeout = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|pd:acquire", names, &blocking, &timeout))
        return NULL;
    if (!blocking && timeout != -1) {
        PyErr_SetString(PyExc_ValueError, "can't specify a timeout for a non-blocking call");
        return NULL;
    }
    if (timeout < 0 && timeout != -1) {
        PyErr_SetString(PyExc_ValueError, "timeout value must be a non-negative number");
        return NULL;
    }
    int got = gil_lock_take(l, blocking ? timeout : 0);
    if (got < 0)
        return NULL;
    return PyBool_FromLong(got);
}

static PyObject *GilLock_release(GilLock *l, PyObject *unused)
{
    if (!l->locked) {
        PyErr_SetString(PyExc_RuntimeError, "release unlocked lock");
        return NULL;
    }
    l->locked = 0;
    Py_RETURN_NONE;
}

static PyObject *GilLock_enter(GilLock *l, PyObject *unused)
{
    if (gil_lock_take(l, -1) < 0)
        return NULL;
    Py_RETURN_TRUE;
}

static PyObject *GilLock_exit(GilLock *l, PyObject *args)
{
    return GilLock_release(l, NULL);
}

static PyObject *GilLock_locked(GilLock *l, PyObject *unused)
{
    return PyBool_FromLong(l->locked);
}

static PyObject *GilLock_repr(GilLock *l)
{
    return PyUnicode_FromFormat("<collcomm GilLock %s>", l->locked ? "locked" : "unlocked");
}

static PyMethodDef GilLock_methods[] = {
    {"acquire", (PyCFunction)(void (*)(void))GilLock_acquire, METH_VARARGS | METH_KEYWORDS,
     "acquire(blocking=True, timeout=-1) -> bool, as threading.Lock's"},
    {"release", (PyCFunction)GilLock_release, METH_NOARGS, "release()"},
    {"locked", (PyCFunction)GilLock_locked, METH_NOARGS, "locked() -> bool"},
    {"__enter__", (PyCFunction)GilLock_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)GilLock_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject GilLockType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "collcomm.native._shmcore.GilLock",
    .tp_basicsize = sizeof(GilLock),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A lock taken and released only under the GIL: plain loads and stores "
              "(see native/_gil_lock.c).",
    .tp_new = PyType_GenericNew,
    .tp_repr = (reprfunc)GilLock_repr,
    .tp_methods = GilLock_methods,
};

static GilLock *gil_lock_of(PyObject *method)   /* the GilLock of a bound method, or NULL */
{
    if (!PyCFunction_Check(method))
        return NULL;
    PyObject *self = PyCFunction_GET_SELF(method);
    return self != NULL && Py_TYPE(self) == &GilLockType ? (GilLock *)self : NULL;
}

static int gil_lock_module_init(PyObject *m)
{
    return add_type(m, "GilLock", &GilLockType);
}
