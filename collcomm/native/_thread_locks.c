/* threading.Lock and threading.RLock taken here without calling their methods, where the
 * interpreter's objects have the layout of CPython 3.10-3.13.0 (a Lock) or 3.10-3.13 (an
 * RLock) (included by _shmcore.c
 * before _fastcall.c; used by the point-to-point channels, _p2p.c / _p2p_own.c, and by the
 * second part of a call started in two parts, _fastcall_parts_end.c).
 *
 * Why: a lock's ``acquire`` parses its arguments (PyArg_ParseTupleAndKeywords), and a
 * call through its method costs a dispatch: ~100 ns of a ~1.3 us native exchange per call
 * (a _thread.lock), and the runner's re-entrant lock taken and given back in every
 * ``Wait`` of a call in two parts (an RLock: ~10% of a persistent Bcast's Start + Wait,
 * perf, 2-vCPU VM, session 43).
 *
 * ``tlock_type`` / ``rlock_type`` are the two types once thread_locks_init has checked
 * their layout on fresh objects (taken and released here and through their methods, each
 * seen to follow the other); else NULL and every lock goes through its methods. Both
 * ways run holding the GIL and do what the methods do: a try that never blocks, then the
 * lock's fields set; the fields cleared, then the release. From 3.13.1 a Lock is
 * {PyObject_HEAD; PyMutex} (CPython gh-117721, backported: the size check turns it down
 * before anything else is read); an RLock keeps its PyThread_type_lock through 3.13.x (its
 * owner a PyThread_ident_t there: an unsigned long's size and value on Linux) and holds a
 * _PyRecursiveMutex from 3.14 (gh-125144), compiled out as free-threaded builds are (its
 * first word, 0 on a fresh lock, would be turned down too: a PyThread_type_lock is a
 * pointer).
 */

typedef struct {                 /* _thread.lock */
    PyObject_HEAD
    PyThread_type_lock lock_lock;
    PyObject *in_weakreflist;
    char locked;
} TLock;

typedef struct {                 /* _thread.RLock */
    PyObject_HEAD
    PyThread_type_lock rlock_lock;
    unsigned long rlock_owner;
    unsigned long rlock_count;
    PyObject *in_weakreflist;
} TRLock;

static PyTypeObject *tlock_type, *rlock_type;

#if PY_VERSION_HEX < 0x030E0000 && !defined(Py_GIL_DISABLED)
#define DIRECT_LOCKS 1
#endif

static TLock *tlock_direct(PyObject *lock)   /* the lock if it is taken here directly */
{
    return tlock_type != NULL && Py_TYPE(lock) == tlock_type ? (TLock *)lock : NULL;
}

static TLock *tlock_of(PyObject *method)     /* the same, by its bound acquire/release */
{
    if (!PyCFunction_Check(method))
        return NULL;
    PyObject *self = PyCFunction_GET_SELF(method);
    return self == NULL ? NULL : tlock_direct(self);
}

/* 1: a PyThread_type_lock is a POSIX semaphore here (CPython's thread_pthread.h with
 * USE_SEMAPHORES, Linux's builds 3.10-3.12), seen so by sem_probe on a lock of its own:
 * a try is sem_trywait. PyThread_acquire_lock_timed(lock, 0) also reads the monotonic
 * clock for a deadline it never uses (~6% of an object irecv + send loop, perf, session 44). */
static int sem_direct;

#if PY_VERSION_HEX < 0x030D0000 && !defined(Py_GIL_DISABLED) && defined(__linux__)
#include <semaphore.h>
#define SEM_LOCKS 1
static void sem_probe(void)
{
    PyThread_type_lock a = PyThread_allocate_lock();
    if (a == NULL)
        return;
    sem_t *s = (sem_t *)a;
    int v = -1;
    if (sem_getvalue(s, &v) == 0 && v == 1 && sem_trywait(s) == 0) {
        int busy = !PyThread_acquire_lock(a, NOWAIT_LOCK);      /* taken here: taken there */
        int twice = sem_trywait(s) == 0;
        PyThread_release_lock(a);                              /* given back there: free here */
        int v2 = -1, v3 = -1;
        if (busy && !twice && sem_getvalue(s, &v2) == 0 && v2 == 1 && PyThread_acquire_lock(a, NOWAIT_LOCK)) {
            sem_direct = sem_getvalue(s, &v3) == 0 && v3 == 0 && sem_trywait(s) != 0;
            PyThread_release_lock(a);
        }
    }
    PyThread_free_lock(a);
}
#endif

