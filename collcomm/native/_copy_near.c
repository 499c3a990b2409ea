/* Copies whose destination lies just past their source modulo 4 KiB: ``near_copy``, the
 * native core's copy of a caller's data to or from the arena, between buffers, and out of
 * a bounce buffer (vec_copy). Included by _shmcore.c after _arena_sync.c (now_ns), before
 * _stage_nt.c (COPY_64S, vec_copy) and every part that copies a caller's data.
 *
 * glibc's memcpy copies from 2 KiB (2,112 bytes with FSRM) up to a bound it derives from
 * the cache (the L2's size on AMD: 512 KiB on the VM of BENCHMARKS.md) with ``rep movsb``,
 * and some CPUs run that 10-30x slower when the destination lies 1-31 bytes past the
 * source modulo 4 KiB (the stores alias the next loads' page offsets), 2-4x slower at
 * 33-63. Measured on the 2-vCPU AMD EPYC (Zen 3) VM of BENCHMARKS.md (session 31), 16 KiB:
 * 40-50 GB/s at a distance of 0, 32 or 64 and up, 1.1-2.8 GB/s at 1-31, 17-22 at 33-63;
 * 4 KiB-256 KiB alike; from 512 KiB glibc's vector loop runs at every distance. A numpy
 * array takes 16-byte alignment from malloc and the arena's blocks start on cache lines, so
 * a collective's copy into the caller's array lands there for one array in four (a 16 KiB
 * all_gather between two ranks: 15.4 µs against 3.2). Where the CPU is slow so (timed once
 * a process, at the first such copy: 16 KiB at 16 bytes past against at 0; or
 * COLLCOMM_NEAR_COPY=1 / 0) such copies take a vector loop with stores aligned to the
 * destination's cache lines (vec_copy) instead. Open MPI's shared-memory copies are glibc's
 * memcpy and meet the same (tools/bench places every library's buffers alike: --skew).
 */

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#define NEAR_BAND 64                        /* destinations 1-63 bytes past the source */
#define NEAR_MIN ((Py_ssize_t)2048)         /* below it glibc's memcpy is a vector loop */
#define NEAR_PROBE ((Py_ssize_t)16 << 10)

static int near_slow = -1;                  /* 1 vector loop, 0 memcpy, -1 not timed yet */
static Py_ssize_t near_max;                 /* glibc's rep movsb bound: the L2's size */
static unsigned long long near_copies;      /* copies that took the vector loop (tests) */

#if defined(__x86_64__)
/* The first `body` bytes (a multiple of 64) of src to dst, 64 a step: four unaligned
 * 16-byte loads, then four stores by `store` (_mm_stream_si128: streamed, _mm_store_si128:
 * plain and aligned, _mm_storeu_si128: plain) */
#define COPY_64S(dst, src, body, store)                                   \
    for (Py_ssize_t i_ = 0; i_ < (body); i_ += 64) {                      \
        __m128i a_ = _mm_loadu_si128((const __m128i *)((src) + i_));      \
        __m128i b_ = _mm_loadu_si128((const __m128i *)((src) + i_ + 16)); \
        __m128i c_ = _mm_loadu_si128((const __m128i *)((src) + i_ + 32)); \
        __m128i d_ = _mm_loadu_si128((const __m128i *)((src) + i_ + 48)); \
        store((__m128i *)((dst) + i_), a_);                               \
        store((__m128i *)((dst) + i_ + 16), b_);                          \
        store((__m128i *)((dst) + i_ + 32), c_);                          \
        store((__m128i *)((dst) + i_ + 48), d_);                          \
    }
#endif

/* Copy n bytes with a plain vector loop (16-byte SSE2 loads, stores aligned to the
 * destination's cache lines; every x86-64; elsewhere memcpy). Measured at 16 bytes past:
 * 4-64 KiB 33-47 GB/s, 1-4 MiB 19-24 (memcpy there: 23-28; unaligned stores: 15-21). */
static void vec_copy(char *dst, const char *src, Py_ssize_t n)
{
#if defined(__x86_64__)
    Py_ssize_t head = (Py_ssize_t)((64 - ((uintptr_t)dst & 63)) & 63);
    if (head > n)
        head = n;
    memcpy(dst, src, (size_t)head);
    dst += head;
    src += head;
    n -= head;
    Py_ssize_t body = n & ~(Py_ssize_t)63;
    COPY_64S(dst, src, body, _mm_store_si128);
    memcpy(dst + body, src + body, (size_t)(n - body));
#else
    memcpy(dst, src, (size_t)n);
#endif
}

