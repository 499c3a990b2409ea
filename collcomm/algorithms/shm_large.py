"""Large one-to-many calls on the arena: how shm_direct moves them, and which way.

broadcast, all_gather / gather, scatter and all_to_all above ``CMA_MIN`` go one of two ways:

* **staged** through the arena's slots, as every smaller call: the writer copies in, the
  readers copy out (two memcpys per byte, on different cores). A broadcast goes in steps
  (:func:`pipeline_elems`), all in one native call, so the root copies step i+1 in while
  the others copy step i out;
* **read by cross-memory attach** (CMA): each rank announces its buffer's address and the
  readers copy straight out of it (one ``process_vm_readv`` per byte), one more sync at the
  end; a broadcast, scatter or gather puts the root to work too (:func:`rooted_split`).

:func:`reads_peers` picks, the same on every rank, from the call's size, the last-level
cache and ``arena.cma_cost`` (a CMA byte in memcpy'd bytes, measured when the arena is
built; see transport/arena.py). Where it was measured (2-vCPU VM, CMA 3.2-3.4x a memcpy)
staging wins from 256 KiB up to a quarter of the cache, except a broadcast or scatter at n = 2,
which goes split by CMA (see BCAST_STAGED), and a gather, which goes split from 64 KiB between
two ranks and past 256 KiB among more (see GATHER_STAGED); between two ranks an all_gather
reads the peer from 64 KiB (arena_layout.AG_PAIR_MIN) and an all_to_all from a 32 KiB
block (A2A_PAIR_BLOCK), below CMA_MIN too, whatever the cost says; and among more ranks than
cores a scatter splits from 1 MiB (SCATTER_SPLIT); docs/large-copies.md has the measurements.
With a core for every rank (:func:`core_each`) the parallel reads
change the sums: large scatters and gathers go split, all_to_all past one slot by CMA
(ROOTED_PARALLEL and a2a_cma_limit; measured on a 16-core VM).
"""
from __future__ import annotations

import functools
import glob
import os

import numpy as np

from ..errors import CollcommError
from ..transport.arena_layout import AG_PAIR_MIN, CMA, CMA_MIN, PIPE_MIN, PIPE_STEPS
from ..transport.arena_layout import OFFSET as OFFSET_WORD
from ..transport.arena_layout import SHARED as SHARED_WORD
from ..transport.arena_layout import SIZE as SIZE_WORD
from .contract import Arena, ShmComm
from .shm_stage import read_peer


#: Above this many times the last-level cache (the call's bytes: see reads_peers), large
#: one-to-many calls read the peers by cross-memory attach whatever it costs per byte:
#: the ranks' buffers and slots (3-4x the call's bytes) no longer fit the cache, a byte
#: read by CMA then costs about what a memcpy'd one does, and staging's extra copy goes
#: to memory. Measured (n = 2, 32 MiB L3, settings interleaved in one job): staging won
#: everywhere at 1-4 MiB (all_gather 1.3-3.5x, all_to_all 1.2-2x); broadcast by CMA split
#: between root and reader won at 16-64 MiB; at 16-64 MiB all_gather and all_to_all went
#: either way from run to run (load 2-5).
#: What a byte of a staged broadcast costs its busiest rank (a reader), in memcpy'd
#: bytes, against the split CMA broadcast's c·(n-1)/n (reads_peers). Not 1: the reader
#: copies out of slots the root's core has just written, and every step is a sync of all
#: ranks, which waits on the slowest. Measured (2-vCPU VM, c = 3.2-3.4, interleaved in one
#: job, docs/large-copies.md): at n = 2 (c·(n-1)/n ≈ 1.65) the split broadcast took
#: 0.4-0.55x the staged time from 512 KiB to 4 MiB; at n = 3 and 4 (2.2, 2.5) staged was
#: 1.5-1.8x faster at 1 MiB and level at 4 MiB.
BCAST_STAGED = 2.0
#: ... and at n = 2, where the split is one transfer each way at once, the root writing half
#: the buffer while the other rank reads the other half. Measured 2026-11-26 (2-vCPU VM,
#: c measured 3.3-4.2 from job to job, docs/large-copies.md): the split took 0.35-0.5x
#: the best staged step size at 256 KiB - 1 MiB in most runs, 1.25-1.7x in the others (the
#: staged copies then ran 3x faster: both vCPUs apparently on one core); with 2.0 here a
#: job that measured c = 4.2 staged its 1 MiB broadcasts, 2x slower than its neighbours.
BCAST_PAIR = 3.0

