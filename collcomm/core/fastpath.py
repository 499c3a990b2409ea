"""The fast call: a group's small collectives in one C call (collcomm/native/_fastcall.c).

A front end offers each synchronous call to its group's ``fast`` object first::

    fast = g.fast
    if fast is not None and fast.all_reduce(send, recv, op, "all_reduce"):
        return None                       # done, exactly as the regular path does it
    ...                                   # else: the regular path (core/collectives.py)

The C side does what :func:`collcomm.core.collectives.all_reduce` →
:meth:`ProcessGroup.call` → :func:`collcomm.algorithms.shm_direct.all_reduce` do for a
small call, without the Python frames: the group's next sequence number, the flight
recorder's record (caller's file:line included), the full call signature, the native
collective, ``done``. It returns ``None`` having done nothing whenever the call is not
the plain case — then the regular path runs and raises every argument error with its text.

This module builds a group's ``Fast`` (:func:`attach`) and answers its three questions
(:class:`Hooks`): which kernel and signature an (op, dtype) pair has, what error to raise
when the C call failed, and how to finish a call the C code handed back (a signature
mismatch, a peer's buffer read in place).

When a group gets one: the native core is built and ``COLLCOMM_FAST`` is not ``"0"``; the
group is a group of one, or its arena runs on the native core; no tracing, stats, DETAIL
checks or INFO logging are on (those take the observed path); and, per collective, the
call plan picks ``shm_direct`` at every size up to the fast limit (so an
``COLLCOMM_ALGO_*`` override keeps its algorithm). The group pauses it while
asynchronous calls are pending and drops it when destroyed; any ``call_timeout`` scope
sends every call the regular way.
"""
from __future__ import annotations

import os
import threading
from typing import Any

import numpy as np

from .. import native, ops
from ..algorithms import shm_direct, shm_large, signature
from ..errors import CollcommError, InvalidArgumentError, with_context
from ..transport.arena_layout import CMA, CMA_MIN, ONE_SHOT
from . import recorder as recorder_mod
from .work import Work

#: the collectives of a Fast, in the order of native/_fastcall.c's FC_* codes
COLLECTIVES = ("all_reduce", "broadcast", "barrier", "all_gather", "reduce", "reduce_scatter",
               "gather", "scatter", "all_to_all")
#: the numpy dtype of each native dtype code (native._DTYPES; 14 is bfloat16, never taken)
_DTYPES = [np.dtype(t) for t in ("bool", "int8", "uint8", "int16", "uint16", "int32", "uint32",
                                 "int64", "uint64", "float16", "float32", "float64", "complex64",
                                 "complex128")]
#: the largest message a Fast of a group of one takes (bytes): the one-shot size
LIMIT = ONE_SHOT
#: ... and of a group with an arena: the fast call runs exactly the regular path's native
#: call, less its 10-40 µs of Python at 128 KiB - 1 MiB (docs/large-copies.md); all_reduce
#: and broadcast up to CMA_MIN bytes, one native call on staged data, never above a slot;
#: the others as _staged_max says (some read by CMA below CMA_MIN between two ranks:
#: shm_large.reads_peers).
STAGED_MAX = CMA_MIN
_SEQ_MASK = (1 << 35) - 1


def enabled() -> bool:
    return native.core is not None and os.environ.get("COLLCOMM_FAST", "1").strip() != "0"


def timeout_scope(delta: int) -> None:
    """A ``call_timeout`` scope opened (+1) or closed (-1) in some thread."""
    if native.core is not None:
        native.core.timeout_scope(delta)


