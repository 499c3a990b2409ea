/* The fast call: one C entry per small collective call of a front end.
 *
 * Included by _shmcore.c (it drives the Core collectives defined there). A ``Fast`` is
 * built per process group by collcomm/core/fastpath.py once the group's arena exists (or
 * at once for a group of one). A front end offers it a call before doing anything else:
 *
 *     if fast is not None and fast.all_reduce(send, recv, op, name): return
 *
 * The call either returns True — it ran completely, exactly as the regular path would:
 * the group's next sequence number taken, a flight-recorder record appended and marked
 * completed, the call's full signature (collective, dtype, count, root, op) checked by
 * every rank in the arena — or None, having done nothing at all (not a contiguous
 * native-endian buffer of a numeric dtype, larger than `limit`, an op or dtype the native
 * kernels do not cover bit-identically, a paused group, a `call_timeout` scope open
 * somewhere): the front end then takes the regular path, which gives every error its text.
 *
 * What is not the happy path goes back to Python, after the record exists: an exception
 * (timeout, lost peer, Ctrl-C) is handed to ``hooks.failed`` which returns the error to
 * raise (context added, recorder dump, missing ranks named); a status other than DONE
 * (signature mismatch, a peer's buffer read in place, a refusal) to ``hooks.finish``,
 * which completes the call with the Python code from where C stopped.
 *
 * Per (op, dtype) the kernel code and the signature base come from ``hooks.learn`` the
 * first time the pair is seen, and are cached here.
 */

#define FAST_OPS 24
enum { FC_ALL_REDUCE, FC_BROADCAST, FC_BARRIER, FC_ALL_GATHER, FC_REDUCE, FC_REDUCE_SCATTER,
       FC_GATHER, FC_SCATTER, FC_ALL_TO_ALL, N_FC };

static int fast_timeout_scopes = 0;   /* open call_timeout scopes, all threads */

typedef struct {
    PyObject *op;               /* the op object (a strong reference) */
    int code[N_DT];             /* kernel code; -1: refused; -2: not asked yet */
    uint64_t sig[N_DT];         /* all_reduce signature base (count 0, root 0) */
} FastOp;

typedef struct {
    PyObject *code;             /* a code object (strong reference) */
    int inside;                 /* it lies inside the collcomm package */
} CodeSeen;

#define CODE_CACHE 64

typedef struct {
    PyObject_HEAD
    PyObject *core;             /* the Core, or None in a group of one */
    PyObject *arena;            /* the Arena, or None */
    PyObject *group;            /* the ProcessGroup (for its timeout) */
    PyObject *seq;              /* the group's sequence counter (an iterator) */
    PyObject *hooks;            /* learn / failed / finish (collcomm.core.fastpath) */
    PyObject *append;           /* the flight recorder ring's append, or None */
    PyObject *observer;         /* the group's observer (``done`` is set), or None */
    PyObject *obs_index;        /* the observer's index (records name it) */
    PyObject *algo_id[N_FC];    /* id() of the family function, as records hold it */
    PyObject *pkg;              /* the package's path prefix (str) */
    uint64_t tag_base, seq_mask;
    uint64_t plain_sig[N_FC];   /* signature bases per collective without op (dtype 0) */
    uint64_t dt_sig[N_DT];      /* the 5-bit signature dtype code of each native dtype */
    Py_ssize_t limit[N_FC];     /* the largest message taken per collective (0: none) */
    int size, rank;
    Py_ssize_t a2a_cma;         /* all_to_all's cma_limit argument (shm_direct: -1 or CMA_MIN/n) */
    int paused;                 /* > 0: every call takes the regular path */
    int record;                 /* 0: no flight-recorder records (to measure what they cost) */
    int n_ops;
    FastOp ops[FAST_OPS];
    CodeSeen seen[CODE_CACHE];
    unsigned long long calls;   /* calls run here (tests check the path) */
} Fast;

static PyObject *s_done, *s_timeout, *s_learn, *s_failed, *s_finish;

/* The native dtype of a buffer from its struct format, or -1. */
static int fast_dtype(const Py_buffer *v)
{
    const char *f = v->format;
    if (f == NULL)
        return DT_U8;
    if (*f == '=' || *f == '@' || *f == '<')
        f++;
    int isz = (int)v->itemsize;
    if (f[0] == 'Z') {
        if (f[1] == 'f' && f[2] == 0)
            return DT_C64;
        if (f[1] == 'd' && f[2] == 0)
            return DT_C128;
        return -1;
    }
    if (f[0] == 0 || f[1] != 0)
        return -1;
    switch (f[0]) {
    case '?': return DT_BOOL;
    case 'b': case 'h': case 'i': case 'l': case 'q':
        return isz == 1 ? DT_I8 : isz == 2 ? DT_I16 : isz == 4 ? DT_I32 : isz == 8 ? DT_I64 : -1;
    case 'B': case 'H': case 'I': case 'L': case 'Q':
        return isz == 1 ? DT_U8 : isz == 2 ? DT_U16 : isz == 4 ? DT_U32 : isz == 8 ? DT_U64 : -1;
    case 'e': return DT_F16;
    case 'f': return DT_F32;
    case 'd': return DT_F64;
    default: return -1;
    }
}

