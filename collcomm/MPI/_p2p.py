"""Point to point with buffers: ``Send/Recv/Isend/Irecv/Ssend/Sendrecv/Probe/Mprobe…``.

Messages travel in the communicator's user tag space (:mod:`collcomm.core.p2p`). Within
its 35 bits collcomm.MPI uses: bits 0–30 the MPI tag (``TAG_UB`` = 2**31 - 1), bit 31
*sync* (an ``Ssend``: the receiver answers with an *ack*, bit 32, when the message is
matched, and the send completes only then), bit 33 *body* (the second part of a large
object, see :mod:`._pobj`). Receives compare the ack and body bits, so ``ANY_TAG`` never
catches them.

``PROC_NULL`` as a peer completes at once (status source ``PROC_NULL``, tag ``ANY_TAG``,
count 0); a bad rank raises ``ERR_RANK``, a bad tag ``ERR_TAG``, a message longer than the
receive buffer ``ERR_TRUNCATE``. ``Isend`` (not synchronous) of a small array to a rank of
this host is sent at once natively, ``Irecv`` from one deferred to its completion, which
receives natively when it can (:mod:`collcomm.core.p2p`: ``native(g).send``, ``defer``).
Sends complete without the receiver (every send is
eager), so ``Bsend``/``Rsend`` are ``Send`` and need no attached buffer. ``Cancel`` of a
receive that nothing matched yet withdraws it (``Status.Is_cancelled()``).
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..core import p2p
from ..errors import CollcommError
from ._consts import ANY_SOURCE, ANY_TAG, PROC_NULL, TAG_UB_VALUE
from ._errors import ERR_RANK, ERR_TAG, Exception as MPIException, translate
from ._msg import simple
from ._types import _BY_NUMPY
from ._request import Done, Request, Status, persistent

TAG_BITS = TAG_UB_VALUE
SYNC, ACK, BODY = 1 << 31, 1 << 32, 1 << 33
EXACT = p2p.MAX_USER_TAG & ~SYNC            # compare the tag, ack and body bits
WILD = p2p.MAX_USER_TAG & ~SYNC & ~TAG_BITS  # compare only the ack and body bits
_EMPTY = np.empty(0, dtype=np.uint8)


# ----------------------------------------------------------------------------- checks
def _dest(g: Any, dest: int, call: str) -> int | None:
    if dest == PROC_NULL:
        return None
    if not 0 <= dest < g.size:
        raise MPIException(ERR_RANK, f"{call} on {g.describe()}: dest must be in [0, {g.size}) or "
                                     f"MPI.PROC_NULL, got {dest}")
    return int(dest)


def _source(g: Any, source: int, call: str) -> int | None:
    if source == ANY_SOURCE:
        return None
    if not 0 <= source < g.size:
        raise MPIException(ERR_RANK, f"{call} on {g.describe()}: source must be in [0, {g.size}), "
                                     f"MPI.ANY_SOURCE or MPI.PROC_NULL, got {source}")
    return int(source)


def _stag(tag: int, call: str) -> int:
    if not 0 <= tag <= TAG_BITS:
        raise MPIException(ERR_TAG, f"{call}: tag must be in [0, {TAG_BITS}], got {tag}")
    return int(tag)


def _rtag(tag: int, call: str) -> tuple[int, int]:
    if tag == ANY_TAG:
        return 0, WILD
    return _stag(tag, call), EXACT


def _native_tag(tag: Any) -> tuple[int, int] | None:
    """(tag, mask) of a receive's ``tag`` for the native calls (``ANY_TAG``: any user
    tag, the message's read back from ``P2P.last_tag``), None for anything else."""
    if type(tag) is not int:
        return None
    if tag == ANY_TAG:
        return 0, WILD
    return (tag, EXACT) if 0 <= tag <= TAG_BITS else None


def _null_status(status: Status | None) -> None:
    if status is not None:
        status._set(PROC_NULL, ANY_TAG, 0)


# ----------------------------------------------------------------------------- operations
class _Send:
    """A send (and, for a synchronous one, the receiver's ack)."""

    def __init__(self, handles: list[Any]) -> None:
        self._h, self.value = handles, None
        self.source, self.tag, self.nbytes, self.cancelled = ANY_SOURCE, ANY_TAG, 0, False

    def test(self) -> bool:
        return all(h.test() for h in self._h)

    def wait(self) -> None:
        for h in self._h:
            h.wait()

    def cancel(self) -> None:
        return None      # the bytes are already on their way (eager sends)


def _ack(g: Any, source: int, tag: int) -> None:
    if tag & SYNC:
        p2p.isend(g, _EMPTY, source, ACK | (tag & TAG_BITS), "ack").wait()


