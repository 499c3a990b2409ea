/* The counter barrier on the arena (Core and its words: _arena_core.c).
 *
 * Included by _shmcore.c after _arena_core.c: arrive (bump our counter, wake sleepers),
 * wait_all (spin, yield, then futex with a Python-side liveness and timeout check every
 * 100 ms, progressing point to point while it sleeps), enter (publish the call's
 * signature, sync, compare), and the early leaving of rooted calls (enter_last, settle).
 */

/* ------------------------------------------------------------------ the counter barrier */
/* Bump our counter; wake whoever sleeps on it. Returns the target everybody must reach. */
static uint64_t arrive(Core *c)
{
    if (c->w_cpu >= 0) {   /* (glibc reads it from the rseq area: a load) */
        int cpu = sched_getcpu();
        uint64_t v = cpu < 0 ? 0 : (uint64_t)cpu + 1;
        /* written only when it changed: a store to the line a waiter is polling, just
         * before the counter's, would make it fetch the line twice */
        if (__atomic_load_n(word(c, c->rank, c->w_cpu), __ATOMIC_RELAXED) != v)
            put(c, c->w_cpu, v);
    }
    uint64_t *mine = word(c, c->rank, c->w_counter);
    uint64_t target = __atomic_load_n(mine, __ATOMIC_RELAXED) + 1;
    __atomic_store_n(mine, target, __ATOMIC_SEQ_CST);
    uint64_t *sleepers = word(c, c->rank, c->w_sleepers);
    if (c->use_futex && __atomic_load_n(sleepers, __ATOMIC_SEQ_CST)) {
        __atomic_store_n(sleepers, 0, __ATOMIC_RELAXED);
        futex_wake_all(mine);
    }
    return target;
}

/* Spin this long holding the GIL (releasing and taking it back costs more than most
 * waits of a small collective); longer waits release it. */
#define GIL_SPIN_NS 5000
/* A wait that sleeps calls Core.progress this often: a rank waiting in a collective still
 * takes the point-to-point messages its posted receives wait for and acknowledges them, and
 * writes its queued sends (MPI's progress rule: a synchronous send to a rank that posted
 * the receive and went into a barrier completes) */
#define PROGRESS_NS 1000000LL

/* The first rank from `from` on whose counter is below target, or -1. */
static inline int first_late(Core *c, uint64_t target, int from)
{
    if (c->only >= 0)
        return from <= c->only && get(c, c->only, c->w_counter) < target ? c->only : -1;
    for (int r = from; r < c->n; r++)
        if (r != c->skip && get(c, r, c->w_counter) < target)
            return r;
    return -1;
}

/* The point-to-point progress of a sleeping wait (wait_all; out of line, off its spin):
 * Core.progress called with the GIL; 0 every counter reached target meanwhile, -1 an
 * exception (GIL held), 1 still waiting (*late updated, GIL released again). */
static __attribute__((noinline)) int wait_progress(Core *c, uint64_t target, int *late, Gil *gil)
{
    gil_take(gil);
    PyObject *fn = c->progress == NULL ? NULL : Py_NewRef(c->progress);   /* (a setter may
                                                                           replace it) */
    PyObject *r = fn == NULL || fn == Py_None ? Py_NewRef(Py_None) : PyObject_CallNoArgs(fn);
    Py_XDECREF(fn);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    *late = first_late(c, target, *late);
    if (*late < 0)
        return 0;
    gil_release(gil);
    return 1;
}

/* Wait until every counter has reached `target`: spin (GIL held), then yield, then block
 * on a futex on the late rank's counter (≤ 1 ms per wait) with the GIL released; every
 * 100 ms the Python side checks for dead peers and the timeout. 0, or -1 with an
 * exception set (and the GIL held). */
