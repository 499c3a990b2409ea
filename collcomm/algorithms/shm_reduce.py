"""shm_direct's reductions: all_reduce, reduce and reduce_scatter on the arena.

The steps (see :mod:`.shm_direct` for the whole family): every rank stages its chunk in
its slot (all_reduce may publish it in place or by address instead:
:func:`.shm_stage.publish`), syncs, and reduces what it owns from the others' data in rank
order, so every rank gets identical bits. all_reduce is one-shot up to ``ONE_SHOT``
bytes as ``all_reduce_one_step`` allows (every rank reduces all n slots), two-shot above (rank i reduces slice i, a sync,
everybody copies each owner's slice out); reduce is the one-shot one on the root alone up
to ``REDUCE_ONE_SHOT`` bytes of all ranks' data, else the two-shot one with only the root copying out; reduce_scatter reduces block i of every slot on rank i. Large chunks may be
read from the peers' memory by cross-memory attach (:data:`CMA_ALL_REDUCE`; reduce_scatter
above ``CMA_MIN``); between two ranks, a reduce past ``REDUCE_PAIR_FROM`` bytes (or a
slot) goes as a pipeline instead (:func:`_reduce_pair`, :func:`reduce_in_pair`), one of
``REDUCE_CMA_MIN``..``REDUCE_CMA_MAX`` by cross-memory attach (:func:`_reduce_cma`). Each
first offers the call to the native core.
"""
from __future__ import annotations

import numpy as np

from .. import native
from ..transport.arena_layout import (CMA, CMA_MIN, REDUCE_CMA_MAX, REDUCE_CMA_MIN, REDUCE_ONE_SHOT,
                                      REDUCE_PAIR_FROM, all_reduce_one_step)
from ..transport.arena_layout import OFFSET as OFFSET_WORD
from ..transport.arena_layout import SHARED as SHARED_WORD
from .base import ReduceFn
from .contract import Arena, ShmComm
from .shm_large import pipeline_elems
from .shm_stage import (
    DONE, MISMATCH, PYTHON, REFUSE, any_in_place, arena_of, call_sig, chunk_elems, enter, heap_location,
    native_core, peer_data, peer_operand, peer_slot, publish, raise_mismatch, read_peer, split_bounds,
    stage,
)

#: all_reduce reads its peers by CMA only for chunks this large: below, the two extra
#: syscalls and the closing sync cost more than the staging copy they save (measured).
CMA_ALL_REDUCE = 2 << 20


def all_reduce(comm: ShmComm, buf: np.ndarray, fn: ReduceFn) -> None:
    if comm.size == 1 or buf.size == 0:
        return
    arena = arena_of(comm, "all_reduce")
    shared = heap_location(comm, buf)
    core = native_core(arena)
    if (core is not None and shared is None and buf.nbytes <= arena.slot
            and not (arena.cma and buf.nbytes > CMA_ALL_REDUCE)):
        code = native.code_for(fn, buf.dtype)
        if code >= 0:
            mine = call_sig(comm, "all_reduce", buf.size)
            status = core.all_reduce(arena, buf, code, mine)
            if status != REFUSE:
                all_reduce_after(comm, arena, status, mine, buf, fn)
                return
    step = chunk_elems(arena, buf.dtype.itemsize)
    for lo in range(0, buf.size, step):
        chunk = buf[lo:lo + step]
        phase = arena.next_phase()
        mine = publish(arena, phase, chunk, shared, lo, arena.cma and chunk.nbytes > CMA_ALL_REDUCE)
        enter(comm, arena, phase, "all_reduce", buf.size, lo == 0)
        _all_reduce_chunk(comm, arena, phase, chunk, mine, fn, any_in_place(arena, phase))


def all_reduce_after(comm: ShmComm, arena: Arena, status: int, mine: int, buf: np.ndarray,
                      fn: ReduceFn) -> None:
    """The rest of an all_reduce the native core returned ``status`` for (not REFUSE)."""
    if status == MISMATCH:
        raise_mismatch(arena, mine)
    if status == PYTHON:   # some rank's buffer is read in place: finish here
        phase = arena.phase
        _all_reduce_chunk(comm, arena, phase, buf, peer_slot(arena, phase, comm.rank, buf.dtype,
                                                         buf.size), fn, True)


