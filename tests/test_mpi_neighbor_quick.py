"""collcomm.MPI's blocking neighbourhood collectives in one C call (``P2P.exchange``,
native/_p2p_exchange.c) and their quick path (``Neighborhood.quick_run``,
MPI/_neighbor_exchange.py): a section of the shared MPI job (tests/mpi_checks.py) at 1-5
ranks and over TCP (no native point-to-point there: the regular path, the same checks).

- repeated ``Neighbor_alltoall``/``Neighbor_allgather``/``Neighbor_alltoallv`` on a ring, a
  line (``PROC_NULL`` ends: their receive blocks untouched) and a distributed graph with
  edges to itself, new values every call: the first call of a layout takes the regular
  path, the next ones the quick path (counted: where the group has native point-to-point
  the quick path must have run);
- layouts that alternate (other sizes, dtypes), blocks above the inline limit alone and
  beside small ones (C stops at the first it cannot take: the rest the regular way);
- what must leave the quick path to the regular one, raising there on every rank, the next
  call right: a receive buffer that is read-only or not contiguous in a cached layout, a
  freed datatype in a cached vector spec, a freed communicator;
- persistent and non-blocking neighbourhood calls between quick ones (the call numbers
  stay in step);
- ``P2P.exchange`` itself: a block outside its buffer or a malformed tuple does nothing;
- the object forms with a large object beside a small one;
- lent sends, freed communicators and requests, a free beside a wait in C, a timeout
  under a freed communicator, another ``call_timeout`` (tests/neighbor_free_checks.py).
The same code in one process with fakes: tests/test_mpi_neighbor_started.py.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from collcomm.core import p2p
from collcomm.MPI._neighbor_exchange import Neighborhood
from tests.mpi_checks import SIZES, Checker, check, job
from tests.neighbor_free_checks import BIG, _a2a_want, _native, lent_and_freed_checks

class _Counted:
    """Neighborhood.quick_run and quick_start counted while in a ``with`` (the calls they
    took: ``runs``, ``starts``)."""

    def __enter__(self) -> "_Counted":
        self.run, self.start, self.runs, self.starts = Neighborhood.quick_run, Neighborhood.quick_start, 0, 0

        def run(nbh: Neighborhood, *a: Any) -> bool:
            ok = self.run(nbh, *a)
            self.runs += ok
            return ok

        def start(nbh: Neighborhood, *a: Any) -> Any:
            op = self.start(nbh, *a)
            self.starts += op is not None
            return op
        Neighborhood.quick_run, Neighborhood.quick_start = run, start  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: Any) -> None:
        Neighborhood.quick_run, Neighborhood.quick_start = self.run, self.start  # type: ignore[method-assign]


HOW = ("Wait", "Test", "Waitall", "Testany")


def complete_by(MPI: Any, req: Any, how: int, others: list[Any] | None = None) -> None:
    """Complete ``req`` by HOW[how]: its Wait, Test polling, a Waitall with ``others``, or
    Testany polling."""
    if how == 0:
        req.Wait()
    elif how == 1:
        while not req.Test():
            pass
    elif how == 2:
        MPI.Request.Waitall([req, *(others or [])])
    else:
        while not MPI.Request.Testany([req])[1]:
            pass


def _ring_checks(c: Checker, MPI: Any, comm: Any, periodic: bool) -> None:
    r, n = comm.rank, comm.size
    t = comm.Create_cart([n], [periodic])
    down, up = t.Shift(0, 1)
    what = f"{'ring' if periodic else 'line'} n={n}"
    with _Counted() as k:
        for it, m in enumerate([1, 1, 3, 1, 3, 3, BIG, BIG, 1]):
            for dtype in (np.float64, np.int32) if m == 3 else (np.float64,):
                send = (np.arange(2 * m) + 100 * r + 1000 * it).astype(dtype)
                recv = np.full(2 * m, -1, dtype)
                t.Neighbor_alltoall(send, recv)
                value = lambda p: (np.arange(2 * m) + 100 * p + 1000 * it).astype(dtype)  # noqa: E731
                c.eq(recv, _a2a_want(MPI, down, up, m, value, dtype),
                     f"{what}: Neighbor_alltoall call {it} m={m} {np.dtype(dtype)}")
                mine = (np.arange(m) + 7 * r + it).astype(dtype)
                got = np.full(2 * m, -1, dtype)
                t.Neighbor_allgather(mine, got)
                want = np.full(2 * m, -1, dtype)
                for slot, p in enumerate((down, up)):
                    if p != MPI.PROC_NULL:
                        want[slot * m:(slot + 1) * m] = (np.arange(m) + 7 * p + it).astype(dtype)
                c.eq(got, want, f"{what}: Neighbor_allgather call {it} m={m} {np.dtype(dtype)}")
    if _native(t):
        c.true(k.runs >= 10, f"{what}: the quick path ran ({k.runs} calls)")
    _refusals(c, MPI, t, what)
    t.Free()


def _refusals(c: Checker, MPI: Any, t: Any, what: str) -> None:
    """Calls in a cached layout that the quick path must leave to the regular one: refused
    on every rank (no call number taken), the next call right."""
    down, up = t.Shift(0, 1)
    value = lambda p, k=0: np.arange(2.0) + 10 * p + k     # noqa: E731 - rank p's send
    recv = np.zeros(2)
    t.Neighbor_alltoall(value(t.rank), recv)        # (the layout cached)
    ro = np.zeros(2)
    ro.flags.writeable = False
    c.raises(lambda: t.Neighbor_alltoall(value(t.rank), ro), BufferError, f"{what}: a read-only receive buffer")
    strided = np.zeros(4)[::2]
    c.raises(lambda: t.Neighbor_alltoall(value(t.rank), strided), BufferError, f"{what}: a strided receive buffer")
    out = np.full(2, -1.0)
    t.Neighbor_alltoall(value(t.rank, 5), out)
    c.eq(out, _a2a_want(MPI, down, up, 1, lambda p: value(p, 5), np.float64), f"{what}: the call after the refusals")


def _graph_checks(c: Checker, MPI: Any, comm: Any) -> None:
    """r -> r+1, r+2 (at n = 1 both to itself, at n = 2 one): Neighbor_alltoallv with spec
    lists, blocks of different sizes, one above the inline limit beside a small one."""
    r, n = comm.rank, comm.size
    g = comm.Create_dist_graph_adjacent([(r - 1) % n, (r - 2) % n], [(r + 1) % n, (r + 2) % n])
    with _Counted() as k:
        for it, (m0, m1) in enumerate([(1, 2), (1, 2), (1, 2), (3, BIG), (3, BIG), (1, 2), (BIG, 1)]):
            send = np.arange(m0 + m1, dtype=np.float64) + 1000 * r + 10 * it
            recv = np.full(m0 + m1 + 4, -1.0)
            # source (r-1) sent me its block 0 (m0), source (r-2) its block 1 (m1)
            g.Neighbor_alltoallv([send, [m0, m1], [0, m0], MPI.DOUBLE], [recv, [m0, m1], [2, m0 + 4], MPI.DOUBLE])
            want = np.full(m0 + m1 + 4, -1.0)
            want[2:2 + m0] = np.arange(m0) + 1000 * ((r - 1) % n) + 10 * it
            want[m0 + 4:m0 + 4 + m1] = np.arange(m0, m0 + m1) + 1000 * ((r - 2) % n) + 10 * it
            c.eq(recv, want, f"graph n={n}: Neighbor_alltoallv call {it} blocks {m0}, {m1}")
    if _native(g):
        c.true(k.runs >= 3, f"graph n={n}: the quick path ran ({k.runs} calls)")
    # counts given as 0-d numpy arrays (valid, read with int()): no layout kept, every form right
    a0, a1 = np.array(1), np.array(1)
    for it in range(2):
        for form in ("blocking", "I", "init"):
            send, recv = np.arange(2.0) + 10 * r + it, np.full(2, -1.0)
            specs = ([send, [a0, a1], [0, 1], MPI.DOUBLE], [recv, [a0, a1], [0, 1], MPI.DOUBLE])
            if form == "blocking":
                g.Neighbor_alltoallv(*specs)
                g.Neighbor_allgatherv(send[:1], [recv, [a0, a1], [0, 1], MPI.DOUBLE])
                recv[:] = -1
                g.Neighbor_alltoallv(*specs)
            elif form == "I":
                g.Ineighbor_alltoallv(*specs).Wait()
            else:
                q = g.Neighbor_alltoallv_init(*specs)
                q.Start()
                q.Wait()
                q.Free()
            c.eq(recv, [10 * ((r - 1) % n) + it, 10 * ((r - 2) % n) + it + 1],
                 f"graph n={n}: Neighbor_alltoallv ({form}) with 0-d array counts, call {it}")
    # a freed datatype in a cached spec: refused on every rank; the next call right
    dt = MPI.DOUBLE.Create_contiguous(1).Commit()
    send, recv = np.arange(2.0) + r, np.zeros(2)
    for _ in range(2):
        g.Neighbor_alltoallv([send, [1, 1], [0, 1], dt], [recv, [1, 1], [0, 1], dt])
    dt.Free()
    c.raises(lambda: g.Neighbor_alltoallv([send, [1, 1], [0, 1], dt], [recv, [1, 1], [0, 1], dt]),
             MPI.Exception, f"graph n={n}: a freed datatype in a cached layout", MPI.ERR_TYPE)
    recv[:] = -1
    g.Neighbor_alltoallv([send, [1, 1], [0, 1], MPI.DOUBLE], [recv, [1, 1], [0, 1], MPI.DOUBLE])
    c.eq(recv, [(r - 1) % n, (r - 2) % n + 1.0], f"graph n={n}: the call after the freed datatype")
    # persistent and non-blocking calls between quick ones: the numbers in step
    ps, pr = np.arange(3.0) + r, np.zeros(3)
    req = g.Neighbor_alltoallv_init([ps, [1, 2], [0, 1], MPI.DOUBLE], [pr, [1, 2], [0, 1], MPI.DOUBLE])
    for it in range(3):
        req.Start()
        qs, qr = np.arange(3.0) + 10 * r + it, np.zeros(3)
        g.Neighbor_alltoallv([qs, [1, 2], [0, 1], MPI.DOUBLE], [qr, [1, 2], [0, 1], MPI.DOUBLE])
        ir = np.zeros(3)
        ireq = g.Ineighbor_alltoallv([qs * 2, [1, 2], [0, 1], MPI.DOUBLE], [ir, [1, 2], [0, 1], MPI.DOUBLE])
        req.Wait()
        ireq.Wait()
        a, b = (r - 1) % n, (r - 2) % n
        c.eq(pr, [a, b + 1, b + 2], f"graph n={n}: persistent start {it}")
        c.eq(qr, [10 * a + it, 10 * b + it + 1, 10 * b + it + 2], f"graph n={n}: quick call {it}")
        c.eq(ir, [2 * (10 * a + it), 2 * (10 * b + it + 1), 2 * (10 * b + it + 2)], f"graph n={n}: Ineighbor {it}")
    req.Free()
    g.Free()
    c.raises(lambda: g.Neighbor_alltoallv([send, [1, 1], [0, 1], MPI.DOUBLE], [recv, [1, 1], [0, 1], MPI.DOUBLE]),
             MPI.Exception, f"graph n={n}: a freed communicator", MPI.ERR_COMM)


def _nonblocking_checks(c: Checker, MPI: Any, comm: Any) -> None:
    """Ineighbor_… and persistent requests begun natively (Started), completed by Wait,
    Test or Testany polling, Waitall, or freed; small and large blocks; a line's PROC_NULL ends."""
    r, n = comm.rank, comm.size
    for periodic in (True, False):
        t = comm.Create_cart([n], [periodic])
        down, up = t.Shift(0, 1)
        what = f"{'ring' if periodic else 'line'} n={n}"
        native = _native(t)
        k = _Counted().__enter__()
        for it, m in enumerate([1, 1, 2, BIG, 1, BIG, 2]):
            value = lambda p, k=it: np.arange(2.0 * m) + 100 * p + 1000 * k    # noqa: E731
            recv = np.full(2 * m, -1.0)
            req = t.Ineighbor_alltoall(value(r), recv)
            how = it % 4
            if how != 2:
                complete_by(MPI, req, how)
            else:
                other = t.Ineighbor_allgather(value(r)[:m], got := np.full(2 * m, -1.0))
                complete_by(MPI, req, how, [other])
                want = np.full(2 * m, -1.0)
                for slot, p in enumerate((down, up)):
                    if p != MPI.PROC_NULL:
                        want[slot * m:(slot + 1) * m] = value(p)[:m]
                c.eq(got, want, f"{what}: Ineighbor_allgather in a Waitall, call {it}")
            c.eq(recv, _a2a_want(MPI, down, up, m, value, np.float64), f"{what}: Ineighbor_alltoall call {it} "
                 f"completed by {HOW[how]}")
        k.__exit__()
        if native:
            c.true(k.starts >= 3, f"{what}: Ineighbor_… took the quick path ({k.starts} calls)")
        # persistent: started again and again, blocking and non-blocking calls between
        ps, pr = np.arange(4.0) + r, np.full(4, -1.0)
        k = _Counted().__enter__()     # (before the request: its Start keeps the bound quick_start)
        pq = t.Neighbor_alltoall_init(ps, pr)
        for it in range(4):
            ps[:] = np.arange(4.0) + r + 10 * it
            pq.Start()
            mid = np.full(2, -1.0)
            t.Neighbor_alltoall(np.arange(2.0) + 50 * r, mid)
            pq.Wait()
            c.eq(pr, _a2a_want(MPI, down, up, 2, lambda p: np.arange(4.0) + p + 10 * it, np.float64),
                 f"{what}: persistent Neighbor_alltoall start {it}")
            c.eq(mid, _a2a_want(MPI, down, up, 1, lambda p: np.arange(2.0) + 50 * p, np.float64),
                 f"{what}: a blocking call inside persistent start {it}")
        k.__exit__()
        if native:
            c.true(k.starts >= 3, f"{what}: persistent starts took the quick path ({k.starts} starts)")
        pq.Free()
        # a freed request completes in the background: filled once a later call read past it
        recv = np.full(2, -1.0)
        t.Ineighbor_alltoall(np.arange(2.0) + 7 * r, recv).Free()
        after = np.full(2, -1.0)
        t.Neighbor_alltoall(np.arange(2.0) + 9 * r, after)
        c.eq(after, _a2a_want(MPI, down, up, 1, lambda p: np.arange(2.0) + 9 * p, np.float64),
             f"{what}: the call after a freed Ineighbor_alltoall")
        t.Barrier()
        t.Neighbor_alltoall(np.arange(2.0), np.zeros(2))     # (reads past anything still in a ring)
        c.eq(recv, _a2a_want(MPI, down, up, 1, lambda p: np.arange(2.0) + 7 * p, np.float64),
             f"{what}: a freed Ineighbor_alltoall's receive buffer")
        t.Free()


