"""collcomm.MPI's object calls on their short ways: the collectives in one or two calls of
plain bytes (collcomm/core/pickled_small.py) and the blocking point to point in one C
call (collcomm/MPI/_pobj.py: ``_fast_send`` and ``recv``). A section of the shared MPI
job (tests/mpi_checks.py) at 1-5 ranks and over TCP (no fast call there: the same checks
on the regular collectives and the Python point to point).

Objects of every size class, on different ranks in one call: pickles that fit their
slot, that just fit and just do not (INLINE bytes), that overflow into the second call,
that go the general way (over SMALL_MAX, or with an out-of-band numpy buffer); an object
that cannot be pickled on one rank, raised on every rank and the next call fine; results
that are copies; that a small ``bcast`` is one fast call; point to point of small and
large objects (a large one's body after a natively received first part), with statuses,
``ssend`` and ``irecv`` beside them; the short ways' edges (:func:`_short_ways`).
"""
from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pytest

from collcomm.core.pickled_small import INLINE, SMALL_MAX
from tests.mpi_checks import SIZES, Checker, check, job


def _sized(pickled_size: int, salt: int) -> bytes:
    """A bytes object whose pickle (MPI.pickle's protocol) is exactly ``pickled_size`` bytes."""
    k = max(0, pickled_size - 40)
    while len(pickle.dumps(bytes([salt % 256]) * k, pickle.HIGHEST_PROTOCOL)) < pickled_size:
        k += 1
    return bytes([salt % 256]) * k


def _objects(rank: int, salt: int) -> list[Any]:
    """Objects of every size class (the same list on every rank, keyed by ``rank``)."""
    return [rank + salt, {"rank": rank, "salt": [salt] * 3}, _sized(INLINE - 1, rank + salt),
            _sized(INLINE, rank + salt), _sized(INLINE + 1, rank + salt), "x" * (1000 + rank),
            _sized(SMALL_MAX + 10, rank), np.full(20_000, float(rank + salt))]


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and np.array_equal(a, b)
    return type(a) is type(b) and a == b


def _pick(kind: int, rank: int, n: int, salt: int) -> Any:
    """Rank ``rank``'s object of size class ``kind`` shifted by rank: ranks differ in class."""
    objs = _objects(rank, salt)
    return objs[(kind + rank) % len(objs)]


