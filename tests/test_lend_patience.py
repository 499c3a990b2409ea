"""A lent send's patience grows with its size (transport/shm_lent.py ``lend_patience``).

A loan unclaimed past its patience is withdrawn into a copy, which for a large buffer costs
a copy into fresh memory; a fixed 5 ms withdrew 32 MiB loans whose reader was only busy
reading one as large first. (And the channel's own send lends only with a CPU per local
rank, the C lenders whatever the CPUs.) Checked on real ranks, for every lender (the functional
``isend`` lent from C, collcomm.MPI's ``Isend`` and ``Sendrecv`` lent from C, the Python
channel's loan): rank 1 comes to read 0.3 s late; with a patience of the larger of 50 ms
and a size term of 3 s the loan is read where it lies, and without the size term (the
floor alone) it is withdrawn, the receiver reading the copy while the sender scribbles over
its array.
"""
from __future__ import annotations

import numpy as np
import pytest

from collcomm import native
from tests.harness import run_ranks

needs_core = pytest.mark.skipif(native.core is None, reason="lending needs the native core")
COUNT = 1 << 19            # float64: 4 MiB, lent by every way


@pytest.fixture(scope="module", autouse=True)
def _cross_memory_attach():
    from tests.test_shm_lent import _reads_peer

    if not all(run_ranks(_reads_peer, 2, transport="shm", timeout=60)):
        pytest.skip("cross-memory attach is not permitted here: no loans")


def test_the_patience_is_the_floor_or_the_size_term(monkeypatch):
    from collcomm.core import p2p_loans
    from collcomm.transport import shm_lent

    monkeypatch.setattr(shm_lent, "LEND_PATIENCE", 0.005)
    monkeypatch.setattr(shm_lent, "LEND_PATIENCE_PER_BYTE", 1e-9)
    assert shm_lent.lend_patience(0) == 0.005
    assert shm_lent.lend_patience(1 << 20) == 0.005
    assert shm_lent.lend_patience(32 << 20) == pytest.approx((32 << 20) * 1e-9)
    assert p2p_loans.patience_ns(32 << 20) == int(shm_lent.lend_patience(32 << 20) * 1e9)
    assert shm_lent.lend_patience(8 << 30) == shm_lent.LEND_PATIENCE_MAX == 1.0   # (capped)
    monkeypatch.setattr(shm_lent, "LEND_PATIENCE_PER_BYTE", 0.0)
    assert shm_lent.lend_patience(1 << 30) == 0.005


def _late_reader(way: str, per_byte: float) -> dict:
    import time

    import collcomm as dist
    import collcomm.core.runtime as rt
    from collcomm import MPI, api_p2p
    from collcomm.transport import shm_lent

    shm_lent.LEND_PATIENCE = 0.05
    shm_lent.LEND_PATIENCE_PER_BYTE = per_byte
    pair = dist.new_group([0, 1])
    comm, r = MPI.COMM_WORLD, dist.get_rank()
    comm.Sendrecv(np.zeros(1), 1 - r, 99, np.zeros(1), 1 - r, 99)   # (MPI's native entry made)
    dist.barrier()
    want = np.arange(COUNT, dtype=np.float64)
    if way == "sendrecv" and r == 1:   # (rank 0's receive done at once; its loan read late)
        comm.Send(np.ones(1), 0, 5)
    if r == 0:
        buf = want.copy()
        out: dict = {}
        if way == "mpi":
            req = comm.Isend(buf, 1)
            out["lent_from_c"] = type(req._op).__name__ == "_LentSend"
            req.Wait()
        elif way == "sendrecv":
            comm.Sendrecv(buf, 1, 6, np.zeros(1), 1, 5)
        elif way == "python":        # not from C: the channel's own loan (LentBodies)
            api_p2p.lend_native = api_p2p.start_native = lambda *a, **k: None
            dist.isend(buf, 1, group=pair).wait()
        else:
            dist.isend(buf, 1).wait()
        buf[:] = -1.0                # the caller's again: the receiver must not see this
        ch = rt.get_world("test").transport.channels[1]
        dist.barrier()
        return dict(out, loans=ch.loans, withdrawals=ch.withdrawals)
    time.sleep(0.3)                  # (polling no ring meanwhile)
    got = np.zeros(COUNT)
    if way == "sendrecv":
        comm.Recv(got, 0, 6)
    else:
        dist.recv(got, 0, group=pair if way == "python" else None)
    dist.barrier()
    return {"ok": bool(np.array_equal(got, want))}


@needs_core
@pytest.mark.timeout(120)
@pytest.mark.parametrize("way", ["isend", "mpi", "sendrecv", "python"])
def test_a_large_loan_waits_out_a_late_reader_past_the_floor(way: str) -> None:
    covers = 0.9 / (COUNT * 8)       # the size term: 0.9 s for this buffer (under the 1 s cap)
    for per_byte, withdrawn in ((covers, 0), (0.0, 1)):
        sender, receiver = run_ranks(_late_reader, 2, way, per_byte, transport="shm", timeout=90,
                                     env={"COLLCOMM_CORES": "2"})
        assert receiver["ok"], (way, per_byte, receiver)
        want = {"loans": 1, "withdrawals": withdrawn}
        if way == "mpi":
            want["lent_from_c"] = True
        assert sender == want, (way, per_byte, sender)


def _own_and_c_loans() -> dict:
    """One large isend from C (the functional isend: P2P.lend) and one by the channel's own
    send (the C entry points turned away, a subgroup), each read by rank 1."""
    import collcomm as dist
    import collcomm.core.runtime as rt
    from collcomm import api_p2p

    pair = dist.new_group([0, 1])
    want = np.arange(COUNT, dtype=np.float64)
    ch = rt.get_world("test").transport.channels[1 - dist.get_rank()]
    out = {}
    for way in ("c", "python"):
        dist.barrier()
        before = ch.loans
        if dist.get_rank() == 0:
            if way == "python":
                api_p2p.lend_native = api_p2p.start_native = lambda *a, **k: None
            dist.isend(want.copy(), 1, group=pair if way == "python" else None).wait()
            out[way] = ch.loans - before
        else:
            got = np.zeros(COUNT)
            dist.recv(got, 0, group=pair if way == "python" else None)
            out[way] = bool(np.array_equal(got, want))
    return out


@needs_core
@pytest.mark.timeout(120)
@pytest.mark.parametrize("cores", [2, 1])
def test_the_channels_own_loans_need_a_cpu_per_rank(cores: int) -> None:
    # the C lenders lend whatever the CPUs (shm_lent.takes_lent); the channel's own send, whose
    # wait is the engine's Python loop, only with a CPU per local rank (shm_lent.python_loans)
    sender, receiver = run_ranks(_own_and_c_loans, 2, transport="shm", timeout=90,
                                 env={"COLLCOMM_CORES": str(cores)})
    assert receiver == {"c": True, "python": True}, receiver
    assert sender == {"c": 1, "python": 1 if cores == 2 else 0}, sender
