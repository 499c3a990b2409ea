"""collcomm.MPI's waits of the common requests in one C call (native/_mpi_wait.c:
``mpi_wait_native``, used by ``Request.Waitall``, ``Wait`` and ``wait``), a section of the
shared MPI job (tests/mpi_checks.py) at 1-5 ranks and over TCP (there, and at one rank,
the Python way: the same checks, the results must not differ).

- ``Waitall`` on a mix: native ``Irecv``s (a tag, ``ANY_TAG``), ``Isend``s written at
  once, object ``irecv``s, a non-blocking collective, a ``PROC_NULL`` receive, a request
  completed already; a list, a tuple and a generator; every request null after, every
  buffer right;
- where C is used: how many requests it completes (it stops at the first it cannot
  complete, leaving that one as it was: a collective's, a persistent request's);
- ``Wait`` and ``wait`` of one request (a native receive, an object's); with a status,
  the Python way's status;
- what C leaves to the Python code, each right: a truncated message (``Waitall``:
  ``ERR_IN_STATUS`` naming ``ERR_TRUNCATE``, every failure counted, also of a generator;
  ``Wait``: ``ERR_TRUNCATE``), a receive waited for under another ``call_timeout`` scope
  than its start's.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tests.mpi_checks import SIZES, Checker, check, job


def _mix(c: Checker, MPI: Any, comm: Any) -> None:
    r, n = comm.rank, comm.size
    nxt, prv = (r + 1) % n, (r - 1) % n
    a, b = np.zeros(3), np.zeros(2, dtype=np.int32)
    bc = np.arange(4.0) if r == 0 else np.zeros(4)
    done_before, z = comm.Isend(np.full(1, 3.0), nxt, 30), np.zeros(1)
    MPI.Request.Waitall([done_before, comm.Irecv(z, prv, 30)])
    c.eq(z[0], 3.0, "Waitall of a send and a receive")
    reqs = [comm.Irecv(a, prv, 31), comm.Isend(np.full(3, float(r)), nxt, 31),
            comm.irecv(source=prv, tag=32), comm.isend({"r": r}, nxt, 32),
            comm.Irecv(b, prv, MPI.ANY_TAG), comm.Isend(np.array([r, -r], dtype=np.int32), nxt, 33),
            comm.Ibcast(bc, 0), comm.Irecv(np.zeros(1), MPI.PROC_NULL, 0), done_before]
    c.true(MPI.Request.Waitall(reqs), "Waitall of a mix")
    c.true(all(not q for q in reqs), "every request null after Waitall")
    c.eq(a.tolist(), [float(prv)] * 3, "Waitall: a native Irecv's data")
    c.eq(b.tolist(), [prv, -prv], "Waitall: an ANY_TAG Irecv's data")
    c.eq(bc.tolist(), [0.0, 1.0, 2.0, 3.0], "Waitall: Ibcast's data")
    q1, q2 = comm.irecv(source=prv, tag=34), comm.irecv(source=prv, tag=35)
    comm.send(("t", r), nxt, 35)
    comm.send(("s", r), nxt, 34)
    c.eq(MPI.Request.waitall((q1, q2)), [("s", prv), ("t", prv)], "waitall of a tuple: values")
    x = np.zeros(2)
    gen = (q for q in [comm.Irecv(x, prv, 36), comm.Isend(np.full(2, 7.0 + r), nxt, 36)])
    c.true(MPI.Request.Waitall(gen), "Waitall of a generator")
    c.eq(x.tolist(), [7.0 + prv] * 2, "Waitall of a generator: data")


def _one(c: Checker, MPI: Any, comm: Any) -> None:
    r, n = comm.rank, comm.size
    nxt, prv = (r + 1) % n, (r - 1) % n
    x = np.zeros(2)
    q = comm.Irecv(x, prv, 40)
    comm.Send(np.full(2, 1.0 + r), nxt, 40)
    c.true(q.Wait(), "Wait of a native Irecv")
    c.true(not q and x.tolist() == [1.0 + prv] * 2, "Wait: request null, data right")
    q = comm.Irecv(x, prv, MPI.ANY_TAG)
    comm.Send(np.full(2, 2.0 + r), nxt, 41)
    st = MPI.Status()
    q.Wait(st)
    c.eq((st.Get_source(), st.Get_tag(), st.Get_count(MPI.DOUBLE)), (prv, 41, 2), "Wait with a status")
    q = comm.Irecv(x, prv, 42)
    comm.Send(np.full(2, 3.0 + r), nxt, 42)
    c.eq(q.wait(), None, "wait of a native Irecv: no value")
    c.eq(x.tolist(), [3.0 + prv] * 2, "wait of a native Irecv: data")
    q = comm.irecv(source=prv, tag=43)
    comm.send([r, "x"], nxt, 43)
    c.eq(q.wait(), [prv, "x"], "wait of an object irecv")
    c.true(not q, "wait of an object irecv: request null")
    c.true(q.Wait() and q.wait() is None, "a null request waited for again")


def _where_c_stops(c: Checker, MPI: Any, comm: Any) -> None:
    """What the C call itself completes, where the group has the native entry (shared
    memory, two ranks or more): the requests before the first it cannot take; that
    Waitall, Wait and wait go through it; the tag and count it gives a receive."""
    from collcomm import native
    from collcomm.MPI import _request
    from collcomm.MPI._obj_spare import SPARE
    from collcomm.MPI._pickle import pickle as own
    from collcomm.core.tags import MPI_TAG_BITS
    r, n = comm.rank, comm.size
    nxt, prv = (r + 1) % n, (r - 1) % n
    c.eq(_request._wait_native is not None, native.core is not None, "the native wait where the core is built")
    g = comm._h.g
    if _request._wait_native is None or n == 1 or getattr(g, "_p2p_native", None) is None:
        return
    wait = _request._wait_native
    x, y = np.zeros(1), np.zeros(1)
    p = comm.Recv_init(y, prv, 51)
    first = comm.Irecv(x, prv, 50)       # (first in the engine's line: C takes it)
    p.Start()
    reqs = [first, comm.Isend(np.ones(1), nxt, 50), comm.Ibarrier(), p, comm.Isend(np.ones(1), nxt, 51)]
    op = reqs[2]._op
    c.eq(wait(reqs, _request.Done, MPI_TAG_BITS, own.native, SPARE), 2,
         "C completes the two before the collective")
    c.true(not reqs[0] and not reqs[1] and reqs[2]._op is op, "... and leaves the collective as it was")
    MPI.Request.Waitall(reqs)
    c.true(not reqs[2] and not reqs[4] and bool(p), "the rest by Waitall (the persistent one inactive)")
    c.eq((x[0], y[0]), (1.0, 1.0), "the data of both receives")
    p.Free()
    q = comm.irecv(source=prv, tag=52)
    comm.send("o", nxt, 52)
    c.true(wait(q, _request.Done, MPI_TAG_BITS, own.native, SPARE) is True, "one object irecv in C")
    c.true(not q and q._op is None, "... its request null")
    q = comm.irecv(source=prv, tag=53)
    comm.send("p", nxt, 53)
    c.true(wait(q, _request.Done, MPI_TAG_BITS) is False, "an object irecv without the serializer: not in C")
    c.eq(q.wait(), "p", "... then the Python way")
    # the front ends go through it (a recorder around the C call)
    seen: list[Any] = []

    def recorder(*args: Any) -> Any:
        got = wait(*args)
        seen.append(got)
        return got

    b = np.zeros(3, dtype=np.int16)
    _request._wait_native = recorder
    try:
        q = comm.Irecv(b, prv, MPI.ANY_TAG)
        copy = MPI.Request(q)            # (shares the op: its status after C completed it)
        MPI.Request.Waitall([q, comm.Isend(np.array([r, 2, 3], dtype=np.int16), nxt, 54)])
        q = comm.Irecv(x, prv, 55)
        comm.Send(np.full(1, 9.0), nxt, 55)
        q.Wait()
        q = comm.irecv(source=prv, tag=56)
        comm.send(("w", r), nxt, 56)
        got = q.wait()
    finally:
        _request._wait_native = wait
    c.eq(seen, [2, True, True], "Waitall, Wait and wait completed in C")
    st = MPI.Status()
    copy.Wait(st)
    c.eq((st.Get_source(), st.Get_tag(), st.Get_count(MPI.INT16_T)), (prv, 54, 3),
         "the status of an ANY_TAG receive C completed")
    c.eq((b.tolist(), x[0], got), ([prv, 2, 3], 9.0, ("w", prv)), "the data of those three")


def _left_to_python(c: Checker, MPI: Any, comm: Any) -> None:
    from collcomm.core.timeouts import call_timeout
    r, n = comm.rank, comm.size
    nxt, prv = (r + 1) % n, (r - 1) % n
    small = np.zeros(2)
    q = comm.Irecv(small, prv, 60)
    comm.Send(np.ones(5), nxt, 60)
    try:
        MPI.Request.Waitall([comm.Isend(np.ones(1), nxt, 61), q, comm.Irecv(np.zeros(1), prv, 61)])
        c.true(False, "Waitall of a truncated message raised nothing")
    except MPI.Exception as exc:
        c.eq(exc.Get_error_class(), MPI.ERR_IN_STATUS, "Waitall of a truncated message")
        c.true("MPI_ERR_TRUNCATE" in str(exc), f"... naming the truncation: {exc}")
    c.true(not q, "the failed receive null")
    q1, q2 = comm.Irecv(small, prv, 64), comm.Irecv(np.zeros(1), prv, 65)
    comm.Send(np.ones(5), nxt, 64)
    comm.Send(np.ones(4), nxt, 65)
    try:                                 # (two failures, of a generator: both counted)
        MPI.Request.Waitall(q for q in [q1, comm.Isend(np.ones(1), nxt, 66), q2, comm.Irecv(np.zeros(1), prv, 66)])
        c.true(False, "Waitall of two truncated messages raised nothing")
    except MPI.Exception as exc:
        c.eq(exc.Get_error_class(), MPI.ERR_IN_STATUS, "Waitall of a generator, two truncated")
        c.true("2 of 4 requests failed" in str(exc), f"... both counted: {exc}")
    q = comm.Irecv(small, prv, 62)
    comm.Send(np.ones(5), nxt, 62)
    c.raises(q.Wait, MPI.Exception, "Wait of a truncated message", MPI.ERR_TRUNCATE)
    x = np.zeros(1)
    q = comm.Irecv(x, prv, 63)                   # started outside, waited for inside a scope
    comm.Send(np.full(1, 5.0), nxt, 63)
    with call_timeout(20.0):
        MPI.Request.Waitall([q])
    c.eq(x[0], 5.0, "a receive waited for under another call_timeout scope")
    comm.Barrier()


def wait_native_checks(c: Checker, MPI: Any, comm: Any) -> None:
    _mix(c, MPI, comm)
    _one(c, MPI, comm)
    _where_c_stops(c, MPI, comm)
    _left_to_python(c, MPI, comm)
    comm.Barrier()


@pytest.mark.timeout(160)
@pytest.mark.parametrize("n", SIZES)
def test_wait_native(n):
    check(job(n), "wait_native")


@pytest.mark.timeout(160)
def test_wait_native_over_tcp():
    check(job(3, "tcp"), "wait_native")
