/* Moving bytes to or from a peer process by cross-memory attach: ``cma_move``
 * (process_vm_readv / process_vm_writev), for every native transfer by CMA (lent
 * point-to-point reads, all_gather and all_to_all by CMA, the split broadcast, scatter and
 * gather, reduce between two ranks). Included by _shmcore.c after _stage_nt.c (vec_copy,
 * nt_copy), before _cma.c.
 *
 * The kernel copies such a transfer with ``rep movsb``, which some CPUs run 4-5x slower
 * when the destination lies a few bytes past the source modulo 4 KiB: on the 2-vCPU AMD
 * EPYC (Zen 3) VM of BENCHMARKS.md (session 30), 1 MiB read with the destination 1-31
 * bytes past the source mod 4096 took 560-630 µs, at 0 or 32 and up 110-135 (memcpy:
 * 35-50 either way). Ranks that allocate alike meet it all the time: a receive buffer
 * allocated right after a send buffer of the same size lies the allocator's 16-byte
 * header past the peer's send buffer, page for page (the bench's second sendrecv cell:
 * 742 µs against the first's 158). Where the CPU is slow so (cma_band_slow: timed once a
 * process, at its first such transfer, or COLLCOMM_CMA_BOUNCE=1/0), a transfer of 4 KiB or
 * more at a distance of 1-63 bytes (the measured 1-31, and a cache line on CPUs where it
 * is that wide) goes through a bounce buffer placed at the remote address's offset in its
 * page (the kernel copies at distance 0), 124 KiB a step, with a vector loop between it
 * and the caller's memory (vec_copy: glibc's memcpy would take rep movsb again at these
 * sizes); a read of COLLCOMM_COPY_NT_MIN bytes or more (cma_nt_min: 4 MiB by default)
 * ends in streamed stores instead, as a rank's own block does (out_copy). Measured there,
 * a lent 1 / 4 / 16 MiB exchange 16 bytes off: 188 / 625 / 2,231 µs (direct: ~600-880 at
 * 1 MiB); 64 bytes off, direct: 144 / 419 / 2,430. The bounce buffer (132 KiB) is a
 * thread's own (these run without the GIL), made at its first such transfer and kept.
 */
#include <sys/uio.h>

#define CMA_SLOW_BAND 64
/* a core's L2 holds it: 1 MiB read through 64 / 128 / 256 KiB took 224-260 / 202-226 /
 * 275-280 µs */
#define CMA_BOUNCE ((Py_ssize_t)128 << 10)
#define CMA_PROBE ((Py_ssize_t)256 << 10)

static unsigned long long cma_bounced;     /* transfers that went through it (tests) */
static int cma_band_slow = -1;             /* 1 bounce, 0 not, -1 not timed yet */
static Py_ssize_t cma_nt_min = (Py_ssize_t)4 << 20;   /* Core_init sets the process's
                                                         out_nt_min (COLLCOMM_COPY_NT_MIN) */

/* Move `len` bytes between `local` and `remote` in process `pid` (process_vm_readv, or
 * process_vm_writev if `write`), looping over partial transfers, as given: 0, or -1. */
static int cma_move_direct(pid_t pid, char *local, uint64_t remote, Py_ssize_t len, int write)
{
    Py_ssize_t done = 0;
    while (done < len) {
        struct iovec l = {local + done, (size_t)(len - done)};
        struct iovec r = {(void *)(uintptr_t)(remote + (uint64_t)done), (size_t)(len - done)};
        ssize_t got = write ? process_vm_writev(pid, &l, 1, &r, 1, 0)
                            : process_vm_readv(pid, &l, 1, &r, 1, 0);
        if (got <= 0)
            return -1;
        done += got;
    }
    return 0;
}

/* Is the destination 1-63 bytes past the source, modulo 4 KiB? (The remote address keeps
 * its page offset in the kernel's mapping of it.) */
static int cma_slow_distance(const char *local, uint64_t remote, int write)
{
    uint64_t src = write ? (uint64_t)(uintptr_t)local : remote;
    uint64_t dst = write ? remote : (uint64_t)(uintptr_t)local;
    uint64_t d = (dst - src) & 4095;
    return d != 0 && d < CMA_SLOW_BAND;
}

/* Read `n` bytes of our own memory at `src` into `dst` as a peer's would be read. */
static int cma_self_read(char *dst, const char *src, Py_ssize_t n)
{
    return cma_move_direct(getpid(), dst, (uint64_t)(uintptr_t)src, n, 0);
}

/* Does this CPU run a transfer 16 bytes off 1.5x slower than one at distance 0?
 * (COLLCOMM_CMA_BOUNCE=1 / 0 says so instead; band_slow_probe, _copy_near.c.) */
static int cma_band_probe(void)
{
    return band_slow_probe("COLLCOMM_CMA_BOUNCE", CMA_PROBE, cma_self_read);
}

static int cma_move(pid_t pid, char *local, uint64_t remote, Py_ssize_t len, int write)
{
    if (len < 4096 || !cma_slow_distance(local, remote, write))
        return cma_move_direct(pid, local, remote, len, write);
    int slow = __atomic_load_n(&cma_band_slow, __ATOMIC_RELAXED);
    if (slow < 0) {                          /* (two threads may both time it: harmless) */
        slow = cma_band_probe();
        __atomic_store_n(&cma_band_slow, slow, __ATOMIC_RELAXED);
    }
    static __thread char *bounce;            /* (a thread's own: calls run without the GIL) */
    if (!slow || (bounce == NULL && (bounce = malloc((size_t)CMA_BOUNCE + 4096)) == NULL))
        return cma_move_direct(pid, local, remote, len, write);
    char *base = (char *)(((uintptr_t)bounce + 4095) & ~(uintptr_t)4095);
    int stream = !write && cma_nt_min > 0 && len >= cma_nt_min;
    __atomic_fetch_add(&cma_bounced, 1, __ATOMIC_RELAXED);
    for (Py_ssize_t done = 0; done < len;) {
        uint64_t at = remote + (uint64_t)done;
        Py_ssize_t step = len - done < CMA_BOUNCE - 4096 ? len - done : CMA_BOUNCE - 4096;
        char *mid = base + (at & 4095);
        if (write)
            vec_copy(mid, local + done, step);
        if (cma_move_direct(pid, mid, at, step, write) < 0)
            return -1;
        if (stream)
            nt_copy(local + done, mid, step);    /* (past the caches: no read for ownership) */
        else if (!write)
            vec_copy(local + done, mid, step);
        done += step;
    }
    return 0;
}

/* cma_bounces() -> (transfers that went through the bounce buffer, whether this CPU needs
 * it: 1, 0, or -1 not timed yet) (tests) */
static PyObject *mod_cma_bounces(PyObject *module, PyObject *unused)
{
    return Py_BuildValue("(Ki)", __atomic_load_n(&cma_bounced, __ATOMIC_RELAXED),
                         __atomic_load_n(&cma_band_slow, __ATOMIC_RELAXED));
}
