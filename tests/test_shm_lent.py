"""Large non-blocking sends lent to the receiver (transport/shm_lent.py): read once, by
cross-memory attach, straight out of the sender's buffer; withdrawn into a copy when the
receiver does not come; never a hang, never a body read after the sender took it back.

Each job checks every byte it receives and which way the bodies went: the channel's
``loans`` / ``withdrawals`` counters, its ``held`` copies, its staging ``pool``.
"""
from __future__ import annotations

import os
import time

import numpy as np
import pytest

from collcomm import native
from tests.harness import run_ranks

BIG = 1 << 21              # 2 MiB: past the inline limit of a 2-rank ring (512 KiB)
COUNT = BIG // 8

needs_core = pytest.mark.skipif(native.core is None, reason="lending needs the native core")


def _reads_peer() -> bool:
    import collcomm as dist

    return bool(_channel(1 - dist.get_rank()).peer_reads_me())


@pytest.fixture(scope="module", autouse=True)
def _cross_memory_attach():
    """Loans are read by cross-memory attach: where a rank may not read its peer's memory
    (Yama, a container's seccomp, COLLCOMM_CMA=0) nothing is lent, and these tests skip."""
    if not all(run_ranks(_reads_peer, 2, transport="shm", timeout=60)):
        pytest.skip("cross-memory attach is not permitted here: no loans")
TWO_CPUS = {"COLLCOMM_CORES": "2"}     # a CPU per rank (waits spin), whatever this host has


def _body(rank: int, i: int = 0) -> np.ndarray:
    return np.arange(COUNT, dtype=np.float64) * (rank + 2) + 1000.0 * i


def _channel(peer: int):
    import collcomm.core.runtime as rt

    return rt.get_world("test").transport.channels[peer]