def _staged_max(arena: Any, collective: str, n: int) -> int:
    """The largest call (bytes, as the C entry measures it: all_gather / gather / scatter /
    reduce_scatter / all_to_all their whole buffer) that shm_direct's regular path runs as
    the same single native call on staged data: the fast call takes no more.

    all_reduce and broadcast stop at STAGED_MAX: above it a buffer in the shared heap is
    read in place (no copy in), and a broadcast goes in several native steps (a broadcast
    that shm_large splits by CMA from CMA_MIN stops below it: the fast call takes those
    split, see _bcast_cma); all_gather while each block fits a slot (from the core's
    ag_vote_min the C entry takes the voted way as shm_move's native call does, passing it
    the fixed rule's answer, from ``Fast.ag_cma``); gather while shm_large stages it (CMA
    costs more than two memcpys here, up to a quarter of the cache) and each block fits a
    slot; reduce, scatter, reduce_scatter
    (without CMA: with it, blocks up to CMA_MIN) and all_to_all (whose native call makes
    its own rounds and CMA choice) up to a slot, a scatter and a gather only below
    shm_large.split_from, where shm_large starts splitting them by CMA (the fast call
    takes those split, see _rooted_cma; a reduce between two
    ranks that read each other's memory goes by CMA in the C entry as in shm_reduce:
    reduce_by_cma; past REDUCE_PAIR_FROM, pipelined: reduce_in_pair)."""
    slot = arena.slot
    if collective == "broadcast":   # from split_from: split (_bcast_cma), or the regular path
        split = shm_large.split_from(arena, collective)
        return min(slot, STAGED_MAX, split - 1) if split else min(slot, STAGED_MAX)
    if collective == "all_reduce":
        return min(slot, STAGED_MAX)
    if collective == "all_gather":     # from the core's ag_vote_min, the voted way (Fast.ag_cma)
        return n * slot
    if collective == "gather":
        top = n * slot
        split = shm_large.split_from(arena, collective)
        return min(top, split - 1) if split else top
    if collective == "reduce_scatter" and arena.cma:
        return min(slot, n * CMA_MIN)
    if collective == "scatter":     # from split_from: by CMA (_rooted_cma), or the regular path
        split = shm_large.split_from(arena, collective)
        return min(slot, split - 1) if split else slot
    return slot


def _limit(group: Any, collective: str, most: int) -> int:
    """``most`` (bytes) if the plan picks shm_direct for ``collective`` at every
    power-of-two size up to it, else 0 (never)."""
    if group.size == 1:
        return most
    if collective == "barrier":
        return 1 if group.plan.algorithm("barrier", 0) is shm_direct.barrier else 0
    want = getattr(shm_direct, collective)
    nbytes = 1
    while nbytes <= most:
        if group.plan.algorithm(collective, nbytes) is not want:
            return 0
        nbytes *= 2
    return most


def attach(group: Any, arena: Any = None) -> Any:
    """``group``'s Fast (None when it cannot have one: see the module docstring)."""
    obs = group.observer
    if not enabled() or (obs is not None and obs.extra):
        return None
    core = None
    if group.size > 1:
        core = getattr(arena, "native_core", None)
        if core is None:
            return None
    try:
        limits = tuple(_limit(group, c, LIMIT if arena is None else
                              _staged_max(arena, c, group.size)) for c in COLLECTIVES)
    except InvalidArgumentError:   # an unknown COLLCOMM_ALGO_* name: the regular path says so
        return None
    pkg = recorder_mod.PACKAGE_PREFIX
    fast = native.core.Fast(
        core=core, arena=arena, group=group, seq=group._seq, hooks=Hooks(group),
        append=obs.append if obs is not None else None, observer=obs,
        obs_index=obs.index if obs is not None else 0,
        algo_ids=tuple(id(getattr(shm_direct, c)) for c in COLLECTIVES), pkg=pkg,
        tag_base=group._tag_base, seq_mask=_SEQ_MASK,
        plain_sigs=tuple(signature.make(c) if c in ("barrier", "all_to_all")
                         else signature.make(c, None, 0, 0) for c in COLLECTIVES),
        dtype_sigs=tuple(signature.dtype_code(d) for d in _DTYPES) + (signature.dtype_code("bfloat16"),),
        limits=limits, size=group.size, rank=group.rank)
    fast.a2a_cma = -1 if arena is None else shm_large.a2a_cma_limit(arena)   # as shm_direct's
    fast.bcast_cma = _bcast_cma(group, arena, limits[COLLECTIVES.index("broadcast")])
    fast.scatter_cma = _rooted_cma(group, arena, "scatter")
    fast.gather_cma = _rooted_cma(group, arena, "gather")
    fast.ag_cma = 0 if arena is None else shm_large.split_from(arena, "all_gather")
    fast.cma_key = CMA
    # small asynchronous all_reduce / broadcast in two parts (native/_fastcall_parts.c)
    calls = group.async_calls
    fast.set_async(Work, threading.Lock, calls.items, calls.exec_lock, group._lock, calls)
    calls.part_age = fast.part_age
    return fast


