"""A synchronous send completes once a receive *takes* its message, whatever that receive's
rank waits for meanwhile (core/p2p_sync.py): rank 1 posts ``Irecv`` for an ``Ssend`` and
then blocks in a ``Recv`` of the next message, which rank 0 sends only after its
``Ssend`` returned. Valid MPI; before the ack was sent by the receive's match, it was
sent at the receive's own ``Wait`` and both ranks waited for each other until the
timeout (found by tests/random_p2p_mpi.py). Every way in: a receive from one rank
(started natively, a deferred receive) and from ``ANY_SOURCE`` (the general path),
``Ssend`` and ``Issend``, a ``Recv`` or a ``Wait`` on another request as the blocking
call, objects (``ssend``), the receiver in a collective (which progresses point to
point while it waits), shared memory and TCP, the native and pure-Python paths.
Each synchronous send is acked exactly once (no ack left over at the sender), and an
``Issend`` still does not complete before its receive is posted."""
from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

from tests.harness import run_ranks


def _ssend_then_next() -> dict[str, Any]:
    from collcomm import MPI
    from collcomm.core import p2p, runtime
    comm = MPI.COMM_WORLD
    me = comm.Get_rank()
    out: dict[str, Any] = {}
    for case, source in (("one", 0), ("any", MPI.ANY_SOURCE)):
        for sync_call in ("Ssend", "Issend"):
            name = f"{case}-{sync_call}"
            comm.Barrier()
            if me == 0:
                first = np.arange(5.0)
                if sync_call == "Ssend":
                    comm.Ssend(first, 1, 2)
                else:
                    comm.Issend(first, 1, 2).Wait()
                comm.Send(np.full(3, 7.0), 1, 1)       # only once the synchronous send is done
            else:
                first, nxt = np.zeros(5), np.zeros(3)
                req = comm.Irecv(first, source, 2)
                comm.Recv(nxt, 0, 1)                    # blocks: the ack must not wait for req.Wait
                st = MPI.Status()
                req.Wait(st)
                out[name] = (first.tolist(), nxt.tolist(), st.Get_source(), st.Get_tag())
    # the blocking call a Wait on another request
    comm.Barrier()
    if me == 0:
        comm.Ssend(np.array([1, 2], dtype="i"), 1, 4)
        comm.Send(np.array([3], dtype="i"), 1, 5)
    else:
        a, b = np.zeros(2, "i"), np.zeros(1, "i")
        ra, rb = comm.Irecv(a, 0, 4), comm.Irecv(b, 0, 5)
        rb.Wait()
        ra.Wait()
        out["wait-other"] = (a.tolist(), b.tolist())
    # objects: ssend, then a second object sent only after it returned
    comm.Barrier()
    if me == 0:
        comm.ssend({"x": 1}, dest=1, tag=6)
        comm.send([2, 3], dest=1, tag=7)
    else:
        req = comm.irecv(source=0, tag=6)
        second = comm.recv(source=0, tag=7)
        out["objects"] = (req.wait(), second)
    # still synchronous: not complete before the receive is posted
    comm.Barrier()
    if me == 0:
        req = comm.Issend(np.array([9], dtype="i"), 1, 8)
        early = req.Test()
        comm.Send(np.zeros(1, "i"), 1, 9)           # tells rank 1 to post its receive now
        req.Wait()
        out["early"] = early
    else:
        comm.Recv(np.zeros(1, "i"), 0, 9)
        time.sleep(0.05)
        x = np.zeros(1, "i")
        comm.Recv(x, 0, 8)
        out["late"] = int(x[0])
    # the receiver in a collective: a Barrier (rank 1 posted Irecv, then entered it), then
    # an Allreduce; the collective's wait must progress (MPI's progress rule)
    for coll in ("Barrier", "Allreduce"):
        comm.Barrier()
        if me == 0:
            comm.Ssend(np.array([11], dtype="i"), 1, 10)
            out[f"into-{coll}"] = "returned"
        else:
            x = np.zeros(1, "i")
            req = comm.Irecv(x, 0, 10)
        if coll == "Barrier":
            comm.Barrier()
        else:
            comm.Allreduce(MPI.IN_PLACE, np.ones(4), MPI.SUM)
        if me == 1:
            req.Wait()
            out[f"into-{coll}"] = int(x[0])
    comm.Barrier()
    time.sleep(0.1)
    eng = p2p.transport(runtime.get_world("test"))
    eng.progress()
    out["left"] = [hex(i.tag) for i in eng._unexpected]     # an ack sent twice would sit here
    return out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["shm", "tcp", "python"])