static int wait_all(Core *c, PyObject *arena, uint64_t target, Gil *gil)
{
    int late = first_late(c, target, 0);
    if (late < 0)
        return 0;
    /* A late rank that arrived last time on the CPU we arrived on now (arrive publishes
     * it) is most likely queued behind us there (two ranks on one CPU, as the scheduler
     * packs them when other work holds the other CPUs): spinning only delays it, so yield
     * at once. */
    int same_cpu = 0;
    if (c->w_cpu >= 0) {
        uint64_t cpu = get(c, c->rank, c->w_cpu);
        same_cpu = cpu != 0 && get(c, late, c->w_cpu) == cpu;
    }
    /* the clock is first read after 64 pauses: most waits of a small call end sooner, and
     * a read costs ~20 ns (the spin budget starts then; 64 pauses are well under it) */
    long long start = same_cpu ? now_ns() : -1;
    while (!same_cpu) {
        for (int i = 0; i < 64; i++) {
            cpu_relax();
            if (get(c, late, c->w_counter) >= target) {
                late = first_late(c, target, late);
                if (late < 0)
                    return 0;
            }
        }
        long long now = now_ns();
        if (start < 0)
            start = now;
        long long spun = now - start;
        if (spun >= c->spin_ns)
            break;
        if (spun >= GIL_SPIN_NS)      /* a longer wait: let this process's other threads run */
            gil_release(gil);
    }
    gil_release(gil);
    /* Yield `yields` times and until `poll_ns` into the wait, then sleep. A woken sleeper
     * comes back late (a futex wake-up takes 50-150 µs on a VM whose idle CPUs halt), so
     * the ranks it lets wait fall asleep too if they stop polling sooner: every call then
     * costs a wake-up (8-byte all_reduce at n=4 on 16 cores: 125 µs instead of 2-3).
     * Not when the late rank shares our CPU: sleeping hands the CPU over, and our wake-up
     * lets the scheduler put us on an idle one (a poller never moves). */
    long long poll_ns = same_cpu ? 0 : c->poll_ns;
    for (int i = 0; i < c->yields || now_ns() - start < poll_ns; i++) {
        sched_yield();
        late = first_late(c, target, late);
        if (late < 0)
            return 0;
    }
    long long next_check = start + 100000000LL, next_progress = start + PROGRESS_NS;
    long sleep_ns = 50000;
    int progress = c->progress != NULL && c->progress != Py_None;
    while (1) {
        if (c->use_futex) {
            uint64_t *counter = word(c, late, c->w_counter);
            __atomic_store_n(word(c, late, c->w_sleepers), 1, __ATOMIC_SEQ_CST);
            uint64_t seen = __atomic_load_n(counter, __ATOMIC_SEQ_CST);
            if (seen < target) {
                struct timespec ts = {0, 1000000};
                syscall(SYS_futex, (uint32_t *)counter, FUTEX_WAIT, (uint32_t)(seen & 0xffffffffu),
                        &ts, NULL, 0);
            }
        } else {
            struct timespec ts = {0, sleep_ns};
            nanosleep(&ts, NULL);
            sleep_ns = sleep_ns * 2 > 1000000 ? 1000000 : sleep_ns * 2;
        }
        late = first_late(c, target, late);
        if (late < 0)
            return 0;
        long long now = now_ns();
        if (progress && now >= next_progress) {
            next_progress = now + PROGRESS_NS;
            int e = wait_progress(c, target, &late, gil);
            if (e <= 0)
                return e;
        }
        if (now >= next_check) {
            next_check = now + 100000000LL;
            gil_take(gil);
            if (PyErr_CheckSignals() < 0)       /* Ctrl-C: KeyboardInterrupt, as in Python */
                return -1;
            if (c->timeout_of != NULL) {
                /* a fast call sets the arena's timeout (what _check compares with) only
                 * when a wait gets this long, not per call as GroupComm.arena() does */
                PyObject *tmo = PyObject_GetAttr(c->timeout_of, s_timeout);
                int bad = tmo == NULL || PyObject_SetAttr(arena, s_timeout, tmo) < 0;
                Py_XDECREF(tmo);
                if (bad)
                    return -1;
                c->timeout_of = NULL;
            }
            PyObject *late_list = PyList_New(0);
            if (late_list == NULL)
                return -1;
            for (int r = 0; r < c->n; r++) {
                if ((c->only < 0 || r == c->only) && r != c->skip &&
                    get(c, r, c->w_counter) < target) {
                    PyObject *v = PyLong_FromLong(r);
                    int bad = v == NULL || PyList_Append(late_list, v) < 0;
                    Py_XDECREF(v);
                    if (bad) {
                        Py_DECREF(late_list);
                        return -1;
                    }
                }
            }
            PyObject *t = PyLong_FromUnsignedLongLong(target);
            PyObject *w = PyFloat_FromDouble((double)(now - start) / 1e9);
            PyObject *res = NULL;
            if (t != NULL && w != NULL)
                res = PyObject_CallMethodObjArgs(arena, s_check, late_list, t, w, NULL);
            Py_XDECREF(t);
            Py_XDECREF(w);
            Py_DECREF(late_list);
            if (res == NULL)
                return -1;
            Py_DECREF(res);
            late = first_late(c, target, 0);
            if (late < 0)
                return 0;
            gil_release(gil);
        }
    }
}

static int sync_all(Core *c, PyObject *arena, Gil *gil)
{
    return wait_all(c, arena, arrive(c), gil);
}

enum { PART_WHOLE, PART_START, PART_FINISH };

/* Did every rank write `sig` in header word `w`? */
static int all_signed(Core *c, int w, uint64_t sig)
{
    for (int r = 0; r < c->n; r++)
        if (get(c, r, w) != sig)
            return 0;
    return 1;
}

