"""collcomm.MPI receives without a tag (``ANY_TAG``, the default of ``Recv``, ``Irecv`` and
``Sendrecv``'s ``recvtag``) from one rank take the native path (native/_p2p.c: a wildcard
mask on the user tag bits; the message's tag read back from ``P2P.last_tag``), as exact
tags did: the statuses carry each message's own tag, in the order sent; a synchronous
send's message is still left to the Python receive, which acks it; a message parked in
the engine by an exact receive is found by the next wildcard one; a truncation is
MPI.ERR_TRUNCATE. Rank 1 runs without the native core (``COLLCOMM_NATIVE=0``), so every
message also crosses native -> Python and Python -> native.
"""
from __future__ import annotations

import numpy as np
import pytest

from collcomm import native
from tests.harness import run_ranks

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(native.core is None, reason=f"native core: {native.reason}")]

TAGS = [5, 3, 0, 2**31 - 1, 7]


def _any_tag() -> dict:
    from collcomm import MPI
    from collcomm.core import p2p, runtime

    comm = MPI.COMM_WORLD
    me, other = comm.Get_rank(), 1 - comm.Get_rank()
    f = p2p.native(runtime.get_world("test"))
    out: dict = {"native": f is not None}
    recvs0 = f.recvs if f is not None else 0
    st = MPI.Status()
    for sender in (0, 1):
        comm.Barrier()
        if me == sender:
            for i, t in enumerate(TAGS):
                comm.Send(np.full(i + 1, float(t)), other, t)
            comm.Ssend(np.full(2, 11.0), other, 11)          # returns once received
            comm.Send(np.full(1, 5.0), other, 5)
            comm.Send(np.full(1, 3.0), other, 3)
            comm.Send(np.arange(3.0), other, 23)
        else:
            got = []
            for i in range(len(TAGS)):                     # Recv: ANY_TAG by default
                buf = np.zeros(8)
                comm.Recv(buf, other, status=st)
                got.append((st.Get_tag(), st.Get_source(), st.Get_count(MPI.DOUBLE), buf[0]))
            buf = np.zeros(8)
            comm.Recv(buf, other, status=st)               # the Ssend's: acked by Python
            got.append((st.Get_tag(), st.Get_count(MPI.DOUBLE), buf[0]))
            three = np.zeros(1)
            comm.Recv(three, other, 3)                     # parks tag 5 in the engine
            buf = np.zeros(1)
            comm.Recv(buf, other, status=st)               # finds it there
            got.append((three[0], st.Get_tag(), buf[0]))
            try:
                comm.Recv(np.zeros(2), other)
                got.append("no error")
            except MPI.Exception as exc:
                got.append(exc.Get_error_class() == MPI.ERR_TRUNCATE)
            out[f"recv{sender}"] = got
    # Irecv without a tag, Waitall, then the statuses; Sendrecv without a recvtag
    comm.Barrier()
    bufs = [np.zeros(4) for _ in range(3)]
    reqs = [comm.Irecv(b, other) for b in bufs]
    sends = [comm.Isend(np.full(4, float(10 * me + k)), other, 40 + k) for k in range(3)]
    sts = [MPI.Status() for _ in range(3)]
    MPI.Request.Waitall(reqs, sts)
    MPI.Request.Waitall(sends)
    out["irecv"] = [(s.Get_tag(), s.Get_source(), b[0]) for s, b in zip(sts, bufs)]
    r = np.zeros(2)
    comm.Sendrecv(np.full(2, float(me)), other, 60 + me, recvbuf=r, source=other, status=st)
    out["sendrecv"] = (st.Get_tag(), st.Get_source(), r[0])
    comm.Barrier()
    out["native_recvs"] = (f.recvs - recvs0) if f is not None else 0
    return out


