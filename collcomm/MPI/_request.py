"""``Request`` and the completion functions (``Prequest``, persistent: :mod:`._prequest`).

A :class:`Request` holds one pending operation (an object with ``test()``, ``wait()``,
``cancel()`` and, once done, ``source``, ``tag``, ``nbytes``, ``cancelled``, ``value``):
a point-to-point transfer (:mod:`._p2p`), a non-blocking collective (:class:`WorkOp`, over
the core's :class:`~collcomm.core.work.Work`) or an operation that completed at once
(:class:`Done`: ``PROC_NULL`` peers, ``Idup``). Completing a request (``Wait``, a
successful ``Test``) fills the optional :class:`Status` and makes the request
``REQUEST_NULL``, as MPI does; a :class:`Prequest` instead becomes inactive until the
next ``Start``. The class methods ``Waitall/Waitany/Waitsome/Testall/Testany/Testsome``
(and the lower-case forms returning received objects) work on any mix of requests
(all but ``Waitall`` in :mod:`._request_many`; the ops and completion basics in
:mod:`._request_ops`).

Errors of the operation surface at completion as ``MPI.Exception``; waiting has
collcomm's timeout (``COLLCOMM_TIMEOUT``), so a peer that never answers is an error, not
a hang.
"""
from __future__ import annotations

from typing import Any, Sequence

from ..core.tags import MPI_TAG_BITS
from ..errors import CollcommError, CommTimeoutError
from ._handles import HandleInts
from ._consts import ANY_SOURCE, ANY_TAG, UNDEFINED  # noqa: F401 - (re-exported)
from ._errors import Exception as MPIException, translate
from ._obj_spare import SPARE
from ._pickle import pickle as _pickle
from ._request_many import ManyRequests, _complete_each
from ._request_ops import (  # noqa: F401 - (Done, WorkOp, ORPHANS, reap_orphans, _poll: re-exported)
    _FATAL, ORPHANS, Done, WorkOp, _fill, _in_status, _poll, _test_native, _wait_native, reap_orphans,
)
from ._status import Status


