"""Persistent sends' and receives' starts and ``Prequest.Startall`` in C
(native/_mpi_pstart.c), against what the Python functions they stand for do
(``_quick_send_start`` / ``_quick_recv_start`` in collcomm/MPI/_p2p.py, the Python
``Startall`` loop). In one process, on stand-ins for the communicator's handle, its group
and the group's native entry, so every condition is set directly: the group still the one
``…_init`` checked against, closed, orphaned receives waiting, no entry (a stand-in entry
is never called by C itself: C calls only a real P2P, the Python function anything else);
and ``Startall`` over Prequests, other requests and a Start that raises. The real exchanges,
where C calls the group's P2P itself, are tests/test_mpi_persistent_p2p.py (a section of
the MPI job at 1-5 ranks and TCP, with a group closed under its requests).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from collcomm import native

pytestmark = pytest.mark.skipif(native.core is None, reason=f"native core: {native.reason}")


class _Entry:
    """A group's native entry that records what it was asked."""

    def __init__(self, answer: Any) -> None:
        self.answer, self.calls = answer, []

    def send(self, *args: Any) -> Any:
        self.calls.append(("send",) + args)
        return self.answer

    def mpi_irecv(self, *args: Any) -> Any:
        self.calls.append(("mpi_irecv",) + args)
        return self.answer


class _Group:
    def __init__(self, entry: Any, closed: bool = False) -> None:
        self._closed = closed
        if entry is not _ABSENT:
            self._p2p_native = entry


class _Handle:
    def __init__(self, g: Any) -> None:
        self.g = g


_ABSENT = object()


class _Op:
    def __init__(self) -> None:
        self._op = object()


def test_quick_starts_are_the_core_s_where_it_has_them() -> None:
    from collcomm.MPI import _p2p

    assert _p2p._QUICK_SEND is native.core.mpi_quick_send
    assert _p2p._QUICK_RECV is native.core.mpi_quick_recv


def test_a_send_start_in_c_as_the_python_function() -> None:
    """Where the entry given is not a live P2P of the handle's group (here a stand-in), or
    receives are orphaned, or the handle's group is not the one of ``…_init``, the C start
    is the Python function's answer, with what that asked of the group's entry."""
    from collcomm.MPI import _p2p
    from collcomm.MPI._request_ops import ORPHANS

    buf = np.ones(2)
    send = native.core.mpi_quick_send
    for answer, want in ((True, _p2p._SENT), (False, None)):
        e = _Entry(answer)
        g = _Group(e)
        assert send(_Handle(g), g, e, buf, 1, 7) is want
        assert e.calls == [("send", buf, 1, 7, 0)]
        e.calls.clear()          # another group than the one checked at init: the Python way
        assert send(_Handle(g), _Group(e), e, buf, 1, 7) is _p2p._quick_send_start(_Handle(g), buf, 1, 7)
        assert [c[:4] for c in e.calls] == [("send", buf, 1, 7)] * 2
    e = _Entry(True)
    g = _Group(e, closed=True)        # closed: nothing sent, None
    assert send(_Handle(g), g, e, buf, 1, 7) is None and e.calls == []
    g = _Group(None)                  # no native entry for the group: None
    assert send(_Handle(g), g, e, buf, 1, 7) is None
    g = _Group(e)
    ORPHANS.append(object())          # receives to unpack first: the general start
    try:
        assert send(_Handle(g), g, e, buf, 1, 7) is None and e.calls == []
    finally:
        ORPHANS.pop()
    assert send(_Handle(None), g, e, buf, 1, 7) is None and e.calls == []   # (freed: h.g None)
    with pytest.raises(TypeError, match="mpi_quick_send"):
        send(_Handle(g), g, buf, 1, 7)                                    # (the entry left out)


def test_the_first_start_before_the_group_has_its_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    """No ``_p2p_native`` on the group yet: the Python function, which makes it
    (``p2p.native``), starts the call."""
    from collcomm.MPI import _p2p

    e = _Entry(True)
    made: list[Any] = []

    def native(g: Any) -> Any:
        made.append(g)
        g._p2p_native = e
        return e

    monkeypatch.setattr(_p2p.p2p, "native", native)
    g = _Group(_ABSENT)
    buf = np.ones(1)
    assert native_send(_Handle(g), g, e, buf, 1, 3) is _p2p._SENT and made == [g]
    assert native_send(_Handle(g), g, e, buf, 1, 3) is _p2p._SENT and made == [g]   # (made once)
    assert [c[:4] for c in e.calls] == [("send", buf, 1, 3)] * 2


