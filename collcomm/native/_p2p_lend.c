/* P2P.lend and P2P.loan_wait: a send lent from C (transport/shm_lent.py's protocol), for a
 * call that waits for its own send before it returns (collcomm.MPI's Sendrecv). Included
 * by _p2p_type.c after _p2p_mpi.c.
 *
 * ``lend(buf, dst, tag, sig)``: writes one LENT record to dst's ring, as ShmChannel.send
 * writes one for a lent request (its release id the channel's ``next_private``, taken
 * under send_lock with the append; ``outside_until`` and ``loans`` kept as there), and
 * returns ``(ident, start)``: the release id and the record's ring position. None, having
 * done nothing, where the Python send would not lend or C cannot write it now (the peer
 * takes no LENT records or its pid is unknown, an empty buffer, a busy lock, a full ring,
 * the engine or channel closed): the caller sends the Python way.
 *
 * ``loan_wait(dst, ident, start, buf)``: returns True once the loan is over: released by
 * the receiver (it read the buffer), or withdrawn after LEND_PATIENCE_NS unclaimed, as
 * LentBodies._withdraw does: a private copy of ``buf`` whose address goes into the record
 * before the state word's swap POSTED -> WITHDRAWN, the copy then held in the channel's
 * ``held`` under the id until released (ShmChannel drops it at a later poll, or keeps it
 * at close). A loan the receiver claimed first (or whose record it took) is waited for
 * to the release. While it waits (the GIL released: spin, yield, then naps) the check
 * hook runs every 100 ms and raises what it raises (the engine closed, the peer lost);
 * an unclaimed loan is withdrawn before such an error leaves, so no reader ever sees the
 * buffer once the call has returned.
 */

#define LEND_PATIENCE_NS 5000000LL   /* shm_lent.LEND_PATIENCE */
#define P2P_LENT_RECORD 64           /* header + LENT_BODY ("<QQQ"), rounded to 64 */

static PyObject *s_l_next, *s_l_outside, *s_l_loans, *s_l_held, *s_l_withdrawals;

static int lend_names(void)
{
    return (s_l_next = PyUnicode_InternFromString("next_private")) == NULL ||
           (s_l_outside = PyUnicode_InternFromString("outside_until")) == NULL ||
           (s_l_loans = PyUnicode_InternFromString("loans")) == NULL ||
           (s_l_held = PyUnicode_InternFromString("held")) == NULL ||
           (s_l_withdrawals = PyUnicode_InternFromString("withdrawals")) == NULL ? -1 : 0;
}

/* channel.<name> += 1 (an int attribute); -1 with an exception */
static int lend_bump(PyObject *channel, PyObject *name, uint64_t *old)
{
    PyObject *v = PyObject_GetAttr(channel, name);
    if (v == NULL)
        return -1;
    uint64_t x = PyLong_AsUnsignedLongLong(v);
    Py_DECREF(v);
    if (x == (uint64_t)-1 && PyErr_Occurred())
        return -1;
    PyObject *nv = PyLong_FromUnsignedLongLong(x + 1);
    int rc = nv == NULL ? -1 : PyObject_SetAttr(channel, name, nv);
    Py_XDECREF(nv);
    if (old != NULL)
        *old = x;
    return rc;
}

/* Append the LENT record (send_lock held): 1 written (*start: its position), 0 no room. */
static int pipe_append_lent(Pipe *p, uint64_t address, uint64_t nbytes, uint64_t tag,
                            uint64_t sig, uint64_t ident, uint64_t *start, uint64_t *head_out)
{
    uint64_t ring = p->out_ring, need = P2P_LENT_RECORD;
    uint64_t head = __atomic_load_n(&p->out_ctl[0], __ATOMIC_RELAXED);
    uint64_t off = head % ring;
    uint64_t pad = ring - off < need ? ring - off : 0;
    uint64_t tail = __atomic_load_n(&p->out_ctl[8], __ATOMIC_ACQUIRE);
    if (need + pad > ring || ring - (head - tail) < need + pad)
        return 0;
    uint8_t *d = p->out_data;
    if (pad) {
        uint8_t h[P2P_HDR] = {0};
        uint32_t len32 = (uint32_t)pad, kind = P2P_PAD;
        memcpy(h, &len32, 4);
        memcpy(h + 4, &kind, 4);
        memcpy(d + off, h, P2P_HDR);
        off = 0;
    }
    uint64_t body[3] = {ident, LENT_POSTED, 0};
    uint32_t len32 = (uint32_t)need, kind = P2P_LENT;
    memcpy(d + off + P2P_HDR, body, sizeof body);
    memcpy(d + off, &len32, 4);
    memcpy(d + off + 4, &kind, 4);
    memcpy(d + off + 8, &tag, 8);
    memcpy(d + off + 16, &nbytes, 8);
    memcpy(d + off + 24, &address, 8);
    memcpy(d + off + 32, &sig, 8);
    *start = head + pad;
    *head_out = head + pad + need;
    __atomic_store_n(&p->out_ctl[0], *head_out, __ATOMIC_RELEASE);   /* record before head */
    return 1;
}

