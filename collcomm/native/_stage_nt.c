/* Large copies written with streaming (non-temporal) stores: staged copies when asked
 * (COLLCOMM_STAGE_NT=1; plain stores by default), and a rank's own block copied into its
 * output from c->out_nt_min bytes (COLLCOMM_COPY_NT_MIN, 4 MiB by default; out_copy below).
 *
 * Included by _shmcore.c (after _copy_near.c, before _call.c, whose stage() writes
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

#define NT_MIN ((Py_ssize_t)64 << 10)

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
 * Below it near_copy; overlapping blocks (an in-place call) are moved with memmove. */
static void out_copy(Core *c, char *dst, const char *src, Py_ssize_t n)
{
    int apart = dst + n <= src || src + n <= dst;
    if (apart && c->out_nt_min > 0 && n >= c->out_nt_min)
        c->out_streamed += nt_copy(dst, src, n);
    else if (apart)
        near_copy(dst, src, n);
    else if (dst != src)
        memmove(dst, src, (size_t)n);
}

/* Write a staged copy, streamed when the core is told to and it is large enough. */
static void staged_copy(Core *c, char *dst, const char *src, Py_ssize_t n)
{
    if (c->stage_nt && n >= NT_MIN)
        c->streamed += nt_copy(dst, src, n);
    else
        near_copy(dst, src, n);
}
