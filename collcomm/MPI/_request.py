"""``Request`` and the completion functions (``Prequest``, persistent: :mod:`._prequest`).

A :class:`Request` holds one pending operation (an object with ``test()``, ``wait()``,
``cancel()`` and, once done, ``source``, ``tag``, ``nbytes``, ``cancelled``, ``value``):
a point-to-point transfer (:mod:`._p2p`), a non-blocking collective (:class:`WorkOp`, over
the core's :class:`~collcomm.core.work.Work`) or an operation that completed at once
(:class:`Done`: ``PROC_NULL`` peers, ``Idup``). Completing a request (``Wait``, a
successful ``Test``) fills the optional :class:`Status` and makes the request
``REQUEST_NULL``, as MPI does; a :class:`Prequest` instead becomes inactive until the
next ``Start``. The class methods ``Waitall/Waitany/Waitsome/Testall/Testany/Testsome``
(and the lower-case forms returning received objects) work on any mix of requests.

Errors of the operation surface at completion as ``MPI.Exception``; waiting has
collcomm's timeout (``COLLCOMM_TIMEOUT``), so a peer that never answers is an error, not
a hang.
"""
from __future__ import annotations

import os
import time
import threading
from typing import Any, Callable, Sequence

from ..errors import ClosedError, CollcommError, CommTimeoutError, PeerLostError
from ..core.tags import MPI_TAG_BITS
from ._consts import ANY_SOURCE, ANY_TAG, UNDEFINED
from ._errors import ERR_IN_STATUS, Exception as MPIException, translate
from ._obj_spare import SPARE
from ._pickle import pickle as _pickle
from ._status import Status


class Done:
    """An operation complete from the start (``PROC_NULL`` peers, ``Idup``, empty calls)."""

    def __init__(self, value: Any = None, source: int = ANY_SOURCE, tag: int = ANY_TAG,
                 nbytes: int = 0) -> None:
        self.value, self.source, self.tag, self.nbytes, self.cancelled = value, source, tag, nbytes, False

    def test(self) -> bool:
        return True

    def wait(self) -> None:
        return None

    def cancel(self) -> None:
        return None


class WorkOp:
    """A non-blocking collective: the core's Work, then an optional ``finish`` (which gives
    the request's value, e.g. ``Idup``'s communicator or a copy-out)."""

    __slots__ = ("_work", "_finish", "_done", "value")
    source, tag, nbytes, cancelled = ANY_SOURCE, ANY_TAG, 0, False   # (a collective's status)

    def __init__(self, work: Any, finish: Callable[[], Any] | None = None) -> None:
        self._work, self._finish, self._done, self.value = work, finish, False, None

    def test(self) -> bool:
        if self._done:
            return True
        if self._work is not None and not self._work.is_completed():
            return False
        self.wait()
        return True

    def wait(self) -> None:
        if self._done:
            return
        try:
            if self._work is not None:
                self._work.wait()
        except CollcommError as exc:
            raise translate(exc) from exc
        if self._finish is not None:
            self.value = self._finish()
        self._done = True

    def cancel(self) -> None:
        return None     # a collective cannot be cancelled (MPI: erroneous); it completes


def _native_entry(name: str) -> Callable[..., Any] | None:
    """The native core's ``name`` (native/_mpi_wait.c: requests of native receives, sends
    done and object receives completed in one call), or None without the core."""
    from .. import native

    return getattr(native.core, name, None) if native.core is not None else None


#: mpi_wait_native(requests, Done, MPI_TAG_BITS, the serializer's native, SPARE) -> how
#: many it completed (Waitall), or with one Request, whether it did (Wait); None: the
#: Python code does it all
_wait_native = _native_entry("mpi_wait_native")
#: mpi_test_native(request(s), Done, MPI_TAG_BITS) -> True (complete, null), False (not
#: yet), None (the Python code decides): Test, Testall
_test_native = _native_entry("mpi_test_native")


#: Freed receives still to be unpacked (derived types with gaps: _p2p_ops.Unpacked).
ORPHANS: list[Any] = []
_REAPING = threading.Lock()