class Request(ManyRequests, HandleInts):
    """A pending operation; see the module docstring."""

    __slots__ = ("_op",)
    _REC = "_op"

    def _record(self) -> Any:
        # the request itself (an inactive persistent one is no null request); f2py gives a
        # copy of it (its op, and a persistent one's start)
        return None if self._key() is None else self

    @classmethod
    def _from_record(cls, rec: Any) -> Any:
        return cls() if rec is None else type(rec)(rec)

    def __new__(cls, request: Any = None) -> Any:
        # (made as mpi4py makes its handles, by __new__: a subclass's __new__(cls, request)
        # that passes request on gets the copy; __init__ then does it again)
        self = object.__new__(cls)
        Request.__init__(self, request)
        return self

    def __init__(self, request: "Request | None" = None) -> None:
        self._op: Any = None if request is None else request._op

    # -- identity --------------------------------------------------------------------------
    def _key(self) -> Any:
        return self._op

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Request) and self._key() is other._key()

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    __hash__ = None  # type: ignore[assignment]

    def __bool__(self) -> bool:
        return self._key() is not None

    def __repr__(self) -> str:
        return f"<collcomm.MPI.{type(self).__name__} {'null' if self._key() is None else 'active' if self._op else 'inactive'}>"

    def __reduce__(self) -> Any:
        if self._key() is None:
            return (Request, ())
        raise ValueError("cannot serialize an active request")

    # -- one request -----------------------------------------------------------------------
    def _completed(self) -> None:
        self._op = None

    def _test_op(self) -> bool:
        try:
            return bool(self._op.test())
        except CollcommError as exc:
            raise translate(exc) from exc

    def _settled(self) -> bool:
        """Complete, or failed (its Wait raises the error): for the calls on many requests."""
        try:
            return self._test_op()
        except MPIException:
            return True

    def _wait_op(self) -> None:
        try:
            self._op.wait()
        except CollcommError as exc:
            raise translate(exc) from exc

    def Wait(self, status: Status | None = None) -> bool:  # noqa: N802
        op = self._op
        if op is not None:
            # a native receive's, an object irecv's, a send's or a collective's op completed
            # in C (the last: its call started in two parts, native/_mpi_wait.c mw_workop), else:
            if _wait_native is None or not _wait_native(self, Done, MPI_TAG_BITS, _pickle.native, SPARE):
                try:       # (what _wait_op does, frames less: the common call)
                    if type(op) is WorkOp and op._finish is None and op._work is not None:
                        work = op._work        # (WorkOp.wait and Work.wait without their frames:
                        g = work._group        # a call started in two parts finished here in C)
                        fast = None if g is None or work.done else g.fast
                        if fast is None or not fast.wait_part(work) or work._exc is not None:
                            work.wait()        # (done or not, its error raised there)
                        op._done = True
                    else:
                        op.wait()
                except CollcommError as exc:
                    if not isinstance(exc, CommTimeoutError):
                        self._op = None    # (complete, in error: MPI frees it; a timed-out wait may be retried)
                    mpi = translate(exc)
                    if mpi is exc:         # (translated already: raised as it is, not its own cause)
                        raise
                    raise mpi from exc
                self._op = None    # (_completed: the same in every subclass)
            if ORPHANS:
                reap_orphans()
        if status is not None:
            _fill(status, op)
        return True

    def Test(self, status: Status | None = None) -> bool:  # noqa: N802
        op = self._op
        if op is not None:
            if _test_native is not None:
                try:                        # (in C: the common ones; _tested without its frame)
                    done = _test_native(self, Done, MPI_TAG_BITS)
                except CollcommError:       # (the Python way tests again, and raises it)
                    done = None
                if done is not None:        # (the C answer's end, as below, frames less)
                    if not done:
                        return False
                    if ORPHANS:
                        reap_orphans()
                    if status is not None:
                        _fill(status, op)
                    return True
            try:
                if not op.test():
                    return False
            except CollcommError as exc:
                if not isinstance(exc, CommTimeoutError):
                    self._op = None        # (complete, in error: freed, as Wait frees it)
                mpi = translate(exc)
                if mpi is exc:
                    raise
                raise mpi from exc
            self._completed()
            if ORPHANS:
                reap_orphans()
        _fill(status, op)
        return True

    def Get_status(self, status: Status | None = None) -> bool:  # noqa: N802
        """Like Test, but the request stays (MPI_Request_get_status)."""
        op = self._op
        if op is not None and not self._test_op():
            return False
        _fill(status, op)
        return True

    def wait(self, status: Status | None = None) -> Any:
        op = self._op
        if status is None and op is not None:
            if type(op) is Done:       # (a send done at once: Wait, frames less)
                self._op = None
                if ORPHANS:
                    reap_orphans()
                return op.value
            if _wait_native is not None and _wait_native(self, Done, MPI_TAG_BITS, _pickle.native, SPARE):
                if ORPHANS:            # (an object irecv's or a native receive's, in C)
                    reap_orphans()
                return op.value
        self.Wait(status)
        return None if op is None else op.value

    def test(self, status: Status | None = None) -> tuple[bool, Any]:
        op = self._op
        flag = self.Test(status)
        return flag, (None if op is None or not flag else op.value)

    def get_status(self, status: Status | None = None) -> bool:
        return self.Get_status(status)

    def Cancel(self) -> None:  # noqa: N802
        if self._op is not None:
            self._op.cancel()

    cancel = Cancel

    def Free(self) -> None:  # noqa: N802
        """Forget the request (the operation still completes in the background; a receive
        into a derived type with gaps is unpacked at this rank's next receive or wait
        after its message arrived: ``ORPHANS``)."""
        op, self._op = self._op, None
        orphan = getattr(op, "orphan", None)
        if orphan is not None:
            orphan()

    free = Free


    # -- many requests (the others: _request_many.ManyRequests) ---------------------------
    @classmethod
    def Waitall(cls, requests: Sequence["Request"], statuses: list[Status] | None = None) -> bool:  # noqa: N802
        if statuses is not None:
            _complete_each(requests, range(len(requests)), statuses, "Waitall")
            return True
        failed: list[tuple[int, Any]] = []
        first = count = 0
        if _wait_native is not None and (type(requests) is list or type(requests) is tuple):
            first = count = _wait_native(requests, Done, MPI_TAG_BITS, _pickle.native, SPARE)   # (the common ones, in C)
            if first == len(requests):
                if ORPHANS:
                    reap_orphans()
                return True
        for i, r in enumerate(requests[first:] if first else requests, first):   # (Wait without a status, inline)
            count = i + 1
            op = r._op
            if op is not None:
                if type(op) is not Done:      # (complete from the start: nothing to wait)
                    try:
                        op.wait()
                    except CollcommError as exc:      # (the others are still waited for)
                        if isinstance(exc, _FATAL):
                            raise translate(exc) from exc
                        failed.append((i, translate(exc)))
                if type(r) is Request:
                    r._op = None              # (Request._completed, without its frame)
                else:
                    r._completed()
        if ORPHANS:
            reap_orphans()
        if failed:                            # (every failure counted; a generator has no len)
            _in_status("Waitall", count, failed)
        return True


REQUEST_NULL = Request()
