"""shm_direct's data moves: broadcast, all_gather / gather (all_to_all(v):
:mod:`.shm_a2a`; scatter: :mod:`.shm_scatter`).

The steps (see :mod:`.shm_direct` for the whole family): the writer publishes its data
(:func:`.shm_stage.publish`: staged in its slot, in place in the shared heap, or by
address), a sync, the readers copy out what is theirs. A staged broadcast goes in steps,
the root copying step i+1 in while the others copy step i out; large one-to-many calls
may instead read the peers' buffers by cross-memory attach (:mod:`.shm_large` picks, and
splits a broadcast between the root and the readers). Each first offers the call to the
native core.
"""
from __future__ import annotations

import numpy as np

from ..transport.arena_layout import CMA
from ..transport.arena_layout import OFFSET as OFFSET_WORD
from ..transport.arena_layout import SHARED as SHARED_WORD
from ..transport.arena_layout import A2A_VOTE_CMA, A2A_VOTE_SHIFT, A2A_VOTE_STAGED
from ..transport.arena_layout import SIZE as SIZE_WORD
from .contract import Arena, ShmComm
from .shm_large import pipeline_elems, publish_split_head, reads_peers, rooted_split
from .shm_stage import (
    MISMATCH, PYTHON, REFUSE, any_in_place, arena_of, call_sig, chunk_elems, enter,
    heap_location, native_core, peer_slot, peers_from_next, publish, raise_mismatch, read_peer,
)


def broadcast(comm: ShmComm, buf: np.ndarray, root: int) -> None:
    if comm.size == 1 or buf.size == 0:
        return
    arena = arena_of(comm, "broadcast")
    dt, me = buf.dtype, comm.rank
    shared = heap_location(comm, buf) if me == root else None
    cma = reads_peers(arena, "broadcast", buf.nbytes)
    # staged: steps of `step` elements, each a copy in by the root, a sync and a copy out
    # by the others, the root already copying in the next step (the phases alternate) while
    # they copy out this one. A root whose buffer is read in place (shared heap, CMA)
    # publishes it whole at the first step; the others see that there and read it all.
    step = pipeline_elems(arena, buf) if not cma else buf.size
    core = native_core(arena)
    if core is not None and shared is None and (not cma or arena.cma_write):
        # one native call: every staged step, or the split CMA step and the closing sync
        # (the same steps and syncs as the loop below)
        mine = call_sig(comm, "broadcast", buf.size)
        if cma:
            status = core.broadcast(arena, buf, root, mine, dt.itemsize, CMA, arena.pids)
        else:
            status = core.broadcast(arena, buf, root, mine, step * dt.itemsize)
        if status != REFUSE:   # refused: this rank runs it in Python (same steps, same syncs)
            broadcast_after(comm, arena, status, mine, buf, root)
            return
    in_place = False
    for lo in range(0, buf.size, buf.size if shared is not None else step):
        chunk = buf[lo:lo + step] if shared is None else buf
        phase = arena.next_phase()
        if me == root:
            publish(arena, phase, chunk, shared, lo, cma)
        elif cma:        # where the root may write our share (rooted_split)
            arena.put(OFFSET_WORD + phase, buf.__array_interface__["data"][0])
        # every step checks the signature, as each native step does (ranks may mix the two)
        enter(comm, arena, phase, "broadcast", buf.size, True)
        key = arena.get(root, SHARED_WORD + phase)
        in_place = bool(key)
        if key == CMA and arena.cma_write:
            rooted_split(comm, arena, phase, "broadcast", buf, root)
            break
        if in_place:     # the root's whole buffer, read in place (at the first step)
            if me != root:
                read_peer(comm, arena, phase, root, dt, buf.size, 0, buf)
            break
        if me != root:
            read_peer(comm, arena, phase, root, dt, chunk.size, 0, chunk)
    if in_place:
        arena.sync()    # nobody may change a buffer read in place until all have read it


