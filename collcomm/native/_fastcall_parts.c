/* Small asynchronous collectives in two parts (included by _fastcall.c after
 * _fastcall_rooted.c).
 *
 * ``all_reduce_async``, ``broadcast_async``, ``barrier_async``, ``all_gather_async``,
 * ``gather_async``, ``scatter_async``, ``reduce_scatter_async``, ``reduce_async`` take the
 * arguments of the fast call of the same name. When the group has nothing queued, a call
 * whose staged form is one arena step (an all_reduce that all_reduce_one_step allows, a reduce
 * of at most reduce_one_shot bytes from all ranks; the others as the fast call
 * takes them, but not split by cross-memory attach and not in list form) is started at
 * once: the record made, this rank's data staged and its arrival published (Core.part
 * PART_START, see enter in _arena_sync.c), so the others can finish the call without
 * this rank, as MPI's nonblocking calls let them. Its second part (``finish_part``: wait
 * for the others' arrival, check every signature, combine or copy out) is queued as the
 * group's next asynchronous call (core/async_calls.py), so it runs in program order
 * before anything else the group does: in ``wait()`` (``wait_part``), in the next
 * blocking call, or on the group's worker. Such a call needs no thread to make progress.
 * Returns the call's Work (made here, as Work.__init__ makes it, without running Python
 * code: nothing can slip in between the arrival and the queueing; done already when the
 * call ran whole at once, handed to the Python code), or None having done nothing (the
 * caller takes the regular path).
 */

enum { W_NAME, W_GROUP, W_TAG, W_STARTED, W_LOCK, W_DONE, W_EVENT, W_RESULT, W_EXC, W_CALLBACKS,
       W_N };
static const char *const work_slot_names[W_N] = {"name", "_group", "_tag", "_started", "_lock",
                                                 "done", "_event", "_result", "_exc", "_callbacks"};
/* Work `w`'s slot i (a W_ index) */
#define WORK_SLOT(s, w, i) (*(PyObject **)((char *)(w) + (s)->work_at[i]))

/* The Work class the first set_async named, and its _group slot's offset: how the MPI
 * waits and tests (_mpi_wait.c, mw_workop) find a Work's group, and so its Fast, without
 * an attribute look-up (NULL until then; every group names the same class) */
static PyTypeObject *fc_work_type;
static Py_ssize_t fc_work_group_at;

/* The Fast whose second part the MPI waits finished last (borrowed; Fast_dealloc forgets
 * it): where its pending Work is the one waited for, it is that Work's group's ``fast``
 * (a group has one Fast; closing drains it first), read without the attribute look-up
 * (~2% of a persistent collective's Start + Wait loop, session 47) */
static Fast *fc_wait_hint;

/* The tuple whose items from the second on are the arguments of the two-part entry being
 * called (borrowed; set by a persistent collective's Start around the call, _mpi_prequest.c,
 * which holds it meanwhile): part_start keeps that tuple for the second part instead of a
 * copy of them (taken only where the arguments are its very items) */
static PyObject *fc_args_tuple;

static PyObject *s_append, *s_pending, *s_finish_part, *s_acquire, *s_release, *s_popleft,
    *s_watch_part, *s_sleeping, *s_worker, *s_locked;

static int parts_names(void)
{
    return (s_append = PyUnicode_InternFromString("append")) == NULL ||
           (s_pending = PyUnicode_InternFromString("_pending")) == NULL ||
           (s_finish_part = PyUnicode_InternFromString("finish_part")) == NULL ||
           (s_acquire = PyUnicode_InternFromString("acquire")) == NULL ||
           (s_release = PyUnicode_InternFromString("release")) == NULL ||
           (s_popleft = PyUnicode_InternFromString("popleft")) == NULL ||
           (s_watch_part = PyUnicode_InternFromString("watch_part")) == NULL ||
           (s_sleeping = PyUnicode_InternFromString("_sleeping")) == NULL ||
           (s_worker = PyUnicode_InternFromString("_worker")) == NULL ||
           (s_locked = PyUnicode_InternFromString("locked")) == NULL ? -1 : 0;
}

/* Is the group's worker started and looking at the queue (AsyncCalls._worker set,
 * _sleeping False)? Then AsyncCalls.watch_part would do nothing: skip its two Python
 * frames (~1.5k instructions a call). The item is queued before this is read, as in
 * AsyncCalls.submit, so a worker that decides to sleep meanwhile sees it. 1 yes, 0 no,
 * -1 an exception. */
static int worker_looking(Fast *s, PyObject *calls)
{
    if (s->worker_at > 0 && s->sleeping_at > 0) {    /* (its slots: no attribute look-ups) */
        PyObject *worker = *(PyObject **)((char *)calls + s->worker_at);
        PyObject *sleeping = *(PyObject **)((char *)calls + s->sleeping_at);
        if (worker != NULL && sleeping != NULL)
            return worker != Py_None && sleeping == Py_False;
    }
    PyObject *worker = PyObject_GetAttr(calls, s_worker);
    if (worker == NULL)
        return -1;
    int started = worker != Py_None;
    Py_DECREF(worker);
    if (!started)
        return 0;
    PyObject *sleeping = PyObject_GetAttr(calls, s_sleeping);
    if (sleeping == NULL)
        return -1;
    int looking = sleeping == Py_False;
    Py_DECREF(sleeping);
    return looking;
}