/* Wait for rank r alone to reach target (wait_all's policy, checks and errors). */
static int wait_one(Core *c, PyObject *arena, int r, uint64_t target, Gil *gil)
{
    c->only = r;
    int e = wait_all(c, arena, target, gil);
    c->only = -1;
    return e;
}

/* shm_stage.enter (the Python path): publish the call's signature, sync, compare everybody's.
 * 0: same call everywhere; 1: some rank differs; -1: exception.
 * A two-part call (c->part, consumed here: later syncs of the call are whole) does the same
 * in two parts: PART_START publishes and arrives and returns 2 without waiting (our data
 * is staged: the others can complete the call without us); PART_FINISH, our next use of
 * the arena (the group runs it before any other call of ours), waits for everybody to
 * reach the counter we reached then, and compares. Nobody writes this phase again before
 * we arrive once more, so the words compared are the call's.
 *
 * An eager rooted call (c->eager_wait, consumed here; whole one-step broadcasts and
 * scatters only): the root, its data staged, publishes and arrives and goes on; a
 * receiver waits for the root alone and compares its signature with the root's. The rest
 * (everybody's arrival, every signature) is left to `settle`, which our next use of the
 * arena runs first (core_call, the list calls, GroupComm.arena in Python, the group's
 * close), so the arena's rule holds: nobody writes a phase before everybody has arrived at
 * the step after its last use. A receiver whose root differs waits for everybody and
 * compares as a whole call does (the mismatch raised in this call), and so does one whose
 * root published its buffer in place or by address (that root waits for everybody). */
static int enter(Core *c, PyObject *arena, int phase, uint64_t sig, Gil *gil)
{
    int w = c->w_signature + phase, mode = c->part, wait_for = c->eager_wait;
    c->part = PART_WHOLE;
    c->eager_wait = EAGER_NO;
    if (mode == PART_FINISH) {
        if (wait_all(c, arena, get(c, c->rank, c->w_counter), gil) < 0)
            return -1;
    } else {
        put(c, w, sig);
        if (mode == PART_START) {
            arrive(c);
            return 2;
        }
        if (wait_for != EAGER_NO) {
            uint64_t target = arrive(c);
            if (wait_for >= 0 && wait_one(c, arena, wait_for, target, gil) < 0)
                return -1;
            /* (a root whose buffer is read in place, a Python-path root, needs everybody's
             * closing sync: the whole call then) */
            if (wait_for < 0 || (get(c, wait_for, w) == sig &&
                                 get(c, wait_for, c->w_shared + phase) == 0)) {
                c->lag_target = target;
                c->lag_sig = sig;
                c->lag_phase = phase;
                return 0;
            }
            if (wait_all(c, arena, target, gil) < 0)
                return -1;
        } else if (sync_all(c, arena, gil) < 0) {
            return -1;
        }
    }
    return !all_signed(c, w, sig);
}

/* The barrier collective when more ranks share the CPUs than there are (c->eager) and this
 * is rank 0: it publishes its signature, waits for every other rank's arrival, and only
 * then arrives itself, so the others leave the barrier once rank 0 runs. A call rank 0
 * roots next (a broadcast or scatter, whose receivers wait for the root alone) then starts
 * at once, instead of its receivers waiting for a root still queued behind them on a busy
 * CPU. Any rank may arrive later than the others: the steps are the same. 0, 1 (some rank
 * differs) or -1, as enter. */
#define HOLD (1ULL << 61)         /* arena_layout.HOLD */

static int enter_last(Core *c, PyObject *arena, int phase, uint64_t sig, Gil *gil)
{
    int w = c->w_signature + phase;
    uint64_t target = get(c, c->rank, c->w_counter) + 1;
    put(c, w, sig);
    put(c, c->w_size + phase, HOLD | target);   /* (for the others' checks: Liveness._check) */
    c->skip = c->rank;
    int e = wait_all(c, arena, target, gil);
    c->skip = -1;
    if (e < 0)
        return -1;
    arrive(c);
    return !all_signed(c, w, sig);
}

/* Settle a call left early (see enter): wait for everybody's arrival at it and compare
 * every rank's signature with ours. 0: nothing pending, or settled; 1: a rank differs
 * (still pending: the Python code raises the mismatch, Core.settle); -1: exception.
 * `block` 0 (the group closing): no wait; a rank not there yet settles it (0). */
static int settle(Core *c, PyObject *arena, Gil *gil, int block)
{
    if (c->lag_target == 0)
        return 0;
    if (!block && first_late(c, c->lag_target, 0) >= 0) {
        c->lag_target = 0;
        return 0;
    }
    if (wait_all(c, arena, c->lag_target, gil) < 0)
        return -1;
    if (!all_signed(c, c->w_signature + c->lag_phase, c->lag_sig))
        return 1;
    c->lag_target = 0;
    return 0;
}