def broadcast_after(comm: ShmComm, arena: Arena, status: int, mine: int, buf: np.ndarray,
                     root: int) -> None:
    """The rest of a broadcast the native core returned ``status`` for (not REFUSE)."""
    if status == MISMATCH:
        raise_mismatch(arena, mine)
    if status == PYTHON:   # the root's buffer is read in place, or a CMA transfer to redo
        phase = arena.phase
        if arena.get(root, SHARED_WORD + phase) == CMA and arena.cma_write:
            rooted_split(comm, arena, phase, "broadcast", buf, root)
        elif comm.rank != root:
            read_peer(comm, arena, phase, root, buf.dtype, buf.size, 0, buf)
        arena.sync()


def all_gather(comm: ShmComm, send: np.ndarray, recv: np.ndarray) -> None:
    _gather_to(comm, send, recv, None)


def gather(comm: ShmComm, send: np.ndarray, recv: np.ndarray | None, root: int) -> None:
    _gather_to(comm, send, recv, root)


def _gather_to(comm: ShmComm, send: np.ndarray, recv: np.ndarray | None, root: int | None) -> None:
    n, me, k = comm.size, comm.rank, send.size
    if n > 1 and k and _gather_native(comm, send, recv, root):
        return
    receiver = recv is not None and (root is None or me == root)
    if n == 1 or k == 0:
        if receiver and k:
            _copy_own(send, recv, me)
        return
    name = "all_gather" if root is None else "gather"
    arena = arena_of(comm, name)
    dt = send.dtype
    shared = heap_location(comm, send)
    cma = reads_peers(arena, name, send.nbytes * n)
    if receiver and not (cma and root is not None and arena.cma_write):
        _copy_own(send, recv, me)     # (a split gather's root copies its block at the end)
    if root is None and _voted(arena, send.nbytes * n):
        assert recv is not None
        _gather_voted(comm, arena, send, recv, cma)
        return
    if cma and root is not None and arena.cma_write:
        phase = arena.next_phase()
        if me == root:   # the root's receive buffer, where the others write their share
            assert recv is not None
            publish(arena, phase, recv, None, 0, True)
            apart = not np.shares_memory(recv[me * k:(me + 1) * k], send)
            publish_split_head(arena, phase, k, apart, dt.itemsize)
        else:
            publish(arena, phase, send, shared, 0, True)
        enter(comm, arena, phase, "gather", k, True)
        _gather_split_end(comm, arena, phase, send, recv, root)
        return
    step = k if cma else chunk_elems(arena, dt.itemsize)
    in_place = False
    for lo in range(0, k, step):
        chunk = send[lo:lo + step]
        count = chunk.size
        phase = arena.next_phase()
        if root is not None and me == root:   # nobody reads a gather root's block
            arena.put(SHARED_WORD + phase, 0)
        else:
            publish(arena, phase, chunk, shared, lo, cma)
        enter(comm, arena, phase, "all_gather" if root is None else "gather", k, lo == 0)
        in_place = in_place or any_in_place(arena, phase)
        if root is None or me == root:
            assert recv is not None
            for r in peers_from_next(me, n):
                read_peer(comm, arena, phase, r, dt, count, 0, recv[r * k + lo:r * k + lo + count])
    if in_place:
        arena.sync()


def _gather_native(comm: ShmComm, send: np.ndarray, recv: np.ndarray | None, root: int | None) -> bool:
    """all_gather / gather on the native core; False: run the Python code."""
    name = "all_gather" if root is None else "gather"
    arena = arena_of(comm, name)
    core = native_core(arena)
    if core is None or heap_location(comm, send) is not None:
        return False
    cma = reads_peers(arena, name, send.nbytes * comm.size)
    if root is None and _voted(arena, send.nbytes * comm.size):   # any size: in chunks
        mine = call_sig(comm, name, send.size)
        status = core.gather(arena, send, recv, -1, mine, cma, send.dtype.itemsize)
        if status != REFUSE:
            gather_after(comm, arena, status, mine, send, recv)
        return status != REFUSE
    split = cma and root is not None and arena.cma_write
    if not split and (send.nbytes > arena.slot or cma):
        return False
    me, k = comm.rank, send.size
    receiver = root is None or me == root
    mine = call_sig(comm, name, k)
    if split:
        status = core.gather(arena, send, recv if receiver else None, root, mine, send.dtype.itemsize,
                             CMA, arena.pids)
    else:
        status = core.gather(arena, send, recv if receiver else None, -1 if root is None else root, mine)
    if status != REFUSE:
        gather_after(comm, arena, status, mine, send, recv if receiver else None, root if split else None)
    return status != REFUSE


