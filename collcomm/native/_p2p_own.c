/* P2P.own(d): the native wait of a deferred receive in one call (included by _p2p_type.c,
 * after _p2p_calls.c, whose P2P_recv it calls).
 *
 * ``d`` is a core/p2p.py ``Deferred`` (its fields the C struct of _p2p_deferred.c, read and
 * set here directly; anything else: False): a receive from a peer on this host held in the
 * engine's posting order (``Engine._deferred``) until its wait. When it is first in that
 * line and no thread waits for it yet, its wait is what Engine.begin_native, P2P.recv
 * (``own`` True) and Engine.end_native do one after the other (engine_deferred.py), here
 * without the three Python calls:
 *
 * - under the engine's ``_defer_mutex`` (tried: busy means another thread is posting,
 *   so the Python path decides): ``d`` first in ``_deferred`` and not ``waiting``, then
 *   marked ``waiting`` (it stays first in line; a thread that must post meanwhile sets
 *   ``steal`` and waits on ``_defer_lock``);
 * - the receive itself: ``recv(d.arr, d.local, d.utag, d.umask, d.sig, False, True)``;
 * - a message received: its status (``d._done(n)``, in C: deferred_done), before the mutex is waited for (a
 *   Ctrl-C there leaves ``d`` first in line and ``waiting``, with its status);
 * - under the mutex again (waited for): ``d`` out of the line, posted there (``d.post()``)
 *   if C left the message to the regular path, ``waiting`` and ``steal`` cleared, the
 *   threads waiting to post woken.
 *
 * Returns False having done nothing (not first in line, the mutex busy, already waited
 * for: the caller takes Deferred.wait's general path); the byte count received; None
 * when C left the message to the regular path (``d`` posted in its turn). An exception
 * of the receive (the peer lost, the timeout, Ctrl-C) is raised with ``d`` still first
 * in line and ``waiting``: the caller ends it (Engine.end_native) as that exception
 * requires, exactly as after a failed P2P.recv.
 */

static PyObject *s_own_mutex, *s_own_acquire, *s_own_release, *s_own_remove,
    *s_own_post, *s_own_stealing, *s_own_lock, *s_own_notify;

