"""The handles of the functional API's non-blocking point-to-point calls (``isend``,
``irecv``, ``batch_isend_irecv``): ``wait()``, ``is_completed()``, ``source_rank()``.

* :class:`P2PWork` wraps a transport handle (the regular path: the group's engine).
* :class:`SentWork` is a send the native entry completed at once (its bytes are in the
  peer's ring, the buffer free again): nothing is left to wait for but its record.
* :class:`RecvWork` is a receive from a peer on this host deferred to its wait, which
  receives natively: it *is* the deferred receive (core/p2p.py ``Deferred``, held in the
  engine's posting order) with P2PWork's methods, one object where the regular path
  has a P2PWork, a handle and a status.

All three raise the same errors: the call, the peer and the group first (``irecv from
global rank 1 on group 'WORLD' ...``); a receive of another byte count than its buffer's
is a :class:`~collcomm.errors.MismatchError`; a wait that timed out under an explicit
``timeout`` leaves the operation pending (waited again, it can still complete: the receive
stays posted), any other failure is kept and raised again.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .buffers import Buf, as_output
from .core import p2p as core_p2p
from .core.group import ProcessGroup
from .core.recorder_records import ENTERED, R_PSTATE
from .core.p2p_loans import lent_base, loan_over
from .core.work import wait_seconds
from .errors import CollcommError, MismatchError, with_context
from .transport.base import Handle, Status

__all__ = ["LentWork", "P2PWork", "RecvWork", "SentWork", "lend_native", "start_native"]


def _p2p_context(name: str, g: ProcessGroup, peer: int | None) -> str:
    """What an error of a point-to-point call is prefixed with (``peer``: global, None = any)."""
    who = "any rank" if peer is None else f"global rank {peer}"
    return f"{name} {'to' if name == 'isend' else 'from'} {who} on {g.describe()}"


def _size_error(context: str, status: Status, buf: Buf) -> MismatchError:
    return MismatchError(f"{context}: received {status.nbytes} bytes, expected "
                         f"{buf.arr.nbytes} ({buf.describe()}); sizes must match")


def _failed(exc: CollcommError, context: str, timeout: float | None) -> tuple[CollcommError, bool]:
    """The error a work's wait raises for ``exc`` and whether the work keeps it (a timeout
    under an explicit ``timeout`` does not: the wait may be retried)."""
    keep = timeout is None or type(exc).__name__ != "CommTimeoutError"
    return with_context(exc, context), keep


class P2PWork:
    """The handle of an ``isend``/``irecv``: ``wait()``, ``is_completed()``, ``source_rank()``."""

    def __init__(self, name: str, handle: Handle, g: ProcessGroup, buf: Buf | np.ndarray,
                 peer: int | None) -> None:
        # (LentWork's fields are the C Lent's, set by its __init__, collcomm.MPI's
        # _LentSend.__init__ and native/_p2p_lent.c lent_make: those three stay alike)
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
        if timeout is not None:
            timeout = wait_seconds(timeout)
        if self._exc is not None:
            raise self._exc
        if self._status is None:
            try:
                status = self._handle.wait(timeout)
            except CollcommError as exc:
                err, keep = _failed(exc, self._context(), timeout)
                if keep:
                    self._exc = err
                raise err from exc
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


class _SentFields:
    """SentWork's fields and methods where the native core is not built (the reference:
    native/_p2p_sent.c's ``Sent`` does the same in C)."""

    __slots__ = ("_group", "_peer", "_rec", "_ok")   # (P2P.batch/start set them, no __init__)

    def wait(self, timeout: float | None = None) -> bool:
        rec = self._rec
        if rec is not None and rec[R_PSTATE] == ENTERED:
            core_p2p.finished(rec, True)
        self._ok = True
        return True

    def is_completed(self) -> bool:
        rec = self._rec
        if rec is not None and rec[R_PSTATE] == ENTERED:
            core_p2p.finished(rec, True)
        return True

    def is_success(self) -> bool:
        return self._ok

    def source_rank(self) -> int:
        self.wait()
        return self._peer


def _sent_base() -> Any:
    """SentWork's base: the C type where the native core is built, else the stand-in."""
    from . import native as nat
    return getattr(nat.core, "Sent", None) or _SentFields


class SentWork(_sent_base(), P2PWork):  # type: ignore[misc]
    """An ``isend`` the native entry completed at once. ``_rec``: its flight-recorder
    record, "entered" until waited for or tested, as the regular path's is."""

    __slots__ = ()
    name = "isend"
    _exc = None
    _handle = property(lambda self: self)

    def __init__(self, g: ProcessGroup, peer: int, rec: list[Any] | None) -> None:
        self._group, self._peer, self._rec, self._ok = g, peer, rec, False


