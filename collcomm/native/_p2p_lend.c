/* P2P.lend and P2P.loan_wait: a send lent from C (transport/shm_lent.py's protocol), for a
 * call that waits for its own send before it returns (collcomm.MPI's Sendrecv). Included
 * by _p2p_type.c before _p2p_batch.c (whose lent sends use lend_write).
 *
 * ``lend(buf, dst, tag, sig)``: writes one LENT record to dst's ring, as ShmChannel.send
 * writes one for a lent request (its release id the channel's ``next_private``, taken
 * under send_lock with the append; ``outside_until`` and ``loans`` kept as there), and
 * returns ``(ident, start, since)``: the release id, the record's ring position and when
 * (now_ns(): LentWork's patience counts from there). None, having
 * done nothing, where the Python send would not lend or C cannot write it now (the peer
 * takes no LENT records or its pid is unknown, an empty buffer, a busy lock, a full ring,
 * the engine or channel closed): the caller sends the Python way.
 *
 * ``loan_wait(dst, ident, start, buf[, since[, spin[, patience]]])``: returns True once the loan is over
 * (``since``: when it was lent, now_ns(), for the patience; ``spin`` > 0: give up after
 * spinning that many ns, False: the loan still out, to be waited for again; such a call
 * runs no check hook and withdraws only past the patience; ``patience``: ns, default
 * LEND_PATIENCE_NS, the callers pass shm_lent.lend_patience of the buffer's size, longer
 * for a large one): released by
 * the receiver (it read the buffer), or withdrawn after the patience unclaimed, as
 * LentBodies._withdraw does (at once once the channel is closed, as drop_lent withdraws
 * the Python loans): a private copy of ``buf`` whose address goes into the record
 * before the state word's swap POSTED -> WITHDRAWN, the copy then held in the channel's
 * ``held`` under the id until released (ShmChannel drops it at a later poll, or keeps it
 * at close). A loan the receiver claimed first (or whose record it took) is waited for
 * to the release. While it waits (the GIL released: spin, yield, then naps) the check
 * hook runs every 100 ms and raises what it raises (the engine closed, the peer lost,
 * Ctrl-C, the timeout: its text is a receive's, the only wait it words); the loan ends
 * before such an error leaves (loan_give_up): withdrawn if unclaimed, so no reader sees
 * the buffer once the call has returned, or, claimed (being read), the buffer kept alive
 * for the reader.
 */

#define LEND_PATIENCE_NS 5000000LL   /* shm_lent.LEND_PATIENCE, the floor of lend_patience */

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

/* Keep `obj` alive for a reader that may still come (transport/shm_end.py's _kept, as
 * ShmChannel.close keeps unreleased copies): 0, or -1 with an exception. */
