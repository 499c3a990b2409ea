/* all_to_all and all_gather staged or by cross-memory attach: rank 0 chooses from what it
 * measures (included by _shmcore.c before _all_gather_voted.c and _collectives_a2a.c,
 * which call way_vote / way_record with their own tables).
 *
 * Why: which way is cheaper can change while a job runs. On the 2-vCPU VM the host moves
 * the two vCPUs every few minutes between placements where a staged 1 MiB all_to_all
 * takes 39-86 µs and where it takes 275-392 µs, while a read by cross-memory attach
 * costs about the same in both (BENCHMARKS.md session 18); a fixed rule (cma_limit, from
 * the CMA cost measured when the arena was built) loses 3x in one placement or 2x in the
 * other.
 *
 * How, without the ranks ever going different ways: rank 0 votes, in the top two bits
 * of its SIZE word of the agreement phase (arena_layout.A2A_VOTE_SHIFT; the rest is its
 * largest block); after the agreement's sync every rank reads rank 0's vote and goes
 * that way (A2A_VOTE_NONE: the fixed rule). The other ranks, and a rank 0 on the Python
 * path, vote NONE; the Python code obeys rank 0's vote as C does (shm_a2a.all_to_all).
 *
 * Rank 0 keeps, per size class (log2 of its send bytes, from a2a_adapt bytes up), the
 * cost per byte of each way, measured from the agreement's sync to the end of its data
 * movement (both ways end with a sync): of the way it took, smoothed over its calls (the
 * mean of the last figure and the new sample, the sample at most A2A_SPIKE x the last
 * figure: one call of 388 µs among CMA's 19-23, a hiccup of the host, had sent a 512 KiB
 * all_to_all to staging for 0.5 s); of the other, what its last try measured (the try's
 * first counted call replaces the old figure). It keeps the way it took until the other
 * costs less than A2A_MARGIN of it, and switches only right after a try of the other (a
 * figure measured a while ago is tried again first), and every A2A_EXPLORE_NS, or
 * A2A_EXPLORE_CALLS calls' time if that is longer, tries the other for A2A_TRIAL calls,
 * of which the first A2A_COLD after a change of way are not counted: the slots and
 * buffers they meet are cold (the phases alternate: the second call stages into the other
 * phase's slot; counting it made a new 1 MiB all_gather pick the way that took 1.5x as
 * long). The first A2A_EARLY tries after the first pick come sooner: after 8, 16, 32 and
 * 64 calls the picked way (16 calls the other way in a size's first ~140). That pick
 * rests on two calls each way, and a job's first calls can run 3-5x slower either way
 * while the processes settle (a 256 KiB all_to_all at 66-82 µs both ways, then 26 staged
 * / 13 by CMA: the staged pick stayed for the next 0.5 s, the whole of a benchmark's size).
 */
#define A2A_VOTE_SHIFT 62              /* arena_layout.A2A_VOTE_SHIFT */
#define A2A_VOTE_NONE 0
#define A2A_VOTE_STAGED 1
#define A2A_VOTE_CMA 2
#define A2A_COUNT_MASK ((1ULL << A2A_VOTE_SHIFT) - 1)
#define A2A_EXPLORE_NS 500000000LL    /* a try of the other way at most this often ... */
#define A2A_EXPLORE_CALLS 400.0        /* ... and than this many calls of the way taken */
#define A2A_TRIAL 4                    /* calls a try goes the other way ... */
#define A2A_COLD 2                     /* ... of which the first ones are not counted */
#define A2A_MARGIN 0.9                 /* switch when the other way costs < 0.9x */
#define A2A_EARLY 4                    /* tries soon after the first pick ... */
#define A2A_EARLY_CALLS 8              /* ... the first after this many calls, then 2x */
#define A2A_SPIKE 2.0                  /* a sample counts at most this x the mean so far */

