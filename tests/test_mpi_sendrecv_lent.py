"""collcomm.MPI's Sendrecv lends its send buffer from C (native/_p2p_lend.c), and a native
receive reads a LENT record by cross-memory attach (native/_p2p_ring.c pipe_read_lent).

From MPI/_p2p.py's LEND_FROM bytes, to a rank of this host that takes lent buffers, a
Sendrecv writes a LENT record (P2P.lend), receives, then waits until the receiver has read
the buffer or, past the patience, withdraws the loan into a private copy (P2P.loan_wait).
Checked here on real ranks: every size around the threshold in a ring of two and three
ranks (results, status, loans counted), a receiver that comes late (the loan withdrawn:
the sender overwrites its buffer and the receiver still gets what was sent), a receiver
without the native core (nothing lent), a Python-lent Isend read by a native Recv, a
receiver that dies and a lender that dies with its loan out (each error names the dead
rank; nothing hangs).
"""
from __future__ import annotations

import time

import numpy as np
import pytest

from collcomm import native
from tests.harness import run_ranks

needs_core = pytest.mark.skipif(native.core is None, reason="lending needs the native core")


@pytest.fixture(scope="module", autouse=True)
def _cross_memory_attach():
    """Loans are read by cross-memory attach: where a rank may not read its peer's memory
    nothing is lent, and these tests skip."""
    from tests.test_shm_lent import _reads_peer

    if not all(run_ranks(_reads_peer, 2, transport="shm", timeout=60)):
        pytest.skip("cross-memory attach is not permitted here: no loans")


def _channel(peer: int):
    import collcomm.core.runtime as rt

    return rt.get_world("test").transport.channels[peer]


def _sizes() -> list[tuple[int, str]]:
    """(elements, dtype): around LEND_FROM, and larger odd sizes."""
    from collcomm.MPI._p2p import LEND_FROM

    k = LEND_FROM // 8
    return [(k - 1, "float64"), (k, "float64"), (k + 1, "float64"), (262_147, "int16"),
            (524_291, "float32"), (7, "float64")]


def _ring() -> dict:
    """Sendrecv around a ring, three rounds per size: every result and status checked;
    the loans this rank's channel to the right made."""
    from collcomm import MPI
    from collcomm.MPI._p2p import LEND_FROM

    from collcomm.core import p2p

    comm = MPI.COMM_WORLD
    r, n = comm.Get_rank(), comm.Get_size()
    right, left = (r + 1) % n, (r - 1) % n
    for dt in sorted({dt for _, dt in _sizes()}):   # (each dtype mapped once: see _warm)
        comm.Sendrecv(np.zeros(1, dt), right, 99, np.zeros(1, dt), left, 99)
    comm.Barrier()
    f = p2p.native(comm._grp("Sendrecv"))
    before, lent, sends, recvs = _channel(right).loans, 0, f.sends, f.recvs
    for count, dt in _sizes():
        for i in range(3):
            out = (np.arange(count) * (r + 2) + i).astype(dt)
            got = np.zeros(count, dt)
            st = MPI.Status()
            comm.Sendrecv(out, right, 10 + i, got, left, 10 + i, status=st)
            want = (np.arange(count) * (left + 2) + i).astype(dt)
            assert np.array_equal(got, want), (count, dt, i)
            assert (st.Get_source(), st.Get_tag(), st.Get_count(MPI.BYTE)) == (left, 10 + i, got.nbytes)
            assert np.array_equal(out, (np.arange(count) * (r + 2) + i).astype(dt))   # untouched
            lent += out.nbytes >= LEND_FROM
    comm.Barrier()
    ch = _channel(right)
    ch.engine.progress()                        # (a poll drops released copies, if any)
    # every send went natively, lent (LENT records, from C) or inline, and every receive
    # (a native receive reads the LENT records itself); no copy left held
    return {"loans": ch.loans - before, "want": lent, "held": len(ch.held),
            "native": f.sends - sends, "native_recv": f.recvs - recvs, "calls": 3 * len(_sizes())}


@needs_core
@pytest.mark.timeout(120)
@pytest.mark.parametrize("n,cores", [(2, 2), (3, 3), (3, 1)])
def test_sendrecv_lends_around_the_threshold(n: int, cores: int) -> None:
    # (COLLCOMM_CORES: a CPU per rank, or one for all: lent either way, shm_lent.takes_lent)
    for res in run_ranks(_ring, n, transport="shm", timeout=90, env={"COLLCOMM_CORES": str(cores)}):
        assert res["want"] > 0 and res["loans"] == res["want"] and res["held"] == 0, res
        assert res["native"] == res["calls"] and res["native_recv"] == res["calls"], res


def _warm(comm) -> None:
    """One small float64 exchange: collcomm.MPI's native Sendrecv takes a dtype it has
    mapped once (its first call of a dtype goes the general way), then a barrier."""
    r = comm.Get_rank()
    comm.Sendrecv(np.zeros(1), 1 - r, 99, np.zeros(1), 1 - r, 99)
    comm.Barrier()