def _all_reduce_chunk(comm: ShmComm, arena: Arena, phase: int, chunk: np.ndarray, mine: np.ndarray,
                      fn: ReduceFn, in_place: bool) -> None:
    """One chunk of all_reduce, after its first sync (``mine``: our published data)."""
    n, me, dt, count = comm.size, comm.rank, chunk.dtype, chunk.size
    if all_reduce_one_step(chunk.nbytes, n, arena.all_reduce_extra) and not in_place:
        slots = [mine if r == me else peer_data(comm, arena, phase, r, dt, count) for r in range(n)]
        np.copyto(chunk, slots[0])
        for r in range(1, n):
            fn(chunk, slots[r])
        return
    s0, s1 = split_bounds(count, n, me)
    acc = mine[s0:s1]
    for r in range(n):
        if r != me:
            fn(acc, peer_operand(comm, arena, phase, r, dt, count, s0, s1))
    arena.sync()
    for r in range(n):
        r0, r1 = split_bounds(count, n, r)
        if r != me:
            read_peer(comm, arena, phase, r, dt, count, r0, chunk[r0:r1])
        elif mine is not chunk:
            np.copyto(chunk[r0:r1], mine[r0:r1])
    if in_place:
        arena.sync()  # nobody may change a buffer read in place until all have read it


def reduce(comm: ShmComm, send: np.ndarray, recv: np.ndarray | None, fn: ReduceFn, root: int) -> None:
    if comm.size == 1:
        if recv is not None and recv is not send and send.size:
            np.copyto(recv, send)
        return
    if send.size == 0:
        return
    arena = arena_of(comm, "reduce")
    n, me, dt = comm.size, comm.rank, send.dtype
    pair = reduce_in_pair(arena, send.nbytes)       # (the native core too: reduce_pair)
    if not pair and reduce_by_cma(arena, send.nbytes):
        _reduce_cma(comm, arena, send, recv, fn, root)
        return
    core = native_core(arena)
    if core is not None and (send.nbytes <= arena.slot or pair):
        code = native.code_for(fn, dt)
        if code >= 0:
            mine = call_sig(comm, "reduce", send.size)
            status = core.reduce(arena, send, recv, code, root, mine)
            if status == DONE:
                return
            if status == MISMATCH:
                raise_mismatch(arena, mine)
    if pair:
        _reduce_pair(comm, arena, send, recv, fn, root)
        return
    if send.nbytes * n <= REDUCE_ONE_SHOT:     # one step: the root combines every slot
        phase = arena.next_phase()
        mine = stage(arena, phase, send)
        enter(comm, arena, phase, "reduce", send.size, True)
        if me == root:
            assert recv is not None
            np.copyto(recv, mine if me == 0 else peer_slot(arena, phase, 0, dt, send.size))
            for r in range(1, n):
                fn(recv, mine if r == me else peer_slot(arena, phase, r, dt, send.size))
        return
    step = chunk_elems(arena, dt.itemsize)
    for lo in range(0, send.size, step):
        chunk = send[lo:lo + step]
        count = chunk.size
        phase = arena.next_phase()
        mine = stage(arena, phase, chunk)
        enter(comm, arena, phase, "reduce", send.size, lo == 0)
        s0, s1 = split_bounds(count, n, me)
        acc = mine[s0:s1]
        for r in range(n):
            if r != me:
                fn(acc, peer_slot(arena, phase, r, dt, count)[s0:s1])
        arena.sync()
        if me == root:
            assert recv is not None
            out = recv[lo:lo + count]
            for r in range(n):
                r0, r1 = split_bounds(count, n, r)
                np.copyto(out[r0:r1], peer_slot(arena, phase, r, dt, count)[r0:r1] if r != me else mine[r0:r1])


def reduce_in_pair(arena: Arena, nbytes: int) -> bool:
    """Does a reduce of ``nbytes`` a rank go as the pipeline between two ranks
    (:func:`_reduce_pair`)? Past REDUCE_PAIR_FROM bytes or a slot, as the native core's
    Core_reduce decides (Core.reduce_pair_from): the same answer on every rank."""
    return arena.n == 2 and nbytes > min(REDUCE_PAIR_FROM, arena.slot)


