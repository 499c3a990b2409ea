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

* all_reduce, small (≤ ``ONE_SHOT`` bytes): copy in, sync, every rank reduces all n slots
  in rank order (identical bits everywhere). 1 sync; reads n·K.
* all_reduce, large ("two-shot" = reduce-scatter + all-gather in place): copy in, sync,
  rank i reduces slice i of all slots into its own slot, sync, every rank copies each
  owner's reduced slice out. 2 syncs; copies K in, reads K + writes K/n, copies K out.
* reduce: as the large all_reduce, but only the root copies out (2 syncs).
* broadcast: the root copies in, sync, the others copy out (1 sync); large buffers in
  steps (see below), the root copying step i+1 in while the others copy step i out.
* all_gather / gather: copy in, sync, every rank (the root) copies all slots out.
* reduce_scatter: copy in the n blocks, sync, rank i reduces block i of all slots.
* scatter: the root copies in the n blocks, sync, rank i copies block i out.
* all_to_all(v): one sync to agree on the largest block, then rounds of: copy each
  destination's next piece to its place in the slot, sync, copy out the pieces sent to us.
* barrier: one sync.

Zero-copy: all_reduce, broadcast and all_gather/gather read a rank's buffer in place when
it lies in the shared heap (``collcomm.empty`` & co, see transport/heap.py) instead of
staging a copy; the rank announces the heap key and offset in its header words. Such a
call always takes the two-shot path and ends with one more sync, since nobody may change a
buffer that others read in place until they are done. all_reduce on shared buffers then
moves ~2K bytes per rank instead of ~3K.

Large one-to-many calls (broadcast, all_gather / gather, all_to_all above ``CMA_MIN``):
either staged as above or read straight from the peers' buffers by cross-memory attach
(CMA: the rank announces its buffer's address; one copy, by the reader, and one more sync
at the end). :func:`.shm_large.reads_peers` picks, the same on every rank: CMA above a quarter of
the last-level cache, and in between only where the arena measured a byte read by CMA to
cost little enough against a memcpy (``arena.cma_cost``: ~3.3 on the VM this was measured
on, where staging wins). A CMA broadcast puts the root to work too: it writes the first
1/n of its buffer into every other rank's while they read the rest (docs/large-copies.md).

Native core: when collcomm/native's C extension is built (and ``COLLCOMM_NATIVE`` is not
"0"), each collective below first offers the call to it: it runs the same steps in C for
one-chunk messages that are staged (not in the shared heap, not read by cross-memory
attach) and, for the reductions, built-in ops on the numeric dtypes. Its status says
what is left: nothing; a signature or split-size mismatch to raise here; the rest of a
call in which some rank published its buffer in place (finished by the Python code
below, from the same point); or the whole call, which the Python code then runs.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .. import native
from ..errors import InvalidArgumentError, MismatchError
from ..transport.arena_layout import CMA, CMA_MIN, ONE_SHOT
from ..transport.arena_layout import OFFSET as OFFSET_WORD
from ..transport.arena_layout import SHARED as SHARED_WORD
from ..transport.arena_layout import SIGNATURE as SIGNATURE_WORD
from ..transport.arena_layout import SIZE as SIZE_WORD
from ..transport.shm import PAGE
from . import signature
from .base import ReduceFn
from .contract import Arena, NativeCore, ShmComm
from .linear import displacements
from .shm_large import a2a_cma_limit, broadcast_split, pipeline_elems, reads_peers

#: all_reduce reads its peers by CMA only for chunks this large: below, the two extra
#: syscalls and the closing sync cost more than the staging copy they save (measured).
CMA_ALL_REDUCE = 2 << 20
# The header words (OFFSET_WORD ..., per phase), ONE_SHOT, CMA_MIN: see transport/arena_layout.py.

