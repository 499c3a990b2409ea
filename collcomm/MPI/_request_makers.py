"""The makers of a non-blocking collective's request: ``Request(WorkOp(work))`` for a call
the fast call started in two parts (native/_fastcall_parts.c) or queued.

Made in C where the native core is built (native/_mpi_request.c: ``mpi_request``,
``mpi_started``, ``mpi_workop_started``, the classes registered once by
``mpi_request_types``), ~1.2-2 µs a call less than the Python helpers on the project's VM
(BENCHMARKS.md, session 38); the Python makers below give the same objects and errors and
stand in where the core is absent or refuses the classes. A collcomm error of the entry
becomes the MPI.Exception ``translate`` gives, raised from it (``raise … from``).
"""
from __future__ import annotations

from typing import Any, Callable

from ..errors import CollcommError
from ._errors import translate
from ._request import Request, WorkOp


def _py_request(work: Any, finish: Callable[[], Any] | None = None) -> Request:
    """Request(WorkOp(work, finish)), without either's __init__ frame."""
    op = WorkOp.__new__(WorkOp)
    op._work, op._finish, op._done, op.value = work, finish, False, None
    r = Request.__new__(Request)
    r._op = op
    return r


def _py_workop_started(entry: Any, *args: Any) -> WorkOp | None:
    """The WorkOp of the Work of a call the fast call's entry ``entry`` started in two parts
    (native/_fastcall_parts.c), or None: it declined (the regular path runs the call)."""
    try:
        work = entry(*args)
    except CollcommError as exc:
        raise translate(exc) from exc
    if work is None:
        return None
    op = WorkOp.__new__(WorkOp)
    op._work, op._finish, op._done, op.value = work, None, False, None
    return op


def _py_started(entry: Any, *args: Any) -> Request | None:
    """The Request of a call ``entry`` started in two parts, or None (as above)."""
    op = _py_workop_started(entry, *args)
    if op is None:
        return None
    r = Request.__new__(Request)
    r._op = op
    return r


def _raise_translated(exc: CollcommError) -> None:
    """Raise ``exc`` as the MPI.Exception it stands for, as the Python makers do (called by
    the C makers with an error of the entry they called)."""
    try:
        raise exc
    except CollcommError as error:
        raise translate(error) from error


def _native_makers() -> tuple[Any, Any, Any]:
    """The three makers in C (native/_mpi_request.c: no Python frame, ~0.8 µs a call less
    on the project's VM), where the core is built and takes these classes."""
    from .. import native

    core = native.core
    if core is None or not hasattr(core, "mpi_request_types") \
            or not core.mpi_request_types(WorkOp, Request, CollcommError, _raise_translated):
        return _py_request, _py_started, _py_workop_started
    return core.mpi_request, core.mpi_started, core.mpi_workop_started


#: request_of(work, finish=None) -> Request(WorkOp(work, finish));
#: started(entry, *args) -> the Request of a call entry started in two parts, or None;
#: workop_started(entry, *args) -> its WorkOp alone (a persistent collective's Start), or None
request_of, started, workop_started = _native_makers()