def reduce_by_cma(arena: Arena, nbytes: int) -> bool:
    """Does a reduce of ``nbytes`` a rank go by cross-memory attach (:func:`_reduce_cma`)?
    Two ranks that read each other's memory, REDUCE_CMA_MIN..REDUCE_CMA_MAX bytes within a
    slot: the same answer on every rank."""
    return (arena.n == 2 and arena.cma and REDUCE_CMA_MIN <= nbytes <= REDUCE_CMA_MAX
            and nbytes <= arena.slot)


def _reduce_cma(comm: ShmComm, arena: Arena, send: np.ndarray, recv: np.ndarray | None, fn: ReduceFn,
                root: int) -> None:
    """reduce between two ranks by cross-memory attach: the other rank announces its send
    buffer (by address; in place when it lies in the shared heap), the root nothing; a sync
    with the signature check; the root reads the other's data into its own slot of the
    phase and combines, rank 0's data first; a closing sync keeps the other's buffer
    untouched until then. The native core's reduce_cma (native/_cma.c) does the same, its
    combine in one pass (a three-operand kernel) with the same bits; a root it hands the
    call back to (a peer announced in place, a read that failed) finishes here."""
    me, dt, count = comm.rank, send.dtype, send.size
    shared = heap_location(comm, send)
    core = native_core(arena)
    code = native.code_for(fn, dt) if core is not None and shared is None else -1
    if code >= 0:
        mine = call_sig(comm, "reduce", count)
        status = core.reduce(arena, send, recv, code, root, mine)   # (by CMA: Core.reduce_cma_min)
        if status == DONE:
            return
        if status == MISMATCH:
            raise_mismatch(arena, mine)
        if status == PYTHON:
            reduce_cma_after(comm, arena, send, recv, fn, root)
            return
    phase = arena.next_phase()
    if me == root:
        arena.put(SHARED_WORD + phase, 0)
        arena.put(OFFSET_WORD + phase, 0)
    else:
        publish(arena, phase, send, shared, 0, True)
    enter(comm, arena, phase, "reduce", count, True)
    if me == root:
        _reduce_cma_root(comm, arena, phase, send, recv, fn)
    arena.sync()


def reduce_cma_after(comm: ShmComm, arena: Arena, send: np.ndarray, recv: np.ndarray | None,
                     fn: ReduceFn, root: int) -> None:
    """The rest of a reduce_cma the native core handed back (PYTHON, the root alone): the
    root's part, then the closing sync."""
    _reduce_cma_root(comm, arena, arena.phase, send, recv, fn)
    arena.sync()


def _reduce_cma_root(comm: ShmComm, arena: Arena, phase: int, send: np.ndarray, recv: np.ndarray | None,
                     fn: ReduceFn) -> None:
    """The root's part of :func:`_reduce_cma` past the first sync: the other's data into
    our own slot, then ``recv`` = rank 0's data (op) rank 1's."""
    assert recv is not None
    me, dt, count = comm.rank, send.dtype, send.size
    other = arena.slot_array(phase, me, dt, count)
    read_peer(comm, arena, phase, 1 - me, dt, count, 0, other)
    if me == 0:
        if not np.shares_memory(recv, send):
            np.copyto(recv, send)
        fn(recv, other)
    else:
        fn(other, send)
        np.copyto(recv, other)