#: ... and at n = 2 (with writes) a broadcast splits from this many bytes, below CMA_MIN:
#: the staged call's two copies run one after the other (the root's in, then the reader's
#: cross-core copy out), the split's two halves at once. Measured through the fast call
#: 2026-11-29 (2-vCPU VM, bench, two jobs each forced either way by COLLCOMM_CMA_COST, µs
#: staged / split): 8 KiB 3.7-4.4 / 5.8-6.1, 16 KiB 5.7-6.2 / 4.9-5.6, 32 KiB 8.3-10.0 /
#: 4.9-5.1, 64 KiB 13.4-14.1 / 6.9-7.5 (session 12, on the regular path: from 64 KiB).
#: A scatter between two ranks likewise from SCATTER_PAIR_MIN (the same runs, all ranks'
#: bytes: 16 KiB 3.5-3.6 / 4.1-5.2, 32 KiB 4.9-5.4 / 4.6-5.4, 64 KiB 7.6-10.5 / 6.0-6.4,
#: 128 KiB 14-17 / 9-10.6; session 12: from 128 KiB), and a gather from GATHER_PAIR_MIN
#: (2026-11-29 likewise, since the fast call splits a gather itself: 32 KiB 5.4-5.7 /
#: 4.8-6.6, 64 KiB 9.0-10.5 / 5.8-6.6, 128 KiB 14-19 / 8.3-8.6, 256 KiB 24-30 / 13,
#: 512 KiB 42-44 / 21-22). all_gather: from arena_layout.AG_PAIR_MIN, whatever c is.
BCAST_PAIR_MIN, SCATTER_PAIR_MIN, GATHER_PAIR_MIN = 16 << 10, 64 << 10, 64 << 10
PAIR_MIN = {"broadcast": BCAST_PAIR_MIN, "scatter": SCATTER_PAIR_MIN, "gather": GATHER_PAIR_MIN}

#: A gather splits by CMA where c·(n-1) < GATHER_STAGED·n (a scatter goes as a broadcast:
#: BCAST_PAIR, BCAST_STAGED), but with a core for every rank below ROOTED_PARALLEL, where
#: c·(n-1) < n (see there). Staged, the others copy their blocks in, a sync, then the root
#: copies n-1 blocks out; split, the root's reads and the others' writes run at once, and
#: the call is one native step, not a pipeline of synced ones: it won by far more than the
#: bytes moved say. Measured 2026-11-29 (2-vCPU VM, the fast call, c measured 2.7-4.2 from
#: job to job, forced either way, µs staged / split, all ranks' bytes): n = 2 1 MiB 84-90 /
#: 42-53, 2 MiB 236-237 / 159-173, 8 MiB 881-892 / 689-788; n = 3 512 KiB 70 / 39, 1 MiB
#: 171 / 63, 8 MiB 948 / 652; n = 4 (two ranks a core) 512 KiB 79 / 56, 1 MiB 133 / 100,
#: 4 MiB 675 / 385. (Session 8's 1.0 was measured when a split gather was no fast call: it
#: paid ~80 Python calls, and lost.)
GATHER_STAGED = 4.0

