"""The layout of a group's shared-memory arena: the one place that says where what lives.

Read by :mod:`.arena` (the barrier, the cross-memory-attach probe, clean departures), by
:mod:`collcomm.algorithms.shm_direct` (the collectives) and handed to the native core
(:mod:`collcomm.native`, as :data:`NATIVE`), so the three agree word for word.

The arena of ``n`` ranks is a header of :data:`LINE` bytes per rank (rounded up to a page)
followed by ``PHASES × n`` slots of ``slot + PAGE`` bytes; slot (phase, rank) is written
only by that rank. A rank's header line holds :data:`WORDS` 64-bit words:

====  ==========================================================================
word  meaning
====  ==========================================================================
0     the rank's arrival counter (the barrier: every rank waits until all reach it)
1, 2  per phase: the signature of the call (collcomm.algorithms.signature)
3, 4  per phase: the byte offset of the rank's data in its slot (the page offset of
      its buffer, for copies of :data:`ONE_SHOT` bytes or more), or, with 5/6 set,
      its offset in the shared heap allocation / its address (:data:`CMA`)
5, 6  per phase: the heap key of a buffer published in place, :data:`CMA` for a buffer
      read from the rank's memory by address, 0 for data staged in the slot
7     the CPU this rank last arrived on (synced), + 1 (0: not known; only the native
      core writes it): a waiter whose late peer last arrived on the waiter's CPU
      yields at once instead of spinning (the peer cannot arrive while it spins there)
8, 9  per phase: a size the rank announces (all_to_all: its largest block; rank 0's top
      two bits, from :data:`A2A_VOTE_SHIFT`: its vote, staged or by CMA, which every
      rank follows: native/_a2a_choice.c); or :data:`HOLD` | the counter value rank 0
      holds its arrival back from in a barrier until every other rank is there
      (native/_arena_sync.c, enter_last), so a wait that times out names the ranks
      missing and not rank 0
10    this rank's phase: which of the two slot sets its last call wrote (flipped by
      every call, the native core's and the Python code's alike)
11    this rank's settings, written once (:func:`pack_settings`): its :data:`ALL_REDUCE_EXTRA`
      (the ranks check they agree when the arena is built: a rank taking one step where
      another takes two would desync) and its CPU count (the group takes the fewest)
12    somebody sleeps on this rank's counter (futex): wake them when it moves
13    the rank left cleanly (destroy_process_group), not a crash
14    cross-memory-attach probe: the address of a magic word (:data:`PROBE_MAGIC`),
      then of a buffer to time reads of (Arena._time_cma)
15    cross-memory-attach probe: 1 this rank could read and write every other's
      memory, 3 only read, 2 not; then its measured read cost × 100
====  ==========================================================================

Words 0-7 are the first 64-byte cache line of the rank's 128: everything the other ranks
read in every small call (counter, signature, offset, shared key) comes with the one
line the counter brings, in either phase. The phase word, which the rank rewrites at the
end of every call, sits on the second line, which the others read only for all_to_all's
sizes, the sleepers flag and the rare departure and probe words. (With the signatures at
7/8 and the phase at 9, the second phase's signature shared a line with the phase word:
one more line moved per call in every other call.)
"""
from __future__ import annotations

import os

LINE = 128                 # header bytes per rank
WORDS = LINE // 8          # 64-bit words per rank
PHASES = 2                 # slots alternate between two phases

COUNTER = 0
SIGNATURE = 1              # + phase
OFFSET = 3                 # + phase
SHARED = 5                 # + phase
SIZE = 8                   # + phase
PHASE = 10
SLEEPERS = 12
LEFT = 13
SETTINGS = 11
PROBE = 14                 # and 15
CPU = 7

CMA = 1                    # a SHARED value: read the data at address OFFSET in the rank's memory
PROBE_MAGIC = 0x636F6C6C636F6D6D

#: Copies of this many bytes or more are placed at their buffer's page offset, and
#: all_reduce above it takes two steps (reduce-scatter + all-gather) instead of one (below
#: it too, past ALL_REDUCE_EXTRA, where every rank has a core).
ONE_SHOT = 64 << 10

#: all_to_all: rank 0's vote in the top bits of its SIZE word of the agreement phase
#: (0: none, the fixed rule; 1: staged; 2: by cross-memory attach; native/_a2a_choice.c)
A2A_VOTE_SHIFT = 62
A2A_VOTE_STAGED, A2A_VOTE_CMA = 1, 2
#: a SIZE word of ``HOLD | target``: the rank is in a barrier, waiting for every other rank
#: to reach ``target`` before it arrives there itself (no size is 2**61 bytes)
HOLD = 1 << 61

#: A staged broadcast, and a reduce between two ranks past REDUCE_PAIR_FROM, go in steps of
#: about 1/PIPE_STEPS of the buffer, none smaller than PIPE_MIN bytes (each step costs a
#: sync; 2 steps of 128 KiB measured slower than one of 256 KiB) nor larger than a slot:
#: the writer copies step i+1 in while the others read step i (shm_large.pipeline_elems;
#: the native core takes both for its reduce).
PIPE_MIN, PIPE_STEPS = 256 << 10, 8

