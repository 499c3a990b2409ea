/* The arena as the native core sees it (the counter barrier on it: _arena_sync.c).
 *
 * Included by _shmcore.c. ``Core`` is one rank's view of a group's arena: the mapping, the
 * geometry and the header words' positions (passed in from the one layout module). Here:
 * the Core struct, the header word access (acquire loads, relaxed stores of our own
 * words), the clock, the futex wake-up, and the GIL released lazily (only once a wait
 * gets long).
 */

/* A buffer the fast call (_fastcall.c) has already asked its object for, handed to the
 * Core call it makes next: call_begin takes the pair, get_buffer (_call.c) uses a view
 * of the same object instead of asking again (a numpy array's buffer costs ~50-90 ns) */
typedef struct {
    PyObject *obj;         /* borrowed; NULL: none */
    char *data;
    Py_ssize_t len;
    int writable;
} Handed;

/* What rank 0 has measured of one size class of all_to_all (see _a2a_choice.c) */
#define A2A_CLASSES 48
typedef struct {
    double cost[2];        /* ns per byte sent, staged / by CMA (smoothed; 0: not measured) */
    long long seen[2];     /* when each was last measured (now_ns) */
    signed char trial;     /* the way being tried (0 / 1) for `left` more calls, or -1 */
    signed char left;
    signed char last;      /* the way the previous call went (-1: none) */
    signed char streak;    /* calls in a row that way, up to A2A_COLD + 1 */
    signed char pick;      /* the way taken between tries (-1: none yet) */
    unsigned char tries;   /* tries of the other way since the first pick (up to A2A_EARLY) */
    unsigned short since;  /* calls the picked way since the last try (early tries count them) */
} A2aChoice;

typedef struct {
    PyObject_HEAD
    char *base;            /* the arena mapping */
    Py_ssize_t size;       /* its bytes */
    Py_buffer mapping;     /* keeps the mapping alive while we point into it */
    int n, rank;
    Py_ssize_t header, slot, stride, page, one_shot;
    Py_ssize_t reduce_one_shot;   /* a reduce of at most this many bytes (n ranks') is one step */
    Py_ssize_t pipe_min;   /* a pipelined call's steps: at least this many bytes (0: a reduce */
    int pipe_steps;        /* between two ranks is two-shot), about 1/pipe_steps of the call */
    Py_ssize_t reduce_pair_from;  /* a reduce between two ranks of more bytes than this (or
                                   * than a slot) is pipelined (reduce_pair; 0: past a slot) */
    Py_ssize_t all_reduce_extra;  /* an all_reduce is one step while (n-1)(n-2)/n x its bytes <= this */
    int words;             /* 64-bit words of header per rank */
    int w_counter, w_offset, w_size, w_shared, w_signature, w_sleepers, w_phase;
    int w_cpu;             /* the CPU we last waited on + 1 (-1: no such word) */
    long long spin_ns;     /* spin this long before yielding */
    int yields;            /* then sched_yield this many times before blocking */
    long long poll_ns;     /* and go on yielding until this long into the wait (see wait_all) */
    int use_futex;
    unsigned long long done;      /* calls completed here, syncs included (tests check the path) */
    unsigned long long finished;  /* calls the Python code finished (ST_PYTHON) */
    int part;              /* the next enter only (a fast call's two-part call, see enter):
                              PART_WHOLE, PART_START or PART_FINISH */
    PyObject *timeout_of;  /* during a fast call: its group (borrowed), whose timeout the
                              arena takes before its first check (see wait_all) */
    Handed handed[2];      /* buffers a fast call holds, for the Core call it makes next */
    int eager;             /* rooted calls may leave before the others arrive (see enter) */
    int eager_wait;        /* the next enter only: EAGER_NO, or the rank it waits for (-1:
                              nobody), set by a one-step rooted call when `eager` */
    int only;              /* while >= 0, waits look at this rank's counter alone */
    int skip;              /* while >= 0, waits do not look at this rank's counter */
    int lag_phase;         /* the phase of the call left early (lag_target != 0) */
    uint64_t lag_target;   /* a call left early: the counter everybody must reach (settle) */
    uint64_t lag_sig;      /* ... and the signature every rank must have written */
    Py_ssize_t a2a_adapt;  /* > 0: rank 0 chooses staged or CMA for all_to_alls of at least
                              this many bytes from its timings (_a2a_choice.c); 0: never */
    A2aChoice a2a_choice[A2A_CLASSES];
    unsigned long long a2a_by[2];   /* all_to_alls rank 0's vote sent staged / by CMA */
    unsigned long long a2a_read;    /* all_to_alls this rank read by CMA (any reason) */
    Py_ssize_t ag_vote_min;         /* all_gathers of at least this many bytes (all ranks')
                                       take an agreement step, rank 0 voting (0: none;
                                       _all_gather_voted.c; Arena.build sets it) */
    A2aChoice ag_choice[A2A_CLASSES];
    unsigned long long ag_by[2];
    unsigned long long ag_read;     /* voted-way all_gathers this rank read by CMA (any reason) */
    Py_ssize_t reduce_cma_min, reduce_cma_max;   /* a reduce of this many bytes a rank goes by
                                       CMA (two ranks: reduce_cma in _cma.c; 0: never;
                                       Arena.build sets them, and `pids`, once CMA works) */
    PyObject *pids;                 /* every rank's pid (a tuple), for reduce_cma */
    PyObject *progress;    /* called (no arguments) every PROGRESS_NS of a wait that sleeps:
                              the point-to-point progress of the group's rank (Arena.progress) */
    int stage_nt;          /* 1: staged copies of NT_MIN bytes or more streamed (_stage_nt.c) */
    unsigned long long streamed;  /* staged copies written so (tests check the path) */
    Py_ssize_t out_nt_min; /* a rank's own block copied into its output streamed from this
                              many bytes (0: never; out_copy in _stage_nt.c) */
    unsigned long long out_streamed;   /* own blocks copied so (tests check the path) */
} Core;

