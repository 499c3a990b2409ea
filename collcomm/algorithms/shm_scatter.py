"""shm_direct's scatter: staged through the root's slot, or split by cross-memory attach.

Staged (one step per slot's worth of n blocks): the root copies the others' blocks into
its slot (row r of n rows; its own row left empty), a sync with the signature check, each
rank copies its row out while the root copies its own block; the phases alternate, so the
root stages step i+1 while the others copy step i. Split (:func:`.shm_large.rooted_split`,
where :func:`.shm_large.reads_peers` says so): every rank publishes its buffer's address,
the root writes the first part of every other rank's block into it (1/n of it, 1/(2n)
where the root also copies its own block: :func:`.shm_large.split_head`, published in the
root's SIZE word) while each reads the rest of its own, a closing sync. Both first go to the native core (native/_scatter.c,
the same steps and syncs), which a rank may refuse: it then runs them here.
"""
from __future__ import annotations

import numpy as np

from ..transport.arena_layout import CMA
from ..transport.arena_layout import SHARED as SHARED_WORD
from .contract import Arena, ShmComm
from .shm_large import publish_split_head, reads_peers, rooted_split
from .shm_stage import MISMATCH, PYTHON, REFUSE, arena_of, call_sig, chunk_elems, enter, native_core, publish, raise_mismatch


def scatter(comm: ShmComm, send: np.ndarray | None, recv: np.ndarray, root: int) -> None:
    n, me, k = comm.size, comm.rank, recv.size
    if n == 1 or k == 0:
        _scatter_own(send, recv, me, root, k)
        return
    arena = arena_of(comm, "scatter")
    dt = recv.dtype
    mine_buf = send if me == root else recv     # what this rank publishes when split
    split = reads_peers(arena, "scatter", n * k * dt.itemsize)
    step = chunk_elems(arena, dt.itemsize, n)   # elements of each block per staged step
    core = native_core(arena)
    if core is not None and (not split or arena.cma_write):
        mine = call_sig(comm, "scatter", k)
        if split:
            status = core.scatter(arena, send if me == root else None, recv, root, mine, dt.itemsize,
                                  CMA, arena.pids)
        elif k <= step:   # one step (the form the fast call takes)
            status = core.scatter(arena, send if me == root else None, recv, root, mine)
        else:
            status = core.scatter(arena, send if me == root else None, recv, root, mine, step * dt.itemsize)
        if status != REFUSE:
            scatter_after(comm, arena, status, mine, send, recv, root)
            return
    if split:
        phase = arena.next_phase()
        publish(arena, phase, mine_buf, None, 0, True)
        if me == root:   # our share of the others' blocks (split_head), for every rank
            assert send is not None
            apart = not np.shares_memory(send[me * k:(me + 1) * k], recv)
            publish_split_head(arena, phase, k, apart, dt.itemsize)
        enter(comm, arena, phase, "scatter", k, True)
        _scatter_split_end(comm, arena, phase, mine_buf, send, recv, root)
        return
    for lo in range(0, k, step):
        count = min(step, k - lo)
        phase = arena.next_phase()
        if me == root:        # the others' blocks only: nobody reads the root's row
            assert send is not None
            arena.put(SHARED_WORD + phase, 0)    # staged (an earlier call's word may say 1)
            staged = arena.slot_array(phase, me, dt, n * count).reshape(n, count)
            blocks = send.reshape(n, k)
            if me:
                np.copyto(staged[:me], blocks[:me, lo:lo + count])
            if me + 1 < n:
                np.copyto(staged[me + 1:], blocks[me + 1:, lo:lo + count])
        enter(comm, arena, phase, "scatter", k, True)   # every step, as each native step does
        if me != root:
            np.copyto(recv[lo:lo + count], arena.slot_array(phase, root, dt, n * count).reshape(n, count)[me])
    _scatter_own(send, recv, me, root, k)   # while the others copy their last step out


def scatter_after(comm: ShmComm, arena: Arena, status: int, mine: int, send: np.ndarray | None,
                  recv: np.ndarray, root: int) -> None:
    """The rest of a scatter the native core (or the fast call) returned ``status`` for
    (not REFUSE): a mismatch raised; a split one whose transfers are to finish here."""
    if status == MISMATCH:
        raise_mismatch(arena, mine)
    if status == PYTHON:   # a peer's buffer not published by address, or a transfer to redo
        _scatter_split_end(comm, arena, arena.phase, send if comm.rank == root else recv, send, recv, root)


def _scatter_split_end(comm: ShmComm, arena: Arena, phase: int, mine: np.ndarray, send: np.ndarray | None,
                       recv: np.ndarray, root: int) -> None:
    """A scatter split by CMA past its first sync (every rank published its buffer's
    address: ``mine``): the transfers (rooted_split), the root's own block, the closing sync."""
    rooted_split(comm, arena, phase, "scatter", mine, root)
    _scatter_own(send, recv, comm.rank, root, recv.size)
    arena.sync()


def _scatter_own(send: np.ndarray | None, recv: np.ndarray, me: int, root: int, k: int) -> None:
    """The root's own block of a scatter into its ``recv`` (unless it is already there)."""
    if me == root and send is not None and k:
        own = send[me * k:(me + 1) * k]
        if not np.shares_memory(own, recv):
            np.copyto(recv, own)
