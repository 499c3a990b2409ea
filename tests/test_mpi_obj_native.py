"""collcomm.MPI's object calls in C (native/_fastcall_obj.c: the fast call's
``obj_bcast``, ``obj_gathered``, ``obj_scatter``, ``obj_alltoall``; native/_p2p_obj.c), a section of the shared
MPI job (tests/mpi_checks.py) at 1-5 ranks and over TCP (no fast call there: the Python
way of collcomm/core/pickled_small.py, the same checks).

- how many fast calls each takes where the group has one (one for small objects; a
  second for bcast's larger pickle and alltoall's pickles);
- the program's own serializer (``MPI.pickle.__init__(dumps, loads)``) called once per
  object, an older ``PROTOCOL``, a lower ``THRESHOLD`` (a numpy buffer over it goes out
  of band: declined in C, the Python way), a ``dumps`` that returns a bytearray (declined);
- a rank whose object the C entry declines (an out-of-band buffer) beside ranks that take
  it, every collective, the results the same;
- blocking ``sendrecv``/``send``/``recv`` of objects pickled and unpickled in C
  (``P2P.obj_send``/``obj_recv``, native/_p2p_obj.c): one native send and receive;
- hazards: a root's list its items' pickling changes (was a crash), a buffer message
  received as an object (``ERR_OTHER`` on every way), two threads waiting on one
  ``ANY_SOURCE`` ``irecv`` (erroneous in MPI; its first-part buffer must still be reused
  once only: it was handed to two receives).
The slot layout is pickled_small's (a plain test compares the constants).
"""
from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pytest

from collcomm.core import pickled_small
from tests.mpi_checks import SIZES, Checker, check, job


def _calls(c: Checker, MPI, comm) -> None:
    g = comm._h.g
    fast = g.fast if g is not None else None
    r, n = comm.rank, comm.size
    cases = [("gather", lambda: comm.gather(r, 0), 1), ("allgather", lambda: comm.allgather(r), 1),
             ("scatter", lambda: comm.scatter(list(range(n)) if r == 0 else None, 0), 1),
             ("alltoall", lambda: comm.alltoall(list(range(n))), 2), ("bcast", lambda: comm.bcast(r, 0), 1),
             ("bcast 1 KB", lambda: comm.bcast("z" * 1000, 0), 2)]
    for name, call, want in cases:
        call()
        if fast is None:
            continue
        before = fast.calls
        call()
        c.eq(fast.calls - before, want, f"{name}: fast calls")
    if fast is not None:      # the C entries themselves (every rank calls them: collectives)
        native = MPI.pickle.native
        c.eq(fast.obj_bcast(r + 7, 0, "bcast", native), (True, 7), "obj_bcast ends in C")
        c.eq(fast.obj_gathered(r, -1, "allgather", native), (True, list(range(n))), "obj_gathered ends in C")
        got = fast.obj_gathered("x" * (300 + r), -1, "allgather", native)   # (over a slot: Python goes on)
        c.true(got[0] is False and got[2] == pickle.dumps("x" * (300 + r), pickle.HIGHEST_PROTOCOL),
               "obj_gathered hands a larger pickle on")
        comm.Barrier()   # (that all_gather's second call is never made: the Python way never ran)


def _serializers(c: Checker, MPI, comm) -> None:
    r, n = comm.rank, comm.size
    seen: list[int] = []

    def dumps(obj, *protocol):
        seen.append(1)
        return pickle.dumps(obj, *protocol)

    try:
        MPI.pickle.__init__(dumps, pickle.loads)
        c.eq(comm.allgather(("own", r)), [("own", j) for j in range(n)], "allgather, the program's dumps")
        c.eq(len(seen), 1, "the program's dumps called once for one object")
        c.eq(comm.alltoall([(r, j) for j in range(n)]), [(j, r) for j in range(n)], "alltoall, the program's dumps")
        MPI.pickle.__init__(lambda obj, *p: bytearray(pickle.dumps(obj, *p)), pickle.loads)
        c.eq(comm.bcast({"k": r}, 0), {"k": 0}, "bcast, a dumps that gives a bytearray")
        c.eq(comm.scatter([j * 2 for j in range(n)] if r == 0 else None, 0), 2 * r, "scatter, bytearray dumps")
        MPI.pickle.__init__()
        MPI.pickle.PROTOCOL = 4
        c.eq(comm.gather({"p4": r}, 0), [{"p4": j} for j in range(n)] if r == 0 else None, "gather, protocol 4")
        MPI.pickle.PROTOCOL = pickle.HIGHEST_PROTOCOL
        MPI.pickle.THRESHOLD = 1000
        arr = np.arange(200, dtype=np.float64) + r          # 1600 bytes: out of band now
        got = comm.allgather(arr)
        c.true(all(np.array_equal(got[j], np.arange(200.0) + j) for j in range(n)), "allgather over THRESHOLD")
    finally:
        MPI.pickle.__init__()
    c.eq(MPI.pickle.THRESHOLD, 64 * 1024, "THRESHOLD back to its default")