#define EAGER_NO (-2)

static PyObject *s_check, *s_timeout;   /* interned attribute names */

static inline uint64_t *word(Core *c, int r, int w)
{
    return (uint64_t *)c->base + (Py_ssize_t)r * c->words + w;
}
static inline uint64_t get(Core *c, int r, int w)
{
    return __atomic_load_n(word(c, r, w), __ATOMIC_ACQUIRE);
}
static inline void put(Core *c, int w, uint64_t v)
{
    __atomic_store_n(word(c, c->rank, w), v, __ATOMIC_RELAXED);
}
/* Is an all_reduce of nbytes one step (every rank reduces all n slots)? As
 * arena_layout.all_reduce_one_step. */
static inline int all_reduce_one_step(Core *c, Py_ssize_t nbytes)
{
    long long extra = c->all_reduce_extra;    /* (a writable member: clamped as Python does) */
    extra = extra < 0 ? 0 : extra > (1LL << 40) ? (1LL << 40) : extra;
    return nbytes <= c->one_shot && (long long)(c->n - 1) * (c->n - 2) * nbytes <= c->n * extra;
}
static inline char *slot_at(Core *c, int phase, int r)
{
    return c->base + c->header + ((Py_ssize_t)phase * c->n + r) * c->stride;
}

static inline long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static inline void futex_wake_all(uint64_t *addr)
{
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE, 0x7fffffff, NULL, NULL, 0);
}

/* -------------------------------------------------------------- the GIL, released lazily */
typedef struct {
    PyThreadState *ts;     /* non-NULL: released */
} Gil;
static inline void gil_release(Gil *g)
{
    if (g->ts == NULL)
        g->ts = PyEval_SaveThread();
}
static inline void gil_take(Gil *g)
{
    if (g->ts != NULL) {
        PyEval_RestoreThread(g->ts);
        g->ts = NULL;
    }
}
