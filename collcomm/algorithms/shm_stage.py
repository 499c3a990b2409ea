"""What every shm_direct collective does on the arena (see :mod:`.shm_direct`).

* find the group's arena (:func:`arena_of`) and its native core (:func:`native_core`,
  whose status codes are :data:`DONE` ... :data:`REFUSE`);
* enter a call (:func:`enter`): the sync, at the first of which every rank checks that all
  are in the same call (the signature word; :func:`raise_mismatch` when the native core
  found they are not);
* place this rank's data where the others can read it (:func:`publish`): staged in its
  own slot at its page offset (:func:`stage`), in place in the shared heap, or by address
  for cross-memory attach;
* read a peer's published data (:func:`peer_data`, :func:`read_peer`,
  :func:`peer_operand`), and the arithmetic of chunks (:func:`chunk_elems`) and of
  slices (:func:`split_bounds`).

The header words (OFFSET_WORD ..., per phase), ONE_SHOT and CMA: see
transport/arena_layout.py.
"""
from __future__ import annotations

import numpy as np

from ..errors import CollcommError, InvalidArgumentError, MismatchError
from ..transport.arena_layout import CMA, ONE_SHOT
from ..transport.arena_layout import OFFSET as OFFSET_WORD
from ..transport.arena_layout import SHARED as SHARED_WORD
from ..transport.arena_layout import SIGNATURE as SIGNATURE_WORD
from ..transport.shm import PAGE
from . import signature
from .contract import Arena, NativeCore, ShmComm


def enter(comm: ShmComm, arena: Arena, phase: int, collective: str, count: int, first: bool,
          last: bool = False) -> None:
    """A call's sync; at its first one every rank checks that all are in the same call:
    the same collective, dtype, count, root and op (the call's signature, see
    :mod:`.signature`), else MismatchError on every rank, naming the ranks that differ.
    ``last``: this rank arrives once every other rank is there (Arena.sync_last)."""
    if not first:
        arena.sync()
        return
    mine = call_sig(comm, collective, count)
    arena.put(SIGNATURE_WORD + phase, mine)
    if last:
        arena.sync_last(phase)
    else:
        arena.sync()
    _verify(arena, phase, mine)


def call_sig(comm: ShmComm, collective: str, count: int) -> int:
    """The call's signature word: the one the core made for it, else one from its name and count."""
    return comm.sig or signature.make(collective, None, count)


def raise_mismatch(arena: Arena, mine: int) -> None:
    """The native core found ranks in different calls: raise as the Python code does."""
    _verify(arena, arena.phase, mine)
    raise MismatchError(f"rank {arena.global_ranks[arena.rank]}: the ranks are not all in the "
                        "same collective call")


#: what a mismatch found by :func:`settle_early` adds to its message
EARLY_NOTE = ("(found when this rank's next call on the group began: with more ranks than "
              "CPUs a broadcast's or scatter's root leaves without waiting for the others and "
              "its receivers wait for the root alone; COLLCOMM_EAGER_ROOTED=0 checks every rank "
              "within the call)")


def settle_early(arena: Arena, closing: bool = False) -> None:
    """Before this rank's next signature-checked step in the arena: settle the call its
    native core left early (a rooted call that did not wait for every rank, enter in
    native/_arena_sync.c): wait for everybody's arrival at it (the timeout and dead-peer
    checks of any wait) and compare every rank's signature. A difference is raised here
    as the MismatchError that call would have raised (its words are still in the arena:
    nobody has moved past it), after this rank took the step of the call being made with
    a word no call makes (signature.ABANDONED): a rank that raised in the eager call itself
    and went on to its next call meets that word there and raises too, so the ranks' calls
    stay in step for a program that catches the error and goes on.
    ``closing`` (the group closes): no wait and no step; a difference found (everybody
    already there) is a RuntimeWarning, since nobody makes another call."""
    core = arena.native_core
    if core is None or not core.lag_target:
        return
    sig = core.settle(arena, not closing)
    if sig is None:
        return
    text = f"{_mismatch_text(arena, core.lag_phase, sig)} {EARLY_NOTE}"
    if closing:
        import warnings
        warnings.warn(f"collcomm: {text}", RuntimeWarning, stacklevel=3)
        return
    phase = arena.next_phase()
    arena.put(SHARED_WORD + phase, 0)
    arena.put(SIGNATURE_WORD + phase, signature.ABANDONED)
    try:
        arena.sync()
    except CollcommError as exc:      # (the mismatch still said, the failed step too)
        raise MismatchError(f"{text}; taking this call's step then failed: {exc}") from exc
    raise MismatchError(text)


def _verify(arena: Arena, phase: int, mine: int) -> None:
    """After the sync: MismatchError unless every rank published signature ``mine``."""
    text = _mismatch_text(arena, phase, mine)
    if text:
        raise MismatchError(text)


