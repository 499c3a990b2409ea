/* The fast call: one C entry per small collective call of a front end.
 *
 * Included by _shmcore.c (it drives the Core collectives defined there). A ``Fast`` is
 * built per process group by collcomm/core/fastpath.py once the group's arena exists (or
 * at once for a group of one). A front end offers it a call before doing anything else:
 *
 *     if fast is not None and fast.all_reduce(send, recv, op, name): return
 *
 * The call either returns True — it ran completely, exactly as the regular path would:
 * the group's next sequence number taken, a flight-recorder record appended (_record.c)
 * and marked completed, the call's full signature (collective, dtype, count, root, op) checked by
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

typedef struct Fast {
    PyObject_HEAD
    PyObject *core;             /* the Core, or None in a group of one */
    PyObject *arena;            /* the Arena, or None */
    PyObject *group;            /* the ProcessGroup (for its timeout) */
    PyObject *seq;              /* the group's sequence counter (an iterator) */
    PyObject *hooks;            /* learn / failed / finish (collcomm.core.fastpath) */
    RecWriter rw;               /* the flight recorder's records (_record.c) */
    PyObject *observer;         /* the group's observer (``done`` is set), or None */
    Py_ssize_t done_at;         /* > 0: ``done`` is a slot of the observer's type at this offset */
    PyTypeObject *obs_type;     /* ... that type (borrowed: the observer holds it) */
    PyObject *algo_id[N_FC];    /* id() of the family function, as records hold it */
    uint64_t tag_base, seq_mask;
    uint64_t plain_sig[N_FC];   /* signature bases per collective without op (dtype 0) */
    uint64_t dt_sig[N_DT];      /* the 5-bit signature dtype code of each native dtype */
    Py_ssize_t limit[N_FC];     /* the largest message taken per collective (0: none) */
    int size, rank;
    Py_ssize_t a2a_cma;         /* all_to_all's cma_limit argument (shm_large.a2a_cma_limit) */
    Py_ssize_t bcast_cma;       /* > 0: a broadcast of this many bytes or more goes split by CMA */
    Py_ssize_t scatter_cma;     /* > 0: a scatter of this many bytes or more (n blocks) too */
    Py_ssize_t gather_cma;      /* > 0: a gather of this many bytes or more (n blocks) too */
    Py_ssize_t ag_cma;          /* > 0: an all_gather of this many bytes or more (n blocks)
                                   reads by CMA unless rank 0 votes (shm_large.reads_peers) */
    unsigned long long cma_key; /* ... announced with this SHARED word (arena_layout.CMA) */
    int paused;                 /* > 0: every call takes the regular path, */
    unsigned long exec_thread;  /* ... but this thread's (PyThread ident; 0: none), which
                                 * runs the group's queued async calls (core/async_calls.py)
                                 * and may then give the call's tag and record: */
    PyObject *exec_tag;         /* the tag its queued call took (NULL/None: the next one) */
    PyObject *exec_rec;         /* ... and its record, appended then (NULL/None: make one) */
    /* asynchronous calls in two parts (_fastcall_parts.c) */
    PyObject *work_type;        /* core.work.Work, whose slots sit at work_at (NULL: none taken) */
    Py_ssize_t work_at[10];
    PyObject *lock_type;        /* what makes a Work's _lock */
    PyObject *async_items;      /* the group's queue of asynchronous calls (a deque) */
    PyObject *exec_lock;        /* ... the lock of the thread running it (AsyncCalls._exec) */
    PyObject *group_lock;       /* ... the group's lock (ProcessGroup._lock) */
    PyObject *async_calls;      /* ... its owner (core/async_calls.py AsyncCalls) */
    PyObject *pending_type;     /* the class whose plain slot _pending is at pending_at: a
                                 * group of it has it stored straight (NULL: by setattr) */
    Py_ssize_t pending_at;
    CMethod exec_acquire, exec_release, group_locked;   /* their methods, */
    CMethod items_append, items_popleft, work_locked;   /* called straight (_cmethod.c) */
    Py_ssize_t worker_at, sleeping_at;   /* AsyncCalls._worker/_sleeping's slots (0: none) */
    PyObject *finish_bound;     /* self.finish_part, made once (what the queue's items hold) */
    PyObject *part_work;        /* the Work of the call started and not finished (NULL: none) */
    PyObject *spare_work;       /* the Work of the last call finished here, made again for the
                                 * next call if nobody else holds it by then (part_work) */
    PyObject *scan_parts;       /* the small scan's gathered blocks, kept for the next (NULL: none) */
    PyObject *a2a_kept[3];      /* all_to_all's parts, made again (NULL: none): the last pair
                                 * of count lists, equal blocks' list, cma limit as an int */
    PyObject *(*part_run)(struct Fast *, PyObject *const *, Py_ssize_t, int);  /* its entry */
    PyObject *part_args;        /* ... the arguments it was given (a tuple, from part_args_at) */
    Py_ssize_t part_args_at;
    PyObject *spare_item;       /* the queue's last item (None, finish_bound), made again
                                 * (NULL: none) */
    PyObject *part_tag, *part_rec;   /* ... its tag and record */
    double part_since;          /* ... when it started (rec_now: CLOCK_MONOTONIC s) */
    int n_ops;
    FastOp ops[FAST_OPS];
    unsigned long long calls;   /* calls run here (tests check the path) */
} Fast;