def _collectives(c: Checker, MPI, comm) -> None:
    r, n = comm.rank, comm.size
    count = len(_objects(0, 0))
    for kind in range(count):
        for root in range(n):
            want = _objects(root, kind)[kind]
            got = comm.bcast(want if r == root else None, root)
            c.true(_same(got, want), f"bcast of object kind {kind} from {root}")
            got = comm.gather(_pick(kind, r, n, 1), root)
            if r == root:
                c.true(all(_same(got[j], _pick(kind, j, n, 1)) for j in range(n)),
                       f"gather of kinds from {kind} to {root}")
            else:
                c.true(got is None, "gather: None off the root")
            items = [_pick(kind, j, n, 2) for j in range(n)]
            got = comm.scatter(items if r == root else None, root)
            c.true(_same(got, _pick(kind, r, n, 2)), f"scatter of kinds from {kind} by {root}")
        got = comm.allgather(_pick(kind, r, n, 3))
        c.true(all(_same(got[j], _pick(kind, j, n, 3)) for j in range(n)), f"allgather of kinds from {kind}")
        got = comm.alltoall([_pick(kind + j, r, n, 4) for j in range(n)])
        c.true(all(_same(got[j], _pick(kind + r, j, n, 4)) for j in range(n)), f"alltoall of kinds from {kind}")
    c.eq(comm.allreduce(r + 1), n * (n + 1) // 2, "allreduce of ints")
    c.eq(comm.allreduce([r]), list(range(n)), "allreduce of lists (concatenated in rank order)")
    mine = [r, [r]]
    got = comm.bcast(mine, 0)
    if r == 0:
        got[1].append(5)
        c.eq(mine, [0, [0]], "bcast: the root's result is a copy")


class _Unpicklable:
    def __reduce__(self) -> Any:
        raise RuntimeError("no pickling for this one")


def _failures(c: Checker, MPI, comm) -> None:
    r, n = comm.rank, comm.size
    bad = n - 1
    calls = [("bcast", lambda: comm.bcast(_Unpicklable() if r == bad else None, bad)),
             ("allgather", lambda: comm.allgather(_Unpicklable() if r == bad else r)),
             ("gather", lambda: comm.gather(_Unpicklable() if r == bad else r, 0)),
             ("scatter", lambda: comm.scatter([r if j != bad else _Unpicklable() for j in range(n)]
                                              if r == 0 else None, 0)),
             ("alltoall", lambda: comm.alltoall([_Unpicklable() if r == bad and j == 0 else j for j in range(n)]))]
    for name, call in calls:
        c.raises(call, MPI.Exception, f"{name} of an object rank {bad} cannot pickle, on rank {r}")
        c.eq(comm.allgather(r), list(range(n)), f"the call after a refused {name}")


def _pending_beside(c: Checker, MPI, comm) -> None:
    """An object call while a non-blocking collective is still pending on some ranks (their
    fast call paused: the regular way) but done on others (the fast call): the same call."""
    r, n = comm.rank, comm.size
    for name, call, want in (("alltoall", lambda: comm.alltoall([(r, i) for i in range(n)]),
                              [(p, r) for p in range(n)]),
                             ("allgather", lambda: comm.allgather(r), list(range(n))),
                             ("bcast", lambda: comm.bcast("x" * 500 if r == 0 else None, 0), "x" * 500),
                             ("scatter", lambda: comm.scatter(list(range(n)) if r == 0 else None, 0), r)):
        q = comm.Ialltoall(np.ones(3 * n), np.empty(3 * n))
        if r == 0:
            q.Wait()
        c.eq(call(), want, f"{name} beside a pending Ialltoall on ranks > 0")
        if r != 0:
            q.Wait()


def _pickled_once(c: Checker, MPI, comm) -> None:
    """A large object sent is pickled once (the native try hands its pickle on)."""
    r, n = comm.rank, comm.size
    if n == 1:
        return
    calls = []

    def dumps(obj, *protocol):
        calls.append(1)
        return pickle.dumps(obj, *protocol)

    MPI.pickle.__init__(dumps, pickle.loads)
    try:
        big = np.arange(20_000, dtype=np.float64)
        got = comm.sendrecv(big, (r + 1) % n, 3, None, (r - 1) % n, 3)
    finally:
        MPI.pickle.__init__()
    c.true(np.array_equal(got, big), "sendrecv of a 160 KB object")
    c.eq(len(calls), 1, "a large object's sendrecv pickles it once")


def _fast_taken(c: Checker, MPI, comm) -> None:
    g = comm._h.g
    comm.bcast(1, 0)
    fast = g.fast if g is not None else None
    if fast is None:
        return
    before = fast.calls
    comm.bcast(2, 0)
    c.eq(fast.calls - before, 1, "bcast of an int is one fast call")
    before = fast.calls
    comm.bcast("y" * 1000, 0)
    c.eq(fast.calls - before, 2, "bcast of a 1 KB string is two fast calls")


def _point_to_point(c: Checker, MPI, comm) -> None:
    r, n = comm.rank, comm.size
    if n == 1:
        return
    nxt, prv = (r + 1) % n, (r - 1) % n
    for k, obj in enumerate(_objects(r, 5)):
        st = MPI.Status()
        got = comm.sendrecv(obj, nxt, 10 + k, None, prv, MPI.ANY_TAG, st)
        c.true(_same(got, _objects(prv, 5)[k]), f"sendrecv of object kind {k}")
        c.eq((st.Get_source(), st.Get_tag()), (prv, 10 + k), f"sendrecv status of kind {k}")
    if r < 2 and n >= 2:
        other = 1 - r
        if r == 0:
            for k, obj in enumerate(_objects(0, 6)):
                comm.send(obj, 1, k)
            comm.ssend("synchronous", 1, 99)
            q = comm.irecv(source=1, tag=7)
            comm.send("after irecv", 1, 8)
            c.eq(q.wait(), "posted first", "irecv posted before a native receive's message")
        else:
            st = MPI.Status()
            for k in range(len(_objects(0, 6))):
                got = comm.recv(None, 0, MPI.ANY_TAG, st)
                c.true(_same(got, _objects(0, 6)[k]), f"recv of object kind {k}")
                c.eq(st.Get_tag(), k, f"recv status tag, kind {k}")
            c.eq(comm.recv(source=0, tag=99), "synchronous", "recv of an ssend's object")
            comm.send("posted first", 0, 7)
            c.eq(comm.recv(source=other, tag=8), "after irecv", "recv after the peer's irecv")
    comm.barrier()


def _short_ways(c: Checker, MPI, comm) -> None:
    """The edges of the short ways of ``send``/``isend``/``recv`` and of a request's
    ``wait``: a receive with a status, a receive while a freed receive is still pending
    (``ORPHANS``: the regular way), tags the C call must not take (a bool, out of range:
    the regular way's errors, raised before any traffic), a large object, a completed
    send's request waited for with and without a status."""
    from collcomm.MPI._request import ORPHANS

    r, n = comm.rank, comm.size
    if n == 1:
        return
    nxt, prv = (r + 1) % n, (r - 1) % n
    big = np.arange(20_000, dtype=np.float64) + r
    for k, obj in enumerate((r, "s" * 3000, big)):
        q = comm.isend(obj, nxt, 30 + k)
        st = MPI.Status()
        got = comm.recv(None, prv, 30 + k, st)
        want = (prv, "s" * 3000, np.arange(20_000, dtype=np.float64) + prv)[k]
        c.true(_same(got, want), f"recv of object {k} with a status")
        c.eq((st.Get_source(), st.Get_tag()), (prv, 30 + k), f"recv status of object {k}")
        if k == 0:
            sst = MPI.Status()
            c.eq(q.wait(sst), None, "wait of a completed isend with a status")
            c.eq(sst.Get_source(), MPI.ANY_SOURCE, "a send request's status source")
        else:
            c.eq(q.wait(), None, f"wait of isend {k}")
        c.true(not q, f"isend {k}'s request null after its wait")
    # a freed receive still pending: the next recv goes the regular way and reaps it
    orphan = comm.irecv(source=prv, tag=40)
    orphan.Free()
    pending = len(ORPHANS)
    comm.barrier()                     # (its message is sent only now)
    comm.send({"late": r}, nxt, 40)
    comm.send(r * 10, nxt, 41)
    c.eq(comm.recv(None, prv, 41), prv * 10, "recv beside a freed pending irecv")
    c.true(pending >= 1, "the freed irecv was pending (ORPHANS)")
    comm.barrier()
    c.eq(comm.sendrecv(r, nxt, 42, None, prv, 42), prv, "sendrecv after the orphan's message")
    c.eq(len(ORPHANS), 0, "the freed irecv completed and left ORPHANS")
    # tags the C call does not take: the regular way's answers
    c.raises(lambda: comm.send(1, nxt, -2), MPI.Exception, "send with tag -2", MPI.ERR_TAG)
    c.raises(lambda: comm.isend(1, nxt, comm.Get_attr(MPI.TAG_UB) + 1), MPI.Exception, "isend past TAG_UB", MPI.ERR_TAG)
    c.raises(lambda: comm.recv(None, prv, -5), MPI.Exception, "recv with tag -5", MPI.ERR_TAG)
    comm.send("bool tag", nxt, True)
    c.eq(comm.recv(None, prv, 1), "bool tag", "send with tag True is tag 1")
    comm.barrier()


def obj_small_checks(c: Checker, MPI, comm) -> None:
    _collectives(c, MPI, comm)
    _failures(c, MPI, comm)
    _pending_beside(c, MPI, comm)
    _pickled_once(c, MPI, comm)
    _fast_taken(c, MPI, comm)
    _point_to_point(c, MPI, comm)
    _short_ways(c, MPI, comm)
    comm.barrier()


@pytest.mark.timeout(160)
@pytest.mark.parametrize("n", SIZES)
def test_obj_small(n):
    check(job(n), "obj_small")


@pytest.mark.timeout(160)
def test_obj_small_over_tcp():
    check(job(3, "tcp"), "obj_small")
