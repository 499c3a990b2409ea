"""What collcomm.MPI's requests hold and the completion basics (:mod:`._request` has
``Request`` itself, :mod:`._request_many` its class methods on many requests).

- the ops a request holds besides the point-to-point ones (:mod:`._p2p_ops`): :class:`Done`
  (complete from the start) and :class:`WorkOp` (a non-blocking collective);
- the native core's waits and tests of the common requests (``_wait_native``,
  ``_test_native``: native/_mpi_wait.c), None without the core;
- the freed receives still to be unpacked (``ORPHANS``, :func:`reap_orphans`), a status
  filled from an op (:func:`_fill`), a poll with the peers' liveness and the timeout
  (:func:`_poll`), ``ERR_IN_STATUS`` (:func:`_in_status`).
"""
from __future__ import annotations

import os
import time
import threading
from typing import Any, Callable

from ..errors import ClosedError, CollcommError, CommTimeoutError, PeerLostError
from ._consts import ANY_SOURCE, ANY_TAG
from ._errors import ERR_IN_STATUS, Exception as MPIException, translate
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


#: Errors that are no single request's: raised as they are, not as ERR_IN_STATUS.
_FATAL = (PeerLostError, CommTimeoutError, ClosedError)


def _in_status(call: str, n: int, failed: list[tuple[int, Any]]) -> None:
    i, exc = failed[0]
    raise MPIException(ERR_IN_STATUS, f"{call}: {len(failed)} of {n} requests failed (their statuses' "
                                      f"error fields say which); request {i}: {exc}") from exc


def _nth(statuses: list[Status] | None, i: int) -> Status | None:
    """Status ``i`` of a statuses argument: a list shorter than the requests grows (as
    mpi4py's), a tuple (or other sequence) gives what it has (None past its end)."""
    if statuses is None:
        return None
    if type(statuses) is list or isinstance(statuses, list):
        while len(statuses) <= i:
            statuses.append(Status())
        return statuses[i]
    return statuses[i] if i < len(statuses) else None
