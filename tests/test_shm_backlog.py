"""Sends that find the peer's shared-memory ring full wait in the channel's backlog
(transport/shm_backlog.py) instead of blocking their caller: a receiver that posted its
receives and went into a collective gets its messages (the hang tests/random_overlap.py
found: the sender blocked in ``isend``, the receiver in ``all_to_all``), messages sent
after a backlog go behind it (native sends too), the engine's writer thread delivers a
backlog while its rank sleeps outside the library, the same through collcomm.MPI's
``Send``, and a sender that leaves with a backlog still delivers it. Natively and on
the pure-Python path.
"""
from __future__ import annotations

import numpy as np
import pytest

from tests.harness import run_ranks

pytestmark = pytest.mark.timeout(120)

BIG = 50_000          # float32s: 200 KiB, inline (below the 256 KiB eager limit of a 1 MiB ring)
COUNT = 8             # 1.6 MB of them: more than the ring holds
SMALL = 40
PIECE, PIECES = 1024, 300   # float32s: 300 isends of 4 KiB
HUGE = 300_000        # float32s: 1.2 MB, past the inline limit (lent or staged)


def _flood() -> dict:
    import time

    import collcomm as dist
    from collcomm import MPI
    from collcomm.core import runtime

    me, other = dist.get_rank(), 1 - dist.get_rank()
    ch = runtime.get_world("test").transport.channels[other]
    out: dict = {}
    bigs = [np.full(BIG, i, np.float32) for i in range(COUNT)]
    huge = [np.full(HUGE, 50 + i, np.float32) for i in range(3)]

    # isends (small enough not to be lent) and, behind them, large ones (lent, or staged)
    # and a large blocking send (staged), while the receiver, its receives posted, sleeps
    # outside the library (so nothing drains the ring), then waits in a barrier. The
    # sender starts when the receiver's "go" message arrives, not when a barrier lets it
    # go: a receiver still waiting in that barrier (descheduled on a busy machine) would
    # progress its posted receives and drain the ring while the sender fills it.
    go = np.zeros(1, np.float32)
    if me == 0:
        pieces = [np.full(PIECE, i, np.float32) for i in range(PIECES)]
        dist.recv(go, other, tag=9)
        works = [dist.isend(b, other, tag=1) for b in pieces]
        works += [dist.isend(h, other, tag=1) for h in huge[:2]]
        dist.send(huge[2], other, tag=1)
        out["queued"] = len(ch.backlog)
        dist.barrier()
        for w in works:
            w.wait()
    else:
        got = [np.zeros(PIECE, np.float32) for _ in range(PIECES)] + [np.zeros(HUGE, np.float32) for _ in range(3)]
        works = [dist.irecv(g, other, tag=1) for g in got]
        dist.send(go, other, tag=9)
        time.sleep(0.3)
        dist.barrier()
        for w in works:
            w.wait()
        out["isend"] = [float(g[0]) if (g == g[0]).all() else -1.0 for g in got]

    # blocking sends past the ring's room return (buffered); small sends after them go
    # behind them (native ones too); the sender then sleeps outside the library while the
    # receiver drains: only the writer thread can write the rest
    if me == 0:
        dist.barrier()
        for b in bigs:
            dist.send(b, other, tag=2)
        for i in range(SMALL):
            dist.send(np.full(2, COUNT + i, np.float32), other, tag=2)
        out["queued behind"] = len(ch.backlog)
        time.sleep(1.0)
        out["after sleeping"] = len(ch.backlog)
        dist.barrier()
    else:
        dist.barrier()
        time.sleep(0.2)
        seq = []
        for i in range(COUNT + SMALL):
            g = np.zeros(BIG if i < COUNT else 2, np.float32)
            dist.recv(g, other, tag=2)
            seq.append(float(g[0]) if (g == g[0]).all() else -1.0)
        out["order"] = seq
        dist.barrier()

    # collcomm.MPI: Send past the ring's room, the receiver's Irecvs waited after Barriers
    comm = MPI.COMM_WORLD
    if me == 0:
        comm.Recv(go, other, 9)
        for b in bigs:
            comm.Send(b, other, 3)
        out["mpi queued"] = len(ch.backlog)
        comm.Barrier()
    else:
        got = [np.zeros(BIG, np.float32) for _ in range(COUNT)]
        reqs = [comm.Irecv(g, other, 3) for g in got]
        comm.Send(go, other, 9)
        time.sleep(0.3)
        comm.Barrier()
        MPI.Request.Waitall(reqs)
        out["mpi"] = [float(g[0]) if (g == g[0]).all() else -1.0 for g in got]
    dist.barrier()
    out["left"] = len(ch.backlog)

    # the sender leaves with a backlog: its close delivers it to the (late) receiver
    dist.barrier()
    if me == 0:
        for b in bigs:
            dist.send(b, other, tag=4)
        out["leaves with"] = len(ch.backlog)
    else:
        time.sleep(0.5)
        got = [np.zeros(BIG, np.float32) for _ in range(COUNT)]
        for g in got:
            dist.recv(g, other, tag=4)
        out["after close"] = [float(g[0]) if (g == g[0]).all() else -1.0 for g in got]
    return out


@pytest.mark.parametrize("python", [False, True], ids=["native", "python"])
def test_full_ring_sends_wait_in_the_backlog_not_in_the_caller(python: bool) -> None:
    env = {"COLLCOMM_NATIVE": "0"} if python else {}
    sender, receiver = run_ranks(_flood, 2, transport="shm", timeout=90, env={**env, "COLLCOMM_TIMEOUT": "30"})
    want = [float(i) for i in range(COUNT)]
    assert sender["queued"] > 0, sender           # the ring could not take them all
    assert receiver["isend"] == [float(i) for i in range(PIECES)] + [50.0, 51.0, 52.0], receiver
    assert sender["queued behind"] > SMALL, sender
    assert sender["after sleeping"] == 0, sender  # the writer thread wrote them meanwhile
    assert receiver["order"] == [float(i) for i in range(COUNT + SMALL)], receiver
    assert sender["mpi queued"] > 0 and receiver["mpi"] == want, (sender, receiver)
    assert sender["left"] == 0, sender
    assert sender["leaves with"] > 0 and receiver["after close"] == want, (sender, receiver)