/* The cached row of `op` (learning the pair (op, dt) through hooks.learn), NULL with no
 * exception if the fast path does not take it, NULL with an exception on error. */
static FastOp *fast_op(Fast *s, PyObject *op, int dt)
{
    FastOp *e = NULL;
    for (int i = 0; i < s->n_ops; i++)
        if (s->ops[i].op == op) {
            e = &s->ops[i];
            break;
        }
    if (e == NULL) {
        if (s->n_ops == FAST_OPS)
            return NULL;
        e = &s->ops[s->n_ops++];
        Py_INCREF(op);
        e->op = op;
        for (int d = 0; d < N_DT; d++)
            e->code[d] = -2;
    }
    if (e->code[dt] == -2) {
        PyObject *dto = PyLong_FromLong(dt);
        PyObject *r = dto == NULL ? NULL : PyObject_CallMethodObjArgs(s->hooks, s_learn, op, dto, NULL);
        Py_XDECREF(dto);
        if (r == NULL)
            return NULL;
        long code;
        unsigned long long sig;
        if (!PyArg_ParseTuple(r, "lK;learn returns (code, signature base)", &code, &sig)) {
            Py_DECREF(r);
            return NULL;
        }
        Py_DECREF(r);
        e->code[dt] = (int)code;
        e->sig[dt] = sig;
    }
    return e->code[dt] >= 0 ? e : NULL;
}

/* Is `code` collcomm's own (cached per code object)? */
static int fast_inside(Fast *s, PyCodeObject *code)
{
    CodeSeen *c = &s->seen[((uintptr_t)code >> 4) % CODE_CACHE];
    if (c->code == (PyObject *)code)
        return c->inside;
    PyObject *file = code->co_filename;
    int inside = PyUnicode_Tailmatch(file, s->pkg, 0, PY_SSIZE_T_MAX, -1) == 1;
    Py_INCREF(code);
    Py_XSETREF(c->code, (PyObject *)code);
    c->inside = inside;
    return inside;
}

/* The record of a call, appended to the ring: (observer index, tag, name, signature,
 * id(family), caller's code, caller's instruction offset, perf_counter time); the caller
 * is the first frame outside collcomm (at most 8 frames up). NULL with an exception on
 * error. */
static PyObject *fast_record(Fast *s, PyObject *tag, PyObject *name, uint64_t sig, int fc)
{
    PyFrameObject *f = PyEval_GetFrame();
    Py_XINCREF(f);
    PyCodeObject *code = NULL;
    int lasti = 0;
    for (int i = 0; f != NULL && i < 8; i++) {
        code = PyFrame_GetCode(f);
        if (!fast_inside(s, code))
            break;
        PyFrameObject *back = PyFrame_GetBack(f);
        if (back == NULL)
            break;
        Py_DECREF(code);
        code = NULL;
        Py_DECREF(f);
        f = back;
    }
    if (f != NULL) {
        if (code == NULL)
            code = PyFrame_GetCode(f);
#if PY_VERSION_HEX >= 0x030B0000
        lasti = PyFrame_GetLasti(f);
#else
        lasti = f->f_lasti * 2;
#endif
        Py_DECREF(f);
    }
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    PyObject *rec = PyTuple_New(8);
    if (rec == NULL) {
        Py_XDECREF(code);
        return NULL;
    }
    Py_INCREF(s->obs_index);
    PyTuple_SET_ITEM(rec, 0, s->obs_index);
    Py_INCREF(tag);
    PyTuple_SET_ITEM(rec, 1, tag);
    Py_INCREF(name);
    PyTuple_SET_ITEM(rec, 2, name);
    PyObject *sigobj = PyLong_FromUnsignedLongLong(sig);
    PyTuple_SET_ITEM(rec, 3, sigobj);
    Py_INCREF(s->algo_id[fc]);
    PyTuple_SET_ITEM(rec, 4, s->algo_id[fc]);
    if (code == NULL) {
        Py_INCREF(Py_None);
        PyTuple_SET_ITEM(rec, 5, Py_None);
    } else {
        PyTuple_SET_ITEM(rec, 5, (PyObject *)code);
    }
    PyTuple_SET_ITEM(rec, 6, PyLong_FromLong(lasti));
    PyTuple_SET_ITEM(rec, 7, PyFloat_FromDouble((double)ts.tv_sec + ts.tv_nsec * 1e-9));
    if (sigobj == NULL || PyTuple_GET_ITEM(rec, 6) == NULL || PyTuple_GET_ITEM(rec, 7) == NULL) {
        Py_DECREF(rec);
        return NULL;
    }
    PyObject *r = PyObject_CallOneArg(s->append, rec);
    if (r == NULL) {
        Py_DECREF(rec);
        return NULL;
    }
    Py_DECREF(r);
    return rec;
}

/* What every call does before its traffic: the next sequence number (as the tag), the
 * record, the arena's timeout. Returns the tag (new reference) and sets *rec (new
 * reference or NULL when recording is off); NULL with an exception on error. */