static PyObject *s_done, *s_learn, *s_failed, *s_finish;

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

/* What every call does before its traffic: the next sequence number (as the tag), the
 * record, the group whose timeout applies (the Core's timeout_of, until fast_end).
 * Returns the tag (new reference) and sets *rec (new reference or NULL when recording
 * is off); NULL with an exception on error. */
static inline int fast_is_exec(Fast *s)
{
    return s->exec_thread != 0 && s->exec_thread == PyThread_get_thread_ident();
}

static PyObject *fast_begin(Fast *s, PyObject *name, uint64_t sig, int fc, PyObject **rec)
{
    *rec = NULL;
    if (s->exec_tag != NULL && s->exec_tag != Py_None && fast_is_exec(s)) {
        if (s->exec_rec != NULL && s->exec_rec != Py_None && rec_on(&s->rw))
            *rec = Py_NewRef(s->exec_rec);
        if (s->core != Py_None)
            ((Core *)s->core)->timeout_of = s->group;
        return Py_NewRef(s->exec_tag);
    }
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
    if (rec_on(&s->rw)) {
        *rec = rec_collective(&s->rw, tag, name, sig, s->algo_id[fc]);
        if (*rec == NULL) {
            Py_DECREF(tag);
            return NULL;
        }
    }
    if (s->core != Py_None)     /* the group's timeout: the arena takes it if a wait is long */
        ((Core *)s->core)->timeout_of = s->group;
    return tag;
}

/* observer.done = rec: the slot written directly when Fast_init found a plain one
 * (what the member descriptor's __set__ does), else through setattr. 0, or -1 with an
 * exception. */
static int fast_set_done(Fast *s, PyObject *rec)
{
    if (s->done_at > 0 && Py_TYPE(s->observer) == s->obs_type) {
        PyObject **slot = (PyObject **)((char *)s->observer + s->done_at);
        Py_XSETREF(*slot, Py_NewRef(rec));
        return 0;
    }
    return PyObject_SetAttr(s->observer, s_done, rec);
}

/* The end of a call: `status` is the Core's result (NULL: an exception is set). Hands
 * failures and unfinished calls to the hooks; True when the call completed. */