#: With a core for every rank (3 <= n <= arena.cores), a scatter (with writes or not: without,
#: each rank reads its whole block) or a gather (with writes) of at least
#: ROOTED_PARALLEL bytes goes split wherever a byte read by CMA costs less than n memcpy'd
#: bytes: staged, the root alone copies the others' (n-1) blocks in (scatter) or out
#: (gather); split, every rank moves about c/n of a block, all at once (rooted_split). The
#: rules above were measured with two ranks per core, where the split runs no faster.
#: Measured 2026-11-27 (16-core Intel Xeon VM, c = 3.4-3.8, forced by COLLCOMM_CMA_COST,
#: bench, one job per setting): split vs staged at n = 8 / 16, 2-32 MiB: scatter 0.23-0.40x
#: / 0.11-0.28x the staged time, gather 0.26-0.77x / 0.16-0.64x; at 512 KiB scatter level,
#: gather 2.1-2.5x slower (a CMA call per peer costs more than the root's small copies).
ROOTED_PARALLEL = 2 << 20

#: A scatter with writes of at least SCATTER_SPLIT bytes among more ranks than cores (n >= 3)
#: splits whatever c: staged, the root copies the n-1 blocks in alone while the others
#: wait for each step, and c, probed on cached data, overstates what a read costs once the
#: blocks leave the per-core cache; the rules above kept it staged where ranks share cores
#: (c·(n-1) >= BCAST_STAGED·n). Measured 2026-11-29 (2-vCPU Intel VM, 2 MiB L2 a core,
#: a 300 MiB L3 shared with the host's other tenants; c = 3.14; bench, jobs splitting and
#: staging alternating, µs split / staged): n = 4: 512 KiB 36-54 / 46-55, 1 MiB 65-94 /
#: 67-137, 2 MiB 144-234 / 152-376, 4 MiB 316-320 / 473-607, 8 MiB 684-711 / 706-1,070
#: (that 706: a job whose probe measured a c low enough to split), 32 MiB 1,950-2,063 /
#: 2,517-4,105; n = 3: 512 KiB 39-57 / 37-56, 1 MiB 94-138 / 79-139, 2 MiB 123-330 /
#: 173-328, 4 MiB 277-280 / 562-585, 8 MiB 575-642 / 1,014-1,073, 32 MiB 2,214-2,284 /
#: 4,468-4,554. (With a core per rank, 2-32 MiB at n = 8 and 16 split took 0.1-0.4x the
#: staged time, level at 512 KiB: ROOTED_PARALLEL above.)
SCATTER_SPLIT = 1 << 20

STAGE_MAX = {"broadcast": 0.25, "gather": 0.25, "all_gather": 0.25, "all_to_all": 0.25, "scatter": 0.25}


@functools.lru_cache(maxsize=1)
def llc_bytes() -> int:
    """This host's last-level cache (bytes; 32 MiB when sysfs does not say)."""
    best = 0
    try:
        for index in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*"):
            with open(os.path.join(index, "size")) as fh:
                text = fh.read().strip().upper()
            scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
            best = max(best, int(text.rstrip("KMG")) * scale)
    except (OSError, ValueError):
        best = 0
    return best or 32 << 20