def _exchange(rounds: int) -> dict:
    """n ranks in a ring, batch_isend_irecv then the waits in list order (the send's
    first): every body checked; how they went."""
    import collcomm as dist

    r, n = dist.get_rank(), dist.get_world_size()
    right, left = (r + 1) % n, (r - 1) % n
    bad = 0
    for i in range(rounds):
        out, got = _body(r, i), np.zeros(COUNT)
        ops = [dist.P2POp(dist.isend, out, right), dist.P2POp(dist.irecv, got, left)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        bad += not np.array_equal(got, _body(left, i))
    ch = _channel(right)
    return {"bad": bad, "loans": ch.loans, "withdrawals": ch.withdrawals, "pool": len(ch.pool),
            "held": len(ch.held), "lent": len(ch.lent)}


@needs_core
@pytest.mark.timeout(120)
@pytest.mark.parametrize("n,cores", [(2, 2), (3, 3), (5, 5), (3, 1), (5, 1)])
def test_exchange_lends_and_reads_once(n, cores):
    # (COLLCOMM_CORES: a CPU per rank, or one for all of them: loans either way, the waits
    # spinning or yielding their CPU to the reader)
    for res in run_ranks(_exchange, n, 6, transport="shm", timeout=90, env={"COLLCOMM_CORES": str(cores)}):
        assert res["bad"] == 0, res
        assert res["loans"] == 6 and res["pool"] == 0 and res["lent"] == 0, res


@pytest.mark.timeout(120)
def test_lend_off_or_python_receiver_copies():
    # COLLCOMM_LEND=0 on rank 1: nobody lends to it (it offers no loans), rank 1 itself
    # still lends to rank 0; a rank without the native core neither lends nor is lent to;
    # a rank that counts fewer CPUs than the host's ranks lends and is lent to all the same
    for env, lenders in (({1: {"COLLCOMM_LEND": "0"}}, {1}),
                         ({1: {"COLLCOMM_NATIVE": "0"}}, set()),
                         ({0: {"COLLCOMM_CORES": "1"}}, {0, 1})):
        res = run_ranks(_exchange, 2, 3, transport="shm", timeout=90, env=TWO_CPUS, rank_env=env)
        for r, got in enumerate(res):
            assert got["bad"] == 0, got
            lends = r in lenders and native.core is not None
            assert (got["loans"] == 3) == lends and (got["pool"] == 0) == lends, (r, got)


def _receiver_elsewhere(patience: float) -> dict:
    """Rank 0 waits for its lent send while rank 1 sits in a barrier that waits for rank
    0 (it polls no ring): the loan is withdrawn; rank 0 then overwrites its buffer, and
    rank 1 still gets what was sent."""
    import collcomm as dist
    from collcomm.transport import shm_lent

    shm_lent.LEND_PATIENCE = patience
    dist.barrier()        # (the first one builds the arena over the rings: rank 1 would poll)
    out = {}
    if dist.get_rank() == 0:
        buf = _body(0)
        t0 = time.monotonic()
        dist.isend(buf, 1).wait()
        out["waited"] = time.monotonic() - t0
        buf[:] = -1.0                       # the caller's again: the receiver must not see this
        dist.barrier()
        ch = _channel(1)
        out.update(loans=ch.loans, withdrawals=ch.withdrawals)
        dist.barrier()                      # rank 1 has read it
        ch.engine.progress()                # (what any wait does first)
        out["held"] = len(ch.held)
    else:
        dist.barrier()
        got = np.zeros(COUNT)
        dist.recv(got, 0)
        out["ok"] = bool(np.array_equal(got, _body(0)))
        dist.barrier()
    return out


@needs_core
@pytest.mark.timeout(120)
def test_a_receiver_busy_elsewhere_gets_a_withdrawn_copy():
    sender, receiver = run_ranks(_receiver_elsewhere, 2, 0.005, transport="shm", timeout=90, env=TWO_CPUS)
    assert receiver["ok"], receiver
    assert sender["loans"] == 1 and sender["withdrawals"] == 1, sender
    assert sender["waited"] < 5, sender          # the patience and a copy, not the timeout
    assert sender["held"] == 0, sender           # the copy went at a poll once released


def _both_wait_first() -> bool:
    """Both ranks wait for their isend before receiving (an unsafe program for MPI's
    rendezvous, fine with copies): the waits read each other's loans aside."""
    import collcomm as dist
    from collcomm.transport import shm_lent

    shm_lent.LEND_PATIENCE = 60.0               # never withdrawn: the reads must do it
    r = dist.get_rank()
    dist.isend(_body(r), 1 - r).wait()
    got = np.zeros(COUNT)
    dist.recv(got, 1 - r)
    return bool(np.array_equal(got, _body(1 - r))) and _channel(1 - r).withdrawals == 0


@needs_core
@pytest.mark.timeout(120)
def test_both_ranks_wait_for_their_isend_before_receiving():
    assert run_ranks(_both_wait_first, 2, transport="shm", timeout=90, env=TWO_CPUS) == [True, True]


def _order() -> list[bool]:
    """Rank 0 lends a large message, then sends a small one with the same tag and one
    with another tag; rank 1 takes the other tag first (the loan is read aside), then the
    two in order; with MPI's Recv (the native receive leaves LENT records to Python)."""
    from collcomm.MPI import COMM_WORLD as comm

    if comm.Get_rank() == 0:
        big, small, other = _body(0), np.full(3, 7.0), np.full(5, 9.0)
        reqs = [comm.Isend(big, 1, tag=1), comm.Isend(small, 1, tag=1), comm.Isend(other, 1, tag=2)]
        for q in reqs:
            q.Wait()
        comm.Barrier()
        return [_channel(1).loans == 1]
    got_other, got_big, got_small = np.zeros(5), np.zeros(COUNT), np.zeros(3)
    comm.Recv(got_other, 0, tag=2)
    comm.Recv(got_big, 0, tag=1)
    comm.Recv(got_small, 0, tag=1)
    comm.Barrier()
    return [bool(np.all(got_other == 9.0)), bool(np.array_equal(got_big, _body(0))),
            bool(np.all(got_small == 7.0))]


@needs_core
@pytest.mark.timeout(120)
def test_a_loan_keeps_its_place_in_the_order():
    sender, receiver = run_ranks(_order, 2, transport="shm", timeout=90, env=TWO_CPUS)
    assert sender == [True] and receiver == [True, True, True], (sender, receiver)


def _race(most: int) -> dict:
    """No patience at all: the sender withdraws at its first look while the receiver
    claims at its own; whoever wins, the receiver reads exactly what was sent (the
    sender scribbles over its buffer as soon as its wait returns). Rounds go on until
    both sides have won at least 5 times (at most ``most``; rank 0 says when to stop); the
    receiver comes late in some rounds."""
    import collcomm as dist
    from collcomm.transport import shm_lent

    shm_lent.LEND_PATIENCE = shm_lent.LEND_PATIENCE_PER_BYTE = 0.0
    r = dist.get_rank()
    ch = _channel(1 - r)
    bad = rounds = 0
    go = np.ones(1)
    while go[0]:
        if r == 0:
            buf = _body(0, rounds)
            dist.isend(buf, 1).wait()
            buf[:] = -1.0
            claims = ch.loans - ch.withdrawals
            go[0] = rounds + 1 < most and min(claims, ch.withdrawals) < 5
        else:
            got = np.zeros(COUNT)
            if rounds % 2:
                time.sleep(0.0002 * (rounds % 5))     # late now and then: the withdrawal wins
            dist.recv(got, 0)
            bad += not np.array_equal(got, _body(0, rounds))
        dist.broadcast(go, src=0)
        rounds += 1
    return {"bad": bad, "rounds": rounds, "loans": ch.loans, "withdrawals": ch.withdrawals}


@needs_core
@pytest.mark.timeout(150)
def test_withdrawal_racing_the_claim_never_tears_a_body():
    sender, receiver = run_ranks(_race, 2, 400, transport="shm", timeout=120, env=TWO_CPUS)
    assert receiver["bad"] == 0, receiver
    assert sender["loans"] == sender["rounds"], sender
    # both ways were taken (seen 2-38 withdrawals in 40 rounds on the 2-vCPU VM)
    assert sender["withdrawals"] >= 5 and sender["loans"] - sender["withdrawals"] >= 5, sender


def _threads_and_a_full_ring() -> dict:
    """Three threads of rank 0 send at once while rank 1 is not yet receiving, so the
    ring fills and their records wait for room: one lends 2 MiB isends, one sends 20 MiB
    blocking (private copies: /dev/shm made to look short), one 400 KiB inline messages.
    Release ids must reach the ring in the order the records are written (RELEASED is a
    watermark): every body arrives intact though each buffer is overwritten as soon as
    its send is done."""
    import threading

    import collcomm as dist
    import collcomm.transport.shm_staging as staging

    r = dist.get_rank()
    big = 20 << 17                     # float64 elements: 20 MiB
    plan = {1: (4, COUNT, True), 2: (3, big, False), 3: (12, 51200, False)}   # tag: (count, elems, lend)
    if r == 0:
        staging.shm_budget = lambda: 64 << 20          # past the pool: private copies
        errors: list[BaseException] = []

        def sender(tag: int) -> None:
            count, elems, lend = plan[tag]
            try:
                for i in range(count):
                    buf = np.arange(elems, dtype=np.float64) + 1e6 * tag + i
                    if lend:
                        dist.isend(buf, 1, tag=tag).wait()
                    else:
                        dist.send(buf, 1, tag=tag)
                    buf[:] = -1.0
            except BaseException as exc:   # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=sender, args=(t,)) for t in plan]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        dist.barrier()
        ch = _channel(1)
        return {"errors": [repr(e) for e in errors], "alive": sum(t.is_alive() for t in threads),
                "loans": ch.loans}
    time.sleep(0.5)                    # the ring fills meanwhile
    bad = []
    for tag, (count, elems, _) in sorted(plan.items(), key=lambda kv: -kv[0]):
        for i in range(count):
            got = np.zeros(elems)
            dist.recv(got, 0, tag=tag)
            if not np.array_equal(got, np.arange(elems, dtype=np.float64) + 1e6 * tag + i):
                bad.append((tag, i))
    dist.barrier()
    return {"bad": bad}


@needs_core
@pytest.mark.timeout(150)
def test_concurrent_senders_behind_a_full_ring_keep_release_order():
    sender, receiver = run_ranks(_threads_and_a_full_ring, 2, transport="shm", timeout=120,
                                 env=TWO_CPUS)
    assert sender["errors"] == [] and sender["alive"] == 0, sender
    assert sender["loans"] == 4, sender
    assert receiver["bad"] == [], receiver


def _closed_with_a_loan_out() -> dict:
    """Rank 0's channel closes (linger 0, as an abort does) with a loan rank 1 has not
    claimed: the loan is withdrawn, the send completes, rank 0 overwrites its buffer, and
    rank 1 still reads what was sent."""
    import collcomm as dist
    from collcomm.transport import shm_lent

    shm_lent.LEND_PATIENCE = 60.0
    dist.barrier()        # (the first one builds the arena over the rings)
    if dist.get_rank() == 0:
        buf = _body(0)
        w = dist.isend(buf, 1)
        ch = _channel(1)
        ch.close(linger=0)
        w.wait()
        buf[:] = -1.0
        dist.barrier()
        dist.barrier()                  # rank 1 has read it
        return {"loans": ch.loans, "withdrawals": ch.withdrawals}
    dist.barrier()
    got = np.zeros(COUNT)
    dist.recv(got, 0)
    dist.barrier()
    return {"ok": bool(np.array_equal(got, _body(0)))}


@needs_core
@pytest.mark.timeout(120)
def test_a_loan_out_when_the_channel_closes_is_withdrawn():
    sender, receiver = run_ranks(_closed_with_a_loan_out, 2, transport="shm", timeout=90, env=TWO_CPUS)
    assert sender == {"loans": 1, "withdrawals": 1}, sender
    assert receiver["ok"], receiver


def _claim_then_fail() -> dict:
    """The receiver claims a loan, then fails before reading it (its receive's buffer
    could not be had, injected once): the record stays at the ring's tail, claimed; the
    next wait takes it again as its own claim and reads the lent buffer. (A receive from
    any source: the Python path's take_lent, which the injection reaches; a native
    receive reads the record in C, native/_p2p_ring.c pipe_read_lent.)"""
    import collcomm as dist
    import collcomm.core.runtime as rt
    from collcomm.transport import shm_lent

    shm_lent.LEND_PATIENCE = 60.0
    dist.barrier()
    if dist.get_rank() == 0:
        buf = _body(0)
        dist.isend(buf, 1).wait()
        dist.barrier()
        return {"withdrawals": _channel(1).withdrawals}
    eng = rt.get_world("test").transport
    real = eng.arriving
    calls = [0]

    def arriving(*args):
        calls[0] += 1
        if calls[0] == 1:
            raise MemoryError("injected: no room for the body")
        return real(*args)

    eng.arriving = arriving
    got = np.zeros(COUNT)
    h = dist.irecv(got)
    seen = ""
    try:
        h.wait()
    except MemoryError as exc:
        seen = str(exc)
    h.wait()
    dist.barrier()
    return {"seen": seen, "ok": bool(np.array_equal(got, _body(0))), "calls": calls[0]}


@needs_core
@pytest.mark.timeout(120)
def test_a_claimed_record_taken_again_reads_the_loan():
    sender, receiver = run_ranks(_claim_then_fail, 2, transport="shm", timeout=90, env=TWO_CPUS)
    assert receiver["seen"].startswith("injected") and receiver["ok"], receiver
    assert receiver["calls"] == 2 and sender["withdrawals"] == 0, (sender, receiver)


def _sender_dies() -> str:
    """Rank 0 lends a body and dies before rank 1 reads it: rank 1's receive fails naming
    rank 0, it does not hang."""
    import collcomm as dist
    from collcomm.transport import shm_lent

    shm_lent.LEND_PATIENCE = 60.0
    dist.barrier()        # (the first one builds the arena over the rings: rank 1 would poll)
    if dist.get_rank() == 0:
        dist.isend(_body(0), 1)
        dist.barrier()
        os._exit(3)
    dist.barrier()
    time.sleep(0.5)                              # rank 0 is gone by now
    try:
        dist.recv(np.zeros(COUNT), 0)
    except dist.PeerLostError as exc:
        return f"PeerLostError: {exc}"
    return "no error"


@needs_core
@pytest.mark.timeout(120)
def test_a_lender_that_dies_fails_the_receive_by_name():
    got = run_ranks(_sender_dies, 2, transport="shm", timeout=60, expect_failure=True, env=TWO_CPUS)[1]
    assert got.ok and got.value.startswith("PeerLostError") and "rank 0" in got.value, got
    assert "could not read" in got.value, got      # the lent record was taken, its read failed