def _enter(comm: ShmComm, arena: Arena, phase: int, collective: str, count: int, first: bool) -> None:
    """A call's sync; at its first one every rank checks that all are in the same call:
    the same collective, dtype, count, root and op (the call's signature, see
    :mod:`.signature`), else MismatchError on every rank, naming the ranks that differ."""
    if not first:
        arena.sync()
        return
    mine = _sig(comm, collective, count)
    arena.put(SIGNATURE_WORD + phase, mine)
    arena.sync()
    _verify(arena, phase, mine)


def _sig(comm: ShmComm, collective: str, count: int) -> int:
    return comm.sig or signature.make(collective, None, count)


def _mismatch(arena: Arena, mine: int) -> None:
    """The native core found ranks in different calls: raise as the Python code does."""
    _verify(arena, arena.phase, mine)
    raise MismatchError(f"rank {arena.global_ranks[arena.rank]}: the ranks are not all in the "
                        "same collective call")


def _verify(arena: Arena, phase: int, mine: int) -> None:
    """After the sync: MismatchError unless every rank published signature ``mine``."""
    word = SIGNATURE_WORD + phase
    odd = [r for r in range(arena.n) if arena.get(r, word) != mine]
    if odd:
        ranks = arena.global_ranks
        who = "; ".join(f"rank {ranks[r]} called {signature.describe(arena.get(r, word))} "
                        f"(differs in {signature.differences(mine, arena.get(r, word))})" for r in odd)
        raise MismatchError(f"rank {ranks[arena.rank]} called {signature.describe(mine)} but {who}: "
                            "every rank must make the same collective calls in the same order, "
                            "with the same dtype, count, root and op")


def _arena(comm: ShmComm, collective: str) -> Arena:
    try:
        get = comm.arena
    except AttributeError:   # a bare point-to-point Comm: no shared memory at all
        get = None
    arena = get() if get is not None else None
    if arena is None:
        raise InvalidArgumentError(
            f"{collective}: algorithm shm_direct needs every rank of the group on this host "
            "with shared memory (it is not available over TCP)")
    return arena


#: native statuses: done; signature mismatch; finish in Python; split sizes differ; run Python
_DONE, _MISMATCH, _PYTHON, _PAIRS, _REFUSE = 0, 1, 2, 3, 4


def _native(arena: Arena) -> NativeCore | None:
    """The arena's native core (collcomm.native), or None."""
    return arena.native_core


def _offset(arr: np.ndarray) -> int:
    """Where in its page ``arr`` starts (only worth matching for large copies)."""
    if arr.nbytes < ONE_SHOT:
        return 0
    return arr.__array_interface__["data"][0] % PAGE