def _late_receiver() -> dict:
    """Rank 1 sends its part first and receives rank 0's only later: rank 0's loan is
    withdrawn when its patience runs out, rank 0 overwrites its buffer at once, and rank
    1 still reads what was sent (the copy)."""
    from collcomm import MPI

    comm = MPI.COMM_WORLD
    count = 300_001
    want = np.arange(count, dtype=np.float64)
    _warm(comm)
    if comm.Get_rank() == 0:
        buf, small = want.copy(), np.zeros(4)
        t0 = time.monotonic()
        from collcomm.core import p2p
        f = p2p.native(comm._grp("Sendrecv"))
        sends = f.sends
        comm.Sendrecv(buf, 1, 3, small, 1, 4)
        waited = time.monotonic() - t0
        assert f.sends == sends + 1     # lent from C (P2P.lend)
        buf[:] = -1.0                          # ours again: the receiver must not see it
        comm.Barrier()
        ch = _channel(1)
        out = {"waited": waited, "loans": ch.loans, "withdrawals": ch.withdrawals}
        comm.Barrier()                         # rank 1 has read it
        ch.engine.progress()                   # (a poll drops a released copy)
        out["held"] = len(ch.held)
        return out
    comm.Send(np.ones(4), 0, 4)
    time.sleep(0.2)
    comm.Barrier()
    got = np.zeros(count)
    comm.Recv(got, 0, 3)
    comm.Barrier()
    return {"ok": bool(np.array_equal(got, want))}


@needs_core
@pytest.mark.timeout(120)
def test_a_late_receiver_reads_the_withdrawn_copy() -> None:
    sender, receiver = run_ranks(_late_receiver, 2, transport="shm", timeout=90,
                                 env={"COLLCOMM_CORES": "2"})
    assert receiver["ok"], receiver
    assert sender["loans"] == 1 and sender["withdrawals"] == 1, sender
    assert sender["waited"] < 5 and sender["held"] == 0, sender


def _plain_exchange() -> dict:
    from collcomm import MPI

    comm = MPI.COMM_WORLD
    r = comm.Get_rank()
    _warm(comm)
    out, got = np.full(200_000, r, np.float64), np.zeros(200_000)
    comm.Sendrecv(out, 1 - r, 0, got, 1 - r, 0)
    return {"ok": bool((got == 1 - r).all()), "loans": _channel(1 - r).loans}


@pytest.mark.timeout(120)
def test_nothing_is_lent_to_a_rank_without_the_native_core() -> None:
    res = run_ranks(_plain_exchange, 2, transport="shm", timeout=90, env={"COLLCOMM_CORES": "2"},
                    rank_env={1: {"COLLCOMM_NATIVE": "0"}})
    assert all(x["ok"] for x in res), res
    assert res[1]["loans"] == 0 and res[0]["loans"] == 0, res   # (rank 1 lends natively only)


def _isend_read_natively() -> dict:
    """A Python-lent Isend (the regular path lends it) read by a native Recv (C)."""
    from collcomm import MPI
    from collcomm.core import p2p

    comm = MPI.COMM_WORLD
    count = 150_003
    comm.Barrier()
    if comm.Get_rank() == 0:
        req = comm.Isend(np.arange(count, dtype=np.float64), 1, 9)
        req.Wait()
        comm.Barrier()
        ch = _channel(1)
        return {"loans": ch.loans, "withdrawals": ch.withdrawals}
    f = p2p.native(comm._grp("Recv"))
    before = f.recvs
    got = np.zeros(count)
    comm.Recv(got, 0, 9)
    comm.Barrier()
    return {"ok": bool(np.array_equal(got, np.arange(count, dtype=np.float64))),
            "native": f.recvs - before}


@needs_core
@pytest.mark.timeout(120)
def test_a_native_receive_reads_a_python_loan() -> None:
    sender, receiver = run_ranks(_isend_read_natively, 2, transport="shm", timeout=90,
                                 env={"COLLCOMM_CORES": "2"})
    assert receiver["ok"] and receiver["native"] == 1, receiver
    assert sender["loans"] == 1, sender


def _dying_receiver() -> dict:
    from collcomm import MPI

    comm = MPI.COMM_WORLD
    _warm(comm)
    if comm.Get_rank() == 1:
        time.sleep(60)                        # killed by the harness
    t0 = time.monotonic()
    try:
        comm.Sendrecv(np.ones(100_000), 1, 0, np.zeros(100_000), 1, 0)
    except Exception as exc:  # noqa: BLE001
        return {"error": f"{type(exc).__name__}: {exc}", "took": time.monotonic() - t0}
    return {"error": "", "took": time.monotonic() - t0}


@needs_core
@pytest.mark.timeout(120)
def test_a_receiver_that_dies_is_named() -> None:
    res = run_ranks(_dying_receiver, 2, transport="shm", timeout=90, env={"COLLCOMM_CORES": "2"},
                    expect_failure=True, kill={1: 1.0})
    out = res[0]
    assert out.ok, out.error + out.output
    assert "rank 1" in out.value["error"] and out.value["took"] < 20, out.value