def test_any_tag_receives_native_and_python() -> None:
    res = run_ranks(_any_tag, 2, rank_env={1: {"COLLCOMM_NATIVE": "0"}}, timeout=100)
    assert res[0]["native"] and not res[1]["native"]
    for me in (0, 1):
        other = 1 - me
        got = res[me][f"recv{other}"]
        assert got[:len(TAGS)] == [(t, other, i + 1, float(t)) for i, t in enumerate(TAGS)]
        assert got[len(TAGS)] == (11, 2, 11.0)
        assert got[len(TAGS) + 1] == (3.0, 5, 5.0)
        assert got[len(TAGS) + 2] is True
        assert res[me]["irecv"] == [(40 + k, other, float(10 * other + k)) for k in range(3)]
        assert res[me]["sendrecv"] == (60 + other, other, float(other))
    # rank 0's wildcard receives of plain messages went through C
    assert res[0]["native_recvs"] >= len(TAGS) + 3 + 1


def _threads() -> dict:
    import threading

    from collcomm import MPI

    comm = MPI.COMM_WORLD
    me = comm.Get_rank()
    count = 300
    wrong: list = []
    if me == 0:
        def receive(src: int) -> None:
            st = MPI.Status()
            buf = np.zeros(1)
            for _ in range(count):
                comm.Recv(buf, src, status=st)          # ANY_TAG, both threads at once
                if st.Get_tag() != int(buf[0]) or st.Get_source() != src:
                    wrong.append((src, st.Get_tag(), buf[0]))
        threads = [threading.Thread(target=receive, args=(src,)) for src in (1, 2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    else:
        for i in range(count):
            tag = (7919 * i + 104729 * me) % 100000
            comm.Send(np.array([float(tag)]), 0, tag)
    comm.Barrier()
    return {"wrong": wrong}


def test_any_tag_status_per_thread() -> None:
    """Two threads of one rank receive without a tag from two peers at once: each status
    has its own message's tag (the native path keeps the last tag per thread)."""
    res = run_ranks(_threads, 3, timeout=100)
    assert res[0]["wrong"] == []


def _order() -> dict:
    """MPI's matching order against a receive posted earlier on the Python path, and the
    status of a wildcard receive completed by Test()."""
    import threading
    import time

    from collcomm import MPI

    comm = MPI.COMM_WORLD
    me = comm.Get_rank()
    out: dict = {}
    if me == 0:
        early = np.zeros(1)
        r1 = comm.Irecv(early, source=MPI.ANY_SOURCE, tag=5)    # posted in the engine
        comm.Barrier()
        st = MPI.Status()
        late = np.zeros(1)
        comm.Recv(late, source=1, status=st)      # ANY_TAG: tag 5 is r1's, so tag 7
        out["recv"] = (st.Get_tag(), float(late[0]))
        t = threading.Thread(target=r1.Wait, daemon=True)
        t.start()
        t.join(20)
        out["early"] = (not t.is_alive(), float(early[0]))
        buf = np.zeros(1)
        req = comm.Irecv(buf, source=1)           # ANY_TAG, completed by Test()
        comm.Barrier()
        while not req.Test(st):
            time.sleep(0.001)
        out["test"] = (st.Get_tag(), float(buf[0]))
    else:
        comm.Barrier()
        comm.Send(np.full(1, 5.0), 0, 5)
        comm.Send(np.full(1, 7.0), 0, 7)
        comm.Barrier()
        comm.Send(np.full(1, 42.0), 0, 42)
    comm.Barrier()
    return out


def test_any_tag_keeps_mpi_order_and_test_status() -> None:
    """A wildcard receive does not take a message an earlier posted receive matches (the
    engine's posted receive claims any tag both could match), and Test() reports the
    message's tag (review of session 14: tag 5 was taken, and Test() said tag 0)."""
    res = run_ranks(_order, 2, timeout=60)
    assert res[0]["recv"] == (7, 7.0)
    assert res[0]["early"] == (True, 5.0)
    assert res[0]["test"] == (42, 42.0)
