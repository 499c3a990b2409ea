"""collcomm.MPI point to point with objects, in the style of mpi4py's test_p2p_obj:
send/recv, isend/irecv, ssend/issend, sendrecv, probe/iprobe, mprobe/improbe + Message,
ANY_SOURCE/ANY_TAG statuses, PROC_NULL, objects small and large (over 64 KiB pickled:
two messages, each body found by its id: a message held by mprobe keeps its own), receives
matched in posting order even when waited out of order, the
lower-case Request methods; sizes 1–5 on a ring.
"""
from __future__ import annotations

import numpy as np
import pytest

from tests.mpi_checks import SIZES, Checker, check, job


def payload(r: int, big: bool) -> dict:
    return {"from": r, "arr": np.arange(30_000 if big else 3) + r, "text": "é" * r}


def same(a: dict, b: dict) -> bool:
    return isinstance(b, dict) and a["from"] == b["from"] and a["text"] == b["text"] and np.array_equal(a["arr"], b["arr"])


def p2p_obj(c: Checker, MPI, comm) -> None:
    r, n = comm.rank, comm.size
    nxt, prv = (r + 1) % n, (r - 1) % n
    st = MPI.Status()
    for big in (False, True):
        req = comm.isend(payload(r, big), nxt, tag=3)
        got = comm.recv(source=prv, tag=3, status=st)
        req.wait()
        c.true(same(payload(prv, big), got), f"isend/recv big={big}")
        c.eq((st.source, st.tag), (prv, 3), f"recv status big={big}")
        c.true(st.Get_count() > (240_000 if big else 0), f"recv status count {st.Get_count()}")
        req = comm.irecv(source=prv, tag=4)
        comm.send(payload(r, big), nxt, tag=4)
        c.true(same(payload(prv, big), req.wait()), f"irecv/send big={big}")
        c.true(same(payload(prv, big), comm.sendrecv(payload(r, big), nxt, 5, None, prv, 5)), f"sendrecv big={big}")
    # posting order: two receives of one (source, tag), waited in reverse order
    first, second = comm.irecv(source=prv, tag=6), comm.irecv(source=prv, tag=6)
    comm.isend(payload(r, True) | {"n": 1}, nxt, 6)
    comm.isend(payload(r, True) | {"n": 2}, nxt, 6)
    b, a = second.wait(), first.wait()
    c.eq((a["n"], b["n"]), (1, 2), "receives match in posting order")
    # ANY_SOURCE / ANY_TAG: everyone sends rank 0 an object with its own tag
    comm.isend(("hello", r), 0, tag=50 + r)
    if r == 0:
        seen = set()
        for _ in range(n):
            obj = comm.recv(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=st)
            seen.add((st.source, st.tag, obj))
        c.eq(sorted(seen), [(p, 50 + p, ("hello", p)) for p in range(n)], "ANY_SOURCE/ANY_TAG objects")
    comm.barrier()
    # ssend is synchronous
    req = comm.issend([r] * 3, nxt, 7)
    c.true(not req.test()[0], "issend completes only when received")
    comm.barrier()
    c.eq(comm.recv(source=prv, tag=7), [prv] * 3, "issend/recv")
    req.wait()
    # probes and matched probes
    comm.isend({"k": r}, nxt, 8)
    c.true(comm.probe(source=prv, tag=MPI.ANY_TAG, status=st), "probe returns True")
    c.eq((st.source, st.tag), (prv, 8), "probe status")
    c.true(comm.iprobe(prv, 8), "iprobe sees it")
    c.eq(comm.recv(source=prv, tag=8), {"k": prv}, "recv after probe")
    c.true(not comm.iprobe(prv, 8), "iprobe after recv")
    comm.isend(payload(r, True), nxt, 9)
    msg = comm.mprobe(prv, 9, st)
    c.true(not comm.iprobe(prv, 9), "mprobed message is taken")
    c.true(same(payload(prv, True), msg.recv()), "mprobe + Message.recv (large)")
    # a large message held by mprobe keeps its own body, whatever is received from that
    # sender and tag before it (three pickles of one size: a swap would go unnoticed)
    sent = [comm.isend(payload(r, True) | {"n": k}, nxt, 11) for k in (1, 2, 3)]
    msg = comm.mprobe(prv, 11)
    two = comm.recv(source=prv, tag=11)
    three = comm.irecv(source=prv, tag=11).wait()
    c.eq([o["n"] for o in (msg.recv(), two, three)], [1, 2, 3], "mprobe'd large message keeps its body")
    MPI.Request.waitall(sent)
    comm.isend("tiny", nxt, 10)
    comm.barrier()
    m = comm.improbe(prv, 10)
    c.eq(m.irecv().wait(), "tiny", "improbe + Message.irecv")
    c.true(comm.improbe(prv, 10) is None, "improbe with nothing pending")
    # PROC_NULL
    comm.send("x", MPI.PROC_NULL)
    c.true(comm.recv(source=MPI.PROC_NULL, status=st) is None and st.source == MPI.PROC_NULL, "recv from PROC_NULL")
    c.true(comm.sendrecv("y", MPI.PROC_NULL, source=MPI.PROC_NULL) is None, "sendrecv with PROC_NULL")
    # lower-case request methods
    reqs = [comm.irecv(source=prv, tag=20 + i) for i in range(3)]
    for i in range(3):
        comm.isend(i * 10 + r, nxt, 20 + i)
    c.eq(MPI.Request.waitall(reqs), [i * 10 + prv for i in range(3)], "Request.waitall")
    reqs = [comm.irecv(source=prv, tag=30 + i) for i in range(2)]
    comm.isend("b", nxt, 31)
    idx, obj = MPI.Request.waitany(reqs)
    c.eq((idx, obj), (1, "b"), "Request.waitany")
    comm.barrier()                       # nobody sends "a" before every waitany returned
    comm.isend("a", nxt, 30)
    flag, objs = False, None
    while not flag:
        flag, objs = MPI.Request.testall(reqs)
    c.eq(objs, ["a", None], "Request.testall after one was completed")
    c.raises(lambda: comm.send(1, n), MPI.Exception, "send to rank n", MPI.ERR_RANK)
    c.raises(lambda: comm.recv(source=prv, tag=-5), MPI.Exception, "recv with a bad tag", MPI.ERR_TAG)
    comm.barrier()


@pytest.mark.timeout(160)
@pytest.mark.parametrize("n", SIZES)
def test_p2p_obj(n):
    check(job(n), "p2p_obj")


@pytest.mark.timeout(160)
def test_p2p_obj_tcp():
    check(job(3, "tcp"), "p2p_obj")