#: all_reduce is one step (every rank reduces all n slots: it reads (n - 1) x the call's
#: bytes) or two (each rank reduces its slice of every slot, a sync, every slice copied
#: out: 2 (n - 1) / n x the bytes, one sync more). With a core per rank, one step while
#: the call is at most ONE_SHOT and what it reads beyond the two-step call, (n - 1)(n - 2)
#: / n x its bytes, is at most ALL_REDUCE_EXTRA (always at n = 2, where both read the
#: same); with more ranks than cores up to ONE_SHOT (ONE_STEP_ALWAYS): there the second
#: sync costs the context switches (n = 4 on the 2-vCPU VM, 16-64 KiB, noisy: the one step
#: 20-56 µs, the two 32-49). COLLCOMM_ALL_REDUCE_EXTRA overrides it (every rank alike:
#: Arena.check_settings). Measured 2026-11-27 (16-core Intel Xeon VM, each forced, bench,
#: two alternating rounds): the two steps overtake the one at 1-2 KiB for n = 4, ~1 KiB for
#: n = 8, ~512 B for n = 16 (extra bytes at the crossing 1.5-3, ~5, ~6.5 KiB); at n = 16
#: the one step took 1.9-5.4x the two from 4 to 64 KiB (227 / 42 µs at 64 KiB). So one step
#: up to 2.7 KiB at n = 4, 780 B at n = 8, 312 B at n = 16, 6 KiB at n = 3, 64 KiB
#: (ONE_SHOT) at n = 2.
ONE_STEP_ALWAYS = 1 << 40


def _extra_from_env(default: int) -> int:
    text = os.environ.get("COLLCOMM_ALL_REDUCE_EXTRA", "").strip()
    try:
        return min(max(int(text), 0), ONE_STEP_ALWAYS) if text else default
    except ValueError:
        import warnings
        warnings.warn(f"collcomm: COLLCOMM_ALL_REDUCE_EXTRA={text!r} is not a number of bytes; "
                      f"using {default}", RuntimeWarning, stacklevel=2)
        return default


ALL_REDUCE_EXTRA = _extra_from_env(4 << 10)


def all_reduce_one_step(nbytes: int, n: int, extra: int) -> bool:
    """Is an all_reduce chunk of ``nbytes`` over ``n`` ranks one step, the group's agreed
    ``extra`` (Arena.all_reduce_extra) given? See ALL_REDUCE_EXTRA."""
    return nbytes <= ONE_SHOT and (n - 1) * (n - 2) * nbytes <= n * extra


def pack_settings(extra: int, cpus: int) -> int:
    """Word SETTINGS: ``extra`` (< 2**41) in the low bits, ``cpus`` (< 2**20) from bit 41."""
    return min(extra, ONE_STEP_ALWAYS) | min(cpus, (1 << 20) - 1) << 41


def unpack_settings(word: int) -> tuple[int, int]:
    return word & ((1 << 41) - 1), word >> 41


#: A reduce whose n ranks' data add up to at most this many bytes is one step: every rank
#: stages its data, one sync (with the signature check), the root combines the n slots in
#: rank order, as a one-shot all_reduce does on every rank. Above, each rank reduces a
#: slice and a second sync lets the root collect the slices (the work is shared; two
#: syncs; at n=2 the two-shot reduce of 32 KiB took 19 µs against 6-11 in one step).
#: Every rank must agree on it.
REDUCE_ONE_SHOT = 64 << 10

#: A reduce between two ranks of REDUCE_CMA_MIN to REDUCE_CMA_MAX bytes a rank (within a
#: slot), where the arena reads peers by cross-memory attach, goes by it: the root reads the
#: other's buffer into its own slot and combines it with its own data into recv in one pass
#: (shm_reduce._reduce_cma). Staged, both ranks copied in, reduced half each, and the root
#: copied out, pulling lines the other core had just written. Measured 2026-11-28 (2-vCPU
#: Intel VM, two processes, numpy): 64 KiB 9.5 against 13-16 µs staged, 128 KiB 14 / 27,
#: 256 KiB 30-35 / 45-47, 512 KiB 51-56 / 81-87, 1 MiB 240-263 / 229-247 (no gain; above,
#: the pipeline: REDUCE_PAIR_FROM). Below 64 KiB too, measured 2026-11-29 (the same VM,
#: `collcomm run -n 2`, an in-place reduce to rank 0 timed 1,000 calls a block, the two
#: ways alternating in one job, medians of five blocks, µs CMA / staged in one step, two
#: jobs): 8 KiB 2.2 / 1.7, 12 KiB 2.7 / 2.4, 16 KiB 3.1 / 3.1-3.2, 24 KiB 7.8 / 9.6 (a noisy
#: job), 32 KiB 4.8-5.4 / 6.1-6.6, 48 KiB 6.4 / 11.4 (two steps there: 96 KiB of data is past
#: REDUCE_ONE_SHOT). Every rank must agree on them.
REDUCE_CMA_MIN, REDUCE_CMA_MAX = 16 << 10, 512 << 10