static int lend_keep(PyObject *obj)
{
    PyObject *mod = PyImport_ImportModule("collcomm.transport.shm_end");
    PyObject *kept = mod == NULL ? NULL : PyObject_GetAttrString(mod, "_kept");
    int rc = kept == NULL || !PyList_Check(kept) ? -1 : PyList_Append(kept, obj);
    if (kept != NULL && !PyList_Check(kept))
        PyErr_SetString(PyExc_TypeError, "collcomm.transport.shm_end._kept is not a list");
    Py_XDECREF(kept);
    Py_XDECREF(mod);
    return rc;
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
    uint64_t state = __atomic_load_n((uint64_t *)(rec + P2P_HDR + 8), __ATOMIC_ACQUIRE);
    if (state != LENT_POSTED) {                   /* withdrawn already (another thread of
                                                   * ours, an earlier try): over; claimed: 0 */
        Py_DECREF(copy);
        return state == LENT_WITHDRAWN ? 1 : 0;
    }
    uint64_t alt = (uint64_t)(uintptr_t)PyByteArray_AS_STRING(copy), held = LENT_POSTED;
    memcpy(rec + P2P_HDR + 16, &alt, 8);          /* before the swap (only while POSTED) */
    __atomic_compare_exchange_n((uint64_t *)(rec + P2P_HDR + 8), &held, LENT_WITHDRAWN, 0,
                                __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    if (held != LENT_POSTED) {
        Py_DECREF(copy);                          /* (the reader claimed it: it reads the
                                                   * lent buffer, not the address we wrote) */
        return held == LENT_WITHDRAWN ? 1 : 0;
    }
    /* held under its id until released (ShmChannel.prune_held); a closed channel has
     * handed its held copies to shm_end._kept already: there, for a late reader */
    int rc;
    if (p->closed)
        rc = lend_keep(copy) < 0 ? -1 : 1;
    else {
        PyObject *dict = PyObject_GetAttr(p->channel, s_l_held);
        PyObject *key = PyLong_FromUnsignedLongLong(ident);
        rc = dict == NULL || key == NULL || PyObject_SetItem(dict, key, copy) < 0 ? -1 : 1;
        Py_XDECREF(dict);
        Py_XDECREF(key);
    }
    if (rc < 0)
        return -1;       /* (the copy leaks: the record points at it, a reader may come) */
    Py_DECREF(copy);
    if (lend_bump(p->channel, s_l_withdrawals, NULL) < 0)
        PyErr_WriteUnraisable(p->channel);
    return 1;
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

/* Lend the checked buffer `b` (of the object `buf`) to pipe p (P2P.lend after its checks;
 * P2P.batch's lent sends): the loan ``(ident, start, since)``, None having done nothing
 * (see P2P.lend), NULL with an exception (no loan out). */
static PyObject *lend_write(P2P *s, Pipe *p, Py_buffer *b, uint64_t tag, uint64_t sig,
                            PyObject *buf)
{
    PyObject *result = Py_None;
    int got = b->len > 0 && p->lends && p->peer_pid > 0 ? p2p_try(p->send_acquire) : 0;
    if (got < 0)
        return NULL;
    if (got) {
        PyObject *v = p->closed ? NULL : PyObject_GetAttr(p->channel, s_l_next);
        uint64_t ident = v == NULL ? 0 : PyLong_AsUnsignedLongLong(v), start, head;
        Py_XDECREF(v);
        if (PyErr_Occurred())
            result = NULL;
        else if (v != NULL && pipe_record(p, P2P_LENT, (uint64_t[3]){ident, LENT_POSTED, 0}, 24,
                                          (uint64_t)b->len, (uint64_t)(uintptr_t)b->buf, tag, sig,
                                          &start, &head)) {   /* body: shm_lent.LENT_BODY */
            lend_note(p, ident, head);
            s->sends++;
            result = Py_BuildValue("KKL", (unsigned long long)ident, (unsigned long long)start,
                                   now_ns());
            if (result == NULL) {          /* (memory) no reader may see it after we return */
                PyObject *et, *ev, *tb;
                PyErr_Fetch(&et, &ev, &tb);
                while (__atomic_load_n(&p->out_ctl[P2P_RELEASED], __ATOMIC_ACQUIRE) <= ident &&
                       loan_withdraw(p, ident, start, buf) == 0)
                    sched_yield();       /* claimed: read now; withdrawn or released: done */
                PyErr_Clear();
                PyErr_Restore(et, ev, tb);
            }
        }
        p2p_release(p->send_release);
    }
    return result == Py_None ? Py_NewRef(Py_None) : result;
}

static PyObject *P2P_lend(P2P *s, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "lend(buf, dst, tag, sig)");
        return NULL;
    }
    Pipe *p;
    uint64_t tag, sig;
    Py_buffer b;
    int ok = p2p_send_args(s, args, &p, &tag, &sig, &b);
    if (ok <= 0)
        return ok < 0 ? NULL : Py_NewRef(Py_None);
    PyObject *result = lend_write(s, p, &b, tag, sig, args[0]);
    PyBuffer_Release(&b);
    return result;
}

/* loan_wait's way out with the check hook's error (GIL held, the error set): the loan
 * ends first. Released meanwhile: the send is done, the error dropped but for Ctrl-C;
 * unclaimed: withdrawn (send_lock waited for); claimed: the reader is reading (or died
 * reading), so the buffer is kept alive for it (shm_end._kept) and the error raised. NULL,
 * or True where the error was dropped. */