static PyObject *fast_run_part(Fast *s, int part, int fc, PyObject *name, uint64_t sig,
                               PyObject *(*fn)(Core *, PyObject *const *, Py_ssize_t),
                               PyObject **cargs, Py_ssize_t nargs, Py_ssize_t sig_at, PyObject *a,
                               PyObject *b, PyObject *c, Pair *p)
{
    if (part == PART_WHOLE)
        return fast_run(s, fc, name, sig, fn, cargs, nargs, sig_at, a, b, c, p);
    Core *core = (Core *)s->core;
    PyObject *rec = NULL, *tag;
    if (part == PART_START) {
        tag = fast_begin(s, name, sig, fc, &rec);
        if (tag == NULL) {
            fast_release(p);
            return NULL;
        }
    } else {                       /* the tag and record of the first part */
        tag = s->part_tag;
        rec = s->part_rec;
        s->part_tag = s->part_rec = NULL;
        core->timeout_of = s->group;
    }
    core->part = part;
    PyObject *status = fast_core_call(s, fn, cargs, nargs, sig_at, sig, p);
    core->part = PART_WHOLE;       /* (if the Core refused before its enter) */
    if (part == PART_START && status != NULL && PyLong_AsLong(status) == ST_STARTED) {
        Py_DECREF(status);
        core->timeout_of = NULL;
        Py_XSETREF(s->part_tag, tag);   /* (references kept for the second part) */
        Py_XSETREF(s->part_rec, rec);
        return Py_NewRef(Py_False);
    }
    if (part == PART_FINISH && status != NULL && PyLong_AsLong(status) == ST_REFUSE) {
        /* (its buffer changed since the first part) never run the whole call again */
        Py_DECREF(status);
        status = NULL;
        PyErr_SetString(PyExc_RuntimeError, "collcomm fast call: the second part of a call "
                        "started in two parts was refused (its buffer, or a list of counts, "
                        "changed before its wait?)");
    }
    return fast_end(s, status, rec, tag, sig, fc, name, a, b, c);
}

static int part_done(Fast *s, PyObject *work, PyObject *exc);
static int set_pending(Fast *s, PyObject *group, PyObject *value);
static int part_finish_here(Fast *s, PyObject *work, int test);

#include "_fastcall_parts_spare.c"   /* its Work and queue item made again: part_work, part_item */

/* An entry of the fast call (fast_all_reduce, ...) given the part to run */
typedef PyObject *(*part_fn)(Fast *, PyObject *const *, Py_ssize_t, int);

/* `work` (a new reference, just made by part_work) marked done, its call having run
 * whole: returned, or NULL with an exception (the reference dropped). */
static PyObject *ran_whole(Fast *s, PyObject *work)
{
    int plain = part_done(s, work, NULL);
    if (plain <= 0)
        Py_CLEAR(work);
    if (plain == 0)
        PyErr_SetString(PyExc_RuntimeError, "collcomm fast call: a new Work was locked");
    return work;
}

/* part_start for a group of one (no Core): the call runs whole now, in program order (none
 * of the group's calls queued or started before it, the fast call not paused), and its
 * Work is returned done, as a call that ran whole at its start is; None having done
 * nothing (the regular path queues it). */
static PyObject *alone_whole(Fast *s, part_fn run, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t queued = PyObject_Length(s->async_items);
    if (queued != 0 || s->part_work != NULL || s->paused)
        return queued < 0 ? NULL : Py_NewRef(Py_None);
    PyObject *work = part_work(s, args[nargs - 1]);
    if (work == NULL)
        return NULL;
    PyObject *r = run(s, args, nargs, PART_WHOLE);
    if (r != Py_True) {            /* declined (None) or failed */
        Py_DECREF(work);
        return r;
    }
    Py_DECREF(r);
    return ran_whole(s, work);
}

/* The async entries' common part: start the call (`run` on `args`, whose last is the
 * call's name), then queue its second part. */
