"""Point-to-point calls of the functional API: ``send``/``recv``, ``isend``/``irecv`` and
``batch_isend_irecv``, torch's names and argument forms.

Peers are global ranks (``dst``/``src``) or ranks of the group (``group_dst``/
``group_src``); ``src=None`` on a receive takes any source. A blocking ``send``/``recv``
of a plain array to a rank of this host is offered first to the group's native
point-to-point entry (:func:`collcomm.core.p2p.native`), after every argument check,
which writes the flight recorder's record in C; when it declines, the call goes through the group's
engine like ``isend``/``irecv``, whose handles are :class:`P2PWork`. ``isend``, ``irecv``
and ``batch_isend_irecv`` use the native entry too: a send done at once (a completed
handle), a receive deferred to its ``wait()`` (core/p2p.py ``Deferred``); their works are
in api_p2p_work.py, and a batch on the world group starts in one C call
(``P2P.batch``). Errors carry the
call, the peer and the group (``isend to global rank 1 on group 'WORLD' ...``), and a
receive of a different byte count than its buffer's is a
:class:`~collcomm.errors.MismatchError`.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .algorithms import signature
from .api_args import p2p_group, p2p_peer
from .buffers import Buf, as_input, as_output
from .core import p2p as core_p2p
from .core import runtime
from .core.group import ProcessGroup
from .core.tags import MAX_USER_TAG
from .api_p2p_work import (LentWork, P2PWork, RecvWork, SentWork, _p2p_context, _size_error, lend_native,
                           start_native)
from .errors import CollcommError, InvalidArgumentError, with_context
from .transport.base import Handle, Status

__all__ = ["P2POp", "P2PWork", "batch_isend_irecv", "irecv", "isend", "recv", "send"]


_p2p_sig = signature.p2p      # (cached per dtype)
_SIGS = signature._P2P        # (its cache, which P2P.batch reads)


def _isend(tensor: Any, dst: int | None, group: Any, tag: int, group_dst: int | None,
           name: str, rec: list[Any] | None = None, lend: bool = False
           ) -> tuple[Handle, ProcessGroup, Buf, int]:
    g = p2p_group(group, name)
    buf = as_input(tensor, name, g.describe(), "tensor")
    peer = p2p_peer(g, name, "dst", dst, group_dst)
    assert peer is not None
    return g.p2p_isend(buf.arr, peer, tag, _p2p_sig(buf.dtype), rec, lend), g, buf, peer


def _irecv(tensor: Any, src: int | None, group: Any, tag: int, group_src: int | None,
           name: str, rec: list[Any] | None = None) -> tuple[Handle, ProcessGroup, Buf, int | None]:
    g = p2p_group(group, name)
    buf = as_output(tensor, name, g.describe(), "tensor")
    peer = p2p_peer(g, name, "src", src, group_src, allow_any=True)
    return g.p2p_irecv(buf.arr, peer, tag, _p2p_sig(buf.dtype), rec), g, buf, peer


def _native(tensor: Any, peer: Any, group: Any, tag: Any, group_peer: Any,
            writable: bool, name: str) -> tuple[Any, ProcessGroup, int] | None:
    """(the group's native p2p entry, the group, the local peer) when a blocking send/recv
    may go native (core/p2p.py): a numeric C-contiguous numpy array (writable to receive),
    a global peer of the group other than this rank, a valid tag; else None (every check
    the regular path makes before it records the call is made here, so a native attempt
    that recorded the call hands its record to the regular path, which cannot refuse it)."""
    if (type(tensor) is not np.ndarray or group_peer is not None or type(peer) is not int
            or type(tag) is not int or not 0 <= tag <= MAX_USER_TAG):
        return None
    g = runtime._world if group is None else None
    if g is None:
        g = runtime.resolve_group(group, name)
        if type(g) is not ProcessGroup:
            return None
    try:
        f = g._p2p_native
    except AttributeError:
        f = core_p2p.native(g)
    if f is None or tensor.dtype.kind not in "biufc":
        return None
    if g is runtime._world:
        local = peer if 0 <= peer < g.size else -1     # the world's ranks are its global ranks
    else:
        local = g.to_local(peer)
    if local < 0 or local == g.rank:
        return None
    if writable:      # (a send of a non-contiguous array: C declines, the regular path copies)
        flags = tensor.flags
        if not flags.c_contiguous or not flags.writeable:
            return None
    return f, g, local


def _world_native(tensor: Any, peer: Any, group: Any, tag: Any, group_peer: Any
                  ) -> tuple[Any, ProcessGroup, int] | None:
    """``_native``'s answer for a blocking send/recv on the world group in a few tests: an
    exact ndarray, int peer and tag, the world's native entry made; None: ask ``_native``.
    The rest of its checks (the peer a rank of this host other than this one, the tag's
    range, a numeric C-contiguous buffer, writable to receive) the C call makes before it
    records anything, declining (None) where one fails (native/_p2p_calls.c)."""
    g = runtime._world
    if (group is None and group_peer is None and g is not None and type(peer) is int
            and type(tag) is int and type(tensor) is np.ndarray):
        f = getattr(g, "_p2p_native", None)
        if f is not None:
            return f, g, peer
    return None


def isend(tensor: Any, dst: int | None = None, group: Any = None, tag: int = 0,
          group_dst: int | None = None) -> P2PWork:
    """Start sending ``tensor`` to global rank ``dst``; returns a handle with ``wait()``.

    A small array to a rank of this host is sent at once natively when its ring has room
    (one C call; the handle is then complete and the array free to reuse, as the regular
    path's is after a shared-memory send); one past the inline limit to a rank that takes
    loans is lent from C: the receiver reads it from the array, and the handle completes
    when it has (api_p2p_work.LentWork; batch_isend_irecv lends from 64 KiB, shm_lent.LEND_FROM_WORK)."""
    g = runtime._world
    if group is None and group_dst is None and g is not None:    # the world: one C call
        f = getattr(g, "_p2p_native", None)
        if f is not None and (w := f.one(False, tensor, dst, tag, np.ndarray, _SIGS, SentWork,
                                         RecvWork, g, g.observer is not None)) is not None:
            return w
    fast = _native(tensor, dst, group, tag, group_dst, False, "isend")
    if fast is not None:
        sig = _p2p_sig(tensor.dtype)
        w = lend_native(*fast, tensor, tag, sig, True) or start_native(*fast, False, tensor, tag, sig)
        if w is not None:
            return w
    h, g, buf, peer = _isend(tensor, dst, group, tag, group_dst, "isend", lend=True)
    return P2PWork("isend", h, g, buf, g.to_global(peer))


def irecv(tensor: Any, src: int | None = None, group: Any = None, tag: int = 0,
          group_src: int | None = None) -> P2PWork:
    """Start receiving into ``tensor`` from global rank ``src`` (None: any rank of the group).

    A receive of a numeric array from a rank of this host is deferred to its wait, which
    receives natively when it can (core/p2p.py ``Deferred``: still matched in posting order)."""
    g = runtime._world
    if group is None and group_src is None and g is not None:    # the world: one C call
        f = getattr(g, "_p2p_native", None)
        if f is not None and (w := f.one(True, tensor, src, tag, np.ndarray, _SIGS, SentWork,
                                         RecvWork, g, g.observer is not None)) is not None:
            return w
    fast = _native(tensor, src, group, tag, group_src, True, "irecv")
    if fast is not None:
        w = start_native(*fast, True, tensor, tag, _p2p_sig(tensor.dtype))
        if w is not None:
            return w
    h, g, buf, peer = _irecv(tensor, src, group, tag, group_src, "irecv")
    return P2PWork("irecv", h, g, buf, None if peer is None else g.to_global(peer))


def send(tensor: Any, dst: int | None = None, group: Any = None, tag: int = 0,
         group_dst: int | None = None) -> None:
    """Send ``tensor`` to global rank ``dst`` and wait until it left this buffer."""
    fast = _world_native(tensor, dst, group, tag, group_dst)
    if fast is None:
        fast = _native(tensor, dst, group, tag, group_dst, False, "isend")
    if fast is not None:     # one C call (native/_p2p.c) with its record, or nothing done
        f, g, local = fast
        if f.send(tensor, local, tag, _p2p_sig(tensor.dtype), True):
            return
    h, g, buf, peer = _isend(tensor, dst, group, tag, group_dst, "isend")   # (records itself)
    try:
        h.wait()
    except CollcommError as exc:   # what isend(...).wait() raises, without the P2PWork
        raise with_context(exc, _p2p_context("isend", g, g.to_global(peer))) from exc


def recv(tensor: Any, src: int | None = None, group: Any = None, tag: int = 0,
         group_src: int | None = None) -> int:
    """Receive into ``tensor`` from ``src`` (None: any rank); returns the sender's global rank."""
    rec = None
    fast = _world_native(tensor, src, group, tag, group_src)
    if fast is None:
        fast = _native(tensor, src, group, tag, group_src, True, "irecv")
    if fast is not None:     # one C call (native/_p2p.c) with its record, or nothing consumed
        f, g, local = fast
        try:
            n = f.recv(tensor, local, tag, MAX_USER_TAG, _p2p_sig(tensor.dtype), True)
        except CollcommError as exc:   # what the regular wait raises, with its context
            raise with_context(exc, _p2p_context("irecv", g, src)) from exc
        if type(n) is int:
            if n != tensor.nbytes:
                raise _size_error(_p2p_context("irecv", g, src), Status(src, n, tag),
                                  as_output(tensor, "irecv", g.describe(), "tensor"))
            return src
        rec = n              # None, or the record C made before it left the message to us
    try:
        h, g, buf, peer = _irecv(tensor, src, group, tag, group_src, "irecv", rec)
    except CollcommError:
        core_p2p.finished(rec, False)
        raise
    try:
        status = h.wait()
    except CollcommError as exc:   # what irecv(...).source_rank() raises, without the P2PWork
        raise with_context(exc, _p2p_context("irecv", g, None if peer is None else g.to_global(peer))) from exc
    if status.nbytes != buf.arr.nbytes:
        raise _size_error(_p2p_context("irecv", g, None if peer is None else g.to_global(peer)), status, buf)
    return status.source


class P2POp:
    """One operation of :func:`batch_isend_irecv`: ``P2POp(dist.isend, tensor, peer)``."""

    # (slots: the native batch reads them at their offsets, native/_p2p_batch.c)
    __slots__ = ("op", "tensor", "peer", "group", "tag", "group_peer")

    def __init__(self, op: Callable[..., Any], tensor: Any, peer: int | None = None,
                 group: Any = None, tag: int = 0, group_peer: int | None = None) -> None:
        if op not in (isend, irecv) and getattr(op, "__name__", "") not in ("isend", "irecv"):
            raise InvalidArgumentError(
                f"P2POp: op must be collcomm.isend or collcomm.irecv, got {op!r}")
        if peer is None and group_peer is None:
            raise InvalidArgumentError("P2POp: peer (a global rank) or group_peer is required")
        self.op = isend if getattr(op, "__name__", "") == "isend" else irecv
        self.tensor, self.peer, self.group, self.tag, self.group_peer = tensor, peer, group, tag, group_peer

    def __repr__(self) -> str:
        return f"P2POp({self.op.__name__}, peer={self.peer}, tag={self.tag})"


def batch_isend_irecv(p2p_op_list: list[P2POp]) -> list[P2PWork]:
    """Start every op of the list (all validated first); returns their handles in order."""
    g = runtime._world      # the world's whole batch in one C call (see _native_batch)
    f = None if g is None else getattr(g, "_p2p_native", None)
    tried = None
    if f is not None:
        tried = f.batch(p2p_op_list, P2POp, irecv, np.ndarray, _SIGS, SentWork, RecvWork, g,
                        g.observer is not None, LentWork)
        if tried is not None and len(tried) == len(p2p_op_list):
            return tried
    return _batch_rest(p2p_op_list, f is not None, tried)


def _batch_rest(p2p_op_list: list[P2POp], tried: bool, started: list[P2PWork] | None) -> list[P2PWork]:
    """The rest of :func:`batch_isend_irecv` once the world's C call (``tried``) started
    ``started`` (None: it declined) or was not made: the ops it left, natively one by one
    or on the regular path (native/_p2p_entry.c calls this too)."""
    works = _native_batch(p2p_op_list, tried, started)
    if works is not None:
        return works
    if not isinstance(p2p_op_list, (list, tuple)) or not all(isinstance(p, P2POp) for p in p2p_op_list):
        raise InvalidArgumentError(
            f"batch_isend_irecv: expected a list of P2POp, got {p2p_op_list!r:.200}")
    prepared = []
    for i, p in enumerate(p2p_op_list):
        name = p.op.__name__
        g = p2p_group(p.group, "batch_isend_irecv")
        what = f"p2p_op_list[{i}].tensor"
        buf = (as_input if name == "isend" else as_output)(p.tensor, "batch_isend_irecv", g.describe(), what)
        peer = p2p_peer(g, "batch_isend_irecv", "peer", p.peer, p.group_peer)
        g._p2p_tag(p.tag, "batch_isend_irecv")
        prepared.append((name, g, buf, peer, p.tag))
    works = []
    for name, g, buf, peer, tag in prepared:
        w = None
        if isinstance(buf.dtype, np.dtype) and buf.dtype.kind in "biufc" and peer != g.rank:
            f = core_p2p.native(g)
            if f is not None:
                w = start_native(f, g, peer, name == "irecv", buf.arr, tag, _p2p_sig(buf.dtype))
        works.append(w if w is not None else _regular(name, g, buf, peer, tag))
    return works


def _regular(name: str, g: ProcessGroup, buf: Buf, peer: int, tag: int) -> P2PWork:
    """An op of ``batch_isend_irecv`` started on the regular path (its checks made)."""
    if name == "isend":
        h = g.p2p_isend(buf.arr, peer, tag, _p2p_sig(buf.dtype), lend=True)
    else:
        h = g.p2p_irecv(buf.arr, peer, tag, _p2p_sig(buf.dtype))
    return P2PWork(name, h, g, buf, g.to_global(peer))


def _native_batch(ops: list[P2POp] | tuple[P2POp, ...], tried: bool = False,
                  started: list[P2PWork] | None = None) -> list[P2PWork] | None:
    """``batch_isend_irecv`` when every op is a plain array to or from a rank of this host
    (``_native`` checks each as the regular path would, so none of them can be refused):
    each send done at once natively, each receive deferred to its wait (the regular path
    for one C declines); None having started nothing when any op is not such (or the
    list is no list of P2POp: the regular path raises). On the world group the whole
    batch is one C call (``P2P.batch``, native/_p2p_batch.c: the same checks, works,
    records and order, a send of ``lend_from`` bytes or more lent as ``lend_native`` lends)
    when it takes it: it starts the ops up to the first send it cannot write, the rest
    start here one by one. ``tried``: batch_isend_irecv made that C call
    already, which started ``started`` (None: it declined), not made again."""
    g = runtime._world
    f = None if g is None else getattr(g, "_p2p_native", False)
    if f is False:
        f = core_p2p.native(g)      # (made on first use)
    if f is not None:
        works = started if tried else f.batch(
            ops, P2POp, irecv, np.ndarray, _SIGS, SentWork, RecvWork, g, g.observer is not None,
            LentWork)
        if works is not None:        # every op checked: on the world, local rank = global
            if len(works) < len(ops):
                works.extend(_start(f, g, p.peer, p) for p in ops[len(works):])
            return works
    if type(ops) is not list and type(ops) is not tuple:
        return None
    fast = []
    for p in ops:
        if type(p) is not P2POp:
            return None
        nat = _native(p.tensor, p.peer, p.group, p.tag, p.group_peer, p.op is irecv, "batch_isend_irecv")
        if nat is None:
            return None
        fast.append(nat)
    return [_start(f, g, local, p) for p, (f, g, local) in zip(ops, fast)] or None


def _start(f: Any, g: ProcessGroup, local: int, p: P2POp) -> P2PWork:
    """One op of a checked batch: natively, else (C declined it) on the regular path."""
    arr, recv = p.tensor, p.op is irecv
    sig = _p2p_sig(arr.dtype)
    w = None if recv else lend_native(f, g, local, arr, p.tag, sig)
    if w is None:
        w = start_native(f, g, local, recv, arr, p.tag, sig)
    if w is None:
        buf = (as_output if recv else as_input)(arr, "batch_isend_irecv", g.describe(), "tensor")
        w = _regular("irecv" if recv else "isend", g, buf, local, p.tag)
    return w


def _native_entry() -> Any:
    """:func:`batch_isend_irecv` as a C callable where the native core is loaded
    (native/_p2p_entry.c: the function's first lines without its frame); the Python
    function stays the reference, its fallback and its ``__wrapped__``."""
    from . import native
    make = getattr(native.core, "BatchCall", None)
    if make is None:
        return batch_isend_irecv
    return make(batch_isend_irecv, _batch_rest, runtime, P2POp, irecv, np.ndarray, _SIGS,
                SentWork, RecvWork, LentWork)


batch_isend_irecv = _native_entry()  # noqa: F811 - the same call, in C where it is built
