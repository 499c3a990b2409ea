"""collcomm.MPI's waits of the common requests in one C call (native/_mpi_wait.c:
``mpi_wait_native``, used by ``Request.Waitall``, ``Wait`` and ``wait``), a section of the
shared MPI job (tests/mpi_checks.py) at 1-5 ranks and over TCP (there, and at one rank,
the Python way: the same checks, the results must not differ); every check runs with the
core's ``Wait``/``Test``/``Waitall`` and again with the Python methods.

- ``Waitall`` on a mix: native ``Irecv``s (a tag, ``ANY_TAG``), ``Isend``s written at
  once, object ``irecv``s, a non-blocking collective, a ``PROC_NULL`` receive, a request
  completed already; a list, a tuple and a generator; every request null after, every
  buffer right;
- where C is used: how many requests it completes (it stops at the first it cannot
  complete, leaving that one as it was: a collective queued behind another; a
  collective started in two parts it completes: tests/test_mpi_wait_collective.py);
- ``Wait`` and ``wait`` of one request (a native receive, an object's); with a status,
  the Python way's status;
- ``Test``, ``Testall``, ``Testany``, ``Testsome``, ``Waitany``, ``Waitsome`` (``mpi_test_native``):
  before and after the messages, beside requests C does not take (a persistent one, a
  collective's), statuses and data; each way in C on messages already in the ring;
- what C leaves to the Python code, each right: a truncated message (``Waitall``:
  ``ERR_IN_STATUS`` naming ``ERR_TRUNCATE``, every failure counted, also of a generator;
  ``Wait``: ``ERR_TRUNCATE``), a receive waited for under another ``call_timeout`` scope
  than its start's.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tests.mpi_checks import SIZES, Checker, check, core_waits, each_wait_way, job


def _swap(name: str, fn: Any) -> None:
    """collcomm.MPI's native wait or test entry ``name`` replaced by ``fn`` in every
    module that calls it."""
    from collcomm.MPI import _request, _request_many
    for module in (_request, _request_many):
        if hasattr(module, name):
            setattr(module, name, fn)


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
    started = comm.Ibarrier()            # (started in two parts: C completes it too)
    two_part = g.fast is not None and g.fast.part_age() >= 0
    every_other = MPI.DOUBLE.Create_vector(2, 1, 2).Commit()
    spread = np.zeros(3)
    gaps = comm.Irecv([spread, 1, every_other], prv, 57)   # (unpacked by Python: C stops there)
    reqs = [first, comm.Isend(np.ones(1), nxt, 50), started, gaps, p, comm.Isend(np.full(2, 5.0), nxt, 57),
            comm.Isend(np.ones(1), nxt, 51)]
    op = gaps._op
    c.true(two_part, "the Ibarrier started in two parts")
    got = wait(reqs, _request.Done, MPI_TAG_BITS, own.native, SPARE)
    # (the Ibarrier's second part is the group worker's once it has waited PART_GRACE,
    # 2 ms, as when the receive before it is slow, many ranks sharing two CPUs: then C
    # leaves it, no longer the fast call's pending part, to the Python way)
    handed = two_part and got == 2 and bool(started) and g.fast.part_age() < 0
    c.eq(got, 3 if two_part and not handed else 2,
         "C completes the three before the receive of a type with gaps")
    c.true(not reqs[0] and not reqs[1] and (handed or not started) and gaps._op is op,
           "... and leaves that receive as it was")
    MPI.Request.Waitall(reqs)
    every_other.Free()
    c.true(not gaps and not reqs[6] and bool(p), "the rest by Waitall (the persistent one inactive)")
    c.eq(spread.tolist(), [5.0, 0.0, 5.0], "the receive of a type with gaps")
    c.eq((x[0], y[0]), (1.0, 1.0), "the data of both receives")
    p.Free()
    # (nobody still in the Python way's wait of the receive with gaps, whose progress would
    # take the next message into the engine's queues, where C leaves it to Python)
    comm.Barrier()
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
    _swap("_wait_native", recorder)
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
        _swap("_wait_native", wait)
    # (Request's own Waitall, Wait and wait in C call the core without the module's name: only
    # the Python methods, the other run of this section, go through the recorder)
    c.eq(seen, [] if core_waits(MPI) else [2, True, True], "Waitall, Wait and wait completed in C")
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


def _tests(c: Checker, MPI: Any, comm: Any) -> None:
    """Test, Testall, Testany, Testsome, Waitany and Waitsome (in C where the group has
    the native entry: a recorder around the C call checks they use it)."""
    from collcomm import native
    from collcomm.MPI import _request
    r, n = comm.rank, comm.size
    nxt, prv = (r + 1) % n, (r - 1) % n
    g = comm._h.g
    in_c = native.core is not None and n > 1 and getattr(g, "_p2p_native", None) is not None
    test = _request._test_native
    seen: list[Any] = []

    def recorder(*args: Any) -> Any:
        got = test(*args)
        seen.append(got)
        return got

    _swap("_test_native", recorder if test is not None else None)
    try:
        a, b, x = np.zeros(2), np.zeros(2), np.zeros(1)
        qa, qb = comm.Irecv(a, prv, 70), comm.Irecv(b, prv, 71)
        c.eq((qa.Test(), MPI.Request.Testall([qa, qb])), (False, False), "Test, Testall before the messages")
        comm.Barrier()
        comm.Send(np.full(2, 1.0 + r), nxt, 71)
        for _ in range(100000):
            if MPI.Request.Testany([qa, qb])[1]:
                break
        c.true(not qb and bool(qa), "Testany: the request whose message came, null; the other active")
        c.true(not MPI.Request.Testall([qa, qb]), "Testall: not while one is pending")
        comm.Barrier()                   # (nobody sends 70 before every rank looked)
        comm.Send(np.full(2, 2.0 + r), nxt, 70)
        st = MPI.Status()
        while not qa.Test(st):
            pass
        c.eq((st.Get_source(), st.Get_tag(), st.Get_count(MPI.DOUBLE)), (prv, 70, 2), "Test with a status")
        c.eq((a.tolist(), b.tolist()), ([2.0 + prv] * 2, [1.0 + prv] * 2), "Test/Testany: the data")
        p = comm.Recv_init(x, prv, 72)
        p.Start()
        qc = comm.Irecv(a, prv, 73)
        comm.Send(np.full(2, 3.0 + r), nxt, 73)
        st = MPI.Status()
        c.eq(MPI.Request.Waitany([p, qc], st), 1, "Waitany beside a persistent receive")
        c.eq((st.Get_source(), st.Get_tag(), a[0]), (prv, 73, 3.0 + prv), "Waitany: status and data")
        comm.Barrier()                   # (nobody sends 72 before every Waitany returned)
        comm.Send(np.full(1, 4.0 + r), nxt, 72)
        c.eq(MPI.Request.Waitany([p, qc]), 0, "Waitany: then the persistent one")
        p.Free()
        q3 = [comm.Irecv(a, prv, 74), comm.Isend(np.ones(1), nxt, 75), comm.Irecv(b, prv, 76), comm.Ibarrier()]
        comm.Send(np.full(2, 5.0 + r), nxt, 74)
        comm.Send(np.full(2, 6.0 + r), nxt, 76)
        got: list[int] = []
        sts = [MPI.Status() for _ in q3]
        while len(got) < 4:
            some = MPI.Request.Waitsome(q3, sts) or []
            got += some
            for k, i in enumerate(some):
                if i in (0, 2):
                    c.eq((sts[k].Get_tag(), sts[k].Get_count(MPI.DOUBLE)), (74 + i, 2), f"Waitsome: {i}'s status")
        c.eq(sorted(got), [0, 1, 2, 3], "Waitsome: every request, once")
        c.eq((a[0], b[0]), (5.0 + prv, 6.0 + prv), "Waitsome: the data")
        comm.Recv(np.zeros(1), prv, 75)
        qs = [comm.Irecv(x, prv, 78)]
        c.eq(MPI.Request.Testsome(qs), [], "Testsome before the message")
        comm.Barrier()
        comm.Send(np.full(1, 7.0 + r), nxt, 78)
        for _ in range(100000):
            done = MPI.Request.Testsome(qs)
            if done:
                break
        c.eq((done, x[0], bool(qs[0])), ([0], 7.0 + prv, False), "Testsome after it")
        qt = comm.Irecv(np.zeros(1), prv, 77)
        comm.Send(np.ones(3), nxt, 77)
        c.raises(lambda: MPI.Request.Waitany([qt]), MPI.Exception, "Waitany of a truncated message",
                 MPI.ERR_TRUNCATE)
        c.true(not qt, "... the request null")
        # each way once more, on messages in the ring before their receives (a blocking
        # call with receives deferred may hand them to the engine: then not C's)
        comm.Barrier()                   # (every rank past its polls above: nothing drains them)
        for k in range(6):
            comm.Send(np.full(1, 10.0 * k + r), nxt, 80 + k)
        comm.Barrier()
        ys = [np.zeros(1) for _ in range(6)]
        qs = [comm.Irecv(ys[k], prv, 80 + k) for k in range(6)]
        del seen[:]
        ok = [qs[0].Test(), MPI.Request.Testall(qs[1:2]), MPI.Request.Testany(qs[2:3]),
              MPI.Request.Testsome(qs[3:4]), MPI.Request.Waitany(qs[4:5]), MPI.Request.Waitsome(qs[5:6])]
        c.eq(ok, [True, True, (0, True), [0], 0, [0]], "each way, its message there")
        c.eq([y[0] for y in ys], [10.0 * k + prv for k in range(6)], "each way: the data")
        c.true(not any(qs), "each way: every request null")
    finally:
        _swap("_test_native", test)
    if in_c:
        c.eq([type(v[0]).__name__ if type(v) is tuple else v for v in seen],
             ["int", "list"] if core_waits(MPI) else [True, True, "int", "list", "int", "list"],
             "each way in C")
    comm.Barrier()


def wait_native_checks(c: Checker, MPI: Any, comm: Any) -> None:
    """Every part with the C waits (the core's where it is built) and with the Python ones
    (the reference, which the C ones call for all else: tests/test_mpi_request_waits.py)."""
    from collcomm import native
    from collcomm.MPI import _request_waits as waits
    c.eq(waits.NATIVE_WAITS, native.core is not None, "Wait, Test and Waitall are the core's where it is built")
    each_wait_way(c, MPI, comm, [_mix, _one, _where_c_stops, _left_to_python, _tests])


@pytest.mark.timeout(160)
@pytest.mark.parametrize("n", SIZES)
def test_wait_native(n):
    check(job(n), "wait_native")


@pytest.mark.timeout(160)
def test_wait_native_over_tcp():
    check(job(3, "tcp"), "wait_native")