def _object_checks(c: Checker, MPI: Any, comm: Any) -> None:
    """The object forms: small objects written in C, a large one (above a ring's inline
    limit) beside a small one the regular way, with that pickle."""
    r, n = comm.rank, comm.size
    t = comm.Create_cart([n], [True])
    down, up = t.Shift(0, 1)
    for it in range(3):
        c.eq(t.neighbor_allgather((r, it)), [(down, it), (up, it)], f"n={n}: neighbor_allgather {it}")
        big = b"x" * 600_000 + bytes([r])
        got = t.neighbor_alltoall([(r, "small", it), big])
        # slot 0 (from down) is what down sent up (its item 1), slot 1 what up sent down (its item 0)
        c.eq(got, [b"x" * 600_000 + bytes([down]), (up, "small", it)], f"n={n}: neighbor_alltoall with a large object {it}")
    t.Free()


def _exchange_entry(c: Checker, MPI: Any, comm: Any) -> None:
    """P2P.exchange declines what it cannot read, having done nothing."""
    t = comm.Create_cart([comm.size], [True])
    nbh = t._neighbor_plan("test")
    f = p2p.native(nbh.twin._grp("test"))
    if f is not None and comm.size > 1:
        peer = t.Shift(0, 1)[1]      # (the twin's local rank: the same)
        send, recv = np.zeros(2), np.zeros(2)
        for sends in ((8, 16, peer, 0), (0, 8, peer), (0, 8, peer, -1), (0, 8.0, peer, 0), (0, 8, 99, 0)):
            c.eq(f.exchange(send, recv, sends, (), 0, 0), (0, 0), f"exchange of {sends}: nothing done")
        c.eq(f.exchange(send, recv, (), (), 0, 0, (0, 8, 16)), (0, 0), "a copy past its buffer: nothing done")
        ro = np.zeros(2)
        ro.flags.writeable = False
        c.eq(f.exchange(send, ro, (0, 8, peer, 0), (), 0, 0), (0, 0), "a read-only receive buffer: nothing done")
        c.raises(lambda: f.exchange(send, recv, [0, 8, peer, 0], (), 0, 0), TypeError, "a list of blocks")
    t.Free()


def neighbor_quick_checks(c: Checker, MPI: Any, comm: Any) -> None:
    _exchange_entry(c, MPI, comm)
    _ring_checks(c, MPI, comm, True)
    _ring_checks(c, MPI, comm, False)
    _graph_checks(c, MPI, comm)
    _nonblocking_checks(c, MPI, comm)
    lent_and_freed_checks(c, MPI, comm)
    _object_checks(c, MPI, comm)


@pytest.mark.timeout(160)
@pytest.mark.parametrize("n", SIZES)
def test_neighbor_quick(n):
    check(job(n), "neighbor_quick")


@pytest.mark.timeout(160)
def test_neighbor_quick_over_tcp():
    check(job(3, "tcp"), "neighbor_quick")