def _mixed(c: Checker, MPI, comm) -> None:
    """Rank 0's object holds a 100 KB numpy buffer (out of band: declined in C), the
    others' are small (taken in C)."""
    r, n = comm.rank, comm.size

    def obj(j: int) -> Any:
        return np.full(12_800, float(j)) if j == 0 else ("small", j)

    def same(a: Any, b: Any) -> bool:
        return (np.array_equal(a, b) if isinstance(b, np.ndarray) else a == b)

    got = comm.allgather(obj(r))
    c.true(all(same(got[j], obj(j)) for j in range(n)), "allgather, rank 0 out of band")
    got = comm.gather(obj(r), n - 1)
    c.true(r != n - 1 or all(same(got[j], obj(j)) for j in range(n)), "gather, rank 0 out of band")
    c.true(same(comm.bcast(obj(0) if r == 0 else None, 0), obj(0)), "bcast of an out-of-band object")
    c.true(same(comm.scatter([obj(j) for j in range(n)] if r == 0 else None, 0), obj(r)),
           "scatter with an out-of-band item")
    got = comm.alltoall([obj(r) if j == 0 else (r, j) for j in range(n)])
    want = [obj(j) for j in range(n)] if r == 0 else [(j, r) for j in range(n)]
    c.true(len(got) == n and all(same(got[j], want[j]) for j in range(n)), "alltoall, items to rank 0 out of band")


def _point_to_point(c: Checker, MPI, comm) -> None:
    """Blocking send/recv/sendrecv of objects with a rank of this host: one native send and
    one native receive each (P2P.obj_send / obj_recv, where the group has them); a dumps
    of the program's own that gives a bytearray (declined: the Python way)."""
    from collcomm.core import p2p
    r, n = comm.rank, comm.size
    if n == 1:
        return
    nxt, prv = (r + 1) % n, (r - 1) % n
    f = p2p.native(comm._h.g)
    before = (f.sends, f.recvs) if f is not None else None
    st = MPI.Status()
    c.eq(comm.sendrecv({"from": r}, nxt, 4, None, prv, MPI.ANY_TAG, st), {"from": prv}, "sendrecv of a dict")
    c.eq((st.Get_source(), st.Get_tag()), (prv, 4), "sendrecv status")
    if before is not None:
        c.eq((f.sends - before[0], f.recvs - before[1]), (1, 1), "sendrecv: one native send and receive")
    try:
        MPI.pickle.__init__(lambda obj, *p: bytearray(pickle.dumps(obj, *p)), pickle.loads)
        c.eq(comm.sendrecv(("ba", r), nxt, 5, None, prv, 5), ("ba", prv), "sendrecv, a bytearray dumps")
    finally:
        MPI.pickle.__init__()
    if before is not None:    # isend written at once; irecv received natively at its wait
        sends, recvs = f.sends, f.recvs
        q = comm.irecv(source=prv, tag=7)
        s = comm.isend(("i", r), nxt, 7)
        c.true(s.Test(), "isend of a small object is complete at once")
        c.eq(q.wait(), ("i", prv), "irecv + isend")
        c.eq((f.sends - sends, f.recvs - recvs), (1, 1), "isend/irecv: one native send and receive")
        comm.barrier()
    if r == 0:
        comm.send([1, 2, 3], nxt, 6)
    if r == 1 % n:
        c.eq(comm.recv(source=0, tag=6), [1, 2, 3], "recv of a list")
    comm.barrier()


class _Shrinks:
    """Empties the list it is in while it is pickled (the program's code runs in dumps)."""

    def __init__(self, home: list) -> None:
        self.home = home

    def __reduce__(self) -> Any:
        self.home.clear()
        return (int, (7,))