/* A way of moving `n` bytes from `src` to `dst` that a band probe times: 0, or -1. */
typedef int (*band_move_t)(char *dst, const char *src, Py_ssize_t n);

/* The best of 4 moves (ns; -1 if one fails), after one to warm the pages up. */
static long long band_time(band_move_t move, char *dst, const char *src, Py_ssize_t n)
{
    long long best = -1;
    for (int i = 0; i < 5; i++) {
        long long t0 = now_ns();
        if (move(dst, src, n) < 0)
            return -1;
        long long t = now_ns() - t0;
        if (i > 0 && (best < 0 || t < best))
            best = t;
    }
    return best;
}

/* Does `move` run `bytes` 16 bytes past the source 1.5x slower than at a distance of 0 on
 * this CPU? The environment variable `setting` ("1" / "0") says so instead. Shared by
 * near_copy (memcpy) and _cma_move.c (a cross-memory read of our own memory). */
static int band_slow_probe(const char *setting, Py_ssize_t bytes, band_move_t move)
{
    const char *env = getenv(setting);
    if (env != NULL && (strcmp(env, "0") == 0 || strcmp(env, "1") == 0))
        return env[0] == '1';
    char *raw = malloc((size_t)(2 * bytes + 3 * 4096));
    if (raw == NULL)
        return 0;
    char *src = (char *)(((uintptr_t)raw + 4095) & ~(uintptr_t)4095);
    char *dst = src + bytes + 4096;
    memset(src, 1, (size_t)(2 * bytes + 4096));
    long long at0 = band_time(move, dst, src, bytes), at16 = band_time(move, dst + 16, src, bytes);
    free(raw);
    return at0 > 0 && at16 > 0 && 2 * at16 > 3 * at0;
}

static int near_memcpy(char *dst, const char *src, Py_ssize_t n)
{
    memcpy(dst, src, (size_t)n);
    __asm__ volatile("" : : "r"(dst) : "memory");
    return 0;
}

/* Does this CPU's memcpy run a copy 16 bytes past its source 1.5x slower than one at a
 * distance of 0? (COLLCOMM_NEAR_COPY=1 / 0 says so instead.) Sets near_max too. */
static int near_probe(void)
{
    long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    __atomic_store_n(&near_max, l2 >= (64 << 10) ? (Py_ssize_t)l2 : (Py_ssize_t)512 << 10,
                     __ATOMIC_RELAXED);     /* (published by near_slow's release store) */
    return band_slow_probe("COLLCOMM_NEAR_COPY", NEAR_PROBE, near_memcpy);
}

/* memcpy, but by vec_copy where the destination lies 1-63 bytes past the source mod 4 KiB
 * in glibc's rep movsb sizes and this CPU is slow there. A destination less than n bytes
 * past the source (an overlap a group of one's calls allow) is moved by memmove. */
static inline void near_copy(void *dst, const void *src, Py_ssize_t n)
{
    if (n >= NEAR_MIN && (((uintptr_t)dst - (uintptr_t)src - 1) & 4095) < NEAR_BAND - 1) {
        if ((uintptr_t)dst - (uintptr_t)src < (uintptr_t)n) {
            memmove(dst, src, (size_t)n);
            return;
        }
        int slow = __atomic_load_n(&near_slow, __ATOMIC_ACQUIRE);   /* (near_max with it) */
        if (slow < 0) {                      /* (two threads may both time it: harmless) */
            slow = near_probe();
            __atomic_store_n(&near_slow, slow, __ATOMIC_RELEASE);
        }
        if (slow && n < __atomic_load_n(&near_max, __ATOMIC_RELAXED)) {
            __atomic_fetch_add(&near_copies, 1, __ATOMIC_RELAXED);
            vec_copy((char *)dst, (const char *)src, n);
            return;
        }
    }
    memcpy(dst, src, (size_t)n);
}

/* near_copies() -> (copies that took the vector loop, whether this CPU needs it: 1, 0,
 * or -1 not timed yet, the bound it applies below) (tests) */
static PyObject *mod_near_copies(PyObject *module, PyObject *unused)
{
    return Py_BuildValue("(Kin)", __atomic_load_n(&near_copies, __ATOMIC_RELAXED),
                         __atomic_load_n(&near_slow, __ATOMIC_RELAXED), near_max);
}