def reap_orphans() -> None:
    """Unpack the freed receives whose message has arrived (tested, never waited for); at
    every completion (wait, test, receive) and at each call on a communicator. One thread
    reaps at a time (another that finds it reaping goes on)."""
    if not _REAPING.acquire(blocking=False):
        return
    try:
        for op in list(ORPHANS):
            try:
                done = op.test()
            except Exception:  # noqa: BLE001 - a failed orphan has no one to tell
                done = True
            if done:
                ORPHANS.remove(op)
    finally:
        _REAPING.release()


def _fill(status: Status | None, op: Any) -> None:
    if status is not None:
        if op is None:
            status._set(ANY_SOURCE, ANY_TAG, 0)
        else:
            status._set(op.source, op.tag, op.nbytes, op.cancelled)


#: how often a poll of several requests checks the peers (as a wait on one does)
LIVENESS_PERIOD = 0.1
#: how long it yields its CPU between tests before it sleeps (as a native receive does:
#: P2P_YIELD_NS; a test of the common requests takes well under a microsecond in C)
YIELD_FOR = 2e-3


def _poll(done: Callable[[], bool], call: str, count: int) -> None:
    """Wait until ``done()`` (which makes progress: the requests' tests), spinning briefly,
    then yielding the CPU between tests for ``YIELD_FOR``, then sleeping. Tests check no peer, so every ``LIVENESS_PERIOD`` the peers are checked
    (a lost one fails the requests pending with it, which ``done()`` then finds), and past
    the world's timeout ``call`` raises, as a wait on one request does: a ``Waitany`` on
    requests of a rank that died used to poll forever (a random kill, session 28)."""
    rounds, sleep = 0, 20e-6
    start = next_check = 0.0
    while not done():
        rounds += 1
        if rounds <= 100:
            continue
        now = time.monotonic()
        if not start:
            start, next_check = now, now + LIVENESS_PERIOD
        elif now >= next_check:
            next_check = now + LIVENESS_PERIOD
            _check(call, count, now - start)
        if now - start < YIELD_FOR:     # (the CPU to whoever needs it, else on at once)
            os.sched_yield()
            continue
        time.sleep(sleep)
        sleep = min(sleep * 2, 1e-3)


def _check(call: str, count: int, waited: float) -> None:
    """The peers' liveness (through the world's engine), then the timeout a wait would
    have here (the world's, or the innermost ``collcomm.call_timeout``)."""
    from ..core import p2p, runtime
    from ..core.timeouts import current_timeout
    try:
        world = runtime.get_world(call)
        p2p.transport(world).check_peers()
        limit = current_timeout(world.timeout)
        if waited > limit:
            raise CommTimeoutError(
                f"{call} on {count} request(s): none completed within {limit:g} s "
                "(COLLCOMM_TIMEOUT); a peer that never answers is an error, not a hang")
    except CollcommError as exc:
        raise translate(exc) from exc


