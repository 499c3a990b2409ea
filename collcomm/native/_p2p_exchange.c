/* P2P.exchange: the messages of a blocking neighbourhood collective in one call (collcomm.MPI
 * Neighbor_*, MPI/_neighbor_exchange.py; included by _p2p_type.c after _p2p_calls.c, whose
 * p2p_write and whose receive steps it uses).
 *
 * ``exchange(send, recv, sends, recvs, base, mask[, local])``: ``sends`` and ``recvs`` are
 * flat tuples of (byte offset, byte length, local peer, tag code) per block, into ``send``
 * and ``recv`` (C-contiguous numeric buffers, ``recv`` writable); a block's tag is ``base +
 * code``; ``local`` a flat tuple of (send offset, recv offset, byte length) per edge to
 * itself, copied first (memmove; the caller checked they fit their receive blocks). In
 * order: every send written as P2P.send writes it (one INLINE record, signature 0), then,
 * all of them written, every receive received as P2P.recv receives it (the tag compared
 * under ``mask``, signature 0, waiting as it waits, with its checks and errors). It stops
 * at the first message C does not take, for P2P.send's and P2P.recv's reasons (above the
 * inline limit, a full ring, a busy lock, a message or receive the engine holds, deferred
 * receives, a paused or busy engine, a peer without a ring) and returns ``(i, j)``: sends
 * [0, i) and receives [0, j) done; the caller does the rest the regular way, in the same
 * order (a receive only after every send: j is 0 while i is short). A block it cannot
 * read (outside its buffer, not ints, a tag out of range) stops it there as a message it
 * cannot take does; buffers it cannot use, or flat tuples of another shape, give (0, 0)
 * having done nothing. An error (a lost peer, the timeout, Ctrl-C) raises as
 * P2P.recv raises it; the messages before it stay done, and ``P2P.exchanged`` (this
 * thread's last exchange: (i, j) as it would have returned them) says which.
 */

static _Thread_local Py_ssize_t xchg_done[2];

/* the k-th block of flat tuple t (4 items a block), checked against a buffer of len bytes:
 * 1 read, 0 not (no exception left) */
