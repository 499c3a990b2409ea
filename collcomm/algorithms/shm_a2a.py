"""shm_direct's all_to_all(v) (the family: :mod:`.shm_direct`).

Every rank first publishes its send and receive counts and its send buffer's address in
one agreement step, and every rank checks every pair's split sizes against each other
(:func:`_check_pairs`: all reach the same verdict). Small calls move their data with that
same sync (:func:`a2a_eager`: each rank staged its whole buffer beside its counts);
larger ones read their blocks straight from the senders' buffers by cross-memory attach
(as rank 0 votes, or past :func:`.shm_large.a2a_cma_limit`), or go in staged rounds of
packed pieces (:func:`a2a_piece`). It first offers the call to the native core, which
takes the same steps (native/_collectives_a2a.c).
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
from .shm_large import a2a_cma_limit
from .shm_stage import (
    MISMATCH, PAIRS, PYTHON, REFUSE, arena_of, call_sig, chunk_elems, enter, native_core,
    peers_from_next, raise_mismatch, read_peer,
)


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
