"""Point-to-point calls of the functional API: ``send``/``recv``, ``isend``/``irecv`` and
``batch_isend_irecv``, torch's names and argument forms.

Peers are global ranks (``dst``/``src``) or ranks of the group (``group_dst``/
``group_src``); ``src=None`` on a receive takes any source. A blocking ``send``/``recv``
of a plain array to a rank of this host is offered first to the group's native
point-to-point entry (:func:`collcomm.core.p2p.native`), after every argument check,
which writes the flight recorder's record in C; when it declines, the call goes through the group's
engine like ``isend``/``irecv``, whose handles are :class:`P2PWork`. ``isend``, ``irecv``
and ``batch_isend_irecv`` use the native entry too: a send done at once (a completed
handle), a receive deferred to its ``wait()`` (core/p2p.py ``Deferred``). Errors carry the
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
from .errors import CollcommError, InvalidArgumentError, MismatchError, with_context
from .transport.base import Handle, Status

__all__ = ["P2POp", "P2PWork", "batch_isend_irecv", "irecv", "isend", "recv", "send"]


def _p2p_context(name: str, g: ProcessGroup, peer: int | None) -> str:
    """What an error of a point-to-point call is prefixed with (``peer``: global, None = any)."""
    who = "any rank" if peer is None else f"global rank {peer}"
    return f"{name} {'to' if name == 'isend' else 'from'} {who} on {g.describe()}"


def _size_error(context: str, status: Status, buf: Buf) -> MismatchError:
    return MismatchError(f"{context}: received {status.nbytes} bytes, expected "
                         f"{buf.arr.nbytes} ({buf.describe()}); sizes must match")


class P2PWork:
    """The handle of an ``isend``/``irecv``: ``wait()``, ``is_completed()``, ``source_rank()``."""

    def __init__(self, name: str, handle: Handle, g: ProcessGroup, buf: Buf | np.ndarray,
                 peer: int | None) -> None:
        self.name = name
        self._handle = handle
        self._group = g
        self._buf = buf          # keeps the (possibly copied) payload alive until done
        self._peer = peer        # global rank, None = any
        self._status: Status | None = None
        self._exc: BaseException | None = None

    def _size_error(self, status: Status) -> MismatchError:
        buf = self._buf
        if type(buf) is np.ndarray:     # (a native call's: its Buf made only for the error)
            buf = as_output(buf, "irecv", self._group.describe(), "tensor")
        return _size_error(self._context(), status, buf)

    def _context(self) -> str:
        return _p2p_context(self.name, self._group, self._peer)

    def wait(self, timeout: float | None = None) -> bool:
        if self._exc is not None:
            raise self._exc
        if self._status is None:
            try:
                status = self._handle.wait(timeout)
            except CollcommError as exc:
                if timeout is not None and type(exc).__name__ == "CommTimeoutError":
                    raise with_context(exc, self._context()) from exc  # retryable: keep handle
                self._exc = with_context(exc, self._context())
                raise self._exc from exc
            if self.name == "irecv" and status.nbytes != (
                    self._buf.nbytes if type(self._buf) is np.ndarray else self._buf.arr.nbytes):
                self._exc = self._size_error(status)
                raise self._exc
            self._status = status
        return True

    def is_completed(self) -> bool:
        if self._status is not None or self._exc is not None:
            return True
        try:
            done = self._handle.test()
        except CollcommError:
            return True
        return done

    def is_success(self) -> bool:
        return self._status is not None

    def exception(self) -> BaseException | None:
        return self._exc

    def source_rank(self) -> int:
        """The global rank the message came from (irecv) or went to (isend); waits first."""
        self.wait()
        assert self._status is not None
        return self._status.source

    def result(self) -> list[Any]:
        self.wait()
        return []




_p2p_sig = signature.p2p      # (cached per dtype)


def _isend(tensor: Any, dst: int | None, group: Any, tag: int, group_dst: int | None,
           name: str, rec: list[Any] | None = None) -> tuple[Handle, ProcessGroup, Buf, int]:
    g = p2p_group(group, name)
    buf = as_input(tensor, name, g.describe(), "tensor")
    peer = p2p_peer(g, name, "dst", dst, group_dst)
    assert peer is not None
    return g.p2p_isend(buf.arr, peer, tag, _p2p_sig(buf.dtype), rec), g, buf, peer


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


def _start_native(f: Any, g: ProcessGroup, name: str, arr: np.ndarray, local: int, tag: int) -> Any:
    """``name`` ("isend" / "irecv") of ``arr`` with local rank ``local`` through the native
    entry ``f``: a send done at once, a receive deferred to its wait (core/p2p.py); None
    having done nothing (the caller takes the regular path)."""
    sig, record = _p2p_sig(arr.dtype), g.observer is not None
    if name == "isend":
        return core_p2p.native_isend(f, g, arr, local, tag, sig, record)
    return core_p2p.defer(f, g, arr, local, tag, MAX_USER_TAG, sig, record)


def isend(tensor: Any, dst: int | None = None, group: Any = None, tag: int = 0,
          group_dst: int | None = None) -> P2PWork:
    """Start sending ``tensor`` to global rank ``dst``; returns a handle with ``wait()``.

    A small array to a rank of this host is sent at once natively when its ring has room
    (one C call; the handle is then complete and the array free to reuse, as the regular
    path's is after a shared-memory send)."""
    fast = _native(tensor, dst, group, tag, group_dst, False, "isend")
    if fast is not None:
        f, g, local = fast
        h = _start_native(f, g, "isend", tensor, local, tag)
        if h is not None:
            return P2PWork("isend", h, g, tensor, dst)
    h, g, buf, peer = _isend(tensor, dst, group, tag, group_dst, "isend")
    return P2PWork("isend", h, g, buf, g.to_global(peer))


def irecv(tensor: Any, src: int | None = None, group: Any = None, tag: int = 0,
          group_src: int | None = None) -> P2PWork:
    """Start receiving into ``tensor`` from global rank ``src`` (None: any rank of the group).

    A receive of a numeric array from a rank of this host is deferred to its wait, which
    receives natively when it can (core/p2p.py ``Deferred``: still matched in posting order)."""
    fast = _native(tensor, src, group, tag, group_src, True, "irecv")
    if fast is not None:
        f, g, local = fast
        h = _start_native(f, g, "irecv", tensor, local, tag)
        if h is not None:
            return P2PWork("irecv", h, g, tensor, src)
    h, g, buf, peer = _irecv(tensor, src, group, tag, group_src, "irecv")
    return P2PWork("irecv", h, g, buf, None if peer is None else g.to_global(peer))


def send(tensor: Any, dst: int | None = None, group: Any = None, tag: int = 0,
         group_dst: int | None = None) -> None:
    """Send ``tensor`` to global rank ``dst`` and wait until it left this buffer."""
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
    if not isinstance(p2p_op_list, (list, tuple)) or not all(isinstance(p, P2POp) for p in p2p_op_list):
        raise InvalidArgumentError(
            f"batch_isend_irecv: expected a list of P2POp, got {p2p_op_list!r:.200}")
    works = _native_batch(p2p_op_list)
    if works is not None:
        return works
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
        h = None
        if isinstance(buf.dtype, np.dtype) and buf.dtype.kind in "biufc" and peer != g.rank:
            f = core_p2p.native(g)
            if f is not None:
                h = _start_native(f, g, name, buf.arr, peer, tag)
        if h is None:
            if name == "isend":
                h = g.p2p_isend(buf.arr, peer, tag, _p2p_sig(buf.dtype))
            else:
                h = g.p2p_irecv(buf.arr, peer, tag, _p2p_sig(buf.dtype))
        works.append(P2PWork(name, h, g, buf, g.to_global(peer)))
    return works


def _native_batch(ops: list[P2POp] | tuple[P2POp, ...]) -> list[P2PWork] | None:
    """``batch_isend_irecv`` when every op is a plain array to or from a rank of this host
    (``_native`` checks each as the regular path would, so none of them can be refused):
    each send done at once natively, each receive deferred to its wait (the regular path
    for one C declines); None having started nothing when any op is not such."""
    fast = []
    for p in ops:
        recv = p.op is irecv
        nat = _native(p.tensor, p.peer, p.group, p.tag, p.group_peer, recv, "batch_isend_irecv")
        if nat is None:
            return None
        fast.append(nat)
    works = []
    for p, (f, g, local) in zip(ops, fast):
        arr = p.tensor
        name = p.op.__name__
        h = _start_native(f, g, name, arr, local, p.tag)
        if h is None and name == "irecv":
            buf = as_output(arr, "batch_isend_irecv", g.describe(), "tensor")
            h = g.p2p_irecv(buf.arr, local, p.tag, _p2p_sig(arr.dtype))
        elif h is None:
            buf = as_input(arr, "batch_isend_irecv", g.describe(), "tensor")
            h = g.p2p_isend(buf.arr, local, p.tag, _p2p_sig(arr.dtype))
            arr = buf        # (the handle keeps the Buf it sent, as the regular path's does)
        works.append(P2PWork(name, h, g, arr, p.peer))
    return works