static inline A2aChoice *way_class(A2aChoice *table, Py_ssize_t bytes)
{
    int k = 0;
    while (bytes > 1 && k < A2A_CLASSES - 1) {
        bytes >>= 1;
        k++;
    }
    return &table[k];
}

/* Rank 0's vote (A2A_VOTE_*) for a call of `bytes` whose sizes `table` records; `cma`: the
 * call can go by CMA at all; `now`: now_ns() (vote_sim's own clock) */
static int way_vote_at(Core *c, A2aChoice *table, Py_ssize_t bytes, int cma, long long now)
{
    if (c->rank != 0 || c->a2a_adapt <= 0 || !cma || bytes < c->a2a_adapt)
        return A2A_VOTE_NONE;
    A2aChoice *h = way_class(table, bytes);
    int way, try_it = 0, stale = 0;
    if (h->trial >= 0 && h->left > 0) {
        way = h->trial;
        h->left--;
    } else {
        h->trial = -1;
        if (h->cost[0] == 0 || h->cost[1] == 0)
            way = h->cost[0] == 0 ? 0 : 1;
        else {
            /* the other way must be clearly cheaper to be taken: noise alone (two ways
             * within a few per cent) made a 4 MiB all_gather switch 3 calls in 10; a wider margin
             * kept a first wrong pick 1.3x slower) */
            int pick = h->pick < 0 ? (h->cost[0] <= h->cost[1] ? 0 : 1) : h->pick;
            if (h->cost[1 - pick] < A2A_MARGIN * h->cost[pick]) {
                /* switch right after a try of the other way only (the previous call went
                 * that way): its figure is then fresh; an older one is tried again first */
                if (h->last == 1 - pick)
                    pick = 1 - pick;
                else
                    stale = 1;
            }
            h->pick = (signed char)pick;
            /* (tries at most every A2A_EXPLORE_CALLS calls' time: a few per cent at most;
             * the first A2A_EARLY after 8, 16, 32, 64 calls the picked way, counted, not
             * timed: a call's measured cost leaves out whatever the program does between) */
            int other;
            if (h->tries < A2A_EARLY)
                other = h->since >= (A2A_EARLY_CALLS << h->tries);
            else {
                double every = A2A_EXPLORE_CALLS * h->cost[pick] * (double)bytes;
                long long gap = every > A2A_EXPLORE_NS ? (long long)every : A2A_EXPLORE_NS;
                other = now - h->seen[1 - pick] > gap;
            }
            other = other || stale;
            way = other ? 1 - pick : pick;
            if (other) {
                if (!stale) {      /* (a stale figure's try leaves the early tries' count) */
                    h->tries += h->tries < A2A_EARLY;
                    h->since = 0;
                }
                try_it = 1;        /* (even right after a try of that way) */
            } else if (h->since < 0xFFFF)
                h->since++;
        }
        if (try_it || h->cost[way] == 0 || way != h->last) {   /* a try: A2A_TRIAL calls */
            h->trial = (signed char)way;
            h->left = A2A_TRIAL - 1;
        }
    }
    return way == 0 ? A2A_VOTE_STAGED : A2A_VOTE_CMA;
}

static int way_vote(Core *c, A2aChoice *table, Py_ssize_t bytes, int cma)
{
    return way_vote_at(c, table, bytes, cma, now_ns());
}

/* Rank 0, after a call it voted for went that way: what it cost (t0: the agreement's
 * sync; `now`: its end, now_ns() or vote_sim's clock); `by` counts the calls each way */