def _bcast_cma(group: Any, arena: Any, staged: int) -> int:
    """From how many bytes the fast call runs a broadcast split by cross-memory attach,
    as shm_move.broadcast's native call does (0: never). Only where shm_large splits every
    broadcast from CMA_MIN or less up (shm_large.split_from; BCAST_PAIR_MIN at n = 2), the
    fast call takes those below (staged: ``staged`` is below that) and the plan picks
    shm_direct at every size; its buffer, in the shared heap or not, is read by CMA (a
    regular root's heap buffer is read in place: the two forms meet, see broadcast_after)."""
    split = 0 if arena is None else shm_large.split_from(arena, "broadcast")
    if (not split or split > CMA_MIN or not staged or arena.n > 64 or not arena.cma_write
            or not _limit(group, "broadcast", 1 << 40)):
        return 0
    return split


def _rooted_cma(group: Any, arena: Any, collective: str) -> int:
    """From how many bytes (n blocks) the fast call runs a scatter or gather split by
    cross-memory attach, as shm_scatter's / shm_move's native call does (0: never): from
    where shm_large starts splitting (shm_large.split_from: past CMA_MIN, SCATTER_PAIR_MIN
    for a scatter between two ranks, from ROOTED_PARALLEL with a core per rank, or a
    scatter's SCATTER_SPLIT among more ranks than cores; the fast
    call stages those below, see _staged_max), where the ranks may write each other's
    memory and the plan picks shm_direct at every size."""
    split = 0 if arena is None else shm_large.split_from(arena, collective)
    if not split or arena.n > 64 or not arena.cma_write or not _limit(group, collective, 1 << 40):
        return 0
    return split


def _flat(x: Any) -> Any:
    """_array(x), one-dimensional (a view: the C call took only C-contiguous buffers), as
    shm_direct's collectives take their buffers."""
    x = _array(x)
    return x.reshape(-1) if isinstance(x, np.ndarray) else x


def _joined(items: Any, k: int, dtype: np.dtype) -> np.ndarray | None:
    """The list's buffers as one flat array over their own memory, when they lie back to
    back (k elements of ``dtype`` each, in order: as the C entry splits a gather from such
    a list, _fastcall_lists.c), else None."""
    first = _array(items[0])
    if not isinstance(first, np.ndarray) or first.dtype != dtype or first.size != k:
        return None
    start, width = first.__array_interface__["data"][0], k * dtype.itemsize
    for r, x in enumerate(items):
        x = _array(x)
        if (not isinstance(x, np.ndarray) or not x.flags.c_contiguous or x.size != k
                or x.__array_interface__["data"][0] != start + r * width):
            return None
    # a view of the first buffer reaching over the others (it keeps the first one's base,
    # the whole allocation where the list was cut from one array, alive)
    return np.lib.stride_tricks.as_strided(first.reshape(-1), (k * len(items),), (dtype.itemsize,))


def _array(x: Any) -> Any:
    """A buffer the C call took (a bytearray, an array.array …) as a numpy array over the
    same memory; anything else as it is."""
    if x is None or isinstance(x, np.ndarray):
        return x
    try:
        return np.asarray(memoryview(x))
    except TypeError:      # an op, a root, a list of counts: not a buffer
        return x


