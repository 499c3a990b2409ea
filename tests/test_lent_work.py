"""The functional API's large sends lent from C (api_p2p_work.LentWork, native/_p2p_lend.c).

From shm_lent.LEND_FROM_WORK bytes, to a rank of this host that takes loans, ``isend`` and
``batch_isend_irecv`` lend the array from C (the batch in its one C call, native/_p2p_batch.c); the work's wait lets the receives take their
messages meanwhile (the first deferred receive's ``test()``, or the engine's poll), so two
ranks that wait for their sends first read each other's loans without the withdrawal.
Checked on real ranks with a patience no test waits out (a wait that only a withdrawal
could end would hang until the harness's timeout): the exchange in rings of two and three,
a work dropped unwaited (withdrawn at once: the sender scribbles, the receiver still reads
what was sent), a loan waited for or ``is_completed()`` polled while the receiver is busy
elsewhere (it ends only by its withdrawal), and a
``wait(timeout=)`` that runs out (the loan stays out; waited again once read, it completes),
and a batch whose lent send's work cannot be made (the loan ends before the error leaves).
Since the wait is C's (native/_p2p_lent.c): a loan read before its wait is waited for in C
alone (functional ``isend`` and collcomm.MPI's ``Isend``), a work dropped unwaited ends
its loan whether ``isend`` or the batch made it, the send's wait takes a deferred receive
in C, another group's receive is left alone; and the Python loop's steps, before and
after C's first try.
"""
from __future__ import annotations

import gc

import numpy as np
import pytest

from collcomm import native
from tests.harness import run_ranks

needs_core = pytest.mark.skipif(native.core is None, reason="lending needs the native core")


@pytest.fixture(scope="module", autouse=True)
def _cross_memory_attach():
    from tests.test_shm_lent import _reads_peer

    if not all(run_ranks(_reads_peer, 2, transport="shm", timeout=60)):
        pytest.skip("cross-memory attach is not permitted here: no loans")


def _channel(peer: int):
    import collcomm.core.runtime as rt

    return rt.get_world("test").transport.channels[peer]


def _ring(counts: list[int]) -> dict:
    """batch_isend_irecv around the ring, the send's wait first, three rounds a size."""
    import collcomm as dist
    from collcomm.api_p2p_work import LentWork
    from collcomm.transport import shm_lent

    import collcomm.core.runtime as rt
    from collcomm.core import p2p

    shm_lent.LEND_PATIENCE = 60.0
    r, n = dist.get_rank(), dist.get_world_size()
    right, left = (r + 1) % n, (r - 1) % n
    dist.barrier()
    # a receive never takes its message when it starts (a rank whose batch comes second
    # would read the other's loan there): every one waits deferred, so only the send's
    # wait letting it take its message ends the loans
    p2p.native(rt.get_world("test")).take_now = 0
    from collcomm import api_p2p       # (the batch lends in its C call: Python lends none)
    python_lent: list[int] = []
    lend_native = api_p2p.lend_native

    def counted(*args: object, **kw: object) -> object:
        w = lend_native(*args, **kw)
        python_lent.append(w is not None)
        return w

    api_p2p.lend_native = counted
    ch = _channel(right)
    before, lent, bad = ch.loans, 0, 0
    for count in counts:
        for i in range(3):
            out = np.arange(count, dtype=np.float32) * (r + 1) + i
            got = np.zeros(count, np.float32)
            works = dist.batch_isend_irecv([dist.P2POp(dist.isend, out, right),
                                            dist.P2POp(dist.irecv, got, left)])
            lent += type(works[0]) is LentWork
            for w in works:
                w.wait()
            bad += not np.array_equal(got, np.arange(count, dtype=np.float32) * (left + 1) + i)
    dist.barrier()
    api_p2p.lend_native = lend_native
    return {"bad": bad, "lent": lent, "loans": ch.loans - before, "withdrawals": ch.withdrawals,
            "python_lent": sum(python_lent)}


