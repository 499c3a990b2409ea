"""shm_direct's data moves: broadcast, all_gather / gather and all_to_all(v) (scatter:
:mod:`.shm_scatter`).

The steps (see :mod:`.shm_direct` for the whole family): the writer publishes its data
(:func:`.shm_stage.publish`: staged in its slot, in place in the shared heap, or by
address), a sync, the readers copy out what is theirs. A staged broadcast goes in steps,
the root copying step i+1 in while the others copy step i out; large one-to-many calls
may instead read the peers' buffers by cross-memory attach (:mod:`.shm_large` picks, and
splits a broadcast between the root and the readers). all_to_all(v) first agrees on the
largest block and checks that every pair's split sizes match (:func:`_check_pairs`);
small ones move their data with that same sync (:func:`a2a_eager`). Each first offers the
call to the native core.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..errors import MismatchError
from ..transport.arena_layout import CMA, ONE_SHOT
from ..transport.arena_layout import OFFSET as OFFSET_WORD
from ..transport.arena_layout import SHARED as SHARED_WORD
from ..transport.arena_layout import A2A_VOTE_CMA, A2A_VOTE_SHIFT, A2A_VOTE_STAGED
from ..transport.arena_layout import SIZE as SIZE_WORD
from .contract import Arena, ShmComm
from .linear import displacements
from .shm_large import a2a_cma_limit, pipeline_elems, publish_split_head, reads_peers, rooted_split
from .shm_stage import (
    MISMATCH, PAIRS, PYTHON, REFUSE, any_in_place, arena_of, call_sig, chunk_elems, enter,
    heap_location, native_core, peer_slot, publish, raise_mismatch, read_peer,
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


def all_to_all_after(comm: ShmComm, arena: Arena, status: int, mine: int, send: np.ndarray,
                      send_counts: Sequence[int], recv: np.ndarray, recv_counts: Sequence[int]) -> None:
    """The rest of an all_to_all the native core returned ``status`` for (not REFUSE)."""
    if status == MISMATCH:
        raise_mismatch(arena, mine)
    if status == PAIRS:
        _check_pairs(comm, arena, arena.phase)
        raise_mismatch(arena, mine)
    if status == PYTHON:   # blocks large enough to read by address (past the agreement)
        _all_to_all_cma(comm, arena, arena.phase, send, recv, displacements(recv_counts),
                        recv_counts)


def all_to_all(comm: ShmComm, send: np.ndarray, send_counts: Sequence[int], recv: np.ndarray,
               recv_counts: Sequence[int]) -> None:
    n, me = comm.size, comm.rank
    if n > 1:
        arena = arena_of(comm, "all_to_all")
        core = native_core(arena)
        if core is not None:
            mine = call_sig(comm, "all_to_all", 0)
            status = core.all_to_all(arena, send, send_counts, recv, recv_counts, send.dtype.itemsize,
                                     mine, a2a_cma_limit(arena), arena.pids)
            if status != REFUSE:
                all_to_all_after(comm, arena, status, mine, send, send_counts, recv, recv_counts)
                return
    sdispl, rdispl = displacements(send_counts), displacements(recv_counts)
    if n == 1:
        _own_block(send, send_counts, sdispl, recv, recv_counts, rdispl, me)
        return
    arena = arena_of(comm, "all_to_all")
    dt = send.dtype
    agree = arena.next_phase()
    arena.put(SIZE_WORD + agree, max((c for j, c in enumerate(send_counts) if j != me), default=0))
    arena.put(SHARED_WORD + agree, CMA)      # our send buffer's address, for a call by CMA
    arena.put(OFFSET_WORD + agree, send.__array_interface__["data"][0] if send.size else 0)
    counts = arena.slot_array(agree, me, np.dtype(np.int64), 2 * n)
    counts[:n], counts[n:] = send_counts, recv_counts
    total = sdispl[n]
    if total and a2a_eager(arena, total * dt.itemsize):   # our buffer but our own block
        staged = arena.slot_array(agree, me, dt, total, a2a_eager_at(n))
        own, past = sdispl[me], sdispl[me + 1]
        np.copyto(staged[:own], send[:own])
        np.copyto(staged[past:total], send[past:total])
    enter(comm, arena, agree, "all_to_all", 0, True)
    tables = _check_pairs(comm, arena, agree)
    # after the check (which covers our block to ourselves too): every rank raises alike
    _own_block(send, send_counts, sdispl, recv, recv_counts, rdispl, me)
    sums = tables[:, :n].sum(axis=1)
    if all(a2a_eager(arena, int(t) * dt.itemsize) for t in sums):
        for r in peers_from_next(me, n):   # every rank staged its buffer: our blocks
            c = recv_counts[r]
            if c:
                at = int(tables[r, :me].sum())
                np.copyto(recv[rdispl[r]:rdispl[r] + c],
                          arena.slot_array(agree, r, dt, int(sums[r]), a2a_eager_at(n))[at:at + c])
        return
    words = [arena.get(r, SIZE_WORD + agree) for r in range(n)]
    largest = max(w & ((1 << A2A_VOTE_SHIFT) - 1) for w in words)
    vote = words[0] >> A2A_VOTE_SHIFT      # rank 0's (native/_a2a_choice.c); ours is none
    limit = a2a_cma_limit(arena)
    if limit >= 0 and (vote == A2A_VOTE_CMA or (vote == 0 and largest * dt.itemsize > limit)):
        _all_to_all_cma(comm, arena, agree, send, recv, rdispl, recv_counts)
        return
    piece = a2a_piece(arena, dt.itemsize, n, largest)
    for lo in range(0, largest, piece):
        phase = arena.next_phase()
        staged = arena.slot_array(phase, me, dt, n * piece).reshape(n, piece)
        for j in range(n):
            if j != me:
                c = min(piece, max(0, send_counts[j] - lo))
                if c:
                    np.copyto(staged[j, :c], send[sdispl[j] + lo:sdispl[j] + lo + c])
        arena.sync()
        for r in peers_from_next(me, n):
            c = min(piece, max(0, recv_counts[r] - lo))
            if c:
                src = arena.slot_array(phase, r, dt, n * piece).reshape(n, piece)[me, :c]
                np.copyto(recv[rdispl[r] + lo:rdispl[r] + lo + c], src)
    if vote == A2A_VOTE_STAGED:    # (as the native core: a voted staged call ends synced)
        arena.sync()


def peers_from_next(me: int, n: int) -> list[int]:
    """Every rank but ``me``, from the next one on (me + 1, me + 2, ... mod n): the order
    all_to_all and all_gather read their peers in (the native core's too), so no peer is
    read by every rank at once (all from rank 0 first took 1.3-1.5x as long by cross-memory
    attach: BENCHMARKS.md session 15)."""
    return [(me + i) % n for i in range(1, n)]


def a2a_piece(arena: Arena, itemsize: int, n: int, largest: int) -> int:
    """Elements per block of a staged all_to_all round: the largest block rounded up to a
    multiple of 64 // itemsize elements (a cache line for itemsizes dividing 64) when n of
    them fit a slot, else a slot's n-th. Packed, not spread over the slot: a 64
    KiB block every 512 KiB (n = 8) put the blocks on the same cache sets (device, n = 8,
    512 KiB: see BENCHMARKS.md session 16). The native core computes the same number."""
    line = 64 // itemsize if itemsize < 64 else 1
    packed = -(-largest // line) * line
    return min(chunk_elems(arena, itemsize, n), max(1, packed))


def a2a_eager_at(n: int) -> int:
    """Where in a rank's agreement slot an eager all_to_all's data starts: past the
    table of 2n split sizes, on a cache line."""
    return (2 * n * 8 + 63) // 64 * 64


def a2a_eager(arena: Arena, nbytes: int) -> bool:
    """Does a rank with a send buffer of ``nbytes`` stage it whole with its split sizes
    (the agreement's one sync then moves the data too)? Every rank asks it of every rank's
    total (from the tables) and goes the eager way only if all did; the native core
    (_collectives_move.c) asks the same."""
    return nbytes <= ONE_SHOT and a2a_eager_at(arena.n) + nbytes <= arena.slot


def _own_block(send: np.ndarray, send_counts: Sequence[int], sdispl: Sequence[int], recv: np.ndarray,
               recv_counts: Sequence[int], rdispl: Sequence[int], me: int) -> None:
    if send_counts[me]:
        np.copyto(recv[rdispl[me]:rdispl[me] + recv_counts[me]], send[sdispl[me]:sdispl[me] + send_counts[me]])


def _all_to_all_cma(comm: ShmComm, arena: Arena, agree: int, send: np.ndarray, recv: np.ndarray,
                    rdispl: Sequence[int], recv_counts: Sequence[int]) -> None:
    """all_to_all(v) past the agreement (phase ``agree``), one copy: read our block straight
    from each sender's buffer, whose address it announced in the agreement, at the place
    its send counts there give (the counts of the ranks before us), then a sync (nobody
    touches a send buffer until all have read it). Two syncs in all, the agreement's
    included."""
    n, me, dt = comm.size, comm.rank, send.dtype
    for r in peers_from_next(me, n):
        c = recv_counts[r]
        if c:
            start = int(arena.slot_array(agree, r, np.dtype(np.int64), n)[:me].sum())
            read_peer(comm, arena, agree, r, dt, 0, start, recv[rdispl[r]:rdispl[r] + c])
    arena.sync()


def _check_pairs(comm: ShmComm, arena: Arena, phase: int) -> np.ndarray:
    """all_to_all(v): what rank i sends rank j must be what j expects from i, for every pair.
    Each rank published its send and receive counts in its slot; every rank checks the
    whole matrix, so all reach the same verdict (a rank that raised alone would leave the
    others waiting in this call). Returns the tables (rank × its send then receive counts)."""
    n, ranks = comm.size, arena.global_ranks
    table = np.stack([arena.slot_array(phase, r, np.dtype(np.int64), 2 * n) for r in range(n)])
    sends, recvs = table[:, :n], table[:, n:]
    bad = np.argwhere(sends != recvs.T)
    if len(bad):
        text = "; ".join(f"rank {ranks[i]} sends {int(sends[i, j])} elements to rank {ranks[j]}, "
                         f"which expects {int(recvs[j, i])}" for i, j in bad[:8])
        raise MismatchError(f"all_to_all: the split sizes do not match: {text}")
    return table