static PyObject *loan_give_up(Pipe *p, uint64_t ident, uint64_t start, PyObject *buf)
{
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    int done = 0, tries = 0;
    while (!done) {
        if (__atomic_load_n(&p->out_ctl[P2P_RELEASED], __ATOMIC_ACQUIRE) > ident) {
            if (!PyErr_GivenExceptionMatches(et, PyExc_KeyboardInterrupt)) {
                Py_XDECREF(et);
                Py_XDECREF(ev);
                Py_XDECREF(tb);
                Py_RETURN_TRUE;                   /* read meanwhile: the send is done */
            }
            break;
        }
        int got = p2p_try(p->send_acquire);
        if (got < 0)
            break;
        if (got == 0 && ++tries > 2000) {         /* busy ~100 ms (this thread holds it?) */
            if (lend_keep(buf) < 0)               /* the array kept for a reader instead */
                PyErr_WriteUnraisable(p->channel);
            PyErr_Clear();
            break;
        }
        if (got == 0) {                           /* busy: another thread sends */
            Py_BEGIN_ALLOW_THREADS
            struct timespec ts = {0, 50000};
            nanosleep(&ts, NULL);
            Py_END_ALLOW_THREADS
            continue;
        }
        int w = loan_withdraw(p, ident, start, buf);
        p2p_release(p->send_release);
        if (w <= 0 && lend_keep(buf) < 0)         /* claimed (being read), or no copy */
            PyErr_WriteUnraisable(p->channel);
        PyErr_Clear();
        done = 1;
    }
    PyErr_Restore(et, ev, tb);
    return NULL;
}

static PyObject *P2P_loan_wait(P2P *s, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 4 || nargs > 7) {
        PyErr_SetString(PyExc_TypeError, "loan_wait(dst, ident, start, buf[, since[, spin[, patience]]])");
        return NULL;
    }
    Pipe *p = p2p_pipe(s, args[0]);
    uint64_t ident = PyLong_AsUnsignedLongLong(args[1]), start = PyLong_AsUnsignedLongLong(args[2]);
    long long since = nargs > 4 ? PyLong_AsLongLong(args[4]) : 0;
    long long spin = nargs > 5 ? PyLong_AsLongLong(args[5]) : 0;
    long long patience = nargs > 6 ? PyLong_AsLongLong(args[6]) : LEND_PATIENCE_NS;
    if (PyErr_Occurred())
        return NULL;
    if (p == NULL || !p->has_out) {
        PyErr_SetString(PyExc_ValueError, "loan_wait: no ring to that rank");
        return NULL;
    }
    Gil gil = {NULL};
    long long t0 = now_ns(), next_check = t0 + P2P_CHECK_NS;
    if (since <= 0 || since > t0)
        since = t0;                               /* (the patience counts from the loan) */
    long sleep_ns = 50000;
    int claimed = 0;
    while (1) {
        if (__atomic_load_n(&p->out_ctl[P2P_RELEASED], __ATOMIC_ACQUIRE) > ident)
            break;                                /* read: the buffer is ours again */
        long long now = now_ns();
        if (spin > 0 && now - t0 >= spin && (claimed || now - since < patience)) {
            gil_take(&gil);
            Py_RETURN_FALSE;                      /* (bounded: not over yet) */
        }
        if (!claimed && (now - since >= patience || p->closed)) {   /* (closed: as drop_lent) */
            gil_take(&gil);
            int got = p2p_try(p->send_acquire);
            if (got < 0)
                return loan_give_up(p, ident, start, args[3]);
            if (got == 0 && spin > 0)
                Py_RETURN_FALSE;                  /* (bounded: busy, perhaps by this thread) */
            if (got) {
                int w = loan_withdraw(p, ident, start, args[3]);
                p2p_release(p->send_release);
                if (w < 0)
                    return loan_give_up(p, ident, start, args[3]);
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
            if (r == NULL)
                return loan_give_up(p, ident, start, args[3]);
            Py_DECREF(r);
        }
        gil_release(&gil);
        if ((spin > 0 && s->spin_ns > 0) || now - t0 < s->spin_ns) {
            for (int i = 0; i < 64; i++)
                cpu_relax();        /* (a bounded wait spins, but where the host has more
                                     * ranks than CPUs, spin_ns 0: it yields the CPU) */
        } else if (spin > 0 || now - t0 < P2P_YIELD_NS) {
            sched_yield();
        } else {                  /* (claimed, or past the patience with send_lock busy) */
            struct timespec ts = {0, sleep_ns};
            nanosleep(&ts, NULL);
            sleep_ns = sleep_ns * 2 > 1000000 ? 1000000 : sleep_ns * 2;
        }
    }
    gil_take(&gil);
    Py_RETURN_TRUE;
}