static PyObject *fast_begin(Fast *s, PyObject *name, uint64_t sig, int fc, PyObject **rec)
{
    *rec = NULL;
    PyObject *n = PyIter_Next(s->seq);
    if (n == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_RuntimeError, "collcomm fast call: the sequence ended");
        return NULL;
    }
    uint64_t seq = PyLong_AsUnsignedLongLongMask(n);
    Py_DECREF(n);
    PyObject *tag = PyLong_FromUnsignedLongLong(s->tag_base | (seq & s->seq_mask));
    if (tag == NULL)
        return NULL;
    if (s->record && s->append != Py_None) {
        *rec = fast_record(s, tag, name, sig, fc);
        if (*rec == NULL) {
            Py_DECREF(tag);
            return NULL;
        }
    }
    if (s->arena != Py_None) {
        PyObject *t = PyObject_GetAttr(s->group, s_timeout);
        int bad = t == NULL || PyObject_SetAttr(s->arena, s_timeout, t) < 0;
        Py_XDECREF(t);
        if (bad) {
            Py_DECREF(tag);
            Py_CLEAR(*rec);
            return NULL;
        }
    }
    return tag;
}

/* The end of a call: `status` is the Core's result (NULL: an exception is set). Hands
 * failures and unfinished calls to the hooks; True when the call completed. */
static PyObject *fast_end(Fast *s, PyObject *status, PyObject *rec, PyObject *tag, uint64_t sig,
                          int fc, PyObject *name, PyObject *a, PyObject *b, PyObject *c)
{
    PyObject *recobj = rec != NULL ? rec : Py_None;
    PyObject *out = NULL;
    if (status == NULL) {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyErr_NormalizeException(&type, &value, &tb);
        if (tb != NULL)
            PyException_SetTraceback(value, tb);
        PyObject *sigobj = PyLong_FromUnsignedLongLong(sig);
        PyObject *err = sigobj == NULL ? NULL : PyObject_CallMethodObjArgs(
            s->hooks, s_failed, value, recobj, name, tag, sigobj, NULL);
        Py_XDECREF(sigobj);
        if (err != NULL) {
            PyErr_SetObject((PyObject *)Py_TYPE(err), err);
            Py_DECREF(err);
        }
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
    } else {
        long st = PyLong_AsLong(status);
        Py_DECREF(status);
        if (st == ST_DONE) {
            s->calls++;
            if (rec == NULL || PyObject_SetAttr(s->observer, s_done, rec) == 0) {
                out = Py_True;
                Py_INCREF(out);
            }
        } else if (!(st == -1 && PyErr_Occurred())) {
            PyObject *sto = PyLong_FromLong(st), *sigobj = PyLong_FromUnsignedLongLong(sig),
                     *fco = PyLong_FromLong(fc);
            if (sto != NULL && sigobj != NULL && fco != NULL)
                out = PyObject_CallMethodObjArgs(s->hooks, s_finish, sto, recobj, name, tag, sigobj,
                                                 fco, a, b, c, NULL);
            Py_XDECREF(sto);
            Py_XDECREF(sigobj);
            Py_XDECREF(fco);
            if (out != NULL) {
                Py_DECREF(out);
                out = Py_True;
                Py_INCREF(out);
            }
        }
    }
    Py_XDECREF(rec);
    Py_DECREF(tag);
    return out;
}

static inline int fast_open(Fast *s)
{
    return s->paused == 0 && fast_timeout_scopes == 0;
}

/* Core collectives take (arena, ..., sig) as Python objects; call one. */
static PyObject *core_call(PyObject *(*fn)(Core *, PyObject *const *, Py_ssize_t), Fast *s,
                           PyObject **args, Py_ssize_t nargs, uint64_t sig)
{
    PyObject *sigobj = PyLong_FromUnsignedLongLong(sig);
    if (sigobj == NULL)
        return NULL;
    args[0] = s->arena;
    args[nargs - 1] = sigobj;
    PyObject *r = fn((Core *)s->core, args, nargs);
    Py_DECREF(sigobj);
    return r;
}

/* all_reduce(send, recv, op, name) -> True | None: recv = op over every rank's send
 * (send may be recv: in place). */
