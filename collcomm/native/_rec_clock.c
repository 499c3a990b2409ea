/* The flight recorder's clock: ``rec_now()``, time.perf_counter()'s value (CLOCK_MONOTONIC,
 * seconds) for a record's start and end. Included by _shmcore.c before the records.
 *
 * A record reads the clock once a collective and three times a batch_isend_irecv of two
 * ops (its start, each op's end); ``clock_gettime`` costs ~36 ns on the 2-vCPU VM of
 * BENCHMARKS.md, the time-stamp counter ~13. Where the kernel keeps CLOCK_MONOTONIC on
 * the TSC itself (current_clocksource "tsc": it found the counter constant-rate and in
 * step across CPUs), ``rec_now`` reads the counter and converts it from the last anchor,
 * a (counter, clock_gettime) pair taken again once the counter has moved on REC_WINDOW
 * ticks (~0.4 ms at 2.4 GHz: one clock_gettime in ~10,000 calls' worth of time); the rate
 * is measured between the last two anchors (>= REC_WINDOW / 2 ticks apart), so it
 * follows the kernel's own adjustments of CLOCK_MONOTONIC (NTP's slewing moved it by up
 * to 1.5e-4 between anchors on that VM: a longer window let the values drift up to 1 µs
 * off clock_gettime's; at this one, 300,000 values each fell between the
 * time.perf_counter() reads around it). Until two anchors give a
 * rate, and anywhere else (another clock source, not x86-64, COLLCOMM_REC_TSC=0), it
 * calls clock_gettime, as it does while the counter reads behind the anchor (a CPU whose
 * counter lags the anchor's, or an unordered read). Values never go back: a fresh anchor
 * behind the last value read (by the extrapolation's error, tens of ns) returns that
 * last value. Everything runs
 * holding the GIL.
 */

#if defined(__x86_64__) && defined(__GNUC__)
#include <x86intrin.h>
#define REC_HAVE_TSC 1
#endif

#define REC_WINDOW ((uint64_t)1 << 20)

static struct {
    int tsc;            /* 1: read the counter (rec_clock_init found the kernel on it) */
    uint64_t tick0;     /* the anchor: counter, */
    double t0;          /* ... and clock_gettime then (s) */
    double per_tick;    /* seconds a tick, between the last two anchors (0: not yet) */
    double last;        /* the last value returned */
    unsigned long long anchors;   /* anchors taken (tests) */
} rec_clock;

static inline double rec_mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

#ifdef REC_HAVE_TSC
#define REC_READ_TICKS 256    /* an anchor's clock read bracketed closer than this (~0.1 µs) */

/* clock_gettime's value now (the counter read at `tick` just before); a new anchor, and
 * the rate from the last one, once the counter has moved on REC_WINDOW / 2 ticks since
 * (or for the first anchor), from a read the counter brackets within REC_READ_TICKS (a
 * read the thread was descheduled in would put the anchor off by that much: three tries,
 * else no anchor this time). */
static double rec_anchor(uint64_t tick)
{
    double t = rec_mono();
    uint64_t after = __rdtsc();
    for (int i = 0; i < 3 && after - tick > REC_READ_TICKS; i++) {
        tick = __rdtsc();
        t = rec_mono();
        after = __rdtsc();
    }
    if (after - tick > REC_READ_TICKS)
        return t;
    tick += (after - tick) / 2;               /* (the counter halfway through the read) */
    int64_t since = (int64_t)(tick - rec_clock.tick0);   /* (< 0: a CPU whose counter is
                                                            behind the anchor's) */
    if (rec_clock.anchors > 0 && since < (int64_t)(REC_WINDOW / 2))
        return t;                             /* (too soon for a rate: the clock as read) */
    if (rec_clock.anchors > 0 && t > rec_clock.t0)
        rec_clock.per_tick = (t - rec_clock.t0) / (double)since;
    rec_clock.tick0 = tick;
    rec_clock.t0 = t;
    rec_clock.anchors++;
    return t;
}
#endif

/* time.perf_counter() */
static inline double rec_now(void)
{
    double t;
#ifdef REC_HAVE_TSC
    if (rec_clock.tsc) {
        uint64_t tick = __rdtsc();
        int64_t since = (int64_t)(tick - rec_clock.tick0);
        if (rec_clock.per_tick > 0.0 && since >= 0 && since < (int64_t)REC_WINDOW)
            t = rec_clock.t0 + (double)since * rec_clock.per_tick;
        else
            t = rec_anchor(tick);
    } else
#endif
        t = rec_mono();
    if (t < rec_clock.last)
        return rec_clock.last;
    rec_clock.last = t;
    return t;
}

/* Read the kernel's clock source once (module init): the counter is used only where the
 * kernel's CLOCK_MONOTONIC is the counter, and COLLCOMM_REC_TSC is not 0. */
static void rec_clock_init(void)
{
    rec_clock.tsc = 0;
#ifdef REC_HAVE_TSC
    const char *env = getenv("COLLCOMM_REC_TSC");
    if (env != NULL && strcmp(env, "0") == 0)
        return;
    FILE *f = fopen("/sys/devices/system/clocksource/clocksource0/current_clocksource", "r");
    char name[32] = {0};
    if (f != NULL) {
        if (fgets(name, sizeof(name), f) == NULL)
            name[0] = 0;
        fclose(f);
    }
    rec_clock.tsc = strncmp(name, "tsc", 3) == 0 && (name[3] == '\n' || name[3] == 0);
    if (rec_clock.tsc)
        rec_anchor(__rdtsc());
#endif
}

/* record_clock() -> (reads the counter, seconds a tick (0.0: not measured yet), anchors
 * taken, rec_now()): the recorder's clock, for tests. */
static PyObject *mod_record_clock(PyObject *module, PyObject *unused)
{
    double now = rec_now();
    return Py_BuildValue("(idKd)", rec_clock.tsc, rec_clock.per_tick, rec_clock.anchors, now);
}