static int xchg_block(PyObject *t, Py_ssize_t k, Py_ssize_t len, Py_ssize_t *off, Py_ssize_t *n,
                      PyObject **peer, PyObject **code)
{
    PyObject *const *it = &((PyTupleObject *)t)->ob_item[4 * k];
    if (!PyLong_CheckExact(it[0]) || !PyLong_CheckExact(it[1]))
        return 0;
    *off = PyLong_AsSsize_t(it[0]);
    *n = PyLong_AsSsize_t(it[1]);
    *peer = it[2];
    *code = it[3];
    if (PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return *off >= 0 && *n >= 0 && *off <= len && *n <= len - *off;
}

/* base + code as a wire tag (p2p_tag's range), or 0 */
static uint64_t xchg_tag(P2P *s, long long base, PyObject *code)
{
    long long c = PyLong_CheckExact(code) ? PyLong_AsLongLong(code) : -1;
    if (c < 0 || c > (long long)P2P_USER - base) {
        PyErr_Clear();
        return 0;
    }
    return s->tag_base | (uint64_t)(base + c);
}

/* Block k of flat tuple t, in a buffer of len bytes: its peer's pipe (*off, *n, *tag set),
 * or NULL (the block unreadable or outside the buffer, no ring to that peer, a tag out of
 * range; no exception left). */
static Pipe *xchg_peer(P2P *s, PyObject *t, Py_ssize_t k, Py_ssize_t len, long long base, Py_ssize_t *off,
                       Py_ssize_t *n, uint64_t *tag)
{
    PyObject *peer, *code;
    if (!xchg_block(t, k, len, off, n, &peer, &code))
        return NULL;
    Pipe *p = p2p_pipe(s, peer);
    *tag = p == NULL ? 0 : xchg_tag(s, base, code);
    return *tag == 0 ? NULL : p;
}

/* One receive into dst[0:cap] from pipe p: 1 received, 0 left to the regular path, -1 error. */
static int xchg_recv(P2P *s, Pipe *p, uint8_t *dst, uint64_t cap, uint64_t tag, uint64_t mask)
{
    int got = p2p_try(p->poll_acquire);
    if (got <= 0)
        return got;
    int claim = p2p_engine_claims(s, p->peer, tag, mask);
    long long n = claim < 0 ? -1 : claim ? -2 : pipe_recv(s, p, dst, cap, tag, mask, 0, 1);
    p2p_release(p->poll_release);
    if (n == -1)
        return -1;
    if (n < 0)
        return 0;
    s->recvs++;
    return 1;
}

/* The copies of flat tuple t (send offset, recv offset, length) from sb to rb, every one
 * checked first: 1 done, 0 not (one outside its buffer or not an int; no exception left). */
static int xchg_local(PyObject *t, const Py_buffer *sb, const Py_buffer *rb)
{
    Py_ssize_t n = PyTuple_GET_SIZE(t);
    if (n % 3)
        return 0;
    for (int pass = 0; pass < 2; pass++)
        for (Py_ssize_t k = 0; k < n; k += 3) {
            PyObject *const *it = &((PyTupleObject *)t)->ob_item[k];
            if (!PyLong_CheckExact(it[0]) || !PyLong_CheckExact(it[1]) || !PyLong_CheckExact(it[2]))
                return 0;
            Py_ssize_t so = PyLong_AsSsize_t(it[0]), ro = PyLong_AsSsize_t(it[1]),
                       len = PyLong_AsSsize_t(it[2]);
            if (PyErr_Occurred()) {
                PyErr_Clear();
                return 0;
            }
            if (so < 0 || ro < 0 || len < 0 || so > sb->len || len > sb->len - so || ro > rb->len ||
                len > rb->len - ro)
                return 0;
            if (pass)
                memmove((char *)rb->buf + ro, (const char *)sb->buf + so, (size_t)len);
        }
    return 1;
}

static PyObject *P2P_exchange(P2P *s, PyObject *const *args, Py_ssize_t nargs)
{
    if ((nargs != 6 && nargs != 7) || !PyTuple_Check(args[2]) || !PyTuple_Check(args[3]) ||
        (nargs == 7 && !PyTuple_Check(args[6]))) {
        PyErr_SetString(PyExc_TypeError, "exchange(send, recv, sends, recvs, base, mask[, local])");
        return NULL;
    }
    PyObject *sends = args[2], *recvs = args[3];
    Py_ssize_t ns = PyTuple_GET_SIZE(sends), nr = PyTuple_GET_SIZE(recvs), i = 0, j = 0;
    xchg_done[0] = xchg_done[1] = 0;
    long long base = PyLong_CheckExact(args[4]) ? PyLong_AsLongLong(args[4]) : -1;
    uint64_t mask = PyLong_CheckExact(args[5]) ? p2p_u64(args[5]) : 0;
    if (PyErr_Occurred())
        PyErr_Clear();
    if (ns % 4 || nr % 4 || base < 0 || (uint64_t)base > P2P_USER || s->paused)
        return Py_BuildValue("(nn)", i, j);
    ns /= 4;
    nr /= 4;
    mask = ~P2P_USER | (mask & P2P_USER);   /* context and kind bits always compared */
    int busy = p2p_engine_busy(s);
    if (busy)
        return busy < 0 ? NULL : Py_BuildValue("(nn)", i, j);
    Py_buffer sb, rb;
    if (p2p_buffer(args[0], &sb, 0) < 0)
        return Py_BuildValue("(nn)", i, j);
    if (p2p_buffer(args[1], &rb, 1) < 0) {
        PyBuffer_Release(&sb);
        return Py_BuildValue("(nn)", i, j);
    }
    if (nargs == 7 && !xchg_local(args[6], &sb, &rb)) {
        PyBuffer_Release(&sb);
        PyBuffer_Release(&rb);
        return Py_BuildValue("(nn)", i, j);
    }
    int failed = 0;
    for (; i < ns; i++) {
        Py_ssize_t off, n;
        uint64_t tag;
        Pipe *p = xchg_peer(s, sends, i, sb.len, base, &off, &n, &tag);
        if (p == NULL || !p->has_out)
            break;
        Py_buffer piece = sb;             /* (only buf and len are read by p2p_write) */
        piece.buf = (char *)sb.buf + off;
        piece.len = n;
        int wrote = p2p_write(s, p, &piece, tag, 0);
        if (wrote <= 0) {
            failed = wrote < 0;
            break;
        }
    }
    if (!failed && i == ns) {
        int held = p2p_engine_deferred(s);   /* receives deferred before this call: theirs first */
        failed = held < 0;
        for (; !held && j < nr; j++) {
            Py_ssize_t off, n;
            uint64_t tag;
            Pipe *p = xchg_peer(s, recvs, j, rb.len, base, &off, &n, &tag);
            if (p == NULL || !p->has_in)
                break;
            int got = xchg_recv(s, p, (uint8_t *)rb.buf + off, (uint64_t)n, tag, mask);
            if (got <= 0) {
                failed = got < 0;
                break;
            }
        }
    }
    PyBuffer_Release(&sb);
    PyBuffer_Release(&rb);
    xchg_done[0] = i;
    xchg_done[1] = j;
    return failed ? NULL : Py_BuildValue("(nn)", i, j);
}

static PyObject *P2P_exchanged(P2P *s, void *unused)
{
    return Py_BuildValue("(nn)", xchg_done[0], xchg_done[1]);
}