static PyObject *Fast_all_reduce(Fast *s, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_args(nargs, 4, "all_reduce") < 0)
        return NULL;
    if (!fast_open(s))
        Py_RETURN_NONE;
    Py_buffer sv, rv;
    if (PyObject_GetBuffer(args[1], &rv, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    int same = args[0] == args[1];
    if (!same && PyObject_GetBuffer(args[0], &sv, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyErr_Clear();
        PyBuffer_Release(&rv);
        Py_RETURN_NONE;
    }
    int dt = fast_dtype(&rv);
    Py_ssize_t nbytes = rv.len;
    int fits = dt >= 0 && nbytes > 0 && nbytes <= s->limit[FC_ALL_REDUCE];
    if (fits && !same)
        fits = sv.len == nbytes && fast_dtype(&sv) == dt &&
               (sv.buf == rv.buf || !overlaps(sv.buf, nbytes, rv.buf, nbytes));
    FastOp *e = fits ? fast_op(s, args[2], dt) : NULL;
    if (e == NULL) {
        if (!same)
            PyBuffer_Release(&sv);
        PyBuffer_Release(&rv);
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_NONE;
    }
    if (!same && sv.buf != rv.buf)
        memcpy(rv.buf, sv.buf, nbytes);
    if (!same)
        PyBuffer_Release(&sv);
    Py_ssize_t count = nbytes / rv.itemsize;
    PyBuffer_Release(&rv);
    uint64_t sig = e->sig[dt] | ((uint64_t)0x3FFF << 36) | ((uint64_t)count & 0xFFFFFFFFFULL);
    PyObject *rec;
    PyObject *tag = fast_begin(s, args[3], sig, FC_ALL_REDUCE, &rec);
    if (tag == NULL)
        return NULL;
    PyObject *status;
    if (s->core == Py_None) {
        status = PyLong_FromLong(ST_DONE);
    } else {
        PyObject *cargs[4] = {NULL, args[1], PyLong_FromLong(e->code[dt]), NULL};
        status = cargs[2] == NULL ? NULL : core_call(Core_all_reduce, s, cargs, 4, sig);
        Py_XDECREF(cargs[2]);
    }
    return fast_end(s, status, rec, tag, sig, FC_ALL_REDUCE, args[3], args[1], args[2], Py_None);
}

/* broadcast(buf, root, name) -> True | None */
static PyObject *Fast_broadcast(Fast *s, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_args(nargs, 3, "broadcast") < 0)
        return NULL;
    if (!fast_open(s) || !PyLong_CheckExact(args[1]))
        Py_RETURN_NONE;
    long root = PyLong_AsLong(args[1]);
    if (root < 0 || root >= s->size) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    Py_buffer v;
    if (PyObject_GetBuffer(args[0], &v, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    int dt = fast_dtype(&v);
    Py_ssize_t nbytes = v.len, count = v.len / (v.itemsize ? v.itemsize : 1);
    PyBuffer_Release(&v);
    if (dt < 0 || nbytes == 0 || nbytes > s->limit[FC_BROADCAST])
        Py_RETURN_NONE;
    uint64_t sig = s->plain_sig[FC_BROADCAST] | (s->dt_sig[dt] << 55) |
                   ((uint64_t)(root & 0x3FFF) << 36) | ((uint64_t)count & 0xFFFFFFFFFULL);
    PyObject *rec;
    PyObject *tag = fast_begin(s, args[2], sig, FC_BROADCAST, &rec);
    if (tag == NULL)
        return NULL;
    PyObject *status;
    if (s->core == Py_None) {
        status = PyLong_FromLong(ST_DONE);
    } else {
        PyObject *cargs[4] = {NULL, args[0], args[1], NULL};
        status = core_call(Core_broadcast, s, cargs, 4, sig);
    }
    return fast_end(s, status, rec, tag, sig, FC_BROADCAST, args[2], args[0], args[1], Py_None);
}

/* all_gather(send, recv, name) -> True | None: recv holds every rank's send, in rank order */
static PyObject *Fast_all_gather(Fast *s, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_args(nargs, 3, "all_gather") < 0)
        return NULL;
    if (!fast_open(s) || args[0] == args[1])
        Py_RETURN_NONE;
    Py_buffer sv, rv;
    if (PyObject_GetBuffer(args[1], &rv, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    if (PyObject_GetBuffer(args[0], &sv, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyErr_Clear();
        PyBuffer_Release(&rv);
        Py_RETURN_NONE;
    }
    int dt = fast_dtype(&sv);
    Py_ssize_t kb = sv.len, count = sv.len / (sv.itemsize ? sv.itemsize : 1);
    int fits = dt >= 0 && fast_dtype(&rv) == dt && kb > 0 && rv.len <= s->limit[FC_ALL_GATHER] &&
               rv.len == kb * s->size &&
               (s->size == 1 || !overlaps(sv.buf, kb, rv.buf, rv.len) ||
                sv.buf == (char *)rv.buf + s->rank * kb);
    if (fits && s->core == Py_None && sv.buf != rv.buf)
        memcpy(rv.buf, sv.buf, kb);
    PyBuffer_Release(&sv);
    PyBuffer_Release(&rv);
    if (!fits)
        Py_RETURN_NONE;
    uint64_t sig = s->plain_sig[FC_ALL_GATHER] | (s->dt_sig[dt] << 55) |
                   ((uint64_t)0x3FFF << 36) | ((uint64_t)count & 0xFFFFFFFFFULL);
    PyObject *rec;
    PyObject *tag = fast_begin(s, args[2], sig, FC_ALL_GATHER, &rec);
    if (tag == NULL)
        return NULL;
    PyObject *status;
    if (s->core == Py_None) {
        status = PyLong_FromLong(ST_DONE);
    } else {
        PyObject *root = PyLong_FromLong(-1);
        PyObject *cargs[5] = {NULL, args[0], args[1], root, NULL};
        status = core_call(Core_gather, s, cargs, 5, sig);
        Py_DECREF(root);
    }
    return fast_end(s, status, rec, tag, sig, FC_ALL_GATHER, args[2], args[0], args[1], Py_None);
}

/* ------------------------------------------------ reduce, reduce_scatter, gather, scatter */
#define TOP4 ((uint64_t)0xF << 60)
#define COUNT_BITS(c) ((uint64_t)(c) & 0xFFFFFFFFFULL)

/* Two buffers, `a` read and `b` written, either possibly None: their data, bytes and the
 * one native dtype they share (-1: refuse — not buffers, not contiguous, different or
 * unsupported dtypes, overlapping unless `same_ok` and identical). Released by the caller
 * through fast_release. */
typedef struct {
    Py_buffer v[2];
    int held[2];
    char *data[2];
    Py_ssize_t len[2], itemsize;
} Pair;

static void fast_release(Pair *p)
{
    for (int i = 0; i < 2; i++)
        if (p->held[i])
            PyBuffer_Release(&p->v[i]);
}

static int fast_pair(Pair *p, PyObject *a, PyObject *b, int same_ok)
{
    PyObject *obj[2] = {a, b};
    int dt = -2;
    p->held[0] = p->held[1] = 0;
    p->itemsize = 1;
    for (int i = 0; i < 2; i++) {
        p->data[i] = NULL;
        p->len[i] = 0;
        if (obj[i] == Py_None)
            continue;
        if (i == 1 && obj[1] == obj[0] && same_ok) {
            p->data[1] = p->data[0];
            p->len[1] = p->len[0];
            continue;
        }
        int written = i == 1 || (same_ok && obj[1] == obj[0]);
        if (PyObject_GetBuffer(obj[i], &p->v[i], PyBUF_C_CONTIGUOUS | PyBUF_FORMAT |
                               (written ? PyBUF_WRITABLE : 0)) < 0) {
            PyErr_Clear();
            return -1;
        }
        p->held[i] = 1;
        int d = fast_dtype(&p->v[i]);
        if (d < 0 || (dt != -2 && d != dt))
            return -1;
        dt = d;
        p->data[i] = p->v[i].buf;
        p->len[i] = p->v[i].len;
        p->itemsize = p->v[i].itemsize ? p->v[i].itemsize : 1;
    }
    if (dt == -2)
        return -1;
    if (p->data[0] != NULL && p->data[1] != NULL &&
        !(same_ok && p->data[0] == p->data[1] && p->len[0] == p->len[1]) &&
        overlaps(p->data[0], p->len[0], p->data[1], p->len[1]))
        return -1;
    return dt;
}

/* Run Core function `fn` with (arena, cargs..., sig) after the bookkeeping, then end. */
static PyObject *fast_run(Fast *s, int fc, PyObject *name, uint64_t sig,
                          PyObject *(*fn)(Core *, PyObject *const *, Py_ssize_t),
                          PyObject **cargs, Py_ssize_t nargs, PyObject *a, PyObject *b,
                          PyObject *c)
{
    PyObject *rec;
    PyObject *tag = fast_begin(s, name, sig, fc, &rec);
    if (tag == NULL)
        return NULL;
    PyObject *status = s->core == Py_None ? PyLong_FromLong(ST_DONE)
                                          : core_call(fn, s, cargs, nargs, sig);
    return fast_end(s, status, rec, tag, sig, fc, name, a, b, c);
}

static long fast_root(Fast *s, PyObject *obj)
{
    if (!PyLong_CheckExact(obj))
        return -1;
    long root = PyLong_AsLong(obj);
    if (root < 0 || root >= s->size) {
        PyErr_Clear();
        return -1;
    }
    return root;
}

/* reduce(send, recv or None, op, root, name) -> True | None: recv (root only; may be send)
 * gets op over every rank's send */
static PyObject *Fast_reduce(Fast *s, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_args(nargs, 5, "reduce") < 0)
        return NULL;
    long root = fast_root(s, args[3]);
    if (!fast_open(s) || root < 0 || (s->rank == root) != (args[1] != Py_None))
        Py_RETURN_NONE;
    Pair p;
    int dt = fast_pair(&p, args[0], args[1], 1);
    Py_ssize_t nbytes = p.len[0], count = nbytes / p.itemsize;
    int fits = dt >= 0 && nbytes > 0 && nbytes <= s->limit[FC_REDUCE] &&
               (args[1] == Py_None || p.len[1] == nbytes);
    if (fits && s->core == Py_None && p.data[1] != p.data[0])
        memcpy(p.data[1], p.data[0], nbytes);
    fast_release(&p);
    FastOp *e = fits ? fast_op(s, args[2], dt) : NULL;
    if (e == NULL) {
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_NONE;
    }
    uint64_t sig = s->plain_sig[FC_REDUCE] | (e->sig[dt] & ~TOP4) |
                   ((uint64_t)(root & 0x3FFF) << 36) | COUNT_BITS(count);
    PyObject *code = PyLong_FromLong(e->code[dt]);
    if (code == NULL)
        return NULL;
    PyObject *cargs[6] = {NULL, args[0], args[1], code, args[3], NULL};
    PyObject *r = fast_run(s, FC_REDUCE, args[4], sig, Core_reduce, cargs, 6, args[0], args[1],
                           args[2]);
    Py_DECREF(code);
    return r;
}

/* reduce_scatter(send, recv, op, name) -> True | None: block i of op over every rank's
 * send (n blocks of recv's size) into rank i's recv */
static PyObject *Fast_reduce_scatter(Fast *s, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_args(nargs, 4, "reduce_scatter") < 0)
        return NULL;
    if (!fast_open(s) || args[0] == args[1])
        Py_RETURN_NONE;
    Pair p;
    int dt = fast_pair(&p, args[0], args[1], 0);
    Py_ssize_t kb = p.len[1], count = kb / p.itemsize;
    int fits = dt >= 0 && kb > 0 && p.len[0] == kb * s->size && p.len[0] <= s->limit[FC_REDUCE_SCATTER];
    if (fits && s->core == Py_None)
        memcpy(p.data[1], p.data[0], kb);
    fast_release(&p);
    FastOp *e = fits ? fast_op(s, args[2], dt) : NULL;
    if (e == NULL) {
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_NONE;
    }
    uint64_t sig = s->plain_sig[FC_REDUCE_SCATTER] | (e->sig[dt] & ~TOP4) |
                   ((uint64_t)0x3FFF << 36) | COUNT_BITS(count);
    PyObject *code = PyLong_FromLong(e->code[dt]);
    if (code == NULL)
        return NULL;
    PyObject *cargs[5] = {NULL, args[0], args[1], code, NULL};
    PyObject *r = fast_run(s, FC_REDUCE_SCATTER, args[3], sig, Core_reduce_scatter, cargs, 5,
                           args[0], args[1], args[2]);
    Py_DECREF(code);
    return r;
}

/* gather(send, recv or None, root, name) / scatter(send or None, recv, root, name):
 * blocks of n × the one rank's size at the root */
static PyObject *fast_rooted(Fast *s, PyObject *const *args, Py_ssize_t nargs, int fc)
{
    int gather = fc == FC_GATHER;
    if (check_args(nargs, 4, gather ? "gather" : "scatter") < 0)
        return NULL;
    long root = fast_root(s, args[2]);
    PyObject *big = gather ? args[1] : args[0];
    if (!fast_open(s) || root < 0 || (s->rank == root) != (big != Py_None))
        Py_RETURN_NONE;
    Pair p;
    int dt = fast_pair(&p, args[0], args[1], 0);
    Py_ssize_t kb = p.len[gather ? 0 : 1], count = kb / p.itemsize;
    int fits = dt >= 0 && kb > 0 && kb * s->size <= s->limit[fc] &&
               (big == Py_None || p.len[gather ? 1 : 0] == kb * s->size);
    if (fits && s->core == Py_None)
        memcpy(p.data[1], p.data[0], kb);
    fast_release(&p);
    if (!fits)
        Py_RETURN_NONE;
    uint64_t sig = s->plain_sig[fc] | (s->dt_sig[dt] << 55) |
                   ((uint64_t)(root & 0x3FFF) << 36) | COUNT_BITS(count);
    PyObject *cargs[5] = {NULL, args[0], args[1], args[2], NULL};
    return fast_run(s, fc, args[3], sig, gather ? Core_gather : Core_scatter, cargs, 5, args[0],
                    args[1], args[2]);
}

static PyObject *Fast_gather(Fast *s, PyObject *const *args, Py_ssize_t nargs)
{
    return fast_rooted(s, args, nargs, FC_GATHER);
}

static PyObject *Fast_scatter(Fast *s, PyObject *const *args, Py_ssize_t nargs)
{
    return fast_rooted(s, args, nargs, FC_SCATTER);
}

/* all_to_all(send, recv, name) -> True | None: equal blocks along the first dimension
 * (all_to_all_single without split sizes): block j of send to rank j, rank j's block into
 * block j of recv */
static PyObject *Fast_all_to_all(Fast *s, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_args(nargs, 3, "all_to_all") < 0)
        return NULL;
    if (!fast_open(s) || args[0] == args[1])
        Py_RETURN_NONE;
    Pair p;
    int dt = fast_pair(&p, args[0], args[1], 0);
    int n = s->size, fits = dt >= 0;
    for (int i = 0; fits && i < 2; i++)   /* rows divisible by n, the same row size */
        fits = p.v[i].ndim >= 1 && p.v[i].shape[0] > 0 && p.v[i].shape[0] % n == 0;
    Py_ssize_t nbytes = p.len[0], count = nbytes / p.itemsize / n;
    fits = fits && nbytes > 0 && p.len[1] == nbytes && p.v[0].shape[0] == p.v[1].shape[0] &&
           nbytes <= s->limit[FC_ALL_TO_ALL];
    if (fits && s->core == Py_None)
        memcpy(p.data[1], p.data[0], nbytes);
    fast_release(&p);
    if (!fits)
        Py_RETURN_NONE;
    uint64_t sig = s->plain_sig[FC_ALL_TO_ALL] | (s->dt_sig[dt] << 55);
    PyObject *counts = PyList_New(n), *k = PyLong_FromSsize_t(count),
             *isz = PyLong_FromSsize_t(p.itemsize), *cma = PyLong_FromSsize_t(s->a2a_cma);
    PyObject *r = NULL;
    if (counts != NULL && k != NULL && isz != NULL && cma != NULL) {
        for (int i = 0; i < n; i++) {
            Py_INCREF(k);
            PyList_SET_ITEM(counts, i, k);
        }
        PyObject *cargs[8] = {NULL, args[0], counts, args[1], counts, isz, NULL, cma};
        PyObject *rec;
        PyObject *tag = fast_begin(s, args[2], sig, FC_ALL_TO_ALL, &rec);
        if (tag != NULL) {
            PyObject *status;
            if (s->core == Py_None) {
                status = PyLong_FromLong(ST_DONE);
            } else {   /* core_call puts the signature last: here it is the 7th of 8 */
                PyObject *sigobj = PyLong_FromUnsignedLongLong(sig);
                cargs[0] = s->arena;
                cargs[6] = sigobj;
                status = sigobj == NULL ? NULL : Core_all_to_all((Core *)s->core, cargs, 8);
                Py_XDECREF(sigobj);
            }
            r = fast_end(s, status, rec, tag, sig, FC_ALL_TO_ALL, args[2], args[0], args[1], counts);
        }
    }
    Py_XDECREF(counts);
    Py_XDECREF(k);
    Py_XDECREF(isz);
    Py_XDECREF(cma);
    return r;
}

/* barrier(name) -> True | None */
static PyObject *Fast_barrier(Fast *s, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_args(nargs, 1, "barrier") < 0)
        return NULL;
    if (!fast_open(s) || s->limit[FC_BARRIER] == 0)
        Py_RETURN_NONE;
    uint64_t sig = s->plain_sig[FC_BARRIER];
    PyObject *rec;
    PyObject *tag = fast_begin(s, args[0], sig, FC_BARRIER, &rec);
    if (tag == NULL)
        return NULL;
    PyObject *status;
    if (s->core == Py_None) {
        status = PyLong_FromLong(ST_DONE);
    } else {
        PyObject *cargs[2] = {NULL, NULL};
        status = core_call(Core_barrier, s, cargs, 2, sig);
    }
    return fast_end(s, status, rec, tag, sig, FC_BARRIER, args[0], Py_None, Py_None, Py_None);
}

static int Fast_init(Fast *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"core", "arena", "group", "seq", "hooks", "append", "observer",
                             "obs_index", "algo_ids", "pkg", "tag_base", "seq_mask",
                             "plain_sigs", "dtype_sigs", "limits", "size", "rank", NULL};
    PyObject *core, *arena, *group, *seq, *hooks, *append, *observer, *obs_index, *algo_ids,
        *pkg, *plain, *dts, *limits;
    unsigned long long tag_base, seq_mask;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOOOOOOUKKOOOii", kwlist, &core, &arena,
                                     &group, &seq, &hooks, &append, &observer, &obs_index,
                                     &algo_ids, &pkg, &tag_base, &seq_mask, &plain, &dts,
                                     &limits, &self->size, &self->rank))
        return -1;
    if (core != Py_None && !PyObject_TypeCheck(core, &CoreType)) {
        PyErr_SetString(PyExc_TypeError, "Fast: core must be a Core or None");
        return -1;
    }
    if (!PyTuple_Check(algo_ids) || PyTuple_GET_SIZE(algo_ids) != N_FC ||
        !PyTuple_Check(plain) || PyTuple_GET_SIZE(plain) != N_FC ||
        !PyTuple_Check(limits) || PyTuple_GET_SIZE(limits) != N_FC ||
        !PyTuple_Check(dts) || PyTuple_GET_SIZE(dts) != N_DT) {
        PyErr_SetString(PyExc_TypeError, "Fast: algo_ids, plain_sigs and dtype_sigs are tuples "
                        "of the collectives' and dtypes' sizes");
        return -1;
    }
    for (int i = 0; i < N_FC; i++) {
        self->plain_sig[i] = PyLong_AsUnsignedLongLongMask(PyTuple_GET_ITEM(plain, i));
        self->limit[i] = PyLong_AsSsize_t(PyTuple_GET_ITEM(limits, i));
        Py_INCREF(PyTuple_GET_ITEM(algo_ids, i));
        Py_XSETREF(self->algo_id[i], PyTuple_GET_ITEM(algo_ids, i));
    }
    for (int i = 0; i < N_DT; i++)
        self->dt_sig[i] = PyLong_AsUnsignedLongLongMask(PyTuple_GET_ITEM(dts, i));
    if (PyErr_Occurred())
        return -1;
    PyObject **slots[] = {&self->core, &self->arena, &self->group, &self->seq, &self->hooks,
                          &self->append, &self->observer, &self->obs_index, &self->pkg};
    PyObject *values[] = {core, arena, group, seq, hooks, append, observer, obs_index, pkg};
    for (int i = 0; i < 9; i++) {
        Py_INCREF(values[i]);
        Py_XSETREF(*slots[i], values[i]);
    }
    self->tag_base = tag_base;
    self->seq_mask = seq_mask;
    self->record = 1;
    return 0;
}