class _Recv:
    """A buffer receive; acks a synchronous send when it completes."""

    def __init__(self, g: Any, handle: Any) -> None:
        self._g, self._h, self._done, self.value = g, handle, False, None
        self.source, self.tag, self.nbytes, self.cancelled = ANY_SOURCE, ANY_TAG, 0, False

    def _finish(self, st: Any) -> None:
        src, tag = p2p.source_tag(self._g, st)
        self.source, self.tag, self.nbytes, self._done = src, tag & TAG_BITS, st.nbytes, True
        _ack(self._g, src, tag)

    def test(self) -> bool:
        if not self._done and self._h.test():
            self._finish(self._h.wait())
        return self._done

    def wait(self) -> None:
        if not self._done:
            self._finish(self._h.wait())

    def cancel(self) -> None:
        """Withdrawn if no message matched it yet: it completes as cancelled (status
        ``Is_cancelled()``); a matched receive completes normally."""
        if not self._done and p2p.cancel(self._g, self._h):
            self._done, self.cancelled = True, True


class _NativeRecv:
    """``Irecv`` from one rank, started natively (a core Deferred, whose wait receives in
    C): the source is known from the start, so its wait only takes the byte count and the
    tag (an ``ANY_TAG`` receive's is the message's); a synchronous send's message (which
    C leaves to the Python receive) is finished and acked as :class:`_Recv` does."""

    __slots__ = ("_g", "_h", "_done", "source", "tag", "nbytes", "cancelled")
    value = None

    def __init__(self, g: Any, handle: Any, source: int, tag: int) -> None:
        self._g, self._h, self._done = g, handle, False
        self.source, self.tag, self.nbytes, self.cancelled = source, tag, 0, False

    def wait(self) -> None:
        if not self._done:
            st = self._h.wait()
            if st.tag & SYNC:
                _Recv._finish(self, st)    # type: ignore[arg-type]
            else:
                self.tag, self.nbytes, self._done = st.tag & TAG_BITS, st.nbytes, True

    def test(self) -> bool:
        if not self._done and self._h.test():
            self.wait()
        return self._done

    def cancel(self) -> None:
        _Recv.cancel(self)    # type: ignore[arg-type]
        if self.cancelled:    # (a cancelled receive's status as the general path gives it)
            self.source, self.tag = ANY_SOURCE, ANY_TAG


_SENT = Done(None, ANY_SOURCE, ANY_TAG, 0)   # what a request of a send done at once holds


def _request(op: Any) -> Request:
    r = Request()
    r._op = op
    return r


def _done_request(source: int = PROC_NULL) -> Request:
    return _request(Done(None, source, ANY_TAG, 0))


def complete(op: Any, status: Status | None = None) -> Any:
    """Wait for ``op`` (errors as MPI.Exception), fill ``status``, return its value."""
    try:
        op.wait()
    except CollcommError as exc:
        raise translate(exc) from exc
    _fill(status, op)
    return op.value


def _fill(status: Status | None, op: Any) -> None:
    if status is not None:
        status._set(op.source, op.tag, op.nbytes)