def reads_peers(arena: Arena, collective: str, nbytes: int) -> bool:
    """Does a ``collective`` call of ``nbytes`` (broadcast: the buffer; all_gather / gather /
    scatter: all ranks' blocks together; all_to_all: n x the largest block) read the peers' buffers
    by cross-memory attach (one copy, by the reader) rather than stage them through the
    slots (a memcpy in by the writer, one out by the reader)? Every rank decides alike:
    the inputs are the same everywhere.

    Not below CMA_MIN bytes (PAIR_MIN for a broadcast, scatter or gather between two ranks
    that may write each other's memory; an all_gather between two ranks: from AG_PAIR_MIN,
    always), nor at CMA_MIN but for a broadcast (staging in C is faster
    there; a split broadcast of 256 KiB measured faster than one staged chunk); always above STAGE_MAX
    x the last-level cache; in between by ``arena.cma_cost``, what a byte read from a peer
    costs in memcpy'd bytes (measured when the arena is built), counting the bytes the
    busiest rank copies, n ranks:

    * broadcast, split (every rank may write every other's memory, ``arena.cma_write``):
      the root writes (n-1)·B/n, each reader reads (n-1)·B/n, so the busiest rank moves
      c·(n-1)·B/n by CMA; staged, each reader copies B out of the root's slots, data the
      root's core has just written, in a pipeline whose every step is a sync of all
      ranks: CMA if c·(n-1)/n < BCAST_STAGED (see there; BCAST_PAIR at n = 2);
    * scatter (the root's buffer: n blocks of B), split likewise (:func:`rooted_split`):
      the root writes 1/n of every other block (1/(2n) since session 25 where it also
      copies its own: :func:`split_head`; these rules were measured with 1/n), each rank
      reads the rest of its own; the same rule as a broadcast (measured alike: see
      GATHER_STAGED);
    * gather, split: each rank writes (n-1)/n of its block into the root's buffer, the
      root reads the rest of every block: CMA if c·(n-1) < GATHER_STAGED·n (staged, the
      ranks copy their blocks in at once, then the root copies them out; see there), with
      a core for every rank below ROOTED_PARALLEL if c·(n-1) < n;
    * broadcast, scatter and gather without writes: the readers (the root of a gather)
      copy (n-1)·c·B by CMA, or B per reader and per writer with staging (the root's copy
      in overlaps the others' copy out): CMA if c ≤ 1;
    * scatter (with or without writes) and gather (with writes) with a core for every
      rank, from ROOTED_PARALLEL bytes: the staged root copies (n-1) blocks alone, the
      split ranks about c/n of a block each at once: CMA if c < n;
    * scatter with writes among more ranks than cores (n >= 3), from SCATTER_SPLIT
      bytes: split, whatever c;
    * all_gather: 1 + (n-1)·c blocks by CMA, or n + 1 staged (own, in, n-1 out):
      CMA if c·(n-1) < n; between two ranks from AG_PAIR_MIN whatever c is (the staged
      copy out of the peer's slot is cross-core, which the probe's c, a read against a
      hot local copy, leaves out: see arena_layout.AG_PAIR_MIN);
    * all_to_all: 1 + (n-1)·c blocks by CMA, or 2n - 1 staged: CMA if c < 2 (between two
      ranks a2a_cma_limit reads from A2A_PAIR_BLOCK instead, whatever c is).

    c is ~1 on most hosts; ~3.3 on the 2-vCPU VM this was measured on (process_vm_readv
    at 7-10 GB/s against memcpy at 25-33 GB/s for data in the cache), where staging wins
    until the data leaves the cache."""
    if not arena.cma:
        return False
    if collective == "all_gather" and arena.n == 2:   # (a read each: no writes needed)
        return nbytes >= AG_PAIR_MIN
    pair = arena.n == 2 and arena.cma_write and collective in PAIR_MIN   # (then BCAST_PAIR below)
    if pair:
        if nbytes < PAIR_MIN[collective]:
            return False
    elif nbytes < CMA_MIN or (nbytes == CMA_MIN and collective != "broadcast"):
        return False
    if nbytes > STAGE_MAX[collective] * llc_bytes():
        return True
    if collective == "scatter" and arena.cma_write and arena.n > max(arena.cores, 2) \
            and nbytes >= SCATTER_SPLIT:
        return True
    cost = arena.cma_cost
    if (collective == "scatter" or (collective == "gather" and arena.cma_write)) \
            and core_each(arena) and nbytes >= ROOTED_PARALLEL:
        return cost < arena.n
    if collective in ("broadcast", "scatter") and arena.cma_write:
        return cost * (arena.n - 1) < (BCAST_PAIR if arena.n == 2 else BCAST_STAGED) * arena.n
    if collective == "gather" and arena.cma_write:
        return cost * (arena.n - 1) < (1.0 if core_each(arena) else GATHER_STAGED) * arena.n
    if collective in ("broadcast", "gather", "scatter"):
        return cost <= 1.0
    if collective == "all_gather":
        return cost * (arena.n - 1) < arena.n
    return cost < 2.0