/* Withdraw the loan at ring position `start` (send_lock held, GIL held): 1 withdrawn
 * (the copy held under `ident`), 0 the receiver claimed or took it first, -1 error. */
static int loan_withdraw(Pipe *p, uint64_t ident, uint64_t start, PyObject *buf)
{
    if (__atomic_load_n(&p->out_ctl[8], __ATOMIC_ACQUIRE) > start)
        return 0;                                 /* the receiver took the record: reading */
    Py_buffer b;
    if (PyObject_GetBuffer(buf, &b, PyBUF_SIMPLE) < 0)
        return -1;
    PyObject *copy = PyByteArray_FromStringAndSize(b.buf, b.len);
    PyBuffer_Release(&b);
    if (copy == NULL)
        return -1;
    uint8_t *rec = p->out_data + start % p->out_ring;
    uint64_t alt = (uint64_t)(uintptr_t)PyByteArray_AS_STRING(copy), held = LENT_POSTED;
    memcpy(rec + P2P_HDR + 16, &alt, 8);          /* before the swap */
    __atomic_compare_exchange_n((uint64_t *)(rec + P2P_HDR + 8), &held, LENT_WITHDRAWN, 0,
                                __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    if (held != LENT_POSTED) {
        Py_DECREF(copy);
        return 0;                                 /* claimed first: it is being read */
    }
    PyObject *dict = PyObject_GetAttr(p->channel, s_l_held);
    PyObject *key = PyLong_FromUnsignedLongLong(ident);
    int rc = dict == NULL || key == NULL || PyObject_SetItem(dict, key, copy) < 0 ? -1 : 1;
    Py_XDECREF(dict);
    Py_XDECREF(key);
    Py_DECREF(copy);     /* (held by the dict: the reader reads it until it releases it) */
    if (rc == 1 && lend_bump(p->channel, s_l_withdrawals, NULL) < 0)
        rc = -1;
    return rc;           /* (-1 after the swap: the copy may be gone; the error says so) */
}

/* The channel's fields after a LENT record went out (ShmChannel.send keeps them so):
 * next_private = ident + 1, outside_until = head, loans += 1. These plain attribute
 * stores cannot fail but for memory: the loan is out either way (the caller waits for
 * it), so a failure is reported as unraisable, not raised. */
static void lend_note(Pipe *p, uint64_t ident, uint64_t head)
{
    PyObject *next = PyLong_FromUnsignedLongLong(ident + 1), *h = PyLong_FromUnsignedLongLong(head);
    if (next == NULL || h == NULL || PyObject_SetAttr(p->channel, s_l_next, next) < 0 ||
        PyObject_SetAttr(p->channel, s_l_outside, h) < 0 || lend_bump(p->channel, s_l_loans, NULL) < 0)
        PyErr_WriteUnraisable(p->channel);
    Py_XDECREF(next);
    Py_XDECREF(h);
}

static PyObject *P2P_lend(P2P *s, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "lend(buf, dst, tag, sig)");
        return NULL;
    }
    Pipe *p = s->paused ? NULL : p2p_pipe(s, args[1]);
    uint64_t tag = p == NULL ? 0 : p2p_tag(s, args[2]);
    if (tag == 0 || !p->has_out || !p->lends || p->peer_pid <= 0 || !PyLong_Check(args[3]))
        Py_RETURN_NONE;
    uint64_t sig = p2p_u64(args[3]);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    int busy = p2p_engine_busy(s);
    if (busy)
        return busy < 0 ? NULL : Py_NewRef(Py_None);
    Py_buffer b;
    if (p2p_buffer(args[0], &b, 0) < 0)
        Py_RETURN_NONE;
    PyObject *result = Py_None;
    int got = b.len > 0 ? p2p_try(p->send_acquire) : 0;
    if (got < 0)
        result = NULL;
    else if (got) {
        PyObject *v = p->closed ? NULL : PyObject_GetAttr(p->channel, s_l_next);
        uint64_t ident = v == NULL ? 0 : PyLong_AsUnsignedLongLong(v), start, head;
        Py_XDECREF(v);
        if (PyErr_Occurred())
            result = NULL;
        else if (v != NULL && pipe_append_lent(p, (uint64_t)(uintptr_t)b.buf, (uint64_t)b.len,
                                               tag, sig, ident, &start, &head)) {
            lend_note(p, ident, head);
            s->sends++;
            result = Py_BuildValue("KK", (unsigned long long)ident, (unsigned long long)start);
            if (result == NULL) {          /* (memory) no reader may see it after we return */
                PyObject *et, *ev, *tb;
                PyErr_Fetch(&et, &ev, &tb);
                while (__atomic_load_n(&p->out_ctl[P2P_RELEASED], __ATOMIC_ACQUIRE) <= ident &&
                       loan_withdraw(p, ident, start, args[0]) == 0)
                    sched_yield();       /* claimed: read now; withdrawn or released: done */
                PyErr_Clear();
                PyErr_Restore(et, ev, tb);
            }
        }
        p2p_release(p->send_release);
    }
    PyBuffer_Release(&b);
    return result == Py_None ? Py_NewRef(Py_None) : result;
}

