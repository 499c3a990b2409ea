"""The makers of a non-blocking collective's request (collcomm/MPI/_request.py
``request_of``, ``started``, ``workop_started``): in C where the core is built
(native/_mpi_request.c), in Python otherwise; both must give the same objects and errors.
In-process (no ranks): the entries are stand-ins that return a Work-like object, None, or
raise."""
from __future__ import annotations

from typing import Any

import pytest

from collcomm import native
from collcomm.errors import CollcommError, InvalidArgumentError
from collcomm.MPI import _request as rq
from collcomm.MPI._errors import Exception as MPIException

MAKERS = [pytest.param((rq._py_request, rq._py_started, rq._py_workop_started), id="python")]
if native.core is not None:
    MAKERS.append(pytest.param((native.core.mpi_request, native.core.mpi_started,
                                native.core.mpi_workop_started), id="native"))


def _fresh_op(op: Any, work: Any, finish: Any) -> None:
    assert type(op) is rq.WorkOp
    assert op._work is work and op._finish is finish and op._done is False and op.value is None
    assert (op.source, op.tag, op.nbytes, op.cancelled) == (rq.ANY_SOURCE, rq.ANY_TAG, 0, False)


@pytest.mark.parametrize("makers", MAKERS)
def test_request_of_holds_a_fresh_workop(makers):
    request_of, _, _ = makers
    work, fin = object(), (lambda: 5)
    r = request_of(work)
    assert type(r) is rq.Request and bool(r)
    _fresh_op(r._op, work, None)
    _fresh_op(request_of(work, fin)._op, work, fin)
    assert request_of(work)._op is not r._op          # a new op every time


@pytest.mark.parametrize("makers", MAKERS)
def test_started_passes_the_arguments_and_none(makers):
    _, started, workop_started = makers
    seen: list[tuple] = []
    work = object()

    def entry(*args: Any) -> Any:
        seen.append(args)
        return None if args and args[0] == "decline" else work

    r = started(entry, 1, "two", None)
    assert seen[-1] == (1, "two", None) and type(r) is rq.Request
    _fresh_op(r._op, work, None)
    op = workop_started(entry)
    assert seen[-1] == () and type(op) is rq.WorkOp
    _fresh_op(op, work, None)
    assert started(entry, "decline") is None and workop_started(entry, "decline") is None


@pytest.mark.parametrize("makers", MAKERS)
@pytest.mark.parametrize("which", [1, 2])
def test_collcomm_errors_become_mpi_exceptions_with_their_cause(makers, which):
    maker = makers[which]
    err = InvalidArgumentError("Ibcast: invalid root 5")

    def entry() -> Any:
        raise err

    with pytest.raises(MPIException) as info:
        maker(entry)
    assert info.value.__cause__ is err and info.value.__suppress_context__
    assert "invalid root 5" in str(info.value)
    assert isinstance(info.value, CollcommError)          # (translate keeps the kind)

    def other() -> Any:
        raise KeyError("not collcomm's")

    with pytest.raises(KeyError):
        maker(other)


@pytest.mark.skipif(native.core is None, reason=f"native core: {native.reason}")
def test_native_makers_refuse_classes_without_plain_slots():
    core = native.core

    class Loose:
        pass

    try:
        assert core.mpi_request_types(Loose, rq.Request, CollcommError, rq.translate) is False
        with pytest.raises(RuntimeError, match="mpi_request_types"):
            core.mpi_request(object())
        with pytest.raises(RuntimeError, match="mpi_request_types"):
            core.mpi_started(lambda: object())
        with pytest.raises(TypeError):
            core.mpi_request_types(rq.WorkOp, rq.Request, CollcommError, 5)
    finally:
        assert core.mpi_request_types(rq.WorkOp, rq.Request, CollcommError, rq.translate) is True
    assert type(core.mpi_request(object())) is rq.Request


def test_the_module_uses_the_native_makers_where_built():
    if native.core is None:
        assert rq.started is rq._py_started and rq.request_of is rq._py_request
    else:
        assert rq.started is native.core.mpi_started and rq.request_of is native.core.mpi_request