@needs_core
@pytest.mark.timeout(120)
@pytest.mark.parametrize("n,cores", [(2, 2), (3, 3), (3, 1)])
def test_a_ring_of_lent_sends_reads_each_loan_once(n: int, cores: int) -> None:
    # (cores 1: more ranks than CPUs, the lent waits yielding to their readers)
    from collcomm.transport.shm_lent import LEND_FROM_WORK

    k = LEND_FROM_WORK // 4
    counts = [k - 1, k, 262_147, 1_000_003]      # below it: through the ring
    for res in run_ranks(_ring, n, counts, transport="shm", timeout=90, env={"COLLCOMM_CORES": str(cores)}):
        assert res["bad"] == 0 and res["lent"] == 9 and res["loans"] >= 9, res
        assert res["withdrawals"] == 0 and res["python_lent"] == 0, res


def _sender_and_receiver(fn: Callable[[], dict]) -> list:
    """``fn`` on two ranks of this host, one CPU each: (rank 0's result, rank 1's)."""
    return run_ranks(fn, 2, transport="shm", timeout=90, env={"COLLCOMM_CORES": "2"})


def _receive_late(count: int, closing_barrier: bool = True) -> dict:
    """Rank 1's side: a barrier (with rank 0, once its send is over), then the receive
    of rank 0's arange (``closing_barrier``: and another, rank 0 reading its counters)."""
    import collcomm as dist

    dist.barrier()
    got = np.zeros(count)
    dist.recv(got, 0)
    if closing_barrier:
        dist.barrier()
    return {"ok": bool(np.array_equal(got, np.arange(count, dtype=np.float64)))}


def _dropped(via: str) -> dict:
    """Rank 0 drops an isend's work unwaited (``via``: made by ``isend``, LentWork's
    __init__, or by the batch's C call): the loan is withdrawn at once (a copy), rank 0
    overwrites the array, and rank 1 still reads what was sent."""
    import collcomm as dist
    from collcomm.transport import shm_lent

    shm_lent.LEND_PATIENCE = 60.0
    dist.barrier()
    count = 300_001
    if dist.get_rank() == 0:
        buf = np.arange(count, dtype=np.float64)
        if via == "isend":
            w = dist.isend(buf, 1)
        else:
            w, = dist.batch_isend_irecv([dist.P2POp(dist.isend, buf, 1)])
        kind = type(w).__name__
        del w
        gc.collect()
        buf[:] = -1.0
        dist.barrier()
        dist.barrier()
        return {"kind": kind, "withdrawals": _channel(1).withdrawals}
    return _receive_late(count)


@needs_core
@pytest.mark.timeout(120)
@pytest.mark.parametrize("via", ["isend", "batch"])
def test_a_work_dropped_unwaited_withdraws_its_loan(via: str) -> None:
    sender, receiver = run_ranks(_dropped, 2, via, transport="shm", timeout=90,
                                 env={"COLLCOMM_CORES": "2"})
    assert sender == {"kind": "LentWork", "withdrawals": 1}, sender
    assert receiver["ok"], receiver


def _read_before_wait(api: str) -> dict:
    """Rank 1 reads rank 0's lent send (a blocking recv) before rank 0 waits for it (a
    barrier between): rank 0's wait is C's alone (native/_p2p_lent.c: released already;
    the Python ``_wait`` never runs) and leaves what the Python one leaves. ``api``: the
    functional ``isend`` (LentWork) or collcomm.MPI's ``Isend`` + ``Wait`` (_LentSend)."""
    import collcomm as dist
    from collcomm import MPI
    from collcomm.MPI._p2p_ops import _LentSend
    from collcomm.api_p2p_work import LentWork
    from collcomm.core.recorder_records import COMPLETED, R_PSTATE
    from collcomm.transport import shm_lent

    shm_lent.LEND_PATIENCE = 60.0
    if api == "mpi":             # (MPI.Isend lends once a first call has made the pipes)
        other = 1 - dist.get_rank()
        MPI.COMM_WORLD.Sendrecv(np.zeros(1), other, 0, np.zeros(1), other, 0)
    dist.barrier()
    count = 300_001
    if dist.get_rank() == 0:
        python_waits: list[object] = []
        cls = LentWork if api == "functional" else _LentSend
        slow = cls._wait
        cls._wait = lambda self, *a: python_waits.append(1) or slow(self, *a)
        buf = np.arange(count, dtype=np.float64)
        if api == "functional":
            w = dist.isend(buf, 1)
            dist.barrier()
            done = w.wait() and w.wait()
        else:
            req = MPI.COMM_WORLD.Isend(buf, 1)
            w = req._op
            dist.barrier()
            done = req.Wait() is True and req == MPI.REQUEST_NULL
        cls._wait = slow
        rec, recording = w._rec, api == "functional" and w._group.observer is not None
        dist.barrier()
        return {"kind": type(w).__name__, "done": done, "python_waits": len(python_waits),
                "status": (w._status.source, w._status.nbytes), "buf": w._buf,
                "rec": recording if rec is None else rec[R_PSTATE] == COMPLETED,
                "withdrawals": _channel(1).withdrawals}
    got = np.zeros(count)
    dist.recv(got, 0)
    dist.barrier()
    dist.barrier()
    return {"ok": bool(np.array_equal(got, np.arange(count, dtype=np.float64)))}