static PyObject *P2P_loan_wait(P2P *s, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "loan_wait(dst, ident, start, buf)");
        return NULL;
    }
    Pipe *p = p2p_pipe(s, args[0]);
    uint64_t ident = PyLong_AsUnsignedLongLong(args[1]), start = PyLong_AsUnsignedLongLong(args[2]);
    if (PyErr_Occurred())
        return NULL;
    if (p == NULL || !p->has_out) {
        PyErr_SetString(PyExc_ValueError, "loan_wait: no ring to that rank");
        return NULL;
    }
    Gil gil = {NULL};
    long long t0 = now_ns(), next_check = t0 + P2P_CHECK_NS;
    long sleep_ns = 50000;
    int claimed = 0;
    while (1) {
        if (__atomic_load_n(&p->out_ctl[P2P_RELEASED], __ATOMIC_ACQUIRE) > ident)
            break;                                /* read: the buffer is ours again */
        long long now = now_ns();
        if (!claimed && now - t0 >= LEND_PATIENCE_NS) {
            gil_take(&gil);
            int got = p2p_try(p->send_acquire);
            if (got < 0)
                return NULL;
            if (got) {
                int w = loan_withdraw(p, ident, start, args[3]);
                p2p_release(p->send_release);
                if (w < 0)
                    return NULL;
                if (w > 0)
                    break;
                claimed = 1;
            }
        }
        if (now >= next_check) {
            next_check = now + P2P_CHECK_NS;
            gil_take(&gil);
            PyObject *r = PyErr_CheckSignals() < 0 ? NULL :
                PyObject_CallFunction(s->check, "OKKd", p->channel, 0ULL, 0ULL,
                                      (double)(now - t0) / 1e9);
            if (r == NULL) {
                if (__atomic_load_n(&p->out_ctl[P2P_RELEASED], __ATOMIC_ACQUIRE) > ident) {
                    PyErr_Clear();               /* read meanwhile: done */
                    break;
                }
                if (!claimed) {                  /* no reader may see it after we return */
                    PyObject *et, *ev, *tb;
                    PyErr_Fetch(&et, &ev, &tb);
                    if (p2p_try(p->send_acquire) == 1) {
                        loan_withdraw(p, ident, start, args[3]);
                        p2p_release(p->send_release);
                    }
                    PyErr_Clear();
                    PyErr_Restore(et, ev, tb);
                }
                return NULL;
            }
            Py_DECREF(r);
        }
        gil_release(&gil);
        if (now - t0 < s->spin_ns) {
            for (int i = 0; i < 64; i++)
                cpu_relax();
        } else if (now - t0 < LEND_PATIENCE_NS || claimed) {
            if (now - t0 < P2P_YIELD_NS)
                sched_yield();
            else {
                struct timespec ts = {0, sleep_ns};
                nanosleep(&ts, NULL);
                sleep_ns = sleep_ns * 2 > 1000000 ? 1000000 : sleep_ns * 2;
            }
        }
    }
    gil_take(&gil);
    Py_RETURN_TRUE;
}