def native_send(*args: Any) -> Any:
    return native.core.mpi_quick_send(*args)


def test_a_receive_start_in_c_as_the_python_function() -> None:
    from collcomm.MPI import _p2p

    buf = np.zeros(2)
    recv = native.core.mpi_quick_recv
    op = _Op()
    e = _Entry(op)
    g = _Group(e)
    g.size, g.rank = 4, 0
    assert recv(_Handle(g), g, e, buf, 1, 5, 3) is op._op
    assert e.calls == [("mpi_irecv", g, buf, 1, 5, 3, np.ndarray, _p2p._DEFERRED, _p2p._NativeRecv, _p2p.Request)]
    e = _Entry(None)                  # declined: None, the general start
    g = _Group(e)
    g.size, g.rank = 4, 0
    assert recv(_Handle(g), g, e, buf, 1, 5, 3) is None and len(e.calls) == 1
    g = _Group(_Entry(op), closed=True)
    assert recv(_Handle(g), g, e, buf, 1, 5, 3) is None
    e = _Entry(op)
    g = _Group(e)                     # another group: the Python function (its own checks)
    g.size, g.rank = 4, 0
    assert recv(_Handle(g), _Group(e), e, buf, 1, 5, 3) is op._op
    assert recv(_Handle(g), _Group(e), e, buf, 0, 5, 3) is None          # (its own rank)


def test_startall_starts_each_in_order_and_stops_at_an_error() -> None:
    from collcomm.MPI._errors import Exception as MPIException
    from collcomm.MPI._prequest import Prequest, persistent

    assert Prequest.Startall.__func__ is native.core.mpi_prequest_startall
    order: list[str] = []

    class Other:                     # (not a Prequest: its Start is called; the Python
        def Start(self) -> None:     # loop read its _persist first and raised) # noqa: N802
            order.append("other")

    def start(name: str) -> Any:
        def go() -> Any:
            order.append(name)
            return _Op()
        return go

    a, b = persistent(start("a")), persistent(start("b"))
    Prequest.Startall((a, Other(), b))
    assert order == ["a", "other", "b"] and a._op is not None and b._op is not None
    order.clear()
    c = persistent(start("c"))
    with pytest.raises(MPIException, match="still active"):
        Prequest.Startall([c, a, b])      # a is active: raises there, b is not started
    assert order == ["c"]
    with pytest.raises(TypeError):
        Prequest.Startall(5)
    d = persistent(start("d"))
    Prequest.Startall(requests=[d])      # (by keyword, as the Python classmethod took it)
    assert order == ["c", "d"] and d._op is not None


def test_a_collective_s_tuple_quick_start_in_c_and_in_python() -> None:
    """A persistent collective's quick start is ``(entry, *args)`` (_coll_persistent.
    _Prepared): the C ``Start`` calls ``entry(*args)`` through mpi_workop_started without a
    partial, the Python ``Start`` and ``Startall`` (what runs without the C ones) through
    ``quick_call``; an entry that declines (None) leaves the start to the general way, in
    all three."""
    from collcomm.MPI._prequest import PY_START, PY_STARTALL, Prequest, persistent, quick_call

    seen: list[Any] = []

    def entry(*args: Any) -> None:
        seen.append(("entry",) + args)
        return None                   # declined: the general start runs

    def general() -> Any:
        seen.append("general")
        return _Op()

    assert quick_call((entry, 1, "x")) is None and seen == [("entry", 1, "x")]
    assert Prequest.Start is not PY_START       # (the C Start installed)
    for way in ("C Start", "Python Start", "Python Startall"):
        seen.clear()
        p = persistent(general)
        p._persist.quick = [(entry, 7, "Bcast_init")]
        if way == "C Start":
            p.Start()
        elif way == "Python Start":
            PY_START(p)
        else:
            PY_STARTALL([p])          # (declined, it calls Start, which tries the entry again)
            seen = seen[1:]
        assert seen == [("entry", 7, "Bcast_init"), "general"] and p._op is not None, (way, seen)