class RecvWork(core_p2p.Deferred, P2PWork):
    """An ``irecv`` deferred to its wait, which receives natively when it can (see
    core/p2p.py ``Deferred``); made by :func:`core.p2p.defer` (``cls``)."""

    __slots__ = ()
    name = "irecv"
    _IS_WORK = True       # Deferred's fields ``_exc`` (the wait's error, kept) and ``_ok``
                          # (waited for, the size right) are this work's; wait() returns True

    _handle = property(lambda self: self)
    _peer = property(lambda self: self.g.ranks[self.local])

    def _context(self) -> str:
        return _p2p_context("irecv", self.g, self.g.ranks[self.local])

    def _wait(self, timeout: float | None = None) -> bool:  # type: ignore[override]
        """``wait()``: the reference (native/_p2p_deferred.c does its common case in C)."""
        if timeout is not None:
            timeout = wait_seconds(timeout)
        if self._exc is not None:
            raise self._exc
        if not self._ok:
            try:
                st = core_p2p.Deferred._wait(self, timeout)
            except CollcommError as exc:
                err, keep = _failed(exc, self._context(), timeout)
                if keep:
                    self._exc = err
                raise err from exc
            self.status = st
            if st.nbytes != self.arr.nbytes:
                self._exc = _size_error(self._context(), st, as_output(
                    self.arr, "irecv", self.g.describe(), "tensor"))
                raise self._exc
            self._ok = True
        return True

    def is_completed(self) -> bool:
        if self._ok or self._exc is not None:
            return True
        try:
            return core_p2p.Deferred.test(self)
        except CollcommError:
            return True

    def is_success(self) -> bool:
        return self._ok

    def source_rank(self) -> int:
        self.wait()
        return self.g.ranks[self.local]


class LentWork(lent_base(), P2PWork):  # type: ignore[misc]
    """An ``isend`` lent from C (``P2P.lend``: a LENT record with the buffer's address,
    native/_p2p_lend.c; or a ``batch_isend_irecv`` send lent by ``P2P.batch``, which makes
    this work itself, native/_p2p_batch.c): done once the receiver has read the buffer, or,
    unclaimed past the patience, withdrawn into a copy. ``wait`` is C's (native/_p2p_lent.c:
    the loan read already, or released while the deferred receives are tried in C, up to
    20 µs + nbytes / 8 ns, then 2 µs, longer while the receiver reads it) or else
    :meth:`_wait`, core/p2p_loans.py's loop (the receives take their messages meanwhile).
    ``_buf`` keeps the array alive until the loan is over; a work dropped unwaited ends its
    loan."""

    __slots__ = ()
    name = "isend"
    _handle = None

    def __init__(self, f: Any, g: ProcessGroup, local: int, loan: tuple[int, int, int],
                 arr: np.ndarray, rec: Any) -> None:
        self._f, self._group, self._peer, self._local = f, g, g.ranks[local], local
        self._loan, self._buf, self._nbytes, self._rec = loan, arr, arr.nbytes, rec
        self._status = self._exc = None

    def _wait(self, timeout: float | None = None, spun: bool = False) -> bool:
        """``wait()``: the reference (native/_p2p_lent.c does its common case in C, and
        passes ``spun`` when it spun for the loan or tried the receives already)."""
        if timeout is not None:
            timeout = wait_seconds(timeout)
        if self._exc is not None:
            raise self._exc
        if self._status is None:
            try:
                loan_over(self._f, self._group, self._local, self._loan, self._buf, self._nbytes, True,
                          timeout, not spun)
            except CollcommError as exc:
                self._failed(exc, timeout)
                raise self._exc if self._exc is not None else with_context(exc, self._context()) from exc
            self._done()
        return True

    def is_completed(self) -> bool:
        if self._status is None and self._exc is None:
            try:
                if not loan_over(self._f, self._group, self._local, self._loan, self._buf, self._nbytes,
                                 False):
                    return False
            except CollcommError as exc:
                self._failed(exc, None)
                return True
            self._done()
        return True

    def _failed(self, exc: CollcommError, timeout: float | None) -> None:
        """The wait failed: a timeout under an explicit ``timeout`` leaves the loan out (the
        wait may be retried); any other error is kept, the loan having ended (loan_wait
        withdraws it first, or keeps the array for its reader)."""
        err, keep = _failed(exc, self._context(), timeout)
        if keep:
            self._exc = err
            self._buf = None
            core_p2p.finished(self._rec, False)

    def _done(self) -> None:
        if self._status is None:
            self._status = Status(self._peer, self._nbytes)
            self._buf = None              # the receiver has it, or our copy
            core_p2p.finished(self._rec, True)


def lend_native(f: Any, g: ProcessGroup, local: int, arr: np.ndarray, tag: int, sig: int,
                alone: bool = False) -> LentWork | None:
    """An ``isend`` of ``arr`` to local rank ``local`` lent from C (a rank of this host that
    takes loans, ``arr`` of ``f.lend_from`` bytes or more), as its work; None having done
    nothing (the caller sends the other ways). ``alone``: a plain ``isend``, which lends
    only past the channel's inline limit (as the Python path does): up to it the ring
    takes the message at once, and its work is done whenever the receiver comes, where a
    loan waits for the receiver (up to the patience) — a batch pairs its sends with the
    other ranks' receives."""
    if f.lend_from <= 0 or arr.nbytes < f.lend_from:
        return None
    if alone:
        ch = g.transport.channels.get(g.ranks[local])
        if ch is None or arr.nbytes <= getattr(ch, "inline", 1 << 62):
            return None
    loan = f.lend(arr, local, tag, sig)
    if loan is None:
        return None
    rec = f.note(False, local) if g.observer is not None else None
    return LentWork(f, g, local, loan, arr, rec)


def start_native(f: Any, g: ProcessGroup, local: int, recv: bool, arr: np.ndarray, tag: int,
                 sig: int) -> P2PWork | None:
    """An ``isend`` (sent at once) or ``irecv`` (deferred to its wait) of ``arr`` with
    local rank ``local`` through the group's native entry ``f``, as its work; None having
    done nothing (the caller takes the regular path)."""
    return f.start(recv, RecvWork if recv else SentWork, g, arr, local, tag, sig,
                   g.observer is not None)       # (core_p2p.defer, or f.send and SentWork)