# ----------------------------------------------------------------------------- the mixin
class PointToPoint:
    """Point-to-point methods of a communicator (``self._grp(call)`` gives its group)."""

    __slots__ = ()

    _grp: Callable[..., Any]      # the communicator's group, from Comm

    # -- buffers ---------------------------------------------------------------------------
    def _isend(self, buf: Any, dest: int, tag: int, sync: bool, call: str) -> Any:
        g = self._grp(call)
        d, t = _dest(g, dest, call), _stag(tag, call)
        if d is None:
            return Done(None, PROC_NULL, ANY_TAG, 0)
        arr, _ = simple(buf, call, "buf")
        f = None if sync else p2p.native(g)
        if f is not None and f.send(arr, d, t, 0):   # sent at once natively, or nothing done
            return Done(None, ANY_SOURCE, ANY_TAG, 0)   # (what a completed _Send reads)
        try:
            handles = [p2p.isend(g, arr, d, (SYNC if sync else 0) | t, call)]
            if sync:
                handles.append(p2p.irecv(g, _EMPTY, d, ACK | t, p2p.MAX_USER_TAG, call))
        except CollcommError as exc:
            raise translate(exc) from exc
        return _Send(handles)

    def _irecv(self, buf: Any, source: int, tag: int, call: str) -> Any:
        g = self._grp(call)
        if source == PROC_NULL:
            return Done(None, PROC_NULL, ANY_TAG, 0)
        s, (t, mask) = _source(g, source, call), _rtag(tag, call)
        arr, _ = simple(buf, call, "buf", writable=True)
        f = None if s is None or s == g.rank else p2p.native(g)
        if f is not None and arr.dtype.kind in "biufc" and arr.flags.c_contiguous:
            # received natively at its wait if it can (core/p2p.py defer, in one C call)
            h = f.start(True, p2p.Deferred, g, arr, s, t, 0, False, mask)
            if h is not None:
                return _Recv(g, h)
        try:
            return _Recv(g, p2p.irecv(g, arr, s, t, mask, call))
        except CollcommError as exc:
            raise translate(exc) from exc

    _complete = staticmethod(lambda op, status=None: complete(op, status))

    def _sent_natively(self, buf: Any, dest: int, tag: int, call: str) -> bool:
        """Sent at once in one C call (native/_p2p.c); False: nothing done, the regular way."""
        f = p2p.native(self._grp(call))
        return bool(f is not None and type(buf) is np.ndarray and type(tag) is int
                    and tag <= TAG_BITS and f.send(buf, dest, tag, 0))

    def Send(self, buf: Any, dest: int, tag: int = 0) -> None:  # noqa: N802
        if not self._sent_natively(buf, dest, tag, "Send"):
            self._complete(self._isend(buf, dest, tag, False, "Send"))

    def Ssend(self, buf: Any, dest: int, tag: int = 0) -> None:  # noqa: N802
        self._complete(self._isend(buf, dest, tag, True, "Ssend"))

    Bsend = Rsend = Send

    def Isend(self, buf: Any, dest: int, tag: int = 0) -> Request:  # noqa: N802
        f = p2p.native(self._grp("Isend"))
        if f is not None and type(tag) is int and tag <= TAG_BITS:
            r = f.mpi_isend(buf, dest, tag, np.ndarray, Request, _SENT)   # sent at once, or None
            if r is not None:
                return r
        return _request(self._isend(buf, dest, tag, False, "Isend"))

    def Issend(self, buf: Any, dest: int, tag: int = 0) -> Request:  # noqa: N802
        return _request(self._isend(buf, dest, tag, True, "Issend"))

    Ibsend = Irsend = Isend

    def Recv(self, buf: Any, source: int = ANY_SOURCE, tag: int = ANY_TAG,  # noqa: N802
             status: Status | None = None) -> None:
        f = p2p.native(self._grp("Recv"))
        tm = _native_tag(tag) if f is not None and type(buf) is np.ndarray else None
        if tm is not None:
            try:
                n = f.recv(buf, source, tm[0], tm[1], 0)     # a specific source only
            except CollcommError as exc:
                raise translate(exc) from exc
            if n is not None:
                if status is not None:
                    status._set(source, f.last_tag & TAG_BITS, n)
                return
        self._complete(self._irecv(buf, source, tag, "Recv"), status)

    def Irecv(self, buf: Any, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> Request:  # noqa: N802
        g = self._grp("Irecv")
        f = p2p.native(g)
        tm = _native_tag(tag) if f is not None and type(source) is int else None
        if tm is not None and 0 <= source < g.size and source != g.rank:
            # _irecv's native start, its Request and op made in C (native/_p2p_mpi.c checks
            # the array: a plain 1-D C-contiguous writable numeric ndarray), without the
            # argument conversions; None: the general way
            r = f.mpi_irecv(g, buf, source, tm[0], tm[1], np.ndarray, p2p.Deferred, _NativeRecv,
                            Request)
            if r is not None:
                return r
        return _request(self._irecv(buf, source, tag, "Irecv"))

    def Sendrecv(self, sendbuf: Any, dest: int, sendtag: int = 0, recvbuf: Any = None,  # noqa: N802
                 source: int = ANY_SOURCE, recvtag: int = ANY_TAG, status: Status | None = None) -> None:
        g = self._grp("Sendrecv")
        f = p2p.native(g)
        tm = _native_tag(recvtag)
        if (f is not None and type(sendbuf) is np.ndarray and type(recvbuf) is np.ndarray
                and type(sendtag) is int and sendtag <= TAG_BITS and tm is not None
                and type(source) is int and 0 <= source < g.size
                and recvbuf.dtype in _BY_NUMPY and recvbuf.flags.writeable
                and recvbuf.flags.c_contiguous and f.send(sendbuf, dest, sendtag, 0)):
            # sent (the receive's arguments were valid, so the regular path would have sent
            # it too); the receive in C, or the regular way if C leaves it
            try:
                n = f.recv(recvbuf, source, tm[0], tm[1], 0)
            except CollcommError as exc:
                raise translate(exc) from exc
            if n is None:
                self._complete(self._irecv(recvbuf, source, recvtag, "Sendrecv"), status)
            elif status is not None:
                status._set(source, f.last_tag & TAG_BITS, n)
            return
        r = self._irecv(recvbuf, source, recvtag, "Sendrecv")
        s = self._isend(sendbuf, dest, sendtag, False, "Sendrecv")
        self._complete(s)
        self._complete(r, status)

    def Sendrecv_replace(self, buf: Any, dest: int, sendtag: int = 0, source: int = ANY_SOURCE,  # noqa: N802
                         recvtag: int = ANY_TAG, status: Status | None = None) -> None:
        arr, dt = simple(buf, "Sendrecv_replace", "buf", writable=True)
        self.Sendrecv(arr.copy(), dest, sendtag, [arr, dt], source, recvtag, status)

    def Isendrecv(self, sendbuf: Any, dest: int, sendtag: int = 0, recvbuf: Any = None,  # noqa: N802
                  source: int = ANY_SOURCE, recvtag: int = ANY_TAG) -> Request:
        r = self._irecv(recvbuf, source, recvtag, "Isendrecv")
        return _request(_Pair(self._isend(sendbuf, dest, sendtag, False, "Isendrecv"), r))

    def Isendrecv_replace(self, buf: Any, dest: int, sendtag: int = 0, source: int = ANY_SOURCE,  # noqa: N802
                          recvtag: int = ANY_TAG) -> Request:
        arr, dt = simple(buf, "Isendrecv_replace", "buf", writable=True)
        return self.Isendrecv(arr.copy(), dest, sendtag, [arr, dt], source, recvtag)

    # -- persistent ------------------------------------------------------------------------------
    def Send_init(self, buf: Any, dest: int, tag: int = 0) -> Any:  # noqa: N802
        return persistent(lambda: self._isend(buf, dest, tag, False, "Send_init"))

    Bsend_init = Rsend_init = Send_init

    def Ssend_init(self, buf: Any, dest: int, tag: int = 0) -> Any:  # noqa: N802
        return persistent(lambda: self._isend(buf, dest, tag, True, "Ssend_init"))

    def Recv_init(self, buf: Any, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> Any:  # noqa: N802
        return persistent(lambda: self._irecv(buf, source, tag, "Recv_init"))

    # -- probes ----------------------------------------------------------------------------------
    def _probe(self, source: int, tag: int, block: bool, take: bool, call: str) -> Any:
        g = self._grp(call)
        s, (t, mask) = _source(g, source, call), _rtag(tag, call)
        try:
            return g, p2p.probe(g, s, t, mask, block=block, take=take, op=call)
        except CollcommError as exc:
            raise translate(exc) from exc

    def Probe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Status | None = None) -> bool:  # noqa: N802
        if source == PROC_NULL:
            _null_status(status)
            return True
        _, m = self._probe(source, tag, True, False, "Probe")
        if status is not None:
            status._set(m.source, m.tag & TAG_BITS, m.nbytes)
        return True

    def Iprobe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Status | None = None) -> bool:  # noqa: N802
        if source == PROC_NULL:
            _null_status(status)
            return True
        _, m = self._probe(source, tag, False, False, "Iprobe")
        if m is not None and status is not None:
            status._set(m.source, m.tag & TAG_BITS, m.nbytes)
        return m is not None

    probe = Probe
    iprobe = Iprobe

    def Mprobe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Status | None = None) -> Any:  # noqa: N802
        if source == PROC_NULL:
            _null_status(status)
            from ._pobj import MESSAGE_NO_PROC
            return MESSAGE_NO_PROC
        g, m = self._probe(source, tag, True, True, "Mprobe")
        from ._pobj import Message
        return Message._claimed(g, m, status)

    def Improbe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Status | None = None) -> Any:  # noqa: N802
        if source == PROC_NULL:
            _null_status(status)
            from ._pobj import MESSAGE_NO_PROC
            return MESSAGE_NO_PROC
        g, m = self._probe(source, tag, False, True, "Improbe")
        from ._pobj import Message
        return None if m is None else Message._claimed(g, m, status)

    mprobe = Mprobe
    improbe = Improbe


class _Pair:
    """A send and a receive completing together (Isendrecv)."""

    def __init__(self, send: Any, recv: Any) -> None:
        self._s, self._r, self.value, self.cancelled = send, recv, None, False

    def test(self) -> bool:
        return bool(self._s.test()) and bool(self._r.test())

    def wait(self) -> None:
        self._s.wait()
        self._r.wait()

    def cancel(self) -> None:
        return None

    source = property(lambda self: self._r.source)
    tag = property(lambda self: self._r.tag)
    nbytes = property(lambda self: self._r.nbytes)