def test_ssend_acked_when_its_receive_takes_it(how: str) -> None:
    env = {"COLLCOMM_TIMEOUT": "20"}
    if how == "python":
        env["COLLCOMM_NATIVE"] = "0"
    outs = run_ranks(_ssend_then_next, 2, env=env, transport="tcp" if how == "tcp" else "shm", timeout=90)
    got = outs[1]
    for case in ("one", "any"):
        for sync_call in ("Ssend", "Issend"):
            assert got[f"{case}-{sync_call}"] == ([0.0, 1.0, 2.0, 3.0, 4.0], [7.0, 7.0, 7.0], 0, 2)
    assert got["wait-other"] == ([1, 2], [3])
    assert got["objects"] == ({"x": 1}, [2, 3])
    assert outs[0]["early"] is False and got["late"] == 9
    for coll in ("Barrier", "Allreduce"):
        assert outs[0][f"into-{coll}"] == "returned" and got[f"into-{coll}"] == 11
    assert outs[0]["left"] == [] and got["left"] == []


def _three_in_a_cycle() -> list[str]:
    """Rank 1 waits natively on rank 2's ring while the Ssend of rank 0 it posted a
    receive for sits in rank 0's ring; rank 2 sends only once rank 0's Ssend is done."""
    import numpy as np
    from collcomm import MPI
    w = MPI.COMM_WORLD
    me = w.Get_rank()
    if me == 0:
        w.Recv(np.zeros(4), 1, 1)
        w.Ssend(np.arange(3.0), 1, 2)
        w.Ssend(np.arange(2.0), 2, 3)
    elif me == 1:
        r0 = w.Issend(np.arange(4.0), 0, 1)
        got = np.zeros(3)
        r1 = w.Irecv(got, 0, 2)
        w.Recv(np.zeros(5), 2, 4)
        r0.Wait()
        r1.Wait()
        return got.tolist()
    else:
        w.Recv(np.zeros(2), 0, 3)
        w.Isend(np.arange(5.0), 1, 4).Wait()
    return []


def _issend_floods() -> list[float]:
    """Both ranks post 400 receives, then Issend 400 4 KiB messages to each other (more
    than a ring holds): each rank's acks go into a ring the other is filling."""
    import numpy as np
    from collcomm import MPI
    w = MPI.COMM_WORLD
    other = 1 - w.Get_rank()
    bufs = [np.zeros(512) for _ in range(400)]
    reqs = [w.Irecv(b, other, 5) for b in bufs]
    reqs += [w.Issend(np.full(512, float(i)), other, 5) for i in range(400)]
    MPI.Request.Waitall(reqs)
    return [float(b[0]) for b in bufs]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["shm", "python"])
def test_ssend_acked_while_waiting_on_another_peer(how: str) -> None:
    env = {"COLLCOMM_TIMEOUT": "20", **({"COLLCOMM_NATIVE": "0"} if how == "python" else {})}
    assert run_ranks(_three_in_a_cycle, 3, env=env, transport="shm", timeout=90)[1] == [0.0, 1.0, 2.0]


@pytest.mark.timeout(120)
def test_issend_floods_both_ways() -> None:
    outs = run_ranks(_issend_floods, 2, env={"COLLCOMM_TIMEOUT": "30"}, transport="shm", timeout=100)
    assert outs == [[float(i) for i in range(400)]] * 2