@needs_core
@pytest.mark.timeout(120)
@pytest.mark.parametrize("api", ["functional", "mpi"])
def test_a_loan_read_before_its_wait_is_waited_for_in_c(api: str) -> None:
    sender, receiver = run_ranks(_read_before_wait, 2, api, transport="shm", timeout=90,
                                 env={"COLLCOMM_CORES": "2"})
    assert receiver["ok"], receiver
    assert sender == {"kind": "LentWork" if api == "functional" else "_LentSend", "done": True,
                      "python_waits": 0, "rec": api == "functional",
                      "status": (1, 300_001 * 8), "buf": None, "withdrawals": 0}, sender


def _receive_waiting() -> dict:
    """Rank 1's message is in rank 0's ring before rank 0's batch (a lent send to 1, a
    receive from 1, taken by nothing as it starts); rank 1 reads the loan only after
    that. The send's wait tries the receive in C (own_test): it comes out taken, as when
    started (``early``), which the Python loop's test() does not mark."""
    import time

    import collcomm as dist
    import collcomm.core.runtime as rt
    from collcomm.core import p2p
    from collcomm.transport import shm_lent

    shm_lent.LEND_PATIENCE = 60.0
    me, count = dist.get_rank(), 300_001
    p2p.native(rt.get_world("test")).take_now = 0
    if me == 1:
        dist.isend(np.full(8, 7.0), 0).wait()      # (inline: in rank 0's ring at once)
        dist.barrier()
        time.sleep(0.2)         # (rank 0 waits for its send meanwhile: its loan still out)
        got = np.zeros(count)
        dist.recv(got, 0)
        dist.barrier()
        return {"ok": bool(np.array_equal(got, np.arange(count, dtype=np.float64)))}
    dist.barrier()
    got = np.zeros(8)
    works = dist.batch_isend_irecv([dist.P2POp(dist.isend, np.arange(count, dtype=np.float64), 1),
                                    dist.P2POp(dist.irecv, got, 1)])
    before = works[1].early
    works[0].wait()
    taken = works[1].early
    works[1].wait()
    dist.barrier()
    return {"ok": bool((got == 7.0).all()), "before": before, "taken_by_the_send_wait": taken}


@needs_core
@pytest.mark.timeout(120)
def test_a_lent_sends_wait_takes_the_deferred_receive_in_c() -> None:
    sender, receiver = _sender_and_receiver(_receive_waiting)
    assert receiver["ok"], receiver
    assert sender == {"ok": True, "before": False, "taken_by_the_send_wait": True}, sender