class Request:
    """A pending operation; see the module docstring."""

    __slots__ = ("_op",)

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
            if (type(op) is not WorkOp and _wait_native is not None
                    and _wait_native(self, Done, MPI_TAG_BITS, _pickle.native, SPARE)):
                if ORPHANS:        # (a native receive's or a send's, completed in C)
                    reap_orphans()
                if status is not None:
                    _fill(status, op)
                return True
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
            if type(op) is not WorkOp and _test_native is not None:
                done = _tested(self, 0)     # (in C: the common ones)
                if done is not None:
                    if not done:
                        return False
                    if ORPHANS:
                        reap_orphans()
                    _fill(status, op)
                    return True
            if not self._test_op():
                return False
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
            if type(op) is not WorkOp and _wait_native is not None \
                    and _wait_native(self, Done, MPI_TAG_BITS, _pickle.native, SPARE):
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

    # -- many requests ---------------------------------------------------------------------
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

    @classmethod
    def Testall(cls, requests: Sequence["Request"], statuses: list[Status] | None = None) -> bool:  # noqa: N802
        if statuses is None and _test_native is not None and (type(requests) is list or type(requests) is tuple):
            done = _tested(requests, 0)     # (in C: the common ones)
            if done is not None:
                if done and ORPHANS:
                    reap_orphans()
                return done
        if not all(r._op is None or r._settled() for r in requests):
            return False
        cls.Waitall(requests, statuses)
        return True

    @classmethod
    def Waitany(cls, requests: Sequence["Request"], status: Status | None = None) -> int:  # noqa: N802
        seq = _test_native is not None and (type(requests) is list or type(requests) is tuple)
        got = _tested(requests, 1) if seq else None   # (in C: the common ones)
        if got:
            _completed_quick(got[1], status)
            return got[0]
        if all(r._op is None for r in requests):
            _fill(status, None)
            return UNDEFINED
        found: list[tuple[int, Any]] = []

        def any_done() -> bool:
            if seq:
                got = _tested(requests, 1)
                if got is not None:
                    if got is False:
                        return False
                    found.append(got)
                    return True
            for i, r in enumerate(requests):
                if r._op is not None:
                    op = _test_quick(r)
                    if op is not None:
                        if op is False:
                            continue
                        found.append((i, op))   # (complete in C, the request null)
                        return True
                    if r._settled():
                        found.append((i, None))
                        return True
            return False

        _poll(any_done, "Waitany", len(requests))
        i, op = found[0]
        _completed_quick(op, status) if op is not None else requests[i].Wait(status)
        return i

    @classmethod
    def Testany(cls, requests: Sequence["Request"], status: Status | None = None) -> tuple[int, bool]:  # noqa: N802
        if _test_native is not None and (type(requests) is list or type(requests) is tuple):
            got = _tested(requests, 1)    # (in C: the common ones)
            if got:
                _completed_quick(got[1], status)
                return got[0], True
            if got is False and not all(r._op is None for r in requests):
                return UNDEFINED, False
        if all(r._op is None for r in requests):
            _fill(status, None)
            return UNDEFINED, True
        for i, r in enumerate(requests):
            if r._op is not None:
                op = _test_quick(r)
                if op is not None:
                    if op is not False:
                        _completed_quick(op, status)
                        return i, True
                elif r._settled():
                    r.Wait(status)
                    return i, True
        return UNDEFINED, False

    @classmethod
    def Waitsome(cls, requests: Sequence["Request"], statuses: list[Status] | None = None) -> list[int] | None:  # noqa: N802
        if _test_native is not None and (type(requests) is list or type(requests) is tuple):
            got = _tested(requests, 2)    # (in C: the common ones)
            pairs = got[0] if got is not None else None
            if pairs:                  # (those complete now: MPI's "some")
                for k, (_, op) in enumerate(pairs):
                    _fill(_nth(statuses, k), op)
                if ORPHANS:
                    reap_orphans()
                return [i for i, _ in pairs]
        if all(r._op is None for r in requests):
            return None
        done: list[int] = []
        quick: dict[int, Any] = {}

        def some_done() -> bool:
            _settled_some(requests, done, quick)
            return bool(done)

        _poll(some_done, "Waitsome", len(requests))
        _complete_each(requests, done, statuses, "Waitsome", quick)
        return done

    @classmethod
    def Testsome(cls, requests: Sequence["Request"], statuses: list[Status] | None = None) -> list[int] | None:  # noqa: N802
        if all(r._op is None for r in requests):
            return None
        done: list[int] = []
        quick: dict[int, Any] = {}
        _settled_some(requests, done, quick)
        _complete_each(requests, done, statuses, "Testsome", quick)
        return done

    Get_status_all = Testall
    Get_status_any = Testany
    Get_status_some = Testsome

    @classmethod
    def waitall(cls, requests: Sequence["Request"], statuses: list[Status] | None = None) -> list[Any]:
        return [r.wait(_nth(statuses, i)) for i, r in enumerate(requests)]

    @classmethod
    def testall(cls, requests: Sequence["Request"], statuses: list[Status] | None = None) -> tuple[bool, list[Any] | None]:
        if not all(r._op is None or r._settled() for r in requests):
            return False, None
        return True, cls.waitall(requests, statuses)

    @classmethod
    def waitany(cls, requests: Sequence["Request"], status: Status | None = None) -> tuple[int, Any]:
        ops = [r._op for r in requests]
        i = cls.Waitany(requests, status)
        return i, (None if i == UNDEFINED or ops[i] is None else ops[i].value)

    @classmethod
    def testany(cls, requests: Sequence["Request"], status: Status | None = None) -> tuple[int, bool, Any]:
        ops = [r._op for r in requests]
        i, flag = cls.Testany(requests, status)
        return i, flag, (None if i == UNDEFINED or ops[i] is None else ops[i].value)

    @classmethod
    def waitsome(cls, requests: Sequence["Request"], statuses: list[Status] | None = None) -> tuple[list[int] | None, list[Any] | None]:
        ops = [r._op for r in requests]
        idx = cls.Waitsome(requests, statuses)
        return idx, (None if idx is None else [ops[i].value for i in idx])

    @classmethod
    def testsome(cls, requests: Sequence["Request"], statuses: list[Status] | None = None) -> tuple[list[int] | None, list[Any] | None]:
        ops = [r._op for r in requests]
        idx = cls.Testsome(requests, statuses)
        return idx, (None if idx is None else [ops[i].value for i in idx])