static int own_names(void)
{
    struct { PyObject **slot; const char *name; } names[] = {
        {&s_own_mutex, "_defer_mutex"}, {&s_own_acquire, "acquire"},
        {&s_own_release, "release"}, {&s_own_remove, "remove"}, {&s_own_post, "post"},
        {&s_own_stealing, "_stealing"}, {&s_own_lock, "_defer_lock"}, {&s_own_notify, "notify_all"},
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if ((*names[i].slot = PyUnicode_InternFromString(names[i].name)) == NULL)
            return -1;
    return 0;
}

/* P2P.recv of deferred receive ``d`` (its buffer, peer, tag, mask and signature; no
 * record: d has its own): ``own``, its own turn (first in line: the receives deferred
 * after it do not stop it); ``block``, waiting (else False back: nothing yet). What
 * P2P.recv returns. */
static PyObject *d_recv(P2P *s, Deferred *d, int own, int block)
{
    PyObject *args[8] = {d->arr, d->local, d->utag, d->umask, d->sig, Py_False,
                         own ? Py_True : Py_False, block ? Py_True : Py_False};
    for (int i = 0; i < 5; i++)
        args[i] = Py_NewRef(args[i] ? args[i] : Py_None);
    PyObject *n = P2P_recv(s, args, 8);
    for (int i = 0; i < 5; i++)
        Py_DECREF(args[i]);
    return n;
}

/* The engine's mutex tried (1 taken, 0 busy, -1 error), taken (waiting for it: 0, -1),
 * released (keeping a pending exception); directly where it is a plain _thread.lock (see
 * p2p_try in _p2p.c), else through its methods. */
static int own_try(PyObject *mutex)
{
    TLock *l = tlock_direct(mutex);
    if (l != NULL)
        return tlock_take(l);
    PyObject *got = PyObject_CallMethodOneArg(mutex, s_own_acquire, Py_False);
    int v = got == NULL ? -1 : PyObject_IsTrue(got);
    Py_XDECREF(got);
    return v;
}

static int own_acquire(PyObject *mutex)
{
    int got = own_try(mutex);
    if (got != 0)
        return got < 0 ? -1 : 0;
    PyObject *r = PyObject_CallMethodNoArgs(mutex, s_own_acquire);   /* (the GIL released) */
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

static void own_release(PyObject *mutex)
{
    TLock *l = tlock_direct(mutex);
    if (l != NULL && l->locked)
        tlock_give(l);
    else
        p2p_release_calling(mutex, s_own_release);
}

/* Under the mutex: d first in line and not waiting, then marked waiting. 1 taken, 0 not. */
static int own_begin(PyObject *held, Deferred *d)
{
    if (!PyList_Check(held) || PyList_GET_SIZE(held) == 0 ||
        PyList_GET_ITEM(held, 0) != (PyObject *)d || d->waiting)
        return 0;
    d->waiting = 1;
    return 1;
}

/* Under the mutex: d out of the line (posted if ``post``), waiting and steal cleared, the
 * threads waiting to post woken (Engine.end_native). 0, or -1 with an exception. */
static int own_end(P2P *s, PyObject *held, Deferred *d, int post)
{
    int rc = 0;
    PyObject *r;
    if (PyList_Check(held) && PyList_GET_SIZE(held) > 0 && PyList_GET_ITEM(held, 0) == (PyObject *)d)
        rc = PySequence_DelItem(held, 0);
    else {
        r = PyObject_CallMethodOneArg(held, s_own_remove, (PyObject *)d);
        rc = r == NULL ? -1 : 0;
        Py_XDECREF(r);
    }
    if (rc == 0 && post) {
        r = PyObject_CallMethodNoArgs((PyObject *)d, s_own_post);
        rc = r == NULL ? -1 : 0;
        Py_XDECREF(r);
    }
    PyObject *t, *v, *tb;             /* what follows runs whatever happened above */
    PyErr_Fetch(&t, &v, &tb);
    d->waiting = 0;
    s->steal = 0;
    PyObject *n = PyObject_GetAttr(s->engine, s_own_stealing);
    int stealing = n == NULL ? -1 : PyObject_IsTrue(n);
    Py_XDECREF(n);
    if (stealing > 0) {
        PyObject *cond = PyObject_GetAttr(s->engine, s_own_lock);
        r = cond == NULL ? NULL : PyObject_CallMethodNoArgs(cond, s_own_notify);
        stealing = r == NULL ? -1 : 0;
        Py_XDECREF(r);
        Py_XDECREF(cond);
    }
    if (t != NULL) {
        PyErr_Clear();
        PyErr_Restore(t, v, tb);
        return -1;
    }
    return rc < 0 || stealing < 0 ? -1 : 0;
}

static PyObject *P2P_own(P2P *s, PyObject *d)
{
    if (s->engine == NULL || s->paused || !PyObject_TypeCheck(d, &DeferredType))
        Py_RETURN_FALSE;
    Deferred *c = (Deferred *)d;
    PyObject *held = p2p_engine_list(s);
    PyObject *mutex = held == NULL ? NULL
                    : s->defer_mutex ? Py_NewRef(s->defer_mutex) : PyObject_GetAttr(s->engine, s_own_mutex);
    PyObject *result = NULL;
    if (mutex == NULL)
        goto done;
    int got = own_try(mutex);
    if (got <= 0) {
        result = got < 0 ? NULL : Py_NewRef(Py_False);
        goto done;
    }
    int begun = own_begin(held, c);
    own_release(mutex);
    if (!begun) {
        result = Py_NewRef(Py_False);
        goto done;
    }
    PyObject *n = d_recv(s, c, 1, 1);
    if (n == NULL)
        goto done;                    /* still first in line and waiting: the caller ends it */
    if (PyLong_Check(n) && deferred_done(c, n, p2p_last_tag) < 0) {   /* received: d's status first, so a */
        Py_DECREF(n);                 /* Ctrl-C while we take the mutex cannot lose the message */
        goto done;
    }
    if (own_acquire(mutex) < 0) {
        Py_DECREF(n);
        goto done;
    }
    int bad = own_end(s, held, c, n == Py_None);
    own_release(mutex);
    if (bad)
        Py_DECREF(n);
    else
        result = n;
done:
    Py_XDECREF(mutex);
    Py_XDECREF(held);
    return result;
}

/* Deferred.test's native try, in C (core/p2p.py: a receive first in the engine's line
 * tries without waiting, holding ``_defer_mutex``), for a lent send's wait (_p2p_lent.c):
 * under the mutex (tried: busy, the Python path decides), ``d`` first in line, not
 * waiting, not posted, then ``recv(..., own True, block False)``: nothing yet, ``d``
 * stays first; received, ``d`` out of the line with its status (deferred_taken); left to
 * the regular path, out of the line and posted. ``d`` must be a receive of ``s`` (the
 * engine's line holds every group's). 1 done (received or posted), 0 nothing yet, 2 not
 * C's to try now (another group's, the mutex busy, not first, waiting in another thread,
 * posted...), -1 with the exception (the receive's, as test() raises it). */
static int own_test(P2P *s, Deferred *d)
{
    if (s->engine == NULL || s->paused || d->f != (PyObject *)s || !d_none(d->h) ||
        !d_none(d->exc) || !d_none(d->status) || d->arr == NULL || d->local == NULL)
        return 2;
    PyObject *held = p2p_engine_list(s);
    PyObject *mutex = held == NULL ? NULL
                    : s->defer_mutex ? Py_NewRef(s->defer_mutex) : PyObject_GetAttr(s->engine, s_own_mutex);
    int rc = -1;
    if (mutex == NULL || (rc = own_try(mutex)) <= 0) {
        rc = rc < 0 ? -1 : 2;
        goto done;
    }
    rc = 2;
    if (PyList_Check(held) && PyList_GET_SIZE(held) > 0 && PyList_GET_ITEM(held, 0) == (PyObject *)d &&
        !d->waiting) {
        PyObject *n = d_recv(s, d, 1, 0);
        rc = n == NULL ? -1 : 0;
        if (n != NULL && n != Py_False) {   /* received, or left to the regular path (None) */
            rc = PySequence_DelItem(held, 0) < 0 ? -1 : 1;
            if (rc > 0 && PyLong_Check(n))
                rc = deferred_taken(d, n) < 0 ? -1 : 1;
            else if (rc > 0) {
                PyObject *r = PyObject_CallMethodNoArgs((PyObject *)d, s_own_post);
                rc = r == NULL ? -1 : 1;
                Py_XDECREF(r);
            }
        }
        Py_XDECREF(n);
    }
    own_release(mutex);
done:
    Py_XDECREF(mutex);
    Py_XDECREF(held);
    return rc;
}