def _other_groups_receive() -> dict:
    """The engine's line of deferred receives holds every group's: rank 0's first one is
    a receive on group B when its lent WORLD send's wait looks, and a WORLD message with
    the same tag lands meanwhile (rank 1 reads the loan 0.2 s later). The wait's C try
    leaves B's receive alone (it is not the send's group's): each receive gets its own
    group's message."""
    import time

    import collcomm as dist
    from collcomm.transport import shm_lent

    shm_lent.LEND_PATIENCE = 60.0
    b = dist.new_group([0, 1])
    count = 300_001
    if dist.get_rank() == 1:
        dist.barrier()
        dist.isend(np.full(8, 5.0), 0).wait()     # WORLD, tag 0
        time.sleep(0.2)
        dist.recv(np.zeros(count), 0)
        dist.send(np.full(8, 9.0), 0, group=b)
        return {}
    got_b, got_world = np.zeros(8), np.zeros(8)
    wb = dist.irecv(got_b, 1, group=b)
    dist.barrier()
    dist.isend(np.arange(count, dtype=np.float64), 1).wait()
    dist.recv(got_world, 1)
    wb.wait()
    return {"b": float(got_b[0]), "world": float(got_world[0])}


@needs_core
@pytest.mark.timeout(120)
def test_a_lent_sends_wait_leaves_another_groups_receive_alone() -> None:
    sender, _ = _sender_and_receiver(_other_groups_receive)
    assert sender == {"b": 9.0, "world": 5.0}, sender


def _withdrawn(how: str) -> dict:
    """Rank 0's lent isend that rank 1 does not read (it waits in a barrier, reading no
    ring), waited for (``how`` "wait") or polled with is_completed() ("poll"): it ends only
    by its withdrawal, past the patience (C's first steps never end it early); rank 1 then
    reads the copy while rank 0 scribbles over its array."""
    import time

    import collcomm as dist
    from collcomm.transport import shm_lent

    shm_lent.LEND_PATIENCE = 0.3
    dist.barrier()
    count = 300_001
    if dist.get_rank() == 0:
        buf = np.arange(count, dtype=np.float64)
        t0 = time.monotonic()
        w = dist.isend(buf, 1)
        polls = 0
        while how == "poll" and not w.is_completed():
            polls += 1
        w.wait()
        took = time.monotonic() - t0
        buf[:] = -1.0
        dist.barrier()
        dist.barrier()
        return {"waited_out": took >= 0.3, "polled": polls > 0,
                "withdrawals": _channel(1).withdrawals}
    return _receive_late(count)


@needs_core
@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["wait", "poll"])
def test_a_loan_nobody_reads_ends_by_its_withdrawal(how: str) -> None:
    sender, receiver = run_ranks(_withdrawn, 2, how, transport="shm", timeout=90,
                                 env={"COLLCOMM_CORES": "2"})
    assert receiver["ok"], receiver
    assert sender == {"waited_out": True, "polled": how == "poll", "withdrawals": 1}, sender


def _timed_out_then_read() -> dict:
    """wait(timeout=) on a loan nobody reads yet raises CommTimeoutError and leaves it
    out (the patience is longer); once rank 1 has read it, wait() completes it."""
    import collcomm as dist
    from collcomm.errors import CommTimeoutError
    from collcomm.transport import shm_lent

    shm_lent.LEND_PATIENCE = 60.0
    dist.barrier()
    count = 300_001
    if dist.get_rank() == 0:
        w = dist.isend(np.arange(count, dtype=np.float64), 1)
        try:
            w.wait(timeout=0.05)
            timed_out = False
        except CommTimeoutError:
            timed_out = True
        pending = not w.is_completed()
        dist.barrier()
        w.wait()
        ch = _channel(1)
        return {"timed_out": timed_out, "pending": pending, "to": w.source_rank(),
                "withdrawals": ch.withdrawals, "kind": type(w).__name__}
    return _receive_late(count, closing_barrier=False)


@needs_core
@pytest.mark.timeout(120)
def test_a_wait_that_times_out_leaves_the_loan_out() -> None:
    sender, receiver = _sender_and_receiver(_timed_out_then_read)
    assert receiver["ok"], receiver
    assert sender == {"timed_out": True, "pending": True, "to": 1, "withdrawals": 0,
                      "kind": "LentWork"}, sender