#: Errors that are no single request's: raised as they are, not as ERR_IN_STATUS.
_FATAL = (PeerLostError, CommTimeoutError, ClosedError)


def _tested(requests: Any, how: int) -> Any:
    """``mpi_test_native(requests, Done, MPI_TAG_BITS, how)``; None where it raised one of
    collcomm's errors (the receive's: the Python way then tests again and raises or
    settles it as always, translated)."""
    try:
        return _test_native(requests, Done, MPI_TAG_BITS, how)   # type: ignore[misc]
    except CollcommError:
        return None


def _test_quick(r: "Request") -> Any:
    """``r`` (its op not null) tested in C (native/_mpi_wait.c mpi_test_native): its op,
    complete, the request left null; False, nothing yet; None, the Python way's."""
    op = r._op
    if _test_native is None or type(op) is WorkOp:
        return None
    done = _tested(r, 0)
    return op if done else done


def _completed_quick(op: Any, status: Status | None) -> None:
    """What Wait does after a request's op completed in C: the orphans, the status."""
    if ORPHANS:
        reap_orphans()
    _fill(status, op)


def _settled_some(requests: Sequence["Request"], done: list[int], quick: dict[int, Any]) -> None:
    """Add to ``done`` the index of every request complete or failed now; those C
    completed (their requests null) also to ``quick``, with their op."""
    if _test_native is not None and (type(requests) is list or type(requests) is tuple):
        got = _tested(requests, 2)    # (in C: the common ones)
        for i, op in got[0] if got is not None else ():
            done.append(i)
            quick[i] = op
        if got is not None and got[1]:
            return
    for i, r in enumerate(requests):
        if r._op is not None:
            op = _test_quick(r)
            if op is None:
                if r._settled():
                    done.append(i)
            elif op is not False:
                done.append(i)
                quick[i] = op
    done.sort()                         # (in the requests' order, C's and Python's together)


def _complete_each(requests: Sequence["Request"], which: Sequence[int], statuses: list[Status] | None,
                   call: str, quick: dict[int, Any] | None = None) -> None:
    """Complete ``requests[i]`` for each i of ``which`` (status k for the k-th), every one
    even when some fail (MPI): then ``ERR_IN_STATUS``, each status's error field saying
    which (the failed requests are complete, as MPI leaves them). ``quick``: the ops of
    those C completed already (their requests null), by index."""
    failed: list[tuple[int, Any]] = []
    for k, i in enumerate(which):
        st = _nth(statuses, k)
        if quick and i in quick:
            _completed_quick(quick[i], st)
            continue
        try:
            requests[i].Wait(st)
        except MPIException as exc:
            if isinstance(exc, _FATAL):      # (a lost peer, a timeout: raised as they are)
                raise
            failed.append((i, exc))
            requests[i]._completed()
            if st is not None:
                st._set(ANY_SOURCE, ANY_TAG, 0)
                st.error = exc.Get_error_class()
    if failed:
        _in_status(call, len(which), failed)


def _in_status(call: str, n: int, failed: list[tuple[int, Any]]) -> None:
    i, exc = failed[0]
    raise MPIException(ERR_IN_STATUS, f"{call}: {len(failed)} of {n} requests failed (their statuses' "
                                      f"error fields say which); request {i}: {exc}") from exc


def _nth(statuses: list[Status] | None, i: int) -> Status | None:
    if statuses is None:
        return None
    while len(statuses) <= i:
        statuses.append(Status())
    return statuses[i]


REQUEST_NULL = Request()

