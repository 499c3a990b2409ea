/* What the native point-to-point path reads of the Python engine (see _p2p.c, which
 * includes this file): whether it is open and has lost no peer, and whether its
 * matching lists may hold or owe a message a receive would match. */

/* 1 if the engine is aborted/closed or has lost a peer (the Python path decides), 0 if
 * not, -1 on error. */
static int p2p_engine_busy(P2P *s)
{
    if (s->health != NULL)
        return PyByteArray_GET_SIZE(s->health) < 1 || PyByteArray_AS_STRING(s->health)[0] != 0;
    PyObject *eng = s->engine;
    PyObject *a = PyObject_GetAttr(eng, s_p2p_aborted);
    if (a == NULL)
        return -1;
    int bad = a != Py_None;
    Py_DECREF(a);
    if (bad)
        return 1;
    a = PyObject_GetAttr(eng, s_p2p_closed);
    if (a == NULL)
        return -1;
    bad = PyObject_IsTrue(a);
    Py_DECREF(a);
    if (bad)
        return bad;
    a = PyObject_GetAttr(eng, s_p2p_lost);
    if (a == NULL)
        return -1;
    bad = !PyDict_Check(a) || PyDict_GET_SIZE(a) != 0;
    Py_DECREF(a);
    return bad;
}

static int p2p_attr_u64(PyObject *o, PyObject *name, uint64_t *out)
{
    PyObject *a = PyObject_GetAttr(o, name);
    if (a == NULL)
        return -1;
    long long v = PyLong_AsLongLong(a);     /* ANY_SOURCE is -1; tags and masks fit 64 bits */
    if (v == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        v = (long long)PyLong_AsUnsignedLongLong(a);
    }
    Py_DECREF(a);
    if (PyErr_Occurred())
        return -1;
    *out = (uint64_t)v;
    return 0;
}

/* engine.<name> (a new reference): the list read at init while the engine is healthy */
static PyObject *p2p_engine_queue(P2P *s, PyObject *held, PyObject *name)
{
    if (held != NULL && s->health != NULL && p2p_engine_busy(s) == 0)
        return Py_NewRef(held);
    return PyObject_GetAttr(s->engine, name);
}

/* 1 if the engine may hold or owe a message for a receive (src, tag, mask): an early
 * message from src it matches, or a receive posted before it that some message from src
 * this one matches would match too (the bits both masks compare agree). 0 if not, -1 on
 * error. */
static int p2p_engine_claims(P2P *s, long src, uint64_t tag, uint64_t mask)
{
    PyObject *lst = p2p_engine_queue(s, s->unexpected, s_p2p_unexpected);
    if (lst == NULL)
        return -1;
    int claim = 0;
    for (Py_ssize_t i = 0; claim == 0 && PyList_Check(lst) && i < PyList_GET_SIZE(lst); i++) {
        PyObject *inc = PyList_GET_ITEM(lst, i);
        uint64_t source, itag;
        PyObject *w = PyObject_GetAttr(inc, s_p2p_waiter);
        if (w == NULL || p2p_attr_u64(inc, s_p2p_source, &source) < 0 ||
            p2p_attr_u64(inc, s_p2p_tag, &itag) < 0)
            claim = -1;
        else if (w == Py_None && (long)source == src && (itag == tag || !((itag ^ tag) & mask)))
            claim = 1;
        Py_XDECREF(w);
    }
    Py_DECREF(lst);
    if (claim)
        return claim;
    lst = p2p_engine_queue(s, s->posted, s_p2p_posted);
    if (lst == NULL)
        return -1;
    for (Py_ssize_t i = 0; claim == 0 && PyList_Check(lst) && i < PyList_GET_SIZE(lst); i++) {
        PyObject *req = PyList_GET_ITEM(lst, i);
        uint64_t peer, rtag, rmask;
        if (p2p_attr_u64(req, s_p2p_peer, &peer) < 0 || p2p_attr_u64(req, s_p2p_tag, &rtag) < 0 ||
            p2p_attr_u64(req, s_p2p_mask, &rmask) < 0)
            claim = -1;
        else if (((long)peer == src || (long long)peer == -1) &&
                 !((rtag ^ tag) & rmask & mask))  /* some tag matches both (ANY_TAG: wildcard) */
            claim = 1;
    }
    Py_DECREF(lst);
    return claim;
}


/* 1 if the engine holds deferred receives (engine._deferred non-empty: receives posted
 * before this one whose native wait is still to come, see core/p2p.py Deferred), 0 if
 * not, -1 on error. A new receive leaves them to the regular path, which posts them
 * first (Engine.irecv), so it cannot overtake them. */
static PyObject *p2p_engine_list(P2P *s)   /* engine._deferred, a new reference */
{
    return s->deferred ? Py_NewRef(s->deferred) : PyObject_GetAttr(s->engine, s_p2p_deferred);
}

static int p2p_engine_deferred(P2P *s)
{
    PyObject *lst = p2p_engine_list(s);
    if (lst == NULL)
        return -1;
    int held = !PyList_Check(lst) || PyList_GET_SIZE(lst) != 0;
    Py_DECREF(lst);
    return held;
}