#: A reduce between two ranks of more bytes a rank than this (or than a slot) is pipelined
#: (shm_reduce._reduce_pair, native reduce_pair): the other rank stages a step while the
#: root folds the one before. It was so only past a slot; within one, measured 2026-11-29
#: (2-vCPU Intel VM, one job, the ways alternating, median µs, root 0, in place / out of
#: place), the pair against CMA (REDUCE_CMA_MAX raised for the test): 768 KiB 100 / 152
#: against 99 / 196, 1 MiB 121-139 / 200 against 165-197 / 229, 2 MiB 236-264 / 352 against
#: 316-411 / 405, 4 MiB 441-456 against 568-580; at 512 KiB and below CMA is as fast or
#: faster (384 KiB 62 / 66 against 39 / 45). Without cross-memory attach the pair beats the
#: two-shot call too: 768 KiB 115 / 148 against 182 / 191, 1 MiB 139 / 197 against 229 /
#: 264, 4 MiB 540 / 843 against 1056 / 1019. It must not be below REDUCE_CMA_MAX (the two
#: ways never overlap), and every rank must agree on it.
REDUCE_PAIR_FROM = 512 << 10
assert REDUCE_CMA_MAX <= REDUCE_PAIR_FROM

#: broadcast, all_gather / gather, reduce_scatter (per-rank block) and all_to_all (largest
#: block × n) read the peers' buffers by cross-memory attach only above this many bytes;
#: below they stage through the slots (one copy more, but in C: measured 1.2-3x faster
#: than the attach path at 128-256 KiB, n = 2 and 4). Every rank must agree on it.
CMA_MIN = 256 << 10

#: ... but an all_gather between two ranks reads its peer's block by cross-memory attach
#: from this many bytes (both blocks): staged, each rank copies its block into its slot
#: and into its receive buffer, then the peer's block out of the peer's slot, a cross-core
#: copy that costs about what the attach's read costs; by CMA it makes one copy and one
#: read. Measured 2026-11-29 (2-vCPU VM, the native core, µs staged / CMA, forced either
#: way): 16 KiB 3.7-3.9 / 4.1-4.3, 32 KiB 5.5 / 5.4-5.5, 64 KiB 8.4-8.9 / 6.0-7.3, 128 KiB
#: 14.6 / 9.5-12.4, 512 KiB 42-47 / 29-30 (staged there in the voted form, one sync more).
#: From VOTE_PAIR_MIN on rank 0 votes between the two (native/_a2a_choice.c).
AG_PAIR_MIN = 64 << 10


#: Rank 0 votes (native/_a2a_choice.c) on all_to_alls and all_gathers from CMA_MIN bytes
#: (all_gather: all ranks'; all_to_all: rank 0's send buffer), between two ranks only from
#: VOTE_PAIR_MIN: below it a read by CMA beat staging in both of the 2-vCPU VM's states
#: (BENCHMARKS.md session 18: staged 256 KiB all_to_all 23-24 µs in the fast state, 1 MiB
#: 51; session 22, the slow one: staged 24-27 / CMA 14-16 at 256 KiB, 44-47 / 24-26 at 512
#: KiB; CMA costs the same in both), and the vote's first tries, two calls each way,
#: picked staging at 256 KiB in some jobs and kept it (0.66-0.76x Open MPI).
VOTE_PAIR_MIN = 512 << 10


def vote_min(n: int) -> int:
    """From how many bytes rank 0 votes among ``n`` ranks (the core's ``a2a_adapt``)."""
    return VOTE_PAIR_MIN if n == 2 else CMA_MIN


def ag_vote_min(n: int, cma: bool) -> int:
    """From how many bytes (all ranks') an all_gather of n ranks takes the voted way
    (shm_move._gather_voted; the native core's _all_gather_voted.c), 0: never (no CMA).
    Never above the size from which shm_large.reads_peers reads the peers: a call it reads
    by CMA goes the voted way on every rank, the fast call's and the regular path's alike."""
    return 0 if not cma else AG_PAIR_MIN if n == 2 else CMA_MIN

#: The words the native core needs, in the order it takes them.
NATIVE = (WORDS, COUNTER, OFFSET, SIZE, SHARED, SIGNATURE, SLEEPERS, PHASE, CPU)

_used = [COUNTER, OFFSET, OFFSET + 1, SIZE, SIZE + 1, SHARED, SHARED + 1, SIGNATURE, SIGNATURE + 1,
         PHASE, SETTINGS, SLEEPERS, LEFT, PROBE, PROBE + 1, CPU]
assert len(set(_used)) == len(_used) and max(_used) < WORDS, "arena header words overlap"