static inline int raw_try(PyThread_type_lock lock)   /* acquire without waiting: 1 taken */
{
#ifdef SEM_LOCKS
    if (sem_direct)
        return sem_trywait((sem_t *)lock) == 0;
#endif
    return PyThread_acquire_lock(lock, NOWAIT_LOCK) == PY_LOCK_ACQUIRED;
}

static int tlock_take(TLock *l)   /* acquire(False) of a direct lock: 1 taken, 0 busy */
{
    if (!raw_try(l->lock_lock))
        return 0;
    l->locked = 1;
    return 1;
}

static void tlock_give(TLock *l)  /* release() of a direct lock this thread took */
{
    l->locked = 0;
    PyThread_release_lock(l->lock_lock);
}

/* lock.locked() of a direct _thread.lock: 1 / 0; -2 not such a lock (call the method) */
static int tlock_held(PyObject *lock)
{
    TLock *l = tlock_direct(lock);
    return l == NULL ? -2 : l->locked != 0;
}

static TRLock *rlock_direct(PyObject *lock)
{
    return rlock_type != NULL && Py_TYPE(lock) == rlock_type ? (TRLock *)lock : NULL;
}

/* rlock.acquire(False) of a direct RLock: 1 taken (again, if this thread holds it), 0 busy */
static int rlock_take(TRLock *l)
{
    unsigned long me = PyThread_get_thread_ident();
    if (l->rlock_count > 0 && l->rlock_owner == me) {
        if (l->rlock_count + 1 == 0)          /* (the method raises there: never here) */
            return 0;
        l->rlock_count++;
        return 1;
    }
    if (!raw_try(l->rlock_lock))
        return 0;
    l->rlock_owner = me;
    l->rlock_count = 1;
    return 1;
}

/* rlock.release() of a direct RLock: 0, or -1 (not held by this thread: the method's error) */
static int rlock_give(TRLock *l)
{
    if (l->rlock_count == 0 || l->rlock_owner != PyThread_get_thread_ident()) {
        PyErr_SetString(PyExc_RuntimeError, "cannot release un-acquired lock");
        return -1;
    }
    if (--l->rlock_count == 0) {
        l->rlock_owner = 0;
        PyThread_release_lock(l->rlock_lock);
    }
    return 0;
}

#ifdef DIRECT_LOCKS
static int call_truth(PyObject *obj, const char *method, PyObject *arg)   /* 1, 0, -1 error */
{
    PyObject *r = arg == NULL ? PyObject_CallMethod(obj, method, NULL)
                              : PyObject_CallMethod(obj, method, "O", arg);
    int v = r == NULL ? -1 : PyObject_IsTrue(r);
    Py_XDECREF(r);
    return v;
}

static void tlock_probe(PyObject *lock)
{
    TLock *l = (TLock *)lock;
    if (Py_TYPE(lock)->tp_basicsize == sizeof(TLock) && l->locked == 0 && l->lock_lock != NULL &&
        strcmp(Py_TYPE(lock)->tp_name, "_thread.lock") == 0 &&
        PyThread_acquire_lock(l->lock_lock, NOWAIT_LOCK)) {
        l->locked = 1;
        int held = call_truth(lock, "locked", NULL);
        int twice = PyThread_acquire_lock(l->lock_lock, NOWAIT_LOCK);
        l->locked = 0;
        PyThread_release_lock(l->lock_lock);
        if (held == 1 && !twice && call_truth(lock, "locked", NULL) == 0)
            tlock_type = (PyTypeObject *)Py_NewRef(Py_TYPE(lock));   /* (kept: a heap type) */
    }
}

