"""collcomm.MPI's non-blocking neighbourhood exchanges begun in C (``Started``,
MPI/_neighbor_ops.py) and the kept-layout quick ways' call numbers, in one process with
fake twins and a fake native entry (no job): what a wait hands over after an error, a
timeout or an interruption (in C or just after it), a test or a free posting the receives,
one claim of an op's receives and a freed communicator's twin kept for its claimer, the
lent sends waited for, the call number taken once a message moved, an interrupted
persistent start leaving its request active (also through the regular way's first start).
The multi-rank checks of the same code: tests/test_mpi_neighbor_quick.py.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from collcomm.MPI._neighbor_ops import Layout


class _Req:
    """A request of the fake twin: complete once waited for (or at once: ``done``)."""

    def __init__(self, log: list[Any], what: Any, done: bool = False) -> None:
        self.log, self.what, self.done = log, what, done

    def Wait(self) -> None:  # noqa: N802
        self.log.append(("wait", self.what))
        self.done = True

    def Test(self) -> bool:  # noqa: N802
        return self.done

    def _settled(self) -> bool:
        return self.done

    def Cancel(self) -> None:  # noqa: N802
        self.log.append(("cancel", self.what))

    def __bool__(self) -> bool:
        return not self.done


class _Twin:
    def __init__(self) -> None:
        self.log: list[Any] = []

    def Free(self) -> None:  # noqa: N802
        self.log.append(("free",))

    def Irecv(self, buf: Any, source: int, tag: int) -> _Req:  # noqa: N802
        self.log.append(("irecv", source, tag, buf.nbytes))
        return _Req(self.log, ("irecv", source, tag))

    def Isend(self, buf: Any, dest: int, tag: int) -> _Req:  # noqa: N802
        self.log.append(("isend", dest, tag, buf.nbytes))
        return _Req(self.log, ("isend", dest, tag))


class _F:
    """P2P.exchange's stand-in: every send written; the receive call raises ``exc`` having
    received ``received`` blocks (``exchanged`` says so), or receives them all."""

    def __init__(self, exc: BaseException | None, received: int) -> None:
        self.exc, self.received, self.exchanged = exc, received, (0, 0)

    def exchange(self, send: Any, recv: Any, sends: tuple, recvs: tuple, base: int, mask: int, *local: Any):
        if recvs and self.exc is not None:
            self.exchanged = (0, self.received)
            raise self.exc
        self.exchanged = (len(sends) // 4, len(recvs) // 4)
        return self.exchanged

    def send(self, *a: Any) -> bool:
        return False


class _G:
    _closed = False


def _Owner(twin: Any) -> Any:       # noqa: N802 - a Started op's owner, over a fake twin
    from collcomm.MPI._neighbor_exchange import Neighborhood, Neighbors, Plan
    return Neighborhood(twin, Plan(Neighbors([1, 2], [1, 2]), 0, "t"), _G())


OWNERS: list[Any] = []


def _started(exc: BaseException | None, received: int, sent: int = 2) -> tuple[Any, _Twin, list[int]]:
    from collcomm.MPI._neighbor_ops import Started
    twin, after = _Twin(), []
    owner = _Owner(twin)
    OWNERS.append(owner)
    flat = Layout((0, 8, 1, 0, 8, 8, 2, 1), (0, 8, 1, 1, 8, 16, 2, 0), 2, 2, ())
    op = Started(_F(exc, received), owner, 40, np.zeros(2), np.zeros(3), flat, lambda: after.append(1), sent)
    assert op in owner.started
    return op, twin, after


def test_started_hands_over_after_an_error_in_its_wait():
    from collcomm import MPI
    from collcomm.errors import CommTimeoutError, PeerLostError
    op, twin, after = _started(CommTimeoutError("timed out"), 1)
    with pytest.raises(MPI.Exception):
        op.wait()
    # the receive after the one C took posted as an Irecv (source 2, tag 40, 16 bytes), nothing else
    assert twin.log == [("irecv", 2, 40, 16)] and not after
    op.wait()                     # waited for again: the Irecv's wait, then `after` once
    assert twin.log[1:] == [("wait", ("irecv", 2, 40))] and after == [1]
    op.wait()
    assert after == [1] and op.test()
    op, twin, after = _started(KeyboardInterrupt(), 0, sent=1)
    assert twin.log == [("isend", 2, 41, 8)]     # (the send C did not write: an Isend)
    with pytest.raises(KeyboardInterrupt):
        op.wait()
    assert twin.log[1:] == [("irecv", 1, 41, 8), ("irecv", 2, 40, 16)]
    op.wait()
    assert [e[0] for e in twin.log[3:]] == ["wait"] * 3 and after == [1]
    op, twin, after = _started(PeerLostError("rank 1 is gone"), 2)
    with pytest.raises(MPI.Exception):
        op.wait()
    assert twin.log == [] and after == []        # (both received: nothing to post)
    op, twin, after = _started(PeerLostError("rank 2 is gone"), 1)
    with pytest.raises(MPI.Exception):
        op.wait()
    # failed: the receive it posted ended (no receive left to catch a later message), and
    # every later wait raises again
    assert twin.log == [("irecv", 2, 40, 16), ("cancel", ("irecv", 2, 40))] and after == []
    with pytest.raises(MPI.Exception):
        op.wait()
    assert not any(o.started or o.claimed for o in OWNERS)


class _LateInterrupt(tuple):
    """A result whose reading raises KeyboardInterrupt: a signal landing just after the C
    call returned (Python checks signals there), before the wait handed anything over."""

    def __getitem__(self, i: Any) -> Any:
        raise KeyboardInterrupt


def test_an_interruption_just_after_the_c_receive_hands_over_the_rest():
    op, twin, after = _started(None, 0)
    f = op._f

    def exchange(send: Any, recv: Any, sends: tuple, recvs: tuple, *a: Any) -> Any:
        f.exchanged = (0, 1) if recvs else (len(sends) // 4, 0)
        return _LateInterrupt((0, 1)) if recvs else f.exchanged
    f.exchange = exchange
    with pytest.raises(KeyboardInterrupt):
        op.wait()
    assert twin.log == [("irecv", 2, 40, 16)] and op._ex is not None   # (the receive C left, posted)
    op.wait()
    assert after == [1] and not any(o.started or o.claimed for o in OWNERS)


def test_started_waits_for_its_sends_before_it_completes():
    op, twin, after = _started(None, 0, sent=1)     # (C took both receives; one send an Isend)
    assert twin.log == [("isend", 2, 41, 8)]
    op.wait()
    assert twin.log[1:] == [("wait", ("isend", 2, 41))] and after == [1]
    assert not any(o.started or o.claimed for o in OWNERS)


class _Interrupted:
    """P2P.exchange interrupted having moved ``exchanged`` (sends, receives)."""

    def __init__(self, exchanged: tuple[int, int]) -> None:
        self.exchanged = exchanged

    def exchange(self, *a: Any) -> Any:
        raise KeyboardInterrupt

    def send(self, *a: Any) -> bool:
        return False


def test_quick_paths_take_the_number_once_a_message_moved():
    """An interruption or error inside P2P.exchange: the call's number counted where C moved
    a message (its peers count it), not where it moved nothing."""
    from collcomm.MPI._neighbor_exchange import Neighborhood, Plan, Neighbors

    class G:
        _closed = False

    for exchanged, sends_phase in (((2, 0), False), ((0, 0), False), ((1, 0), True), ((0, 0), True)):
        nbh = Neighborhood(_Twin(), Plan(Neighbors([1, 2], [1, 2]), 0, "t"), G())
        nbh.f = _Interrupted(exchanged)
        send, recv = np.zeros(2), np.zeros(2)
        nbh.quick[(0, send.dtype, send.shape, recv.dtype, recv.shape)] = Layout((0, 8, 1, 0, 8, 8, 2, 1),
                                                                           (0, 8, 1, 1, 8, 8, 2, 0), 2, 2, ())
        with pytest.raises(KeyboardInterrupt):
            (nbh.quick_start if sends_phase else nbh.quick_run)(0, send, recv)
        assert nbh.calls == (1 if any(exchanged) else 0), (exchanged, sends_phase)
        if sends_phase:         # started all the same: its receives posted (no request to hold it)
            log = nbh.twin.log
            assert [e[0] for e in log] == (["isend", "irecv", "irecv"] if exchanged[0] else []), log


def test_an_interrupted_persistent_start_leaves_its_request_active():
    """A persistent Start interrupted once its sends were written has started: its request
    is active (a second Start is refused, its Wait completes it), not inactive (a second
    Start would send that round again: its peers a round behind for good)."""
    from collcomm.MPI._neighbor_exchange import Neighborhood, Neighbors, Plan
    from collcomm.MPI._neighbor_ops import Started
    from collcomm.MPI._prequest import persistent

    class G:
        _closed = False

    nbh = Neighborhood(_Twin(), Plan(Neighbors([1, 2], [1, 2]), 0, "t"), G())
    nbh.f = _Interrupted((1, 0))
    send, recv = np.zeros(2), np.zeros(2)
    nbh.quick[(0, send.dtype, send.shape, recv.dtype, recv.shape)] = Layout((0, 8, 1, 0, 8, 8, 2, 1),
                                                                       (0, 8, 1, 1, 8, 8, 2, 0), 2, 2, ())
    req = persistent(lambda: None)
    req._persist.quick = [lambda: nbh.quick_start(0, send, recv, None, 6, req)]
    with pytest.raises(KeyboardInterrupt):
        req.Start()
    assert isinstance(req._op, Started) and nbh.calls == 0      # (a persistent request keeps its number)
    from collcomm import MPI
    with pytest.raises(MPI.Exception):
        req.Start()
    # the same through the regular way (a request's first Start: no layout kept yet)
    from collcomm.MPI._neighbor_exchange import exchange

    class Twin(_Twin):
        def _grp(self, call: str) -> Any:
            return grp

    class Grp:
        _p2p_native = _Interrupted((1, 0))

    grp = Grp()
    nbh = Neighborhood(Twin(), Plan(Neighbors([1, 2], [1, 2]), 0, "t"), G())
    req = persistent(lambda: None)
    nbh.starting = req
    with pytest.raises(KeyboardInterrupt):
        exchange(nbh, 6, [(0, 1), (1, 1)], send, [(0, 1), (1, 1)], recv, True, "t", [])
    assert isinstance(req._op, Started) and nbh.twin.log == [("isend", 2, 6, 8)]   # (the send C did not write)


def test_started_test_and_free_post_its_receives():
    op, twin, after = _started(None, 0)
    assert op.test() is False           # (a test never blocks: the receives posted)
    assert twin.log == [("irecv", 1, 41, 8), ("irecv", 2, 40, 16)]
    op, twin, after = _started(None, 0)
    op.orphan()
    assert [e[0] for e in twin.log] == ["irecv", "irecv"]
    op, twin, after = _started(None, 0)
    op.wait()                           # all in C: nothing posted, `after` run
    assert twin.log == [] and after == [1] and op.test()
    op, twin, after = _started(None, 0)
    owner = OWNERS[-1]
    token = owner.claim(op)                        # (as another thread's wait takes it)
    assert token is not None and owner.claim(op) is None
    op.orphan()
    assert op.test() is False and twin.log == []   # (neither posts what that thread takes)
    owner.free()                                   # (freed meanwhile: the twin kept for it)
    assert owner.freeing and twin.log == []
    owner.settle(token)
    assert not owner.freeing and twin.log == [("free",)]    # (by the last to settle, once)
    owner.settle(token)
    assert twin.log == [("free",)]
    OWNERS.clear()


def test_an_interrupted_posting_fails_the_request_once():
    """An interruption while a test posts the receives: the test raises it; the request then
    fails with ERR_OTHER (a collcomm error too, so Wait frees it as MPI frees a failed one),
    the error not its own cause."""
    from collcomm import MPI
    from collcomm.MPI._p2p_ops import _request
    op, twin, after = _started(None, 0)
    posted = twin.Irecv
    calls = []

    def irecv(*a: Any) -> Any:
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return posted(*a)
    twin.Irecv = irecv
    req = _request(op)
    with pytest.raises(KeyboardInterrupt):
        req.Test()
    with pytest.raises(MPI.Exception) as info:
        req.Wait()
    assert info.value.Get_error_class() == MPI.ERR_OTHER and info.value.__cause__ is not info.value
    assert req == MPI.REQUEST_NULL and ("cancel", ("irecv", 1, 41)) in twin.log and after == []
    OWNERS.clear()