class Hooks:
    """What the C fast call asks Python (see native/_fastcall.c)."""

    __slots__ = ("group",)

    def __init__(self, group: Any) -> None:
        self.group = group

    def learn(self, op: Any, dt: int) -> tuple[int, int]:
        """(kernel code or -1, all_reduce signature base) of ``op`` on native dtype ``dt``;
        -1 sends such calls the regular way (AVG, user functions, an op that does not fit
        the dtype: the regular path raises that error)."""
        if dt >= len(_DTYPES):
            return -1, 0
        dtype = _DTYPES[dt]
        try:
            rop = ops.ReduceOp.from_any(op)
            if rop is ops.ReduceOp.AVG or rop.name not in native.OPS:
                return -1, 0
            fn, avg, op_name = self.group.plan.reducer(op, dtype, "all_reduce")
        except (InvalidArgumentError, TypeError, ValueError):
            return -1, 0
        if avg:
            return -1, 0
        return native.code_for(fn, dtype), signature.make("all_reduce", dtype, 0, 0, op_name)

    def _comm(self, tag: int, sig: int) -> Any:
        from .call_comm import GroupComm
        from .timeouts import current_timeout

        g = self.group
        return GroupComm(g, tag, current_timeout(g.timeout), sig)

    def failed(self, exc: BaseException, rec: Any, name: str, tag: int, sig: int) -> BaseException:
        """The error to raise for ``exc`` out of the C call (as ProcessGroup.call raises it)."""
        if not isinstance(exc, CollcommError):
            return exc
        g = self.group
        context = f"{name} on {g.describe()}"
        if rec is not None and g.observer is not None:
            err = g.observer.failed(rec, exc, self._comm(tag, sig), context)
        else:
            err = with_context(exc, context)
        if err is not exc:
            err.__cause__ = exc
        return err

    def finish(self, status: int, rec: Any, name: str, tag: int, sig: int, fc: int,
               a: Any, b: Any, c: Any) -> None:
        """Complete a call the C code handed back with ``status`` (shm_stage's statuses);
        ``a``, ``b``, ``c`` are what the C entry passes (see :meth:`_args`)."""
        g = self.group
        comm = self._comm(tag, sig)
        collective = COLLECTIVES[fc]
        try:
            if collective in ("all_gather", "gather", "scatter") and isinstance(c, (list, tuple)):
                self._finish_list(comm, status, collective, sig, b if collective == "scatter" else a, c)
            else:
                args = self._args(collective, name, sig, _flat(a), _flat(b), c)
                shm_direct.finish_native(comm, status, collective, *args)
        except CollcommError as exc:
            raise self.failed(exc, rec, name, tag, sig) from exc
        if rec is not None:
            g.observer.done = rec

    def _finish_list(self, comm: Any, status: int, collective: str, sig: int, one: Any,
                     items: Any) -> None:
        """finish for a list form (native/_fastcall_lists.c: all_gather, gather and scatter
        at the root): ``one`` is this rank's own buffer (the gathers' send, scatter's
        receive), ``items`` the list, which stands for the contiguous buffer shm_direct
        takes. Our own block is already in place (gathers: in ``items[rank]``; scatter: in
        ``one``)."""
        root = (sig >> 36) & signature.NO_ROOT
        one = _array(one).reshape(-1)
        k, me = one.size, comm.rank
        if collective == "scatter":
            send = np.concatenate([_array(x).reshape(-1) for x in items]).astype(one.dtype, copy=False)
            shm_direct.finish_native(comm, status, collective, send, one, root)
            return
        joined = _joined(items, k, one.dtype)   # (a split gather's: the others wrote there)
        recv = np.empty(k * len(items), one.dtype) if joined is None else joined
        recv[me * k:(me + 1) * k] = one
        shm_direct.finish_native(comm, status, collective, one, recv,
                                 *(() if collective == "all_gather" else (root,)))
        if joined is not None:
            return
        for r, x in enumerate(items):
            if r != me:
                memoryview(x).cast("B")[:] = recv[r * k:(r + 1) * k].view(np.uint8)

    def _args(self, collective: str, name: str, sig: int, a: Any, b: Any, c: Any) -> tuple:
        """shm_direct's arguments after ``comm`` for what the C entry of ``collective``
        passed as (a, b, c)."""
        root = (sig >> 36) & signature.NO_ROOT
        if collective == "all_reduce":            # (recv, op, -)
            return a, self._combiner(b, a, name)
        if collective == "reduce":                # (send, recv or None, op)
            return a, b, self._combiner(c, a, name), root
        if collective == "reduce_scatter":        # (send, recv, op)
            return a, b, self._combiner(c, a, name)
        if collective == "all_to_all":            # (send, recv, the equal counts)
            if type(c) is tuple:                  # all_to_all_v: (send counts, recv counts)
                sc, rc = list(c[0]), list(c[1])
                return a[:sum(sc)], sc, b[:sum(rc)], rc
            return a, c, b, c
        if collective in ("gather", "scatter"):   # (send, recv, root)
            return a, b, root
        return {"barrier": (), "broadcast": (a, b), "all_gather": (a, b)}[collective]

    def _combiner(self, op: Any, buf: np.ndarray, name: str) -> Any:
        return self.group.plan.reducer(op, buf.dtype, name)[0]
