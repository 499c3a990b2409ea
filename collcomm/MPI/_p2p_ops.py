"""collcomm.MPI point to point: the tag layout, argument checks and the operations a
Request holds (:mod:`._p2p` has the communicator's methods that make them).

An operation has ``wait``/``test``/``cancel`` and, once complete, ``source``, ``tag``,
``nbytes``, ``cancelled`` and ``value``: ``_Send`` (a send, and a synchronous one's ack),
``_Recv`` (a receive on the general path; a synchronous send's message it takes is
acknowledged the moment it does, core/p2p_sync.py), ``_NativeRecv``
(a receive started natively), ``_Pair`` (``Isendrecv``); ``complete`` waits for one with
MPI's errors and fills a Status.
"""
from __future__ import annotations

import threading
from typing import Any

import numpy as np

from ..core import p2p
from ..core.tags import ACK, BODY, MPI_TAG_BITS, SYNC
from ..core.p2p_loans import lent_base, loan_over
from ..errors import CollcommError
from ..transport.base import Status as Moved
from ._consts import ANY_SOURCE, ANY_TAG, PROC_NULL
from ._errors import ERR_RANK, ERR_TAG, Exception as MPIException, translate
from ._request import ORPHANS, Done, Request, Status, reap_orphans
from ._staging import unpack_staged

TAG_BITS = MPI_TAG_BITS     # MPI's TAG_UB; the flags above it: core/tags.py
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


class _LentSend(lent_base()):  # type: ignore[misc]
    """An ``Isend`` lent from C (P2P.lend, native/_p2p_lend.c): done once the receiver
    has read the buffer, or withdrawn past the patience; its wait is the C one of the
    functional API's lent works (native/_p2p_lent.c: the loan read already, or the
    deferred receives tried and a short spin), else core/p2p_loans.py's loop (``_wait``).
    The array is kept alive until then (dropped unwaited, the loan ends, or the array stays
    for its reader)."""

    __slots__ = ("source", "tag", "nbytes", "cancelled")
    value = None

    def __init__(self, f: Any, g: Any, local: int, loan: tuple[int, int, int], buf: Any) -> None:
        self._f, self._group, self._peer, self._local = f, g, g.ranks[local], local
        self._loan, self._buf, self._nbytes, self._rec = loan, buf, buf.nbytes, None
        self._status = self._exc = None
        self.source, self.tag, self.nbytes, self.cancelled = ANY_SOURCE, ANY_TAG, 0, False

    def _wait(self, timeout: float | None = None, spun: bool = False) -> bool:
        if self._buf is not None:
            try:
                loan_over(self._f, self._group, self._local, self._loan, self._buf, self._nbytes, True,
                          None, not spun)
                self._status = Moved(self._peer, self._nbytes)   # (as the C wait leaves it)
            finally:      # (over, or ended by its error: withdrawn, or the array kept)
                self._buf = None
        return True

    def test(self) -> bool:
        if self._buf is not None:
            try:
                if not loan_over(self._f, self._group, self._local, self._loan, self._buf, self._nbytes,
                                 False):
                    return False
            except BaseException:
                self._buf = None
                raise
            self._buf = None
        return True

    def cancel(self) -> None:
        return None      # (MPI: a send may not be cancellable; it completes as sent)


class _Recv:
    """A buffer receive (a synchronous send's message it takes was acknowledged when it
    did: core/p2p_sync.py)."""

    def __init__(self, g: Any, handle: Any) -> None:
        self._g, self._h, self._done, self.value = g, handle, False, None
        self.source, self.tag, self.nbytes, self.cancelled = ANY_SOURCE, ANY_TAG, 0, False

    def _finish(self, st: Any) -> None:
        src, tag = p2p.source_tag(self._g, st)
        self.source, self.tag, self.nbytes, self._done = src, tag & TAG_BITS, st.nbytes, True

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
    tag (an ``ANY_TAG`` receive's is the message's; a synchronous send's message, which C
    leaves to the engine, was acknowledged when the receive took it)."""

    __slots__ = ("_g", "_h", "_done", "source", "tag", "nbytes", "cancelled")
    value = None

    def __init__(self, g: Any, handle: Any, source: int, tag: int) -> None:
        self._g, self._h, self._done = g, handle, False
        self.source, self.tag, self.nbytes, self.cancelled = source, tag, 0, False

    def wait(self) -> None:
        if not self._done:
            st = self._h.wait()
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
    r = Request.__new__(Request)      # (no __init__: it only sets _op)
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
    if ORPHANS:
        reap_orphans()
    _fill(status, op)
    return op.value


def _fill(status: Status | None, op: Any) -> None:
    if status is not None:
        status._set(op.source, op.tag, op.nbytes)


class Unpacked:
    """A receive into a derived datatype with gaps: the receive (into a packed temporary),
    then the unpacking into the caller's memory (``staged``) once it completes."""

    def __init__(self, recv: Any, staged: list[Any]) -> None:
        self._r, self._staged, self._lock = recv, staged, threading.Lock()

    def _unpack(self) -> None:
        with self._lock:         # (once, whichever thread completes it: reap_orphans too)
            staged, self._staged = self._staged, []
        if not self._r.cancelled:
            unpack_staged(staged, self._r.nbytes)

    def test(self) -> bool:
        if self._r.test():
            self._unpack()
            return True
        return False

    def wait(self) -> None:
        self._r.wait()
        self._unpack()

    def cancel(self) -> Any:
        return self._r.cancel()

    def orphan(self) -> None:
        """Freed while active: unpacked once its message is in (``_request.reap_orphans``)."""
        if not self.test():
            ORPHANS.append(self)

    source = property(lambda self: self._r.source)
    tag = property(lambda self: self._r.tag)
    nbytes = property(lambda self: self._r.nbytes)
    cancelled = property(lambda self: self._r.cancelled)
    value = property(lambda self: self._r.value)


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

    def orphan(self) -> None:
        """Freed while active: its receive (of a derived type) is still unpacked."""
        orphan = getattr(self._r, "orphan", None)
        if orphan is not None:
            orphan()

    source = property(lambda self: self._r.source)
    tag = property(lambda self: self._r.tag)
    nbytes = property(lambda self: self._r.nbytes)