def _reduce_pair(comm: ShmComm, arena: Arena, send: np.ndarray, recv: np.ndarray | None, fn: ReduceFn,
                 root: int) -> None:
    """reduce between two ranks past REDUCE_PAIR_FROM bytes, pipelined: the other rank stages its
    buffer in steps (the phases alternate), the root folds each step into ``recv`` as it
    arrives, in rank order (rank 0's data first), while the other stages the next step;
    every step checks the signature, as each native step does (ranks may mix the two).
    Rank 0 as the root copies its own step into ``recv`` before the step's sync (while the
    other stages). Each byte is copied once by the other rank and reduced once by the
    root; the two-shot loop had both ranks stage everything, reduce half each, sync, and
    the root copy it all out again (measured 2026-11-26, 8-64 MiB: 0.34-0.5x Open MPI
    before; session 18 found the two-shot call faster within a slot, 1-2 MiB, but session
    23 measured the pair faster than it and than CMA from 768 KiB: the figures at
    arena_layout.REDUCE_PAIR_FROM).
    ``recv`` may be ``send`` at
    the root (every step of it is read before it is written). The native core's reduce
    does the same (native/_collectives_reduce.c reduce_pair)."""
    me, dt, count = comm.rank, send.dtype, send.size
    step = pipeline_elems(arena, send)
    in_place = me == root and recv is not None and np.shares_memory(send, recv)
    for lo in range(0, count, step):
        chunk = send[lo:lo + step]
        phase = arena.next_phase()
        out = None if recv is None else recv[lo:lo + chunk.size]
        if me != root:
            stage(arena, phase, chunk)
        else:
            arena.put(OFFSET_WORD + phase, 0)   # (nothing staged: nobody reads the root's slot)
            if me == 0 and not in_place:
                np.copyto(out, chunk)
        enter(comm, arena, phase, "reduce", count, True)
        if me != root:
            continue
        assert out is not None
        other = peer_slot(arena, phase, 1 - me, dt, chunk.size)
        if me == 0:
            fn(out, other)
        else:
            mine = chunk.copy() if in_place else chunk
            np.copyto(out, other)
            fn(out, mine)


def reduce_scatter(comm: ShmComm, send: np.ndarray, recv: np.ndarray, fn: ReduceFn) -> None:
    n, me, k = comm.size, comm.rank, recv.size
    if n == 1:
        if k:
            np.copyto(recv, send[:k])
        return
    if k == 0:
        return
    arena = arena_of(comm, "reduce_scatter")
    dt = send.dtype
    core = native_core(arena)
    if (core is not None and not (arena.cma and recv.nbytes > CMA_MIN)
            and k <= chunk_elems(arena, dt.itemsize, n)):
        code = native.code_for(fn, dt)
        if code >= 0:
            mine = call_sig(comm, "reduce_scatter", k)
            status = core.reduce_scatter(arena, send, recv, code, mine)
            if status == DONE:
                return
            if status == MISMATCH:
                raise_mismatch(arena, mine)
    if arena.cma and recv.nbytes > CMA_MIN:
        _reduce_scatter_cma(comm, arena, send, recv, fn)
        return
    step = chunk_elems(arena, dt.itemsize, n)
    blocks = send.reshape(n, k)
    for lo in range(0, k, step):
        count = min(step, k - lo)
        phase = arena.next_phase()
        staged = arena.slot_array(phase, me, dt, n * count).reshape(n, count)
        np.copyto(staged, blocks[:, lo:lo + count])
        enter(comm, arena, phase, "reduce_scatter", k, lo == 0)
        out = recv[lo:lo + count]
        np.copyto(out, arena.slot_array(phase, 0, dt, n * count).reshape(n, count)[me])
        for r in range(1, n):
            fn(out, arena.slot_array(phase, r, dt, n * count).reshape(n, count)[me])


def _reduce_scatter_cma(comm: ShmComm, arena: Arena, send: np.ndarray, recv: np.ndarray, fn: ReduceFn) -> None:
    """Every rank reads block ``rank`` of each other's send buffer straight from its memory
    (through our slot as scratch) and reduces in rank order; one sync in, one out."""
    n, me, k, dt = comm.size, comm.rank, recv.size, send.dtype
    phase = arena.next_phase()
    arena.put(SHARED_WORD + phase, CMA)
    arena.put(OFFSET_WORD + phase, send.__array_interface__["data"][0])
    enter(comm, arena, phase, "reduce_scatter", k, True)
    step = chunk_elems(arena, dt.itemsize)
    base = me * k
    for lo in range(0, k, step):
        out = recv[lo:lo + step]
        hi = lo + out.size
        for r in range(n):
            if r == me:
                block = send[base + lo:base + hi]
            elif r == 0:
                read_peer(comm, arena, phase, 0, dt, n * k, base + lo, out)
                continue
            else:
                block = peer_operand(comm, arena, phase, r, dt, n * k, base + lo, base + hi)
            if r == 0:
                np.copyto(out, block)
            else:
                fn(out, block)
    arena.sync()  # nobody may change a send buffer the others read until all have read it