def core_each(arena: Arena) -> bool:
    """Do three or more ranks have a core each (``arena.cores``, agreed), so that copies
    split among them run at once?"""
    return 3 <= arena.n <= arena.cores


def split_from(arena: Arena, collective: str) -> int:
    """The fewest bytes from which :func:`reads_peers` reads the peers for ``collective``
    (it does for every larger size too), 0 if it never does: the staged calls stop below
    it (the fast call's limits, core/fastpath.py)."""
    for nbytes in sorted((*PAIR_MIN.values(), CMA_MIN, CMA_MIN + 1, ROOTED_PARALLEL, SCATTER_SPLIT,
                          int(STAGE_MAX[collective] * llc_bytes()) + 1)):
        if reads_peers(arena, collective, nbytes):
            return nbytes
    return 0


#: An all_to_all between two ranks reads its block from the peer by CMA from this many
#: bytes (the block; a call whose whole send buffer fits ONE_SHOT, 64 KiB, is eager: one
#: step, the data staged with the split sizes), for the reason an all_gather does
#: (arena_layout.AG_PAIR_MIN: staged, the copy out of the peer's slot is cross-core too).
#: Measured 2026-11-29 (2-vCPU VM, the fast call, Fast.a2a_cma pinned either way,
#: COLLCOMM_VOTE=0, medians of 1,500 calls, two passes, µs staged / CMA, sizes of one
#: rank's send buffer): 128 KiB 14.0-14.5 / 9.9-11.5, 256 KiB 24-27 / 14-16,
#: 512 KiB 44-47 / 24-26 (Open MPI 9.9-12.7, 14.5-21, 27-40 in other runs that day).
#: From arena_layout.vote_min(2) = 512 KiB (a rank's send bytes) rank 0 votes.
A2A_PAIR_BLOCK = 32 << 10