static PyObject *part_start(Fast *s, part_fn run, PyObject *const *args, Py_ssize_t nargs)
{
    if (s->work_type == NULL || s->exec_thread != 0 || fast_timeout_scopes != 0 || nargs < 1)
        Py_RETURN_NONE;
    if (s->core == Py_None)        /* a group of one: nothing to wait for */
        return alone_whole(s, run, args, nargs);
    /* the call started before and alone in the queue, which everybody has joined already:
     * finished here at once (waiting for nothing), so this one can start too (a burst of
     * small async calls all start at once while the ranks keep pace) */
    Py_ssize_t queued = PyObject_Length(s->async_items);
    if (queued < 0 || (s->part_work != NULL && queued == 1 &&
                       part_finish_here(s, s->part_work, 1) < 0))
        return NULL;
    if (s->part_work != NULL || s->paused)
        Py_RETURN_NONE;
    PyObject *src = fc_args_tuple, *kept;     /* (the second part's arguments) */
    Py_ssize_t kept_at = 0;
    fc_args_tuple = NULL;
    if (src != NULL && PyTuple_GET_SIZE(src) == nargs + 1 && args == &PyTuple_GET_ITEM(src, 1)) {
        kept = Py_NewRef(src);                 /* (a persistent Start's own tuple) */
        kept_at = 1;
    } else {
        kept = PyTuple_New(nargs);
        for (Py_ssize_t i = 0; kept != NULL && i < nargs; i++)
            PyTuple_SET_ITEM(kept, i, Py_NewRef(args[i]));
    }
    PyObject *work = kept == NULL ? NULL : part_work(s, args[nargs - 1]);
    if (work == NULL) {
        Py_XDECREF(kept);
        return NULL;
    }
    /* paused from here: no fast call of this group may slip in (from another thread or a
     * finalizer) before this one's second part, whatever runs Python code meanwhile */
    s->paused = 1;
    PyObject *r = run(s, args, nargs, PART_START);
    if (r != Py_False)
        s->paused = 0;
    if (r == Py_True) {            /* ran whole (handed to the Python code): done */
        Py_DECREF(r);
        Py_DECREF(kept);
        return ran_whole(s, work);
    }
    if (r != Py_False) {           /* declined (None) or failed */
        Py_DECREF(work);
        Py_DECREF(kept);
        return r;
    }
    Py_DECREF(r);
    /* started (still paused, until the queue is drained: ProcessGroup._settled) */
    Py_SETREF(WORK_SLOT(s, work, W_TAG), Py_NewRef(s->part_tag));
    s->part_work = Py_NewRef(work);
    s->part_run = run;
    s->part_since = rec_now();     /* (the recorder's clock: ~20 ns less than clock_gettime) */
    Py_XSETREF(s->part_args, kept);
    s->part_args_at = kept_at;
    PyObject *item = part_item(s, work);
    PyObject *ok = item == NULL ? NULL : cmethod_call(&s->items_append, s->async_items, item);
    Py_XDECREF(item);
    int bad = ok == NULL || set_pending(s, s->group, Py_True) < 0;
    Py_XDECREF(ok);
    /* the worker, as the safety net: it finishes a second part nobody else runs within
     * PART_GRACE (a peer publishing in place needs more syncs from this rank); started
     * or woken only when it is not looking already */
    int looking = bad || s->async_calls == NULL ? 1 : worker_looking(s, s->async_calls);
    bad = bad || looking < 0;
    if (!bad && !looking) {
        PyObject *r2 = PyObject_CallMethodNoArgs(s->async_calls, s_watch_part);
        bad = r2 == NULL;
        Py_XDECREF(r2);
    }
    if (bad) {
        /* (out of memory) the call is started and cannot be taken back; its Work and the
         * pause stay, so the group's next call waits for it (its timeout names it) */
        Py_DECREF(work);
        return NULL;
    }
    return work;
}

/* X_async(... the arguments of X ..., name) -> Work | None, for the collectives whose
 * staged call is one step (all_reduce_one_step, reduce up to reduce_one_shot;
 * gather/scatter/broadcast not split by CMA; no list forms) */
#define PART_ENTRY(name)                                                                     \
    static PyObject *Fast_##name##_async(Fast *s, PyObject *const *args, Py_ssize_t nargs)   \
    {                                                                                        \
        return part_start(s, fast_##name, args, nargs);                                      \
    }
PART_ENTRY(all_reduce)
PART_ENTRY(broadcast)
PART_ENTRY(barrier)
PART_ENTRY(all_gather)
PART_ENTRY(gather)
PART_ENTRY(scatter)
PART_ENTRY(reduce_scatter)
PART_ENTRY(reduce)

/* finish_part(): the second part of the call started (what the queue runs for it):
 * None, or the call's error raised (its context, record and missing ranks as the fast
 * call gives them). */
static PyObject *Fast_finish_part(Fast *s, PyObject *unused)
{
    if (s->part_work == NULL || s->part_args == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "collcomm fast call: no call started in two parts "
                        "is pending (the group was closed)");
        return NULL;
    }
    PyObject *work = s->part_work, *args = s->part_args;
    Py_ssize_t at = s->part_args_at;
    s->part_work = s->part_args = NULL;
    PyObject *r = s->part_run(s, &PyTuple_GET_ITEM(args, at), PyTuple_GET_SIZE(args) - at, PART_FINISH);
    Py_DECREF(work);
    Py_DECREF(args);
    if (r == NULL) {
        Py_CLEAR(s->part_tag);     /* (if it failed before taking them) */
        Py_CLEAR(s->part_rec);
        return NULL;
    }
    int done = r == Py_True;
    Py_DECREF(r);
    if (!done) {                   /* (the same checks took its first part: only arguments
                                    * the program changed before its wait fail them) */
        Py_CLEAR(s->part_tag);
        Py_CLEAR(s->part_rec);
        PyErr_SetString(PyExc_RuntimeError, "collcomm fast call: the second part of a call "
                        "started in two parts was declined");
        return NULL;
    }
    Py_RETURN_NONE;
}