def _lent_work_not_made() -> dict:
    """Rank 0's batch lends from C but making the send's work fails (a ``lent`` class that
    raises): the error comes out and the loan is already over (withdrawn into a copy:
    rank 0 scribbles over its array, rank 1 still reads what was sent)."""
    import collcomm as dist
    import collcomm.core.runtime as rt
    from collcomm import api_p2p
    from collcomm.core import p2p
    from collcomm.transport import shm_lent

    shm_lent.LEND_PATIENCE = 60.0
    me = dist.get_rank()
    dist.batch_isend_irecv([dist.P2POp(dist.isend, np.zeros(1), 1 - me),    # (the pipes made)
                            dist.P2POp(dist.irecv, np.zeros(1), 1 - me)])[1].wait()
    dist.barrier()
    count = 300_001
    if me == 0:
        g = rt.get_world("test")
        f = p2p.native(g)

        class Refused:
            def __init__(self, *args: object) -> None:
                raise MemoryError("no work today")

        buf = np.arange(count, dtype=np.float64)
        try:
            f.batch([dist.P2POp(dist.isend, buf, 1)], dist.P2POp, dist.irecv, np.ndarray,
                    api_p2p._SIGS, api_p2p.SentWork, api_p2p.RecvWork, g, False, Refused)
            raised = None
        except MemoryError as exc:
            raised = str(exc)
        buf[:] = -1.0
        dist.barrier()
        dist.barrier()
        return {"raised": raised, "loans": _channel(1).loans, "withdrawals": _channel(1).withdrawals}
    return _receive_late(count)


@needs_core
@pytest.mark.timeout(120)
def test_a_loan_whose_work_cannot_be_made_ends_before_the_error_leaves() -> None:
    sender, receiver = _sender_and_receiver(_lent_work_not_made)
    assert receiver["ok"], receiver
    assert sender == {"raised": "no work today", "loans": 1, "withdrawals": 1}, sender


def test_the_wait_steps_grow_from_2_us_and_let_receives_progress_between() -> None:
    """core/p2p_loans.loan_over waits in C 2 µs first, then twice as long each time up to
    STEP_NS, and lets the receives progress between steps: the first deferred receive
    test()s before the first step (its peer may be waiting for it), the engine's poll (none
    deferred) after it (a fake P2P and engine: no processes)."""
    from types import SimpleNamespace

    from collcomm.core import p2p_loans

    for deferred in (True, False):
        steps, tests = [], []

        class FakeP2P:
            def loan_wait(self, local, ident, start, buf, since, step, patience):
                steps.append(step)
                return len(steps) == 8

        receive = SimpleNamespace(test=lambda: tests.append(len(steps)))
        eng = SimpleNamespace(_deferred=[receive] if deferred else [], native_check=lambda *a: None,
                              progress=lambda: tests.append(len(steps)))
        g = SimpleNamespace(transport=eng, ranks=[0, 1], timeout=None)
        assert p2p_loans.loan_over(FakeP2P(), g, 1, (1, 0, 0), bytearray(8), 8, True)
        assert steps == [2_000, 4_000, 8_000, 16_000, 20_000, 20_000, 20_000, 20_000]
        assert steps[0] == p2p_loans.FIRST_STEP_NS and max(steps) == p2p_loans.STEP_NS
        # after every step that did not end it; a deferred receive before the first too
        assert tests == ([0] if deferred else []) + [1, 2, 3, 4, 5, 6, 7]
    # C spun already (LentWork._wait(spun=True)): the receives first, whatever is deferred
    steps, tests = [], []
    eng = SimpleNamespace(_deferred=[], native_check=lambda *a: None,
                          progress=lambda: tests.append(len(steps)))
    g = SimpleNamespace(transport=eng, ranks=[0, 1], timeout=None)
    assert p2p_loans.loan_over(FakeP2P(), g, 1, (1, 0, 0), bytearray(8), 8, True, None, False)
    assert steps == [2_000, 4_000, 8_000, 16_000, 20_000, 20_000, 20_000, 20_000]
    assert tests == [0, 1, 2, 3, 4, 5, 6, 7]
    # the C wait's own bounds are the loop's first step and step (native/_p2p_lent.c)
    if native.core is not None:
        assert native.core.LENT_FIRST_STEP_NS == p2p_loans.FIRST_STEP_NS
        assert native.core.LENT_POLL_NS == p2p_loans.STEP_NS