static void way_record_at(A2aChoice *table, unsigned long long *by, Py_ssize_t bytes, int vote,
                          long long t0, long long now)
{
    if (vote == A2A_VOTE_NONE)
        return;
    int way = vote == A2A_VOTE_CMA;
    A2aChoice *h = way_class(table, bytes);
    by[way]++;
    h->streak = h->last == way ? (h->streak > A2A_COLD ? h->streak : h->streak + 1) : 0;
    h->last = (signed char)way;
    if (h->streak < A2A_COLD)
        return;
    double per = (double)(now - t0) / (double)bytes;
    /* a try's first counted call (the way not picked) replaces its old figure (averaged
     * in, a lucky or unlucky old sample would decide the switch); else the mean of the
     * last and the new, the new at most A2A_SPIKE x the last (see the top): a lasting
     * change still shows within a few calls (x1.5 a call at most) */
    int first = h->streak == A2A_COLD && way != h->pick;
    if (h->cost[way] > 0 && !first && per > A2A_SPIKE * h->cost[way])
        per = A2A_SPIKE * h->cost[way];
    h->cost[way] = h->cost[way] == 0 || first ? per : 0.5 * h->cost[way] + 0.5 * per;
    h->seen[way] = now;
}

static void way_record(A2aChoice *table, unsigned long long *by, Py_ssize_t bytes, int vote,
                       long long t0)
{
    way_record_at(table, by, bytes, vote, t0, now_ns());
}

/* vote_sim(bytes, staged_us, cma_us) -> the way rank 0 took for each call (0 staged, 1 by
 * CMA): its vote run on a fresh table of choices over len(staged_us) calls of `bytes`,
 * each call costing the given sample (µs) of the way it took. For the tests: the vote's
 * rules on chosen samples, with no processes and no timing of real calls: its own clock
 * advances by each call's sample, nothing else (a try every A2A_EXPLORE_NS does not come
 * within such a run; a descheduled test process cannot inflate a sample). */
static PyObject *mod_vote_sim(PyObject *m, PyObject *args)
{
    Py_ssize_t bytes;
    PyObject *staged_obj, *cma_obj;
    if (!PyArg_ParseTuple(args, "nOO:vote_sim", &bytes, &staged_obj, &cma_obj))
        return NULL;
    PyObject *samples[2] = {PySequence_Fast(staged_obj, "vote_sim: staged_us: a sequence"),
                            NULL};
    if (samples[0] != NULL)
        samples[1] = PySequence_Fast(cma_obj, "vote_sim: cma_us: a sequence");
    PyObject *out = NULL;
    A2aChoice *table = NULL;
    Core *c = NULL;
    if (samples[1] == NULL)
        goto done;
    Py_ssize_t calls = PySequence_Fast_GET_SIZE(samples[0]);
    if (bytes <= 0 || PySequence_Fast_GET_SIZE(samples[1]) != calls) {
        PyErr_SetString(PyExc_ValueError, "vote_sim: bytes > 0 and as many samples each way");
        goto done;
    }
    c = PyMem_Calloc(1, sizeof(Core));           /* (only rank and a2a_adapt are read) */
    table = PyMem_Calloc(A2A_CLASSES, sizeof(A2aChoice));
    if (c == NULL || table == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    c->a2a_adapt = 1;
    for (int i = 0; i < A2A_CLASSES; i++)
        table[i] = (A2aChoice){{0, 0}, {0, 0}, -1, 0, -1, 0, -1};
    unsigned long long by[2] = {0, 0};
    long long clock = now_ns();
    out = PyList_New(calls);
    for (Py_ssize_t i = 0; out != NULL && i < calls; i++) {
        int vote = way_vote_at(c, table, bytes, 1, clock);
        int way = vote == A2A_VOTE_CMA;
        double us = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(samples[way], i));
        if (us == -1.0 && PyErr_Occurred()) {
            Py_CLEAR(out);
            break;
        }
        long long t0 = clock;
        clock += (long long)(us * 1000.0);
        way_record_at(table, by, bytes, vote, t0, clock);
        PyList_SET_ITEM(out, i, PyLong_FromLong(way));
    }
done:
    PyMem_Free(table);
    PyMem_Free(c);
    Py_XDECREF(samples[0]);
    Py_XDECREF(samples[1]);
    return out;
}