static PyObject *fast_end(Fast *s, PyObject *status, PyObject *rec, PyObject *tag, uint64_t sig,
                          int fc, PyObject *name, PyObject *a, PyObject *b, PyObject *c)
{
    PyObject *recobj = rec != NULL ? rec : Py_None;
    PyObject *out = NULL;
    if (s->core != Py_None)
        ((Core *)s->core)->timeout_of = NULL;
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
            if (rec == NULL || fast_set_done(s, rec) == 0) {
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
    return (s->paused == 0 || fast_is_exec(s)) && fast_timeout_scopes == 0;
}

/* Whether a call in `part` may run: a second part always (its first was taken: a
 * call_timeout scope opened since does not apply to it), else as fast_open says. */
/* Whether a call moving `bytes` (staged) may run in `part`: a whole call always; in two
 * parts only up to one_shot, where no staging copy releases the GIL (so the first part
 * runs without letting any other thread in). */
static inline int part_size_ok(Fast *s, int part, Py_ssize_t bytes)
{
    return part == PART_WHOLE || bytes <= ((Core *)s->core)->one_shot;
}

static inline int fast_open_part(Fast *s, int part)
{
    /* (a first part runs paused: part_start paused the group for it) */
    return part == PART_FINISH || (part == PART_START ? fast_timeout_scopes == 0 : fast_open(s));
}

/* Before a call uses the arena: settle the call the Core left early (enter in
 * _arena_sync.c). 0 go on; 1 some rank made that call differently: this call is refused
 * (ST_REFUSE: the Python path, whose GroupComm.arena settles too, raises the mismatch);
 * -1 an exception (a timeout or lost peer while waiting; Ctrl-C). */
static int fast_settle(Fast *s)
{
    Core *c = (Core *)s->core;
    if (c->lag_target == 0)
        return 0;
    Gil gil = {NULL};
    int e = settle(c, s->arena, &gil, 1);
    gil_take(&gil);
    return e;
}

/* Core collectives take (arena, ..., sig, ...) as Python objects; call one with the
 * signature at args[sig_at]. */
static PyObject *core_call(PyObject *(*fn)(Core *, PyObject *const *, Py_ssize_t), Fast *s,
                           PyObject **args, Py_ssize_t nargs, Py_ssize_t sig_at, uint64_t sig)
{
    int settled = fast_settle(s);
    if (settled != 0)
        return settled < 0 ? NULL : PyLong_FromLong(ST_REFUSE);
    PyObject *sigobj = rec_sig(&s->rw, sig);   /* (the record's int, reused) */
    if (sigobj == NULL)
        return NULL;
    args[0] = s->arena;
    args[sig_at] = sigobj;
    PyObject *r = fn((Core *)s->core, args, nargs);
    Py_DECREF(sigobj);
    return r;
}

/* a signature's top four bits (the collective) and its count field */
#define TOP4 ((uint64_t)0xF << 60)
#define COUNT_BITS(c) ((uint64_t)(c) & 0xFFFFFFFFFULL)

/* A call's root argument as a rank of the group, or -1 (then the regular path runs). */
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

/* The offset of `name` in instances of `type` when it is a plain, writable object slot
 * (``__slots__``: written directly, no setattr), else 0 (no exception). */
static Py_ssize_t plain_slot_offset(PyTypeObject *type, PyObject *name)
{
    PyObject *descr = _PyType_Lookup(type, name);
    if (descr == NULL || !Py_IS_TYPE(descr, &PyMemberDescr_Type))
        return 0;
    /* a slot of this class or a base (a descriptor of another class copied into its
     * namespace points at that class's layout: Python refuses it, so do we) */
    PyTypeObject *owner = ((PyMemberDescrObject *)descr)->d_common.d_type;
    if (owner == NULL || !PyType_IsSubtype(type, owner))
        return 0;
    PyMemberDef *m = ((PyMemberDescrObject *)descr)->d_member;
    return m->type == T_OBJECT_EX && !(m->flags & READONLY) && m->offset > 0 &&
           m->offset + (Py_ssize_t)sizeof(PyObject *) <= owner->tp_basicsize ? m->offset : 0;
}

/* The arguments after (arena, buf, root, sig) of Core_broadcast's split CMA form
 * (shm_move.broadcast: itemsize, cma_key, the arena's pids) into tail[0..2]: new
 * references; -1 with an exception. */
static int fast_bcast_cma_args(Fast *s, Py_ssize_t itemsize, PyObject **tail)
{
    tail[0] = PyLong_FromSsize_t(itemsize);
    tail[1] = PyLong_FromUnsignedLongLong(s->cma_key);
    tail[2] = PyObject_GetAttrString(s->arena, "pids");
    if (tail[0] != NULL && tail[1] != NULL && tail[2] != NULL)
        return 0;
    for (int i = 0; i < 3; i++)
        Py_CLEAR(tail[i]);
    return -1;
}

#include "_fastcall_lists.c"
#include "_fastcall_ops.c"
#include "_fastcall_v.c"         /* all_to_all_v: split sizes (MPI's v collectives) */
#include "_fastcall_reduce.c"      /* reduce, reduce_scatter */
#include "_fastcall_rooted.c"
#include "_fastcall_parts.c"
#include "_fastcall_a2a_parts.c"   /* all_to_all(_v) in two parts */
#include "_fastcall_vroot.c"       /* Gatherv / Scatterv / Allgatherv: the spec read, the call made */
#include "_fastcall_vw.c"          /* Alltoallw of gapless blocks: the same, in bytes */
#include "_obj_pickle.c"           /* objects pickled in band, their slots */
#include "_fastcall_obj.c"         /* objects (pickled_small's calls) */
#include "_fastcall_scan.c"        /* small scan / exscan */
#include "_fastcall_parts_end.c"   /* their second part: wait_part, test_part */
#include "_fastcall_parts_setup.c" /* ... what set_async gives them; their references */
#include "_fastcall_type.c"
