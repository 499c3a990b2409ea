"""Shared-memory-direct collectives: every rank of a one-host group works in one arena.

Instead of messages, each rank copies its contribution into its own *slot* of the group's
arena (see :mod:`collcomm.transport.arena`), the ranks meet at a counter barrier
(``sync``), and each rank reads what it needs straight from the other ranks' slots.
Buffers larger than a slot go through in *chunks*; consecutive chunks (and calls)
alternate between the two slot *phases*, so a slot is rewritten only after everybody has
passed the next sync, i.e. finished reading it. Each rank places its data at the page
offset its own buffer has (copies between different page offsets run up to 4x slower)
and announces that offset in its header word 1.

Per chunk of K bytes on n ranks:

* all_reduce, small (``arena_layout.all_reduce_one_step``: up to ``ONE_SHOT`` bytes at n = 2,
  less as n grows where every rank has a core): copy in, sync, every rank reduces all n slots
  in rank order (identical bits everywhere). 1 sync; reads n·K.
* all_reduce, large ("two-shot" = reduce-scatter + all-gather in place): copy in, sync,
  rank i reduces slice i of all slots into its own slot, sync, every rank copies each
  owner's reduced slice out. 2 syncs; copies K in, reads K + writes K/n, copies K out.
* reduce: as the large all_reduce, but only the root copies out (2 syncs).
* broadcast: the root copies in, sync, the others copy out (1 sync); large buffers in
  steps (see below), the root copying step i+1 in while the others copy step i out.
* all_gather / gather: copy in, sync, every rank (the root) copies all slots out.
* reduce_scatter: copy in the n blocks, sync, rank i reduces block i of all slots.
* scatter: the root copies in the others' n-1 blocks, sync, rank i copies block i out (the
  root copies its own block while they do).
* all_to_all(v): one sync to agree on the largest block, then rounds of: copy each
  destination's next piece to its place in the slot, sync, copy out the pieces sent to us.
* barrier: one sync.

Zero-copy: all_reduce, broadcast and all_gather/gather read a rank's buffer in place when
it lies in the shared heap (``collcomm.empty`` & co, see transport/heap.py) instead of
staging a copy; the rank announces the heap key and offset in its header words. Such a
call always takes the two-shot path and ends with one more sync, since nobody may change a
buffer that others read in place until they are done. all_reduce on shared buffers then
moves ~2K bytes per rank instead of ~3K. (An all_gather from arena.ag_vote_min bytes takes
the voted way instead, heap or not: read by CMA or staged, as rank 0 votes.)

Large one-to-many calls (broadcast, all_gather / gather, all_to_all above ``CMA_MIN``):
either staged as above or read straight from the peers' buffers by cross-memory attach
(CMA: the rank announces its buffer's address; one copy, by the reader, and one more sync
at the end). :func:`.shm_large.reads_peers` picks, the same on every rank: CMA above a quarter of
the last-level cache, and in between only where the arena measured a byte read by CMA to
cost little enough against a memcpy (``arena.cma_cost``: ~3.3 on the VM this was measured
on, where staging wins). A CMA broadcast puts the root to work too: it writes the first
1/n of its buffer into every other rank's while they read the rest (docs/large-copies.md).

Native core: when collcomm/native's C extension is built (and ``COLLCOMM_NATIVE`` is not
"0"), each collective first offers the call to it: it runs the same steps in C for
one-chunk messages that are staged (not in the shared heap, not read by cross-memory
attach) and, for the reductions, built-in ops on the numeric dtypes. Its status says
what is left: nothing; a signature or split-size mismatch to raise here; the rest of a
call in which some rank published its buffer in place (finished by the Python code,
from the same point); or the whole call, which the Python code then runs.

The code: :mod:`.shm_stage` (entering a call, publishing and reading data, the native
statuses), :mod:`.shm_reduce` (all_reduce, reduce, reduce_scatter), :mod:`.shm_move`
(broadcast, all_gather, gather), :mod:`.shm_a2a` (all_to_all(v)), :mod:`.shm_scatter` and :mod:`.shm_large`
(how large rooted and one-to-many calls go). This module is the family: its collectives are importable here as
``shm_direct.<collective>``, the very functions of those modules (the registry and the
fast call find them here by name and tell them apart by identity), and it holds
:func:`barrier` and :func:`finish_native`.
"""
from __future__ import annotations

from typing import Any

from .contract import ShmComm
from .shm_a2a import all_to_all, all_to_all_after
from .shm_move import all_gather, broadcast, broadcast_after, gather, gather_after
from .shm_large import reads_peers
from .shm_scatter import scatter, scatter_after
from .shm_reduce import all_reduce, all_reduce_after, reduce, reduce_cma_after, reduce_scatter
from .shm_stage import MISMATCH, PYTHON, REFUSE, arena_of, call_sig, enter, native_core, raise_mismatch

__all__ = ["all_gather", "all_reduce", "all_to_all", "barrier", "broadcast", "finish_native", "gather",
           "reduce", "reduce_scatter", "scatter"]


def barrier(comm: ShmComm) -> None:
    """One sync with the signature check. With more ranks than CPUs (``arena.eager``) rank
    0 arrives last, once every other rank is there (native: enter_last), so that nobody
    leaves the barrier before rank 0 runs: a call it roots next (a broadcast or scatter,
    whose receivers wait for the root alone) starts at once instead of after the root
    gets a CPU back (bench, n = 4 on 2 vCPUs, 8-64 B broadcast: 7-9 -> 1.5-2 µs)."""
    if comm.size > 1:
        arena = arena_of(comm, "barrier")
        core = native_core(arena)
        if core is not None:
            mine = call_sig(comm, "barrier", 0)
            if core.barrier(arena, mine) == MISMATCH:
                raise_mismatch(arena, mine)
            return
        enter(comm, arena, arena.next_phase(), "barrier", 0, True, arena.eager and arena.rank == 0)


def finish_native(comm: ShmComm, status: int, collective: str, *args: Any) -> None:
    """Finish a call that the native fast call (collcomm/core/fastpath.py) ran up to
    ``status``, as the collective here does after its own native call: a mismatch raised,
    a call in which some rank's buffer is read in place completed in Python, a refused
    call (nothing done yet) run whole. ``args`` are the collective's after ``comm``."""
    arena = arena_of(comm, collective)
    if status == REFUSE:
        {"all_reduce": all_reduce, "broadcast": broadcast, "all_gather": all_gather,
         "barrier": barrier, "reduce": reduce, "reduce_scatter": reduce_scatter,
         "gather": gather, "scatter": scatter, "all_to_all": all_to_all}[collective](comm, *args)
    elif collective == "all_reduce":
        all_reduce_after(comm, arena, status, comm.sig, *args)
    elif collective == "broadcast":
        broadcast_after(comm, arena, status, comm.sig, *args)
    elif collective == "all_gather":
        gather_after(comm, arena, status, comm.sig, *args)
    elif collective == "all_to_all":
        all_to_all_after(comm, arena, status, comm.sig, *args)
    elif collective == "gather":
        send, recv, root = args   # split by CMA as the fast call splits it (fastpath._rooted_cma)
        split = arena.cma_write and reads_peers(arena, "gather", send.nbytes * comm.size)
        gather_after(comm, arena, status, comm.sig, send, recv if comm.rank == root else None,
                     root if split else None)
    elif collective == "scatter":
        scatter_after(comm, arena, status, comm.sig, *args)
    elif status == MISMATCH:
        raise_mismatch(arena, comm.sig)
    elif collective == "reduce" and status == PYTHON:   # a root reduce_cma handed back
        reduce_cma_after(comm, arena, *args)