def _warmed() -> tuple[Any, int, int]:
    """COMM_WORLD, this rank and the other, after a few regular calls both ways (they make
    the native entries: a later Irecv from one rank is then deferred) and a barrier."""
    import numpy as np
    from collcomm import MPI
    w = MPI.COMM_WORLD
    me = w.Get_rank()
    other = 1 - me
    for _ in range(2):
        w.Sendrecv(np.zeros(1), other, 1, np.zeros(1), other, 1)
        for receiver in (0, 1):
            w.Irecv(np.zeros(1), other, 2).Wait() if me == receiver else w.Send(np.zeros(1), other, 2)
    w.Barrier()
    return w, me, other


def _ack_into_a_full_ring() -> bool:
    """Each rank's Issend message waits unexpected at the other while both fill their rings
    (a lent 1 MiB Isend, then 17000 8-byte ones): the ack owed when a poll posts the
    deferred receive finds the ring full and must neither wait there (holding the poll:
    both ranks would wait for each other's ring) nor be lost."""
    import time

    import numpy as np
    from collcomm import MPI
    w, me, other = _warmed()
    got = np.zeros(3)
    s = w.Issend(np.arange(3.0), other, 5)
    r5 = w.Irecv(got, other, 5)        # deferred: posted by a later poll, the message there
    time.sleep(0.2)
    s.Test()                           # polls: the other's message waits unexpected
    w.Barrier()
    small = [np.full(1, float(i)) for i in range(17000)]
    reqs = [w.Isend(np.ones(1 << 17), other, 7)] + [w.Isend(x, other, 6) for x in small]
    bufs = [np.zeros(1) for _ in small]
    reqs += [w.Irecv(np.zeros(1 << 17), other, 7)] + [w.Irecv(b, other, 6) for b in bufs]
    MPI.Request.Waitall([r5] + reqs + [s])
    return got.tolist() == [0.0, 1.0, 2.0] and all(b[0] == i for i, b in enumerate(bufs))


def _leave_after_taking() -> bool:
    """The receiver leaves right after taking the synchronous message: the ack it owed
    must have gone (or go as its engine closes)."""
    import numpy as np
    from collcomm import MPI
    w = MPI.COMM_WORLD
    for _ in range(5):
        if w.Get_rank() == 0:
            s = w.Issend(np.arange(3.0), 1, 2)
            w.Send(np.ones(2), 1, 1)
            s.Wait()
        else:
            r = w.Irecv(np.zeros(3), MPI.ANY_SOURCE, 2)
            w.Recv(np.zeros(2), 0, 1)
            r.Wait()
    return True


@pytest.mark.timeout(120)
@pytest.mark.parametrize("job", ["full-ring", "leave"])
def test_owed_acks_neither_wait_nor_get_lost(job: str) -> None:
    fn = _ack_into_a_full_ring if job == "full-ring" else _leave_after_taking
    assert run_ranks(fn, 2, env={"COLLCOMM_TIMEOUT": "20"}, transport="shm", timeout=100) == [True, True]


def _crossed_issends() -> list[float]:
    """Each rank Issends to the other, then posts its Irecv (deferred: posted in the engine
    only at its wait, or when something else posts), then waits for its Issend first:
    the other's message must meet that Irecv as it arrives, or both wait for an ack."""
    import numpy as np
    w, me, other = _warmed()
    got = []
    for size in (3, 1 << 16, 1 << 18):
        buf = np.zeros(size)
        s = w.Issend(np.full(size, float(me + 1)), other, 3)
        r = w.Irecv(buf, other, 3)
        s.Wait()
        r.Wait()
        got.append(float(buf[-1]))
    return got


@pytest.mark.timeout(120)
def test_crossed_issends_meet_deferred_receives() -> None:
    outs = run_ranks(_crossed_issends, 2, env={"COLLCOMM_TIMEOUT": "20"}, transport="shm", timeout=100)
    assert outs == [[2.0] * 3, [1.0] * 3]