def a2a_cma_limit(arena: Arena) -> int:
    """all_to_all reads by CMA when the largest block of any rank (bytes) exceeds this
    (the native core's ``cma_limit``; -1: never): see reads_peers; between two ranks from
    A2A_PAIR_BLOCK (see there), whatever a CMA byte costs. With a core for every rank also
    once a rank's data (n x the largest block) outgrows its slot, whatever a CMA byte
    costs: staged, such a call takes several steps, each a sync of all ranks waiting on
    the slowest; by CMA every rank reads its n-1 blocks and syncs once. Measured
    2026-11-27 (16-core Intel Xeon VM, c = 3.4-3.8, forced by COLLCOMM_CMA_COST): CMA vs
    staged at n = 8 / 16: 8 MiB a rank 0.59x / 0.45x the staged time, 32 MiB 0.91x /
    0.68x; 2 MiB (one slot step) 1.23x / 0.96x, 512 KiB 1.7x / 1.4x."""
    if not arena.cma:
        return -1
    n = arena.n
    if n == 2:      # as an all_gather between two ranks (A2A_PAIR_BLOCK), whatever c is
        return A2A_PAIR_BLOCK - 1
    if reads_peers(arena, "all_to_all", CMA_MIN + 1):
        return CMA_MIN // n
    limit = int(STAGE_MAX["all_to_all"] * llc_bytes()) // n
    if core_each(arena):
        limit = min(limit, max(arena.slot, CMA_MIN) // n)
    return limit


def pipeline_elems(arena: Arena, buf: np.ndarray) -> int:
    """Elements per step of a staged broadcast (see PIPE_STEPS)."""
    step = min(arena.slot, max(PIPE_MIN, buf.nbytes // PIPE_STEPS))
    return max(1, step // buf.dtype.itemsize)


def split_head(elems: int, n: int, root_copies_own: bool) -> int:
    """How many elements of each other rank's block the root of a split scatter or gather
    moves itself (:func:`rooted_split`; the root publishes it in its SIZE word of the
    call's phase, so every rank, native or Python, uses the root's number): 1/n of the
    block, or 1/(2n) when the root also copies its own block (out of place), which is about
    another reader's share (a read by CMA costs more than the root's memcpy, c > 1). Measured
    2026-11-29 (2-vCPU Intel VM, n = 2, out of place, bench, the root's share forced, two
    jobs each, µs at 1/2 / 1/4 / 1/8 of the block): scatter 4 MiB 326-345 / 246-362 /
    234-285, 16 MiB 1,244-1,292 / 1,035-1,190 / 832-1,045, 64 MiB 8,526-9,501 / 5,567-7,805 /
    5,402-6,230; gather 4 MiB 346-379 / 330-343 / 228-251, 16 MiB 1,204-1,243 / 967-1,331 /
    882-1,022, 64 MiB 7,909-8,549 / 5,458-7,187 / 5,400-6,008. (1/8 measured as good or
    better there; 1/(2n) follows the balance of the root's memcpy against a read at c ~ 2
    past the cache, for every n; n = 4 measured in one job only.)"""
    return elems // (2 * n) if root_copies_own else elems // n


def publish_split_head(arena: Arena, phase: int, elems: int, root_copies_own: bool, itemsize: int) -> None:
    """The root of a split scatter or gather, before the call's first sync: its share
    (:func:`split_head`, in bytes) in its SIZE word of ``phase``, which every rank's
    :func:`rooted_split` (and the native core's rooted_cma) reads."""
    arena.put(SIZE_WORD + phase, split_head(elems, arena.n, root_copies_own) * itemsize)


def rooted_split(comm: ShmComm, arena: Arena, phase: int, mode: str, buf: np.ndarray, root: int) -> None:
    """A rooted call by cross-memory attach with the root at work too (``mode``: broadcast,
    scatter or gather; a broadcast or gather only where every rank may write every other's
    memory, ``arena.cma_write``: a scatter without it has each rank read its block). Every rank
    has published its buffer's address (``buf``: the root's whole buffer, or this rank's
    block; a broadcast's is the whole buffer everywhere); for each rank r but the root, the
    first 1/n of r's block (a scatter's or gather's: the root's published
    :func:`split_head`) moves by the root (broadcast, scatter: written into r's buffer;
    gather: read from it) and the rest by r (read from the root's buffer; gather: written
    into it). A gather peer whose buffer is published in place (shared heap) is read whole
    by the root instead. The caller's closing sync keeps every buffer untouched until all
    are done. (n = 2: each rank moves half; a broadcast measured 1.3-1.6x faster than the
    receiver reading it all, 4-64 MiB.) The native core's rooted_cma does the same."""
    n, me = arena.n, arena.rank
    per_rank = mode != "broadcast"
    block = buf.size // n if per_rank and me == root else buf.size
    item = buf.dtype.itemsize
    # without writes (scatter only), each rank reads its whole block itself
    head = 0 if not arena.cma_write else block // n if not per_rank else arena.get(root, SIZE_WORD + phase)
    if per_rank and arena.cma_write:
        if head % item or head // item > block:
            raise CollcommError(f"rank {me}: the root's share of a split {mode} ({head} bytes) "
                                f"does not fit a block of {block} elements: ranks running "
                                "different collcomm versions?")
        head //= item
    if me == root:
        for i in range(1, n):
            r = (root + i) % n
            at = r * block if per_rank else 0
            if mode != "gather":
                address = arena.get(r, OFFSET_WORD + phase)
                arena.write_remote(r, address, buf[at:at + head])
            else:   # r's head (r's send buffer in the shared heap: all of it, in place)
                whole = arena.get(r, SHARED_WORD + phase) != CMA
                read_peer(comm, arena, phase, r, buf.dtype, block, 0, buf[at:at + (block if whole else head)])
    elif mode != "gather" or arena.get(me, SHARED_WORD + phase) == CMA:
        address = arena.get(root, OFFSET_WORD + phase) + ((me * block if per_rank else 0) + head) * item
        if mode == "gather":
            arena.write_remote(root, address, buf[head:])
        else:
            arena.read_remote(root, address, buf[head:])