def _dying_lender() -> dict:
    """Rank 0 lends (Sendrecv) and is killed in the receive that follows; rank 1 then
    receives: its native read of the loan fails, and the receive names rank 0."""
    from collcomm import MPI

    comm = MPI.COMM_WORLD
    _warm(comm)
    if comm.Get_rank() == 0:
        comm.Sendrecv(np.ones(100_000), 1, 5, np.zeros(1), 1, 6)   # killed in there
        return {}
    time.sleep(2.5)                           # (rank 0 is killed at 1.5 s)
    got = np.zeros(100_000)
    try:
        comm.Recv(got, 0, 5)
    except Exception as exc:  # noqa: BLE001
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {"error": "", "sum": float(got.sum())}


@needs_core
@pytest.mark.timeout(120)
def test_a_lender_that_dies_is_named() -> None:
    res = run_ranks(_dying_lender, 2, transport="shm", timeout=90, env={"COLLCOMM_CORES": "2"},
                    expect_failure=True, kill={0: 1.5})
    out = res[1]
    assert out.ok, out.error + out.output
    assert "rank 0" in out.value["error"], out.value


def _halo(order: str) -> dict:
    """Irecv + Isend + Waitall around a ring (the halo exchange of mpi4py programs), the
    requests waited in ``order`` ("recv" first or "send" first), with a patience no test
    waits out: an Isend of LEND_FROM_WORK bytes or more is lent from C, and only the reads
    (the receive's native wait, or the send's wait letting the receive take its message)
    can end the loans."""
    from collcomm import MPI
    from collcomm.transport import shm_lent
    from collcomm.transport.shm_lent import LEND_FROM_WORK

    shm_lent.LEND_PATIENCE = 60.0
    comm = MPI.COMM_WORLD
    r, n = comm.Get_rank(), comm.Get_size()
    right, left = (r + 1) % n, (r - 1) % n
    comm.Sendrecv(np.zeros(1, np.float32), right, 99, np.zeros(1, np.float32), left, 99)
    comm.Barrier()
    before, bad, lent = _channel(right).loans, 0, 0
    for count in (LEND_FROM_WORK // 4 - 1, LEND_FROM_WORK // 4, 700_001):
        for i in range(3):
            out = np.arange(count, dtype=np.float32) * (r + 1) + i
            got = np.zeros(count, np.float32)
            rq, sq = comm.Irecv(got, left, 7), comm.Isend(out, right, 7)
            lent += out.nbytes >= LEND_FROM_WORK
            MPI.Request.Waitall([rq, sq] if order == "recv" else [sq, rq])
            bad += not np.array_equal(got, np.arange(count, dtype=np.float32) * (left + 1) + i)
    comm.Barrier()
    ch = _channel(right)
    return {"bad": bad, "loans": ch.loans - before, "want": lent, "withdrawals": ch.withdrawals}


@needs_core
@pytest.mark.timeout(120)
@pytest.mark.parametrize("n,order", [(2, "recv"), (2, "send"), (3, "send")])
def test_isend_lends_and_waitall_reads_in_either_order(n: int, order: str) -> None:
    for res in run_ranks(_halo, n, order, transport="shm", timeout=90, env={"COLLCOMM_CORES": str(n)}):
        assert res["bad"] == 0 and res["loans"] == res["want"] == 6, res
        assert res["withdrawals"] == 0, res


def _isend_tested() -> dict:
    """Test() polled on a lent Isend while rank 1 waits in a barrier for rank 0: past the
    patience the loan is withdrawn, the poll sees it done, and rank 1 reads the copy."""
    from collcomm import MPI

    comm = MPI.COMM_WORLD
    _warm(comm)
    count = 300_001
    if comm.Get_rank() == 0:
        buf = np.arange(count, dtype=np.float64)
        req = comm.Isend(buf, 1, 2)
        assert type(req._op).__name__ == "_LentSend"     # lent from C (not the Python path)
        polls = 0
        while not req.Test():
            polls += 1
        buf[:] = -1.0
        comm.Barrier()
        comm.Barrier()
        return {"polls": polls, "withdrawals": _channel(1).withdrawals}
    comm.Barrier()
    got = np.zeros(count)
    comm.Recv(got, 0, 2)
    comm.Barrier()
    return {"ok": bool(np.array_equal(got, np.arange(count, dtype=np.float64)))}


@needs_core
@pytest.mark.timeout(120)
def test_a_lent_isend_tested_while_its_receiver_is_elsewhere() -> None:
    sender, receiver = run_ranks(_isend_tested, 2, transport="shm", timeout=90,
                                 env={"COLLCOMM_CORES": "2"})
    assert receiver["ok"], receiver
    assert sender["polls"] > 0 and sender["withdrawals"] == 1, sender