static int Fast_traverse(Fast *self, visitproc visit, void *arg)
{
    Py_VISIT(self->core);
    Py_VISIT(self->arena);
    Py_VISIT(self->group);
    Py_VISIT(self->seq);
    Py_VISIT(self->hooks);
    Py_VISIT(self->append);
    Py_VISIT(self->observer);
    for (int i = 0; i < self->n_ops; i++)
        Py_VISIT(self->ops[i].op);
    return 0;
}

static int Fast_clear(Fast *self)
{
    Py_CLEAR(self->core);
    Py_CLEAR(self->arena);
    Py_CLEAR(self->group);
    Py_CLEAR(self->seq);
    Py_CLEAR(self->hooks);
    Py_CLEAR(self->append);
    Py_CLEAR(self->observer);
    Py_CLEAR(self->obs_index);
    Py_CLEAR(self->pkg);
    for (int i = 0; i < N_FC; i++)
        Py_CLEAR(self->algo_id[i]);
    for (int i = 0; i < self->n_ops; i++)
        Py_CLEAR(self->ops[i].op);
    self->n_ops = 0;
    for (int i = 0; i < CODE_CACHE; i++)
        Py_CLEAR(self->seen[i].code);
    self->paused = 1;     /* a cleared Fast never runs a call again */
    return 0;
}