def _voted(arena: Arena, nbytes: int) -> bool:
    """Does an all_gather of ``nbytes`` (all ranks') go the voted way? The same on every rank."""
    return 0 < arena.ag_vote_min <= nbytes


def _gather_voted(comm: ShmComm, arena: Arena, send: np.ndarray, recv: np.ndarray,
                  fixed_cma: bool) -> None:
    """An all_gather staged or by cross-memory attach as rank 0 votes: every rank announces
    its buffer's address, rank 0 its vote (a Python rank 0 does not vote: ``fixed_cma``,
    reads_peers' answer, decides), a sync with the signature check; then by CMA (each
    reads every other's block, a closing sync) or staged in chunks of a slot (each staged,
    synced, copied out; a voted call ends synced). The native core's all_gather_voted
    (native/_all_gather_voted.c, which says why) does the same, step for step. Our own
    block is in ``recv`` already."""
    n, me, k, dt = comm.size, comm.rank, send.size, send.dtype
    phase = arena.next_phase()
    arena.put(SHARED_WORD + phase, CMA)
    arena.put(OFFSET_WORD + phase, send.__array_interface__["data"][0])
    arena.put(SIZE_WORD + phase, 0)
    enter(comm, arena, phase, "all_gather", k, True)
    vote = arena.get(0, SIZE_WORD + phase) >> A2A_VOTE_SHIFT
    if vote == A2A_VOTE_CMA or (vote == 0 and fixed_cma):
        for r in peers_from_next(me, n):
            read_peer(comm, arena, phase, r, dt, k, 0, recv[r * k:(r + 1) * k])
        arena.sync()
        return
    step = chunk_elems(arena, dt.itemsize)
    for lo in range(0, k, step):
        chunk = send[lo:lo + step]
        count = chunk.size
        staged = arena.next_phase()
        publish(arena, staged, chunk, None, lo, False)
        arena.sync()
        for r in peers_from_next(me, n):
            np.copyto(recv[r * k + lo:r * k + lo + count], peer_slot(arena, staged, r, dt, count))
    if vote == A2A_VOTE_STAGED:
        arena.sync()


def gather_after(comm: ShmComm, arena: Arena, status: int, mine: int, send: np.ndarray,
                  recv: np.ndarray | None, split_root: int | None = None) -> None:
    """The rest of a gather / all_gather the native core returned ``status`` for (not
    REFUSE); ``recv`` is None on a rank that receives nothing; ``split_root``: the root of
    a gather split by CMA."""
    if status == MISMATCH:
        raise_mismatch(arena, mine)
    if status == PYTHON and split_root is not None:   # a buffer in place, or a transfer to redo
        _gather_split_end(comm, arena, arena.phase, send, recv, split_root)
    elif status == PYTHON:   # some rank's buffer is read in place
        phase, k = arena.phase, send.size
        if recv is not None:
            for r in range(comm.size):
                if r != comm.rank:
                    read_peer(comm, arena, phase, r, send.dtype, k, 0, recv[r * k:(r + 1) * k])
        arena.sync()


def _gather_split_end(comm: ShmComm, arena: Arena, phase: int, send: np.ndarray, recv: np.ndarray | None,
                      root: int) -> None:
    """A gather split by CMA past its first sync (every rank published its buffer's
    address): the transfers (rooted_split), the root's own block, the closing sync."""
    me, k = comm.rank, send.size
    rooted_split(comm, arena, phase, "gather", recv if me == root else send, root)
    if me == root:
        assert recv is not None
        _copy_own(send, recv, me)
    arena.sync()


def _copy_own(send: np.ndarray, recv: np.ndarray, me: int) -> None:
    """A gathering rank's own block into ``recv`` (nothing to do where it is there already)."""
    k = send.size
    own = recv[me * k:(me + 1) * k]
    if not np.shares_memory(own, send):
        np.copyto(own, send)