def _chunk_elems(arena: Arena, itemsize: int, parts: int = 1) -> int:
    """Elements per chunk so that ``parts`` blocks of them fit a slot."""
    return max(1, arena.slot // (itemsize * parts))


def _split(count: int, n: int, i: int) -> tuple[int, int]:
    q, r = divmod(count, n)
    lo = i * q + min(i, r)
    return lo, lo + q + (1 if i < r else 0)


def _stage(arena: Arena, phase: int, src: np.ndarray) -> np.ndarray:
    """Copy ``src`` into this rank's slot at its page offset and announce the offset."""
    off = _offset(src)
    arena.put(OFFSET_WORD + phase, off)
    dst = arena.slot_array(phase, arena.rank, src.dtype, src.size, off)
    np.copyto(dst, src)
    return dst


def _peer(arena: Arena, phase: int, r: int, dtype: np.dtype, count: int) -> np.ndarray:
    return arena.slot_array(phase, r, dtype, count, arena.get(r, OFFSET_WORD + phase))


def _shared(comm: ShmComm, arr: np.ndarray) -> tuple[int, int] | None:
    return comm.shared(arr)


def _publish(arena: Arena, phase: int, src: np.ndarray, shared: tuple[int, int] | None,
             lo: int, cma: bool) -> np.ndarray:
    """Make ``src`` (elements from ``lo`` of a buffer) readable by the others: announce it
    in place when it is in the shared heap, or by address when ``cma`` (the call reads
    peers by cross-memory attach: every rank decided alike), else stage a copy. Returns
    our readable copy."""
    if shared is not None:
        arena.put(SHARED_WORD + phase, shared[0])
        arena.put(OFFSET_WORD + phase, shared[1] + lo * src.dtype.itemsize)
        return src
    if cma:
        arena.put(SHARED_WORD + phase, CMA)
        arena.put(OFFSET_WORD + phase, src.__array_interface__["data"][0])
        return src
    arena.put(SHARED_WORD + phase, 0)
    return _stage(arena, phase, src)


def _source(comm: ShmComm, arena: Arena, phase: int, r: int, dtype: np.dtype, count: int) -> np.ndarray:
    """Rank ``r``'s published data as an array: its heap buffer in place, or its slot
    (not for CMA sources: use :func:`_read`)."""
    key = arena.get(r, SHARED_WORD + phase)
    if not key:
        return _peer(arena, phase, r, dtype, count)
    off = arena.get(r, OFFSET_WORD + phase)
    return comm.peer_bytes(key, r)[off:off + count * dtype.itemsize].view(dtype)  


def _read(comm: ShmComm, arena: Arena, phase: int, r: int, dtype: np.dtype, count: int,
          start: int, out: np.ndarray) -> None:
    """Copy elements ``start:start+out.size`` of rank ``r``'s published data into ``out``."""
    if arena.get(r, SHARED_WORD + phase) == CMA:
        arena.read_remote(r, arena.get(r, OFFSET_WORD + phase) + start * dtype.itemsize, out)
    else:
        np.copyto(out, _source(comm, arena, phase, r, dtype, count)[start:start + out.size])


def _operand(comm: ShmComm, arena: Arena, phase: int, r: int, dtype: np.dtype, count: int,
             start: int, stop: int) -> np.ndarray:
    """Elements ``start:stop`` of rank ``r``'s data as an array to reduce with (a CMA source
    is first copied into our own slot of this phase, which nobody else reads then)."""
    if arena.get(r, SHARED_WORD + phase) != CMA:
        return _source(comm, arena, phase, r, dtype, count)[start:stop]
    scratch = arena.slot_array(phase, arena.rank, dtype, stop - start)
    _read(comm, arena, phase, r, dtype, count, start, scratch)
    return scratch


def _any_shared(arena: Arena, phase: int) -> bool:
    word = SHARED_WORD + phase
    for r in range(arena.n):
        if arena.get(r, word):
            return True
    return False


def all_reduce(comm: ShmComm, buf: np.ndarray, fn: ReduceFn) -> None:
    if comm.size == 1 or buf.size == 0:
        return
    arena = _arena(comm, "all_reduce")
    shared = _shared(comm, buf)
    core = _native(arena)
    if (core is not None and shared is None and buf.nbytes <= arena.slot
            and not (arena.cma and buf.nbytes > CMA_ALL_REDUCE)):
        code = native.code_for(fn, buf.dtype)
        if code >= 0:
            mine = _sig(comm, "all_reduce", buf.size)
            status = core.all_reduce(arena, buf, code, mine)
            if status != _REFUSE:
                _all_reduce_after(comm, arena, status, mine, buf, fn)
                return
    step = _chunk_elems(arena, buf.dtype.itemsize)
    for lo in range(0, buf.size, step):
        chunk = buf[lo:lo + step]
        phase = arena.next_phase()
        mine = _publish(arena, phase, chunk, shared, lo, arena.cma and chunk.nbytes > CMA_ALL_REDUCE)
        _enter(comm, arena, phase, "all_reduce", buf.size, lo == 0)
        _all_reduce_chunk(comm, arena, phase, chunk, mine, fn, _any_shared(arena, phase))


def _all_reduce_after(comm: ShmComm, arena: Arena, status: int, mine: int, buf: np.ndarray,
                      fn: ReduceFn) -> None:
    """The rest of an all_reduce the native core returned ``status`` for (not REFUSE)."""
    if status == _MISMATCH:
        _mismatch(arena, mine)
    if status == _PYTHON:   # some rank's buffer is read in place: finish here
        phase = arena.phase
        _all_reduce_chunk(comm, arena, phase, buf, _peer(arena, phase, comm.rank, buf.dtype,
                                                         buf.size), fn, True)


def _all_reduce_chunk(comm: ShmComm, arena: Arena, phase: int, chunk: np.ndarray, mine: np.ndarray,
                      fn: ReduceFn, in_place: bool) -> None:
    """One chunk of all_reduce, after its first sync (``mine``: our published data)."""
    n, me, dt, count = comm.size, comm.rank, chunk.dtype, chunk.size
    if chunk.nbytes <= ONE_SHOT and not in_place:
        slots = [mine if r == me else _source(comm, arena, phase, r, dt, count) for r in range(n)]
        np.copyto(chunk, slots[0])
        for r in range(1, n):
            fn(chunk, slots[r])
        return
    s0, s1 = _split(count, n, me)
    acc = mine[s0:s1]
    for r in range(n):
        if r != me:
            fn(acc, _operand(comm, arena, phase, r, dt, count, s0, s1))
    arena.sync()
    for r in range(n):
        r0, r1 = _split(count, n, r)
        if r != me:
            _read(comm, arena, phase, r, dt, count, r0, chunk[r0:r1])
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
    arena = _arena(comm, "reduce")
    n, me, dt = comm.size, comm.rank, send.dtype
    core = _native(arena)
    if core is not None and send.nbytes <= arena.slot:
        code = native.code_for(fn, dt)
        if code >= 0:
            mine = _sig(comm, "reduce", send.size)
            status = core.reduce(arena, send, recv, code, root, mine)
            if status == _DONE:
                return
            if status == _MISMATCH:
                _mismatch(arena, mine)
    step = _chunk_elems(arena, dt.itemsize)
    for lo in range(0, send.size, step):
        chunk = send[lo:lo + step]
        count = chunk.size
        phase = arena.next_phase()
        mine = _stage(arena, phase, chunk)
        _enter(comm, arena, phase, "reduce", send.size, lo == 0)
        s0, s1 = _split(count, n, me)
        acc = mine[s0:s1]
        for r in range(n):
            if r != me:
                fn(acc, _peer(arena, phase, r, dt, count)[s0:s1])
        arena.sync()
        if me == root:
            assert recv is not None
            out = recv[lo:lo + count]
            for r in range(n):
                r0, r1 = _split(count, n, r)
                np.copyto(out[r0:r1], _peer(arena, phase, r, dt, count)[r0:r1] if r != me else mine[r0:r1])


def broadcast(comm: ShmComm, buf: np.ndarray, root: int) -> None:
    if comm.size == 1 or buf.size == 0:
        return
    arena = _arena(comm, "broadcast")
    dt, me = buf.dtype, comm.rank
    shared = _shared(comm, buf) if me == root else None
    cma = reads_peers(arena, "broadcast", buf.nbytes)
    # staged: steps of `step` elements, each a copy in by the root, a sync and a copy out
    # by the others, the root already copying in the next step (the phases alternate) while
    # they copy out this one. A root whose buffer is read in place (shared heap, CMA)
    # publishes it whole at the first step; the others see that there and read it all.
    step = pipeline_elems(arena, buf) if not cma else buf.size
    core = _native(arena)
    if core is not None and shared is None and (not cma or arena.cma_write):
        # one native call: every staged step, or the split CMA step and the closing sync
        # (the same steps and syncs as the loop below)
        mine = _sig(comm, "broadcast", buf.size)
        if cma:
            status = core.broadcast(arena, buf, root, mine, dt.itemsize, CMA, arena.pids)
        else:
            status = core.broadcast(arena, buf, root, mine, step * dt.itemsize)
        if status != _REFUSE:   # refused: this rank runs it in Python (same steps, same syncs)
            _broadcast_after(comm, arena, status, mine, buf, root)
            return
    in_place = False
    for lo in range(0, buf.size, buf.size if shared is not None else step):
        chunk = buf[lo:lo + step] if shared is None else buf
        phase = arena.next_phase()
        if me == root:
            _publish(arena, phase, chunk, shared, lo, cma)
        elif cma:        # where the root may write our share (broadcast_split)
            arena.put(OFFSET_WORD + phase, buf.__array_interface__["data"][0])
        # every step checks the signature, as each native step does (ranks may mix the two)
        _enter(comm, arena, phase, "broadcast", buf.size, True)
        key = arena.get(root, SHARED_WORD + phase)
        in_place = bool(key)
        if key == CMA and arena.cma_write:
            broadcast_split(arena, phase, buf, root)
            break
        if in_place:     # the root's whole buffer, read in place (at the first step)
            if me != root:
                _read(comm, arena, phase, root, dt, buf.size, 0, buf)
            break
        if me != root:
            _read(comm, arena, phase, root, dt, chunk.size, 0, chunk)
    if in_place:
        arena.sync()    # nobody may change a buffer read in place until all have read it


def _broadcast_after(comm: ShmComm, arena: Arena, status: int, mine: int, buf: np.ndarray,
                     root: int) -> None:
    """The rest of a broadcast the native core returned ``status`` for (not REFUSE)."""
    if status == _MISMATCH:
        _mismatch(arena, mine)
    if status == _PYTHON:   # the root's buffer is read in place, or a CMA transfer to redo
        phase = arena.phase
        if arena.get(root, SHARED_WORD + phase) == CMA and arena.cma_write:
            broadcast_split(arena, phase, buf, root)
        elif comm.rank != root:
            _read(comm, arena, phase, root, buf.dtype, buf.size, 0, buf)
        arena.sync()


def all_gather(comm: ShmComm, send: np.ndarray, recv: np.ndarray) -> None:
    _gather_to(comm, send, recv, None)


def gather(comm: ShmComm, send: np.ndarray, recv: np.ndarray | None, root: int) -> None:
    _gather_to(comm, send, recv, root)


def _gather_to(comm: ShmComm, send: np.ndarray, recv: np.ndarray | None, root: int | None) -> None:
    n, me, k = comm.size, comm.rank, send.size
    if n > 1 and k and _gather_native(comm, send, recv, root):
        return
    if recv is not None and (root is None or me == root):
        own = recv[me * k:(me + 1) * k]
        if k and not np.shares_memory(own, send):
            np.copyto(own, send)
    if n == 1 or k == 0:
        return
    name = "all_gather" if root is None else "gather"
    arena = _arena(comm, name)
    dt = send.dtype
    shared = _shared(comm, send)
    cma = reads_peers(arena, name, send.nbytes * n)
    step = k if cma else _chunk_elems(arena, dt.itemsize)
    in_place = False
    for lo in range(0, k, step):
        chunk = send[lo:lo + step]
        count = chunk.size
        phase = arena.next_phase()
        _publish(arena, phase, chunk, shared, lo, cma)
        _enter(comm, arena, phase, "all_gather" if root is None else "gather", k, lo == 0)
        in_place = in_place or _any_shared(arena, phase)
        if root is None or me == root:
            assert recv is not None
            for r in range(n):
                if r != me:
                    _read(comm, arena, phase, r, dt, count, 0, recv[r * k + lo:r * k + lo + count])
    if in_place:
        arena.sync()


def _gather_native(comm: ShmComm, send: np.ndarray, recv: np.ndarray | None, root: int | None) -> bool:
    """all_gather / gather on the native core; False: run the Python code."""
    name = "all_gather" if root is None else "gather"
    arena = _arena(comm, name)
    core = _native(arena)
    if (core is None or send.nbytes > arena.slot or reads_peers(arena, name, send.nbytes * comm.size)
            or _shared(comm, send) is not None):
        return False
    me, k = comm.rank, send.size
    receiver = root is None or me == root
    mine = _sig(comm, name, k)
    status = core.gather(arena, send, recv if receiver else None, -1 if root is None else root, mine)
    if status != _REFUSE:
        _gather_after(comm, arena, status, mine, send, recv if receiver else None)
    return status != _REFUSE


def _gather_after(comm: ShmComm, arena: Arena, status: int, mine: int, send: np.ndarray,
                  recv: np.ndarray | None) -> None:
    """The rest of a gather / all_gather the native core returned ``status`` for (not
    REFUSE); ``recv`` is None on a rank that receives nothing."""
    if status == _MISMATCH:
        _mismatch(arena, mine)
    if status == _PYTHON:   # some rank's buffer is read in place
        phase, k = arena.phase, send.size
        if recv is not None:
            for r in range(comm.size):
                if r != comm.rank:
                    _read(comm, arena, phase, r, send.dtype, k, 0, recv[r * k:(r + 1) * k])
        arena.sync()


def reduce_scatter(comm: ShmComm, send: np.ndarray, recv: np.ndarray, fn: ReduceFn) -> None:
    n, me, k = comm.size, comm.rank, recv.size
    if n == 1:
        if k:
            np.copyto(recv, send[:k])
        return
    if k == 0:
        return
    arena = _arena(comm, "reduce_scatter")
    dt = send.dtype
    core = _native(arena)
    if (core is not None and not (arena.cma and recv.nbytes > CMA_MIN)
            and k <= _chunk_elems(arena, dt.itemsize, n)):
        code = native.code_for(fn, dt)
        if code >= 0:
            mine = _sig(comm, "reduce_scatter", k)
            status = core.reduce_scatter(arena, send, recv, code, mine)
            if status == _DONE:
                return
            if status == _MISMATCH:
                _mismatch(arena, mine)
    if arena.cma and recv.nbytes > CMA_MIN:
        _reduce_scatter_cma(comm, arena, send, recv, fn)
        return
    step = _chunk_elems(arena, dt.itemsize, n)
    blocks = send.reshape(n, k)
    for lo in range(0, k, step):
        count = min(step, k - lo)
        phase = arena.next_phase()
        staged = arena.slot_array(phase, me, dt, n * count).reshape(n, count)
        np.copyto(staged, blocks[:, lo:lo + count])
        _enter(comm, arena, phase, "reduce_scatter", k, lo == 0)
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
    _enter(comm, arena, phase, "reduce_scatter", k, True)
    step = _chunk_elems(arena, dt.itemsize)
    base = me * k
    for lo in range(0, k, step):
        out = recv[lo:lo + step]
        hi = lo + out.size
        for r in range(n):
            if r == me:
                block = send[base + lo:base + hi]
            elif r == 0:
                _read(comm, arena, phase, 0, dt, n * k, base + lo, out)
                continue
            else:
                block = _operand(comm, arena, phase, r, dt, n * k, base + lo, base + hi)
            if r == 0:
                np.copyto(out, block)
            else:
                fn(out, block)
    arena.sync()  # nobody may change a send buffer the others read until all have read it


def scatter(comm: ShmComm, send: np.ndarray | None, recv: np.ndarray, root: int) -> None:
    n, me, k = comm.size, comm.rank, recv.size
    if n > 1 and k:
        arena = _arena(comm, "scatter")
        core = _native(arena)
        if core is not None and k <= _chunk_elems(arena, recv.dtype.itemsize, n):
            mine = _sig(comm, "scatter", k)
            status = core.scatter(arena, send if me == root else None, recv, root, mine)
            if status == _DONE:
                return
            if status == _MISMATCH:
                _mismatch(arena, mine)
    if me == root and send is not None and k:
        own = send[me * k:(me + 1) * k]
        if not np.shares_memory(own, recv):
            np.copyto(recv, own)
    if n == 1 or k == 0:
        return
    arena = _arena(comm, "scatter")
    dt = recv.dtype
    step = _chunk_elems(arena, dt.itemsize, n)
    for lo in range(0, k, step):
        count = min(step, k - lo)
        phase = arena.next_phase()
        if me == root:
            assert send is not None
            staged = arena.slot_array(phase, me, dt, n * count).reshape(n, count)
            np.copyto(staged, send.reshape(n, k)[:, lo:lo + count])
        _enter(comm, arena, phase, "scatter", k, lo == 0)
        if me != root:
            np.copyto(recv[lo:lo + count], arena.slot_array(phase, root, dt, n * count).reshape(n, count)[me])


def _all_to_all_after(comm: ShmComm, arena: Arena, status: int, mine: int, send: np.ndarray,
                      send_counts: Sequence[int], recv: np.ndarray, recv_counts: Sequence[int]) -> None:
    """The rest of an all_to_all the native core returned ``status`` for (not REFUSE)."""
    if status == _MISMATCH:
        _mismatch(arena, mine)
    if status == _PAIRS:
        _check_pairs(comm, arena, arena.phase)
        _mismatch(arena, mine)
    if status == _PYTHON:   # blocks large enough to read by address
        _all_to_all_cma(comm, arena, send, displacements(send_counts), recv,
                        displacements(recv_counts), recv_counts)


def all_to_all(comm: ShmComm, send: np.ndarray, send_counts: Sequence[int], recv: np.ndarray,
               recv_counts: Sequence[int]) -> None:
    n, me = comm.size, comm.rank
    if n > 1:
        arena = _arena(comm, "all_to_all")
        core = _native(arena)
        if core is not None:
            mine = _sig(comm, "all_to_all", 0)
            status = core.all_to_all(arena, send, send_counts, recv, recv_counts, send.dtype.itemsize,
                                     mine, a2a_cma_limit(arena), arena.pids)
            if status != _REFUSE:
                _all_to_all_after(comm, arena, status, mine, send, send_counts, recv, recv_counts)
                return
    sdispl, rdispl = displacements(send_counts), displacements(recv_counts)
    if n == 1:
        _own_block(send, send_counts, sdispl, recv, recv_counts, rdispl, me)
        return
    arena = _arena(comm, "all_to_all")
    dt = send.dtype
    agree = arena.next_phase()
    arena.put(SIZE_WORD + agree, max((c for j, c in enumerate(send_counts) if j != me), default=0))
    counts = arena.slot_array(agree, me, np.dtype(np.int64), 2 * n)
    counts[:n], counts[n:] = send_counts, recv_counts
    _enter(comm, arena, agree, "all_to_all", 0, True)
    _check_pairs(comm, arena, agree)
    # after the check (which covers our block to ourselves too): every rank raises alike
    _own_block(send, send_counts, sdispl, recv, recv_counts, rdispl, me)
    largest = max(arena.get(r, SIZE_WORD + agree) for r in range(n))
    limit = a2a_cma_limit(arena)
    if limit >= 0 and largest * dt.itemsize > limit:
        _all_to_all_cma(comm, arena, send, sdispl, recv, rdispl, recv_counts)
        return
    piece = _chunk_elems(arena, dt.itemsize, n)
    for lo in range(0, largest, piece):
        phase = arena.next_phase()
        staged = arena.slot_array(phase, me, dt, n * piece).reshape(n, piece)
        for j in range(n):
            if j != me:
                c = min(piece, max(0, send_counts[j] - lo))
                if c:
                    np.copyto(staged[j, :c], send[sdispl[j] + lo:sdispl[j] + lo + c])
        arena.sync()
        for r in range(n):
            c = min(piece, max(0, recv_counts[r] - lo))
            if r != me and c:
                src = arena.slot_array(phase, r, dt, n * piece).reshape(n, piece)[me, :c]
                np.copyto(recv[rdispl[r] + lo:rdispl[r] + lo + c], src)


def _own_block(send: np.ndarray, send_counts: Sequence[int], sdispl: Sequence[int], recv: np.ndarray,
               recv_counts: Sequence[int], rdispl: Sequence[int], me: int) -> None:
    if send_counts[me]:
        np.copyto(recv[rdispl[me]:rdispl[me] + recv_counts[me]], send[sdispl[me]:sdispl[me] + send_counts[me]])


def _all_to_all_cma(comm: ShmComm, arena: Arena, send: np.ndarray, sdispl: Sequence[int], recv: np.ndarray,
                    rdispl: Sequence[int], recv_counts: Sequence[int]) -> None:
    """all_to_all(v) past the agreement, one copy: read our block straight from each
    sender's buffer, at the displacement it left in its slot."""
    n, me, dt = comm.size, comm.rank, send.dtype
    phase = arena.next_phase()
    np.copyto(arena.slot_array(phase, me, np.dtype(np.int64), n), np.asarray(sdispl[:n], dtype=np.int64))
    arena.put(SHARED_WORD + phase, CMA)
    arena.put(OFFSET_WORD + phase, send.__array_interface__["data"][0] if send.size else 0)
    arena.sync()
    for r in range(n):
        c = recv_counts[r]
        if r != me and c:
            start = int(arena.slot_array(phase, r, np.dtype(np.int64), n)[me])
            _read(comm, arena, phase, r, dt, 0, start, recv[rdispl[r]:rdispl[r] + c])
    arena.sync()


def _check_pairs(comm: ShmComm, arena: Arena, phase: int) -> None:
    """all_to_all(v): what rank i sends rank j must be what j expects from i, for every pair.
    Each rank published its send and receive counts in its slot; every rank checks the
    whole matrix, so all reach the same verdict (a rank that raised alone would leave the
    others waiting in this call)."""
    n, ranks = comm.size, arena.global_ranks
    table = np.stack([arena.slot_array(phase, r, np.dtype(np.int64), 2 * n) for r in range(n)])
    sends, recvs = table[:, :n], table[:, n:]
    bad = np.argwhere(sends != recvs.T)
    if len(bad):
        text = "; ".join(f"rank {ranks[i]} sends {int(sends[i, j])} elements to rank {ranks[j]}, "
                         f"which expects {int(recvs[j, i])}" for i, j in bad[:8])
        raise MismatchError(f"all_to_all: the split sizes do not match: {text}")


def barrier(comm: ShmComm) -> None:
    if comm.size > 1:
        arena = _arena(comm, "barrier")
        core = _native(arena)
        if core is not None:
            mine = _sig(comm, "barrier", 0)
            if core.barrier(arena, mine) == _MISMATCH:
                _mismatch(arena, mine)
            return
        _enter(comm, arena, arena.next_phase(), "barrier", 0, True)


def finish_native(comm: ShmComm, status: int, collective: str, *args: Any) -> None:
    """Finish a call that the native fast call (collcomm/core/fastpath.py) ran up to
    ``status``, as the collective here does after its own native call: a mismatch raised,
    a call in which some rank's buffer is read in place completed in Python, a refused
    call (nothing done yet) run whole. ``args`` are the collective's after ``comm``."""
    arena = _arena(comm, collective)
    if status == _REFUSE:
        {"all_reduce": all_reduce, "broadcast": broadcast, "all_gather": all_gather,
         "barrier": barrier, "reduce": reduce, "reduce_scatter": reduce_scatter,
         "gather": gather, "scatter": scatter, "all_to_all": all_to_all}[collective](comm, *args)
    elif collective == "all_reduce":
        _all_reduce_after(comm, arena, status, comm.sig, *args)
    elif collective == "broadcast":
        _broadcast_after(comm, arena, status, comm.sig, *args)
    elif collective == "all_gather":
        _gather_after(comm, arena, status, comm.sig, *args)
    elif collective == "all_to_all":
        _all_to_all_after(comm, arena, status, comm.sig, *args)
    elif collective == "gather":
        send, recv, root = args
        _gather_after(comm, arena, status, comm.sig, send, recv if comm.rank == root else None)
    elif status == _MISMATCH:
        _mismatch(arena, comm.sig)
