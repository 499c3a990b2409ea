"""collcomm.MPI's completion functions on many requests: ``Waitall``, ``Testall``,
``Waitany``, ``Testany``, ``Waitsome``, ``Testsome`` and their lower-case forms (a mixin of
:class:`._request.Request`).

Where the native core is built the common requests (native receives from ranks of this
host, sends done at once) are tested in one C call (native/_mpi_wait.c:
``mpi_test_native``; ``Waitall`` is :class:`._request.Request`'s own, with
``mpi_wait_native``), which leaves any other request to this code; the results,
statuses and errors are the Python way's.
"""
from __future__ import annotations

from typing import Any, Sequence

from ..core.tags import MPI_TAG_BITS
from ..errors import CollcommError
from ._consts import ANY_SOURCE, ANY_TAG, UNDEFINED
from ._errors import Exception as MPIException
from ._request_ops import (
    _FATAL, ORPHANS, Done, WorkOp, _fill, _in_status, _nth, _poll, _test_native, reap_orphans,
)
from ._status import Status


class ManyRequests:
    """The class methods of :class:`._request.Request` on many requests."""

    __slots__ = ()

    @classmethod
    def Testall(cls, requests: Sequence["Request"], statuses: list[Status] | None = None) -> bool:  # noqa: N802
        if statuses is None and _test_native is not None and (type(requests) is list or type(requests) is tuple):
            try:                   # (in C: the common ones; _tested without its frame)
                done = _test_native(requests, Done, MPI_TAG_BITS, 0)
            except CollcommError:  # (the Python way tests again, and raises it)
                done = None
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
        if seq:                    # (in C: the common ones; _tested without its frame)
            try:
                got = _test_native(requests, Done, MPI_TAG_BITS, 1)
            except CollcommError:  # (the Python way tests again, and raises it)
                got = None
            if got:
                if ORPHANS:
                    reap_orphans()
                if status is not None:
                    _fill(status, got[1])
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
        done: list[int] = []
        quick: dict[int, Any] = {}
        if _test_native is not None and (type(requests) is list or type(requests) is tuple):
            try:                   # (in C: the common ones; _tested without its frame)
                got = _test_native(requests, Done, MPI_TAG_BITS, 2)
            except CollcommError:  # (the Python way tests again, and raises it)
                got = None
            if got is not None and got[0] and got[1]:   # (every active one C's: those complete now)
                if statuses is not None:
                    for k, (_, op) in enumerate(got[0]):
                        _fill(_nth(statuses, k), op)
                if ORPHANS:
                    reap_orphans()
                return [i for i, _ in got[0]]
            if got is not None and got[0]:   # (and the others tested the Python way too)
                return waitsome_rest(requests, got, statuses)
        if all(r._op is None for r in requests):
            return None

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

    # -- non-destructive: MPI 4.1's get_status calls (the requests stay as they are) -------------
    @classmethod
    def Get_status_all(cls, requests: Sequence["Request"], statuses: list[Status] | None = None) -> bool:  # noqa: N802
        """Whether every active request is complete (a failed one counts); then the
        statuses are filled (an empty one for a null or inactive request). Nothing is
        freed or made inactive: a Wait or Test still completes each."""
        if not all(r._op is None or r._settled() for r in requests):
            return False
        for i, r in enumerate(requests):
            _fill(_nth(statuses, i), r._op)
        return True

    @classmethod
    def Get_status_any(cls, requests: Sequence["Request"], status: Status | None = None) -> tuple[int, bool]:  # noqa: N802
        """(index, True) of the first active request complete, its status filled;
        (UNDEFINED, True) when none is active; (UNDEFINED, False) when none is complete.
        Nothing is freed."""
        active = False
        for i, r in enumerate(requests):
            if r._op is not None:
                active = True
                if r._settled():
                    _fill(status, r._op)
                    return i, True
        if not active:
            _fill(status, None)
        return UNDEFINED, not active

    @classmethod
    def Get_status_some(cls, requests: Sequence["Request"], statuses: list[Status] | None = None) -> list[int] | None:  # noqa: N802
        """The indices of the active requests complete now (their statuses filled in that
        order), None when none is active. Nothing is freed."""
        if all(r._op is None for r in requests):
            return None
        done = [i for i, r in enumerate(requests) if r._op is not None and r._settled()]
        for k, i in enumerate(done):
            _fill(_nth(statuses, k), requests[i]._op)
        return done

    get_status_all = Get_status_all
    get_status_any = Get_status_any
    get_status_some = Get_status_some

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
    if _test_native is None:
        return None
    done = _tested(r, 0)
    return op if done else done


def _completed_quick(op: Any, status: Status | None) -> None:
    """What Wait does after a request's op completed in C: the orphans, the status."""
    if ORPHANS:
        reap_orphans()
    _fill(status, op)


def waitsome_rest(requests: Sequence["Request"], got: Any, statuses: list[Status] | None = None) -> list[int]:
    """Waitsome's answer from C's first look ``got`` (``mpi_test_native(requests, …, 2)``:
    the requests it completed are null now) with the others tested the Python way: also
    what the C ``Waitsome`` hands over where C completed some but not every active request
    is C's (native/_mpi_request_many.c)."""
    done: list[int] = []
    quick: dict[int, Any] = {}
    _settled_some(requests, done, quick, got)
    _complete_each(requests, done, statuses, "Waitsome", quick)
    return done


def _settled_some(requests: Sequence["Request"], done: list[int], quick: dict[int, Any],
                  got: Any = None) -> None:
    """Add to ``done`` the index of every request complete or failed now; those C
    completed (their requests null) also to ``quick``, with their op (``got``: C's answer
    already asked for, its requests null: the others are tested here)."""
    if got is None and _test_native is not None and (type(requests) is list or type(requests) is tuple):
        got = _tested(requests, 2)    # (in C: the common ones)
    if got is not None:
        for i, op in got[0]:
            done.append(i)
            quick[i] = op
        if got[1]:
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