def _hazards(c: Checker, MPI, comm) -> None:
    """What the C code must survive: a root's list changed by its own items' pickling; a
    buffer message received as an object (refused on every way, MPI.ERR_OTHER); two
    threads waiting on one irecv (one value, its buffer reused once)."""
    import threading
    r, n = comm.rank, comm.size
    items: list = []
    items.extend([_Shrinks(items)] + list(range(1, n)))
    got = comm.scatter(items if r == 0 else None, 0)
    c.eq(got, 7 if r == 0 else r, "scatter of a list its first item empties while pickled")
    if n == 1:
        return
    if r == 1:
        for k, source in ((7, 0), (100, 0), (100, MPI.ANY_SOURCE)):
            c.raises(lambda: comm.recv(source=source, tag=40 + k), MPI.Exception,
                     f"recv of a {k}-byte Send from {source}", MPI.ERR_OTHER)
        q = comm.irecv(source=MPI.ANY_SOURCE, tag=41)    # (erroneous in MPI: no more than
        out: list = []                                   # the regular way's guarantees)
        waiters = [threading.Thread(target=lambda: out.append(q.wait())) for _ in range(2)]
        for t in waiters:
            t.start()
        comm.send("go", 0, 42)
        for t in waiters:
            t.join()
        # (a waiter that comes after the other completed it finds it null: None, as
        # mpi4py's wait of a completed request gives; never another value, never twice the buffer)
        c.true(len(out) == 2 and "first" in out and all(x in ("first", None) for x in out),
               f"two threads waiting on one irecv: {out}")
        q1, q2 = comm.irecv(source=0, tag=43), comm.irecv(source=0, tag=43)
        comm.send("go", 0, 42)
        c.eq((q1.wait(), q2.wait()), (("A", 1), ("B", 2)), "the receives after it")
    elif r == 0:
        for k in (7, 100, 100):
            comm.Send(np.zeros(k, dtype=np.uint8), 1, 40 + k)
        comm.recv(source=1, tag=42)
        comm.send("first", 1, 41)
        comm.recv(source=1, tag=42)
        comm.send(("A", 1), 1, 43)
        comm.send(("B", 2), 1, 43)
    comm.barrier()


class _NoPickle:
    def __reduce__(self) -> Any:
        raise RuntimeError("not this one")


def _failures_leave_nothing(c: Checker, MPI, comm) -> None:
    """A sendrecv whose object does not pickle posts no receive (the next sendrecv got its
    message: a hang); a dumps of the program's that returns a str fails on every rank (the
    others waited until the timeout)."""
    r, n = comm.rank, comm.size
    if n > 1:
        nxt, prv = (r + 1) % n, (r - 1) % n
        c.raises(lambda: comm.sendrecv(_NoPickle(), nxt, 6, None, prv, 6), MPI.Exception,
                 "sendrecv of an object that does not pickle")
        c.eq(comm.sendrecv(("ok", r), nxt, 6, None, prv, 6), ("ok", prv), "the sendrecv after it")
    try:
        MPI.pickle.__init__(lambda obj, *p: "not bytes" if r == 0 else pickle.dumps(obj, *p), pickle.loads)
        c.raises(lambda: comm.bcast(r, 0), MPI.Exception, "bcast, the root's dumps gives a str")
    finally:
        MPI.pickle.__init__()
    c.eq(comm.allgather(r), list(range(n)), "the call after it")


def obj_native_checks(c: Checker, MPI, comm) -> None:
    _failures_leave_nothing(c, MPI, comm)
    _calls(c, MPI, comm)
    _hazards(c, MPI, comm)
    _point_to_point(c, MPI, comm)
    _serializers(c, MPI, comm)
    _mixed(c, MPI, comm)
    comm.barrier()


def test_slot_layout_matches_python():
    native = pytest.importorskip("collcomm.native._shmcore")
    ps = pickled_small
    assert (native.OBJ_SLOT, native.OBJ_HEADER, native.OBJ_SMALL_MAX, native.OBJ_INLINE, native.OBJ_BIG) == \
        (ps.SLOT, ps.HEADER, ps.SMALL_MAX, ps.INLINE, ps.BIG)
    assert (native.OBJ_DONE, native.OBJ_OVERFLOW, native.OBJ_GENERAL) == (ps.DONE, ps.OVERFLOW, ps.GENERAL)


@pytest.mark.timeout(160)
@pytest.mark.parametrize("n", SIZES)
def test_obj_native(n):
    check(job(n), "obj_native")


@pytest.mark.timeout(160)
def test_obj_native_over_tcp():
    check(job(3, "tcp"), "obj_native")