static void rlock_probe(PyObject *lock)
{
    TRLock *l = (TRLock *)lock;
    unsigned long me = PyThread_get_thread_ident();
    if (Py_TYPE(lock)->tp_basicsize != sizeof(TRLock) || l->rlock_lock == NULL ||
        l->rlock_owner != 0 || l->rlock_count != 0 || strcmp(Py_TYPE(lock)->tp_name, "_thread.RLock") != 0)
        return;
    /* its methods seen in the fields ... */
    int ok = call_truth(lock, "acquire", Py_False) == 1 && call_truth(lock, "acquire", Py_False) == 1 &&
             l->rlock_owner == me && l->rlock_count == 2;
    if (PyErr_Occurred())            /* (an acquire raised: nothing to give back, not used) */
        return;
    PyObject *r1 = PyObject_CallMethod(lock, "release", NULL);
    PyObject *r2 = r1 == NULL ? NULL : PyObject_CallMethod(lock, "release", NULL);
    ok = ok && r2 != NULL && l->rlock_owner == 0 && l->rlock_count == 0;
    Py_XDECREF(r1);
    Py_XDECREF(r2);
    if (!ok || PyErr_Occurred())
        return;
    /* ... and the fields in its methods: taken here, owned there; free again after */
    rlock_type = Py_TYPE(lock);
    ok = rlock_take(l) == 1 && rlock_take(l) == 1 && call_truth(lock, "_is_owned", NULL) == 1;
    int given = rlock_give(l) == 0 && rlock_give(l) == 0;
    ok = ok && given && call_truth(lock, "_is_owned", NULL) == 0 && call_truth(lock, "acquire", Py_False) == 1;
    PyObject *r3 = ok ? PyObject_CallMethod(lock, "release", NULL) : NULL;
    if (r3 == NULL)
        rlock_type = NULL;
    else                     /* (kept: a heap type of _thread's, which the probe's lock drops) */
        Py_INCREF(rlock_type);
    Py_XDECREF(r3);
}
#endif

static int thread_locks_init(void)
{
    PyObject *mod = PyImport_ImportModule("_thread");
    PyObject *lock = mod == NULL ? NULL : PyObject_CallMethod(mod, "allocate_lock", NULL);
    PyObject *rlock = mod == NULL ? NULL : PyObject_CallMethod(mod, "RLock", NULL);
    Py_XDECREF(mod);
    if (lock == NULL || rlock == NULL) {
        Py_XDECREF(lock);
        Py_XDECREF(rlock);
        return -1;
    }
#ifdef SEM_LOCKS
    sem_probe();
#endif
#ifdef DIRECT_LOCKS
    tlock_probe(lock);
    rlock_probe(rlock);
#endif
    PyErr_Clear();
    Py_DECREF(lock);
    Py_DECREF(rlock);
    return 0;
}

/* lock_take(lock) -> whether it was taken, lock_give(lock): a threading.Lock or RLock
 * through the direct paths above (TypeError where a lock is not taken directly; for
 * tests/test_thread_locks.py: the direct way and the methods must see each other). */
static int tl_either(PyObject *lock, const char *name, TLock **t, TRLock **r)
{
    *t = tlock_direct(lock);
    *r = *t == NULL ? rlock_direct(lock) : NULL;
    if (*t == NULL && *r == NULL) {
        PyErr_Format(PyExc_TypeError, "%s: not a lock taken directly here", name);
        return -1;
    }
    return 0;
}

static PyObject *mod_lock_take(PyObject *m, PyObject *lock)
{
    TLock *t;
    TRLock *r;
    if (tl_either(lock, "lock_take", &t, &r) < 0)
        return NULL;
    return PyBool_FromLong(t != NULL ? tlock_take(t) : rlock_take(r));
}

static PyObject *mod_lock_give(PyObject *m, PyObject *lock)
{
    TLock *t;
    TRLock *r;
    if (tl_either(lock, "lock_give", &t, &r) < 0)
        return NULL;
    if (t != NULL) {
        if (!t->locked) {
            PyErr_SetString(PyExc_RuntimeError, "release unlocked lock");
            return NULL;
        }
        tlock_give(t);
    } else if (rlock_give(r) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}
