"""The makers of a non-blocking collective's request (collcomm/MPI/_request_makers.py
``request_of``, ``started``, ``workop_started``): in C where the core is built
(native/_mpi_request.c), in Python otherwise; both must give the same objects and errors.
In-process (no ranks): the entries are stand-ins that return a Work-like object, None, or
raise."""
from __future__ import annotations

from typing import Any

import pytest

from collcomm import native
from collcomm.errors import CollcommError, InvalidArgumentError
from collcomm.MPI import _request_makers as rq
from collcomm.MPI._request import ANY_SOURCE, ANY_TAG, Request, WorkOp
from collcomm.MPI._errors import Exception as MPIException

MAKERS = [pytest.param((rq._py_request, rq._py_started, rq._py_workop_started), id="python")]
if native.core is not None:
    MAKERS.append(pytest.param((native.core.mpi_request, native.core.mpi_started,
                                native.core.mpi_workop_started), id="native"))


def _fresh_op(op: Any, work: Any, finish: Any) -> None:
    assert type(op) is WorkOp
    assert op._work is work and op._finish is finish and op._done is False and op.value is None
    assert (op.source, op.tag, op.nbytes, op.cancelled) == (ANY_SOURCE, ANY_TAG, 0, False)


@pytest.mark.parametrize("makers", MAKERS)
def test_request_of_holds_a_fresh_workop(makers):
    request_of, _, _ = makers
    work, fin = object(), (lambda: 5)
    r = request_of(work)
    assert type(r) is Request and bool(r)
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
    assert seen[-1] == (1, "two", None) and type(r) is Request
    _fresh_op(r._op, work, None)
    op = workop_started(entry)
    assert seen[-1] == () and type(op) is WorkOp
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


@pytest.mark.parametrize("makers", MAKERS)
@pytest.mark.parametrize("which", [1, 2])
def test_errors_chain_as_raise_from_does(makers, which):
    """The translated error's context is the original even inside an ``except`` block;
    an error translate leaves as it is gets no context of itself; an error translate
    raises has the original as its context (what ``raise translate(exc) from exc`` in an
    ``except`` block gives)."""
    maker = makers[which]
    err = InvalidArgumentError("bad")

    def entry() -> Any:
        raise err

    try:
        raise KeyError("outer")
    except KeyError as outer:
        with pytest.raises(MPIException) as info:
            maker(entry)
        assert info.value.__context__ is err and info.value.__cause__ is err
        import sys
        assert sys.exc_info()[1] is outer          # (the caller's handled exception back)
    # in a generator resumed from an except block: its own exception state stays its own
    def gen() -> Any:
        try:
            maker(entry)
        except MPIException:
            pass
        yield
        raise ValueError("later")

    it = gen()
    try:
        raise KeyError("driver's")
    except KeyError:
        next(it)
    with pytest.raises(ValueError) as later:
        next(it)
    assert later.value.__context__ is None
    mpi_err = rq.translate(InvalidArgumentError("once"))

    def entry_mpi() -> Any:
        raise mpi_err                               # (translate returns it as it is)

    with pytest.raises(MPIException) as info:
        maker(entry_mpi)
    assert info.value is mpi_err and info.value.__context__ is not mpi_err


_FRESH = """
import sys
from collcomm import native
from collcomm.errors import CollcommError
core = native.core
try:
    core.mpi_started(lambda: object())
except RuntimeError as exc:
    print("refused before:", "mpi_request_types" in str(exc))
class Big:
    __slots__ = tuple(f"s{i}" for i in range(4000)) + ("_work", "_finish", "_done", "value", "_op")
class Small:
    __slots__ = ()
for name in ("_work", "_finish", "_done", "value"):
    setattr(Small, name, getattr(Big, name))
class Req:
    __slots__ = ("_op",)
class Loose:
    pass
print("foreign:", core.mpi_request_types(Small, Req, CollcommError, repr))
print("loose:", core.mpi_request_types(Loose, Req, CollcommError, repr))
class Op:
    __slots__ = ("_work", "_finish", "_done", "value")
print("good:", core.mpi_request_types(Op, Req, CollcommError, repr))
print("again:", core.mpi_request_types(Op, Req, CollcommError, repr))
print("other:", core.mpi_request_types(Loose, Req, CollcommError, repr))
r = core.mpi_request(5)
print("kept:", type(r).__name__, type(r._op).__name__, r._op._work)
"""


@pytest.mark.skipif(native.core is None, reason=f"native core: {native.reason}")
def test_native_registration_is_checked_and_kept_once():
    """In a fresh interpreter (collcomm.MPI registers its classes at import): the makers
    refuse before a registration; classes whose slots are not their own (a descriptor
    of another class copied in: Python refuses to use it too) or that have none are
    refused; a good registration is kept for good: another answers False and changes
    nothing."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _FRESH], capture_output=True, text=True,
                         timeout=60, check=True).stdout.split("\n")
    assert out[:7] == ["refused before: True", "foreign: False", "loose: False", "good: True",
                       "again: True", "other: False", "kept: Req Op 5"], out


def test_the_module_uses_the_native_makers_where_built():
    if native.core is None:
        assert rq.started is rq._py_started and rq.request_of is rq._py_request
    else:
        assert rq.started is native.core.mpi_started and rq.request_of is native.core.mpi_request