static PyObject *Fast_close(Fast *self, PyObject *unused)
{
    Fast_clear(self);
    Py_RETURN_NONE;
}

static void Fast_dealloc(Fast *self)
{
    PyObject_GC_UnTrack(self);
    Fast_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* timeout_scope(delta): call_timeout scopes opened (+1) and closed (-1), all threads */
static PyObject *mod_timeout_scope(PyObject *m, PyObject *arg)
{
    long d = PyLong_AsLong(arg);
    if (d == -1 && PyErr_Occurred())
        return NULL;
    fast_timeout_scopes += (int)d;
    return PyLong_FromLong(fast_timeout_scopes);
}

#define FASTM(name, doc) {#name, (PyCFunction)(void (*)(void))Fast_##name, METH_FASTCALL, doc}
static PyMethodDef Fast_methods[] = {
    FASTM(all_reduce, "all_reduce(send, recv, op, name) -> True | None"),
    FASTM(broadcast, "broadcast(buf, root, name) -> True | None"),
    FASTM(all_gather, "all_gather(send, recv, name) -> True | None"),
    FASTM(barrier, "barrier(name) -> True | None"),
    FASTM(reduce, "reduce(send, recv or None, op, root, name) -> True | None"),
    FASTM(reduce_scatter, "reduce_scatter(send, recv, op, name) -> True | None"),
    FASTM(gather, "gather(send, recv or None, root, name) -> True | None"),
    FASTM(scatter, "scatter(send or None, recv, root, name) -> True | None"),
    FASTM(all_to_all, "all_to_all(send, recv, name) -> True | None (equal blocks)"),
    {"close", (PyCFunction)Fast_close, METH_NOARGS,
     "drop every reference; later calls take the regular path"},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef Fast_members[] = {
    {"paused", T_INT, offsetof(Fast, paused), 0, "> 0: calls take the regular path"},
    {"a2a_cma", T_PYSSIZET, offsetof(Fast, a2a_cma), 0,
     "all_to_all's cross-memory-attach limit (shm_direct passes CMA_MIN // n, or -1)"},
    {"calls", T_ULONGLONG, offsetof(Fast, calls), READONLY, "calls completed here"},
    {"record", T_INT, offsetof(Fast, record), 0,
     "1 (default): append flight-recorder records; 0: not (to measure their cost)"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject FastType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "collcomm.native._shmcore.Fast",
    .tp_basicsize = sizeof(Fast),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A group's fast call (see collcomm/native/_fastcall.c).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Fast_init,
    .tp_dealloc = (destructor)Fast_dealloc,
    .tp_traverse = (traverseproc)Fast_traverse,
    .tp_clear = (inquiry)Fast_clear,
    .tp_methods = Fast_methods,
    .tp_members = Fast_members,
};

static int fast_module_init(PyObject *m)
{
    s_done = PyUnicode_InternFromString("done");
    s_timeout = PyUnicode_InternFromString("timeout");
    s_learn = PyUnicode_InternFromString("learn");
    s_failed = PyUnicode_InternFromString("failed");
    s_finish = PyUnicode_InternFromString("finish");
    if (s_done == NULL || s_timeout == NULL || s_learn == NULL || s_failed == NULL ||
        s_finish == NULL || PyType_Ready(&FastType) < 0)
        return -1;
    Py_INCREF(&FastType);
    if (PyModule_AddObject(m, "Fast", (PyObject *)&FastType) < 0) {
        Py_DECREF(&FastType);
        return -1;
    }
    return 0;
}