def _ssend_into_a_failing_receive() -> list[Any]:
    """A synchronous send whose message the receive takes but cannot hold (too large:
    ``ERR_TRUNCATE``; a small and a lent size): the receive raises, the send completes (as
    in MPI), in well under the timeout."""
    import numpy as np
    from collcomm import MPI
    w = MPI.COMM_WORLD
    out: list[Any] = []
    for size in (5, 1 << 16):
        w.Barrier()
        t0 = time.monotonic()
        if w.Get_rank() == 0:
            w.Ssend(np.arange(float(size)), 1, 4)
            out.append(time.monotonic() - t0 < 10)
        else:
            try:
                w.Recv(np.zeros(size - 3), 0, 4)
                out.append("no error")
            except MPI.Exception as exc:
                out.append(exc.Get_error_class() == MPI.ERR_TRUNCATE)
    return out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["shm", "tcp"])
def test_ssend_into_a_failing_receive_completes(how: str) -> None:
    outs = run_ranks(_ssend_into_a_failing_receive, 2, env={"COLLCOMM_TIMEOUT": "20"}, transport=how,
                     timeout=100)
    assert outs == [[True, True], [True, True]]


def _message_before_its_irecv() -> list[float]:
    """The other rank's Issend message is already waiting unexpected (a probe polled it
    in) when this rank's Irecv for it is made, deferred; then each waits for its Issend."""
    import numpy as np
    w, me, other = _warmed()
    y = np.zeros(4)
    s = w.Issend(np.full(4, float(me + 1)), other, 3)
    time.sleep(0.2)
    w.Iprobe(other, 99)
    r = w.Irecv(y, other, 3)
    s.Wait()
    r.Wait()
    return y.tolist()


def _later_irecv_while_an_earlier_waits() -> list[float]:
    """Rank 0 posts Irecv tag 5 and Irecv tag 6 (both deferred), then waits natively for
    the first; rank 1 Issends tag 6 and waits for it before it sends tag 5."""
    import numpy as np
    w, me, _ = _warmed()
    if me == 0:
        a, b = np.zeros(2), np.zeros(3)
        d1, d2 = w.Irecv(a, 1, 5), w.Irecv(b, 1, 6)
        d1.Wait()
        d2.Wait()
        return a.tolist() + b.tolist()
    w.Issend(np.full(3, 6.0), 0, 6).Wait()
    w.Send(np.full(2, 5.0), 0, 5)
    return []


@pytest.mark.timeout(120)
@pytest.mark.parametrize("job", ["before-irecv", "behind-a-native-wait"])
def test_ssend_meets_a_deferred_irecv(job: str) -> None:
    fn = _message_before_its_irecv if job == "before-irecv" else _later_irecv_while_an_earlier_waits
    outs = run_ranks(fn, 2, env={"COLLCOMM_TIMEOUT": "20"}, transport="shm", timeout=100)
    want = [[2.0] * 4, [1.0] * 4] if job == "before-irecv" else [[5.0, 5.0, 6.0, 6.0, 6.0], []]
    assert outs == want


def _mrecv_bad_buffer_then_good() -> Any:
    """A matched probe's receive given a read-only buffer raises and leaves the message
    to the next receive of it (a synchronous send's too: it completes when that takes it)."""
    import numpy as np
    from collcomm import MPI
    w = MPI.COMM_WORLD
    if w.Get_rank() == 0:
        w.Ssend(np.arange(3.0), 1, 8)
        return "sent"
    msg = w.Mprobe(0, 8)
    bad = np.zeros(3)
    bad.flags.writeable = False
    try:
        msg.Recv(bad)
        return "no error"
    except (MPI.Exception, BufferError):      # (BufferError: as mpi4py raises for it)
        good = np.zeros(3)
        msg.Recv(good)
        return good.tolist()


@pytest.mark.timeout(120)
def test_mrecv_with_a_bad_buffer_keeps_the_message() -> None:
    outs = run_ranks(_mrecv_bad_buffer_then_good, 2, env={"COLLCOMM_TIMEOUT": "20"}, transport="shm", timeout=100)
    assert outs == ["sent", [0.0, 1.0, 2.0]]
