/* Large copies written with streaming (non-temporal) stores: staged copies when asked
 * (COLLCOMM_STAGE_NT=1; plain stores by default), and a rank's own block copied into its
 * output from c->out_nt_min bytes (COLLCOMM_COPY_NT_MIN, 4 MiB by default; out_copy below).
 *
 * Included by _shmcore.c (after _arena_sync.c, before _call.c, whose stage() writes
 * through staged_copy). A staged copy is written by one CPU and read by another soon
 * after. Written with plain stores it sits dirty in the writer's cache and each line the
 * reader wants is pulled from there; streamed, it goes to memory and the reader reads it
 * from there. Where the two CPUs share a last-level cache the pull is cheap and streaming
 * only adds a trip to memory; where they are far apart the pull can cost several times a
 * memory read. On the 2-vCPU VM of BENCHMARKS.md, whose host moves the vCPUs every few
 * seconds, a 256 KiB handoff (writer then reader) took 45-77 µs plain / 46-65 streamed in
 * one placement and 160-204 / 46-67 in another. Choosing by timing both sides at run time
 * was tried (session 17, docs/native.md) and was not reliable there, so this is a switch
 * a user sets for a machine known to place ranks far apart. Results are bit for bit the
 * same either way; copies below NT_MIN are never streamed.
 */

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#define NT_MIN ((Py_ssize_t)64 << 10)

#if defined(__x86_64__)
/* The first `body` bytes (a multiple of 64) of src to dst, 64 a step: four unaligned
 * 16-byte loads, then four stores by `store` (_mm_stream_si128: streamed,
 * _mm_storeu_si128: plain) */
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

/* Copy n bytes with non-temporal stores (16-byte SSE2, in every x86-64): 1; elsewhere
 * memcpy: 0. */
static int nt_copy(char *dst, const char *src, Py_ssize_t n)
{
#if defined(__x86_64__)
    Py_ssize_t head = (Py_ssize_t)((16 - ((uintptr_t)dst & 15)) & 15);
    if (head > n)
        head = n;
    memcpy(dst, src, head);
    dst += head;
    src += head;
    n -= head;
    Py_ssize_t body = n & ~(Py_ssize_t)63;
    COPY_64S(dst, src, body, _mm_stream_si128);
    _mm_sfence();        /* streamed stores are weakly ordered: all done before we arrive */
    memcpy(dst + body, src + body, n - body);
    return 1;
#else
    memcpy(dst, src, n);
    return 0;
#endif
}

/* A rank's own block copied into its output (all_gather, all_to_all, a gather's or
 * scatter's root): streamed from c->out_nt_min bytes (0: never). A plain store first reads
 * the line it writes (read for ownership); a copy past the caches pays that read from
 * memory for every line, which a streamed store does not, and with many ranks copying at
 * once memory bandwidth is what they share. On the 2-vCPU VM of BENCHMARKS.md (session
 * 30) a cold 8-32 MiB copy took 0.68-0.80x the time streamed, 1-4 MiB 0.79-0.91x; an
 * all_gather or all_to_all of 16-64 MiB followed by the caller's read of its result took
 * 0.89-0.96x the time (the read itself within 8% either way: past the L2 it comes from
 * memory whichever stores wrote it). glibc's memcpy streams by itself past a threshold
 * it derives from the L3 cpuid reports: 3/4 of one thread's share in 2.33-2.37 (1.5 MiB
 * with a 32 MiB L3 shared by 16 threads), a quarter of the whole from 2.38 (8 MiB). On
 * that VM glibc 2.36 takes its share to be 256 MiB (lscpu: a 32 MiB L3) and streams only
 * past 192 MiB: never here.
 * 4 MiB sits inside glibc's range on real hosts. What a streamed block gives up is a place
 * in a large L3 for the caller's next read; COLLCOMM_COPY_NT_MIN=0 keeps plain stores.
 * Overlapping blocks (an in-place call) are moved with memmove. */
static void out_copy(Core *c, char *dst, const char *src, Py_ssize_t n)
{
    if (c->out_nt_min > 0 && n >= c->out_nt_min && (dst + n <= src || src + n <= dst))
        c->out_streamed += nt_copy(dst, src, n);
    else if (dst != src)
        memmove(dst, src, (size_t)n);
}

/* Copy n bytes with a plain vector loop (16-byte SSE2 loads and stores, every x86-64;
 * elsewhere memcpy): for copies whose destination lies a few bytes past the source
 * modulo 4 KiB, where glibc's memcpy takes ``rep movsb`` (from 2 KiB up to a bound it
 * derives from the cache: 512 KiB on the VM of BENCHMARKS.md) and some CPUs run that
 * 4-5x slower (_cma_move.c says where it comes from). */
static void vec_copy(char *dst, const char *src, Py_ssize_t n)
{
#if defined(__x86_64__)
    Py_ssize_t body = n & ~(Py_ssize_t)63;
    COPY_64S(dst, src, body, _mm_storeu_si128);
    memcpy(dst + body, src + body, (size_t)(n - body));
#else
    memcpy(dst, src, (size_t)n);
#endif
}

/* Write a staged copy, streamed when the core is told to and it is large enough. */
static void staged_copy(Core *c, char *dst, const char *src, Py_ssize_t n)
{
    if (c->stage_nt && n >= NT_MIN)
        c->streamed += nt_copy(dst, src, n);
    else
        memcpy(dst, src, n);
}