def _mismatch_text(arena: Arena, phase: int, mine: int) -> str:
    """What differs from signature ``mine`` in the ranks' words of ``phase`` ("": nothing)."""
    word = SIGNATURE_WORD + phase
    odd = [r for r in range(arena.n) if arena.get(r, word) != mine]
    if not odd:
        return ""
    ranks = arena.global_ranks
    who = "; ".join(f"rank {ranks[r]} called {signature.describe(arena.get(r, word))} "
                    f"(differs in {signature.differences(mine, arena.get(r, word))})" for r in odd)
    return (f"rank {ranks[arena.rank]} called {signature.describe(mine)} but {who}: every rank "
            "must make the same collective calls in the same order, with the same dtype, count, "
            "root and op")


def arena_of(comm: ShmComm, collective: str) -> Arena:
    """The group's arena; InvalidArgumentError (naming ``collective``) where there is none."""
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
DONE, MISMATCH, PYTHON, PAIRS, REFUSE = 0, 1, 2, 3, 4


def native_core(arena: Arena) -> NativeCore | None:
    """The arena's native core (collcomm.native), or None."""
    return arena.native_core


def _offset(arr: np.ndarray) -> int:
    """Where in its page ``arr`` starts (only worth matching for large copies)."""
    if arr.nbytes < ONE_SHOT:
        return 0
    return arr.__array_interface__["data"][0] % PAGE


def chunk_elems(arena: Arena, itemsize: int, parts: int = 1) -> int:
    """Elements per chunk so that ``parts`` blocks of them fit a slot."""
    return max(1, arena.slot // (itemsize * parts))


def split_bounds(count: int, n: int, i: int) -> tuple[int, int]:
    """[lo, hi) of part ``i`` when ``count`` elements are split as evenly as can be into ``n``."""
    q, r = divmod(count, n)
    lo = i * q + min(i, r)
    return lo, lo + q + (1 if i < r else 0)


def stage(arena: Arena, phase: int, src: np.ndarray) -> np.ndarray:
    """Copy ``src`` into this rank's slot at its page offset and announce the offset."""
    off = _offset(src)
    arena.put(OFFSET_WORD + phase, off)
    dst = arena.slot_array(phase, arena.rank, src.dtype, src.size, off)
    np.copyto(dst, src)
    return dst


def peer_slot(arena: Arena, phase: int, r: int, dtype: np.dtype, count: int) -> np.ndarray:
    """``count`` elements that rank ``r`` staged in its slot of ``phase`` (at the offset it announced)."""
    return arena.slot_array(phase, r, dtype, count, arena.get(r, OFFSET_WORD + phase))


def heap_location(comm: ShmComm, arr: np.ndarray) -> tuple[int, int] | None:
    """(heap key, byte offset) of ``arr`` when it lies in the shared heap, else None."""
    return comm.shared(arr)


def publish(arena: Arena, phase: int, src: np.ndarray, shared: tuple[int, int] | None,
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
    return stage(arena, phase, src)


def peer_data(comm: ShmComm, arena: Arena, phase: int, r: int, dtype: np.dtype, count: int) -> np.ndarray:
    """Rank ``r``'s published data as an array: its heap buffer in place, or its slot
    (not for CMA sources: use :func:`read_peer`)."""
    key = arena.get(r, SHARED_WORD + phase)
    if not key:
        return peer_slot(arena, phase, r, dtype, count)
    off = arena.get(r, OFFSET_WORD + phase)
    return comm.peer_bytes(key, r)[off:off + count * dtype.itemsize].view(dtype)


def read_peer(comm: ShmComm, arena: Arena, phase: int, r: int, dtype: np.dtype, count: int,
          start: int, out: np.ndarray) -> None:
    """Copy elements ``start:start+out.size`` of rank ``r``'s published data into ``out``."""
    if arena.get(r, SHARED_WORD + phase) == CMA:
        arena.read_remote(r, arena.get(r, OFFSET_WORD + phase) + start * dtype.itemsize, out)
    else:
        np.copyto(out, peer_data(comm, arena, phase, r, dtype, count)[start:start + out.size])


def peer_operand(comm: ShmComm, arena: Arena, phase: int, r: int, dtype: np.dtype, count: int,
             start: int, stop: int) -> np.ndarray:
    """Elements ``start:stop`` of rank ``r``'s data as an array to reduce with (a CMA source
    is first copied into our own slot of this phase, which nobody else reads then)."""
    if arena.get(r, SHARED_WORD + phase) != CMA:
        return peer_data(comm, arena, phase, r, dtype, count)[start:stop]
    scratch = arena.slot_array(phase, arena.rank, dtype, stop - start)
    read_peer(comm, arena, phase, r, dtype, count, start, scratch)
    return scratch


def any_in_place(arena: Arena, phase: int) -> bool:
    """Did some rank publish its data in place (shared heap) or by address (CMA) in ``phase``?"""
    word = SHARED_WORD + phase
    for r in range(arena.n):
        if arena.get(r, word):
            return True
    return False


def peers_from_next(me: int, n: int) -> list[int]:
    """Every rank but ``me``, from the next one on (me + 1, me + 2, ... mod n): the order
    all_to_all and all_gather read their peers in (the native core's too), so no peer is
    read by every rank at once (all from rank 0 first took 1.3-1.5x as long by cross-memory
    attach: BENCHMARKS.md session 15)."""
    return [(me + i) % n for i in range(1, n)]
