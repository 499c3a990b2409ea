"""collcomm.MPI persistent collectives started in different orders on different ranks.

MPI 4 lets each rank start its persistent collective requests in any order (only
``mpi_assert_strict_persistent_collective_ordering`` promises the same one). Before
session 35 every ``Start`` took the communicator's next collective, so two requests of
the same signature started in opposite orders swapped their data silently. The section
``persistent_order`` of the shared MPI job (tests/mpi_checks.py, sizes 1-5 and TCP) makes
two requests of equal signature for every ``…_init`` form, starts them in opposite orders
on neighbouring ranks (one by one and with ``Startall``), waits for them in yet another
order, over several rounds with new data, and checks every value; then the crossed waits
that need each request to progress on its own (a rank waits for A while its peer waits
for B), blocking collectives on the parent between starts, and ``Free``.
"""
from __future__ import annotations

import gc
from typing import Any, Callable

import numpy as np
import pytest

from tests.mpi_checks import SIZES, Checker, check, job

Made = tuple[Any, Callable[[int], None], Callable[[int], list[tuple[Any, Any]]]]


def _kinds(MPI, comm) -> dict[str, Callable[[int], Made]]:
    """For each ``…_init`` form: make(k) -> (request, fill(round), [(got, expected)] after
    the round); requests k = 0 and 1 have the same signature and different data."""
    r, n = comm.rank, comm.size
    tri = n * (n + 1) / 2

    def val(k: int, it: int) -> float:
        return 100.0 * k + 1000.0 * it

    def bcast(k: int) -> Made:
        buf = np.zeros(3)
        root = n - 1

        def fill(it: int) -> None:
            buf[:] = np.arange(3) + val(k, it) if r == root else -1
        return comm.Bcast_init(buf, root), fill, lambda it: [(buf, np.arange(3) + val(k, it))]

    def gather(k: int) -> Made:
        send, recv = np.zeros(1), np.full(n, -1.0)
        return (comm.Gather_init(send, recv, 0), lambda it: send.fill(r + val(k, it)),
                lambda it: [(recv, np.arange(n) + val(k, it))] if r == 0 else [])

    def gatherv(k: int) -> Made:
        send, recv = np.zeros(1), np.full(n, -1.0)
        return (comm.Gatherv_init(send, [recv, [1] * n], 0), lambda it: send.fill(r + val(k, it)),
                lambda it: [(recv, np.arange(n) + val(k, it))] if r == 0 else [])

    def scatter(k: int) -> Made:
        send, recv = np.zeros(n), np.zeros(1)
        return (comm.Scatter_init(send, recv, 0), lambda it: send.__setitem__(slice(None), np.arange(n) + val(k, it)),
                lambda it: [(recv, [r + val(k, it)])])

    def scatterv(k: int) -> Made:
        send, recv = np.zeros(n), np.zeros(1)
        return (comm.Scatterv_init([send, [1] * n], recv, 0),
                lambda it: send.__setitem__(slice(None), np.arange(n) + val(k, it)),
                lambda it: [(recv, [r + val(k, it)])])

    def allgather(k: int) -> Made:
        send, recv = np.zeros(1), np.zeros(n)
        return (comm.Allgather_init(send, recv), lambda it: send.fill(r + val(k, it)),
                lambda it: [(recv, np.arange(n) + val(k, it))])

    def allgatherv(k: int) -> Made:
        send, recv = np.zeros(1), np.zeros(n)
        return (comm.Allgatherv_init(send, [recv, [1] * n]), lambda it: send.fill(r + val(k, it)),
                lambda it: [(recv, np.arange(n) + val(k, it))])

    def alltoall(k: int) -> Made:
        send, recv = np.zeros(n), np.zeros(n)
        return (comm.Alltoall_init(send, recv),
                lambda it: send.__setitem__(slice(None), 10.0 * r + np.arange(n) + val(k, it)),
                lambda it: [(recv, 10.0 * np.arange(n) + r + val(k, it))])

    def alltoallv(k: int) -> Made:
        send, recv = np.zeros(n), np.zeros(n)
        return (comm.Alltoallv_init([send, [1] * n], [recv, [1] * n]),
                lambda it: send.__setitem__(slice(None), 10.0 * r + np.arange(n) + val(k, it)),
                lambda it: [(recv, 10.0 * np.arange(n) + r + val(k, it))])

    def alltoallw(k: int) -> Made:
        send, recv = np.zeros(n), np.zeros(n)
        spec = ([1] * n, [8 * j for j in range(n)], [MPI.DOUBLE] * n)
        return (comm.Alltoallw_init([send, *spec], [recv, *spec]),
                lambda it: send.__setitem__(slice(None), 10.0 * r + np.arange(n) + val(k, it)),
                lambda it: [(recv, 10.0 * np.arange(n) + r + val(k, it))])

    def reduce(k: int) -> Made:
        send, recv = np.zeros(2), np.full(2, -1.0)
        root = n - 1
        return (comm.Reduce_init(send, recv, MPI.SUM, root), lambda it: send.fill(r + 1 + val(k, it)),
                lambda it: [(recv, np.full(2, tri + n * val(k, it)))] if r == root else [])

    def allreduce(k: int) -> Made:
        send, recv = np.zeros(2), np.zeros(2)
        return (comm.Allreduce_init(send, recv, MPI.SUM), lambda it: send.fill(r + 1 + val(k, it)),
                lambda it: [(recv, np.full(2, tri + n * val(k, it)))])

    def reduce_scatter_block(k: int) -> Made:
        send, recv = np.zeros(n), np.zeros(1)
        return (comm.Reduce_scatter_block_init(send, recv, MPI.SUM),
                lambda it: send.__setitem__(slice(None), r + 1 + np.arange(n) + val(k, it)),
                lambda it: [(recv, [tri + n * (r + val(k, it))])])

    def reduce_scatter(k: int) -> Made:
        send, recv = np.zeros(n), np.zeros(1)
        return (comm.Reduce_scatter_init(send, recv, [1] * n, MPI.SUM),
                lambda it: send.__setitem__(slice(None), r + 1 + np.arange(n) + val(k, it)),
                lambda it: [(recv, [tri + n * (r + val(k, it))])])

    def scan(k: int) -> Made:
        send, recv = np.zeros(1), np.zeros(1)
        return (comm.Scan_init(send, recv, MPI.SUM), lambda it: send.fill(r + 1 + val(k, it)),
                lambda it: [(recv, [(r + 1) * (r + 2) / 2 + (r + 1) * val(k, it)])])

    def exscan(k: int) -> Made:
        send, recv = np.zeros(1), np.full(1, -7.0)
        return (comm.Exscan_init(send, recv, MPI.SUM), lambda it: send.fill(r + 1 + val(k, it)),
                lambda it: [(recv, [r * (r + 1) / 2 + r * val(k, it)])] if r > 0 else [])

    return {"Bcast_init": bcast, "Gather_init": gather, "Gatherv_init": gatherv, "Scatter_init": scatter,
            "Scatterv_init": scatterv, "Allgather_init": allgather, "Allgatherv_init": allgatherv,
            "Alltoall_init": alltoall, "Alltoallv_init": alltoallv, "Alltoallw_init": alltoallw,
            "Reduce_init": reduce, "Allreduce_init": allreduce,
            "Reduce_scatter_block_init": reduce_scatter_block, "Reduce_scatter_init": reduce_scatter,
            "Scan_init": scan, "Exscan_init": exscan}


def _opposite_orders(c: Checker, MPI, comm, name: str, make: Callable[[int], Made]) -> None:
    """Two requests of one form, started in opposite orders on neighbouring ranks."""
    r = comm.rank
    made = [make(0), make(1)]
    reqs = [m[0] for m in made]
    for it in range(3):     # (the first start builds the group's fast call, the second binds the
        # quick start (_coll_persistent._Prepared), the third runs through it alone)
        for _, fill, _ in made:
            fill(it)
        order = reqs if (r + it) % 2 == 0 else reqs[::-1]
        if it % 2:
            MPI.Prequest.Startall(order)
        else:
            for q in order:
                q.Start()
        MPI.Request.Waitall(order[::-1] if r % 3 == 1 else order)
        for k, (_, _, expect) in enumerate(made):
            for got, want in expect(it):
                c.eq(got, want, f"{name} request {k} round {it} (started in rank order {r % 2})")
    for q in reqs:
        q.Free()
    c.true(all(q == MPI.REQUEST_NULL for q in reqs), f"{name}: freed requests are REQUEST_NULL")


def _crossed_waits(c: Checker, MPI, comm) -> None:
    """Rank 0 waits for B while the others wait for A first: each request has to progress
    while its rank waits for the other one (a single queue per communicator hangs here)."""
    r, n = comm.rank, comm.size
    a, b = np.full(2, r + 1.0), np.full(2, 10.0 * (r + 1))
    ra, rb = np.zeros(2), np.zeros(2)
    A, B = comm.Allreduce_init(a, ra), comm.Allreduce_init(b, rb)
    if r == 0:
        A.Start()
        B.Start()
        B.Wait()
        A.Wait()
    else:
        B.Start()
        A.Start()
        A.Wait()
        B.Wait()
    tri = n * (n + 1) / 2
    c.eq((ra, rb), (np.full(2, tri), np.full(2, 10 * tri)), "crossed waits: both sums right")
    # rank 0 completes A before it starts B; the others start B first
    if r == 0:
        A.Start()
        A.Wait()
        comm.Barrier()                 # a blocking collective on the parent in between
        B.Start()
        B.Wait()
    else:
        B.Start()
        A.Start()
        A.Wait()
        comm.Barrier()
        B.Wait()
    c.eq((ra, rb), (np.full(2, tri), np.full(2, 10 * tri)), "A finished before B started on rank 0")
    # two barriers in opposite orders
    X, Y = comm.Barrier_init(), comm.Barrier_init()
    order = [X, Y] if r % 2 == 0 else [Y, X]
    for q in order:
        q.Start()
    MPI.Request.Waitall(order)
    c.true(X != MPI.REQUEST_NULL and Y != MPI.REQUEST_NULL, "completed Barrier_init requests stay")
    for q in (A, B, X, Y):
        q.Free()


def _free_and_memory(c: Checker, MPI, comm) -> None:
    """Free refuses an active persistent collective and frees an inactive one (one that
    failed too; a copy of a freed request is freed; a dropped one frees its communicator);
    a request's arena is sized to its buffers, not COLLCOMM_SHM_SLOT's 4 MiB."""
    r, n = comm.rank, comm.size
    x, y = np.ones(3), np.zeros(3)
    p = comm.Allreduce_init(x, y)
    p.Start()
    p.Wait()
    c.eq(y, np.full(3, float(n)), "Allreduce_init once")
    arena = p._persist.comm._h.g.arena
    if arena is not None:              # (shared memory, n > 1)
        c.true(arena.slot <= 4096, f"a 24-byte request's arena has slots of {arena.slot} bytes")
    if n > 1:
        q = comm.Allreduce_init(x, y)
        if r == 0:
            q.Start()                  # the others have not started it: it cannot be done
            c.raises(q.Free, MPI.Exception, "Free of an active persistent collective", MPI.ERR_REQUEST)
        comm.Barrier()
        if r != 0:
            q.Start()
        q.Wait()
        c.eq(y, np.full(3, float(n)), "after a refused Free the request still completes")
        q.Free()
    copy = MPI.Prequest(p)
    p.Free()
    c.raises(p.Start, MPI.Exception, "Start after Free", MPI.ERR_REQUEST)
    c.raises(copy.Start, MPI.Exception, "Start of a copy of a freed request", MPI.ERR_REQUEST)
    # a request that failed (sizes differ between ranks), its error seen through Test: Free frees it
    if n > 1:
        bad = comm.Allreduce_init(np.ones(2 + r), np.zeros(2 + r))
        bad.Start()
        try:
            while not bad.Test():
                pass
            c.true(False, "Test of an Allreduce_init whose sizes differ between ranks raised")
        except MPI.Exception:
            pass
        bad.Free()
        c.true(bad == MPI.REQUEST_NULL, "a request that failed is freed by Free")
    # dropped without Free (inactive): its communicator is freed with it
    q = comm.Allreduce_init(x, y)
    q.Start()
    q.Wait()
    g = q._persist.comm._h.g
    c.true(g.async_calls._watcher is not None, "a request's calls are watched, not polled by a worker of its own")
    del q
    gc.collect()
    c.true(g._closed, "a request dropped without Free: its communicator is closed")


def _prepared_roots(c: Checker, MPI, comm) -> None:
    """Every root and IN_PLACE through the prepared start (the fast call's two-part entry
    with the arguments worked out at …_init: MPI/_coll_persistent.py _Prepared), three
    starts each, against values from the whole job; numpy arrays take that start."""
    from collcomm.MPI._coll_persistent import _Prepared
    r, n = comm.rank, comm.size

    def run(p: Any) -> None:
        for _ in range(3):
            p.Start()
            p.Wait()
        c.true(type(p._persist.start) is _Prepared, "a persistent collective of arrays is prepared")
        p.Free()

    for root in range(n):
        buf = np.full(2, float(r))
        run(comm.Bcast_init(buf, root))
        c.eq(buf, np.full(2, float(root)), f"Bcast_init root {root}")
        out = np.zeros(n)
        run(comm.Gather_init(np.full(1, float(r)), out, root))
        if r == root:
            c.eq(out, np.arange(n, dtype=float), f"Gather_init root {root}")
        got = np.zeros(1)
        run(comm.Scatter_init(np.arange(n, dtype=float) * 2, got, root))
        c.eq(got, np.full(1, 2.0 * r), f"Scatter_init root {root}")
        acc = np.full(2, float(r + 1))
        send = MPI.IN_PLACE if r == root else acc
        run(comm.Reduce_init(send, acc if r == root else None, MPI.SUM, root))
        if r == root:   # (in place: each of the three starts adds the others' values again)
            others = n * (n + 1) / 2 - (root + 1)
            c.eq(acc, np.full(2, root + 1 + 3 * others), f"Reduce_init IN_PLACE root {root}")
    acc = np.full(3, float(r + 1))
    run(comm.Allreduce_init(MPI.IN_PLACE, acc, MPI.MAX))
    c.eq(acc, np.full(3, float(n)), "Allreduce_init IN_PLACE MAX")


def _quick_start(c: Checker, MPI, comm) -> None:
    """Once its group has the fast call, a prepared request's ``Start`` is one C call
    (``_Persistent.quick``): with ``_Prepared.__call__`` made to fail, later starts still
    work where the group has a fast call (and take the prepared way, which fails, where it
    has none: TCP); the values right throughout; after ``Free`` the quick call is dropped."""
    from collcomm.MPI._coll_persistent import _Prepared
    r, n = comm.rank, comm.size
    x, y = np.full(2, float(r + 1)), np.zeros(2)
    p = comm.Allreduce_init(x, y)
    for _ in range(2):
        p.Start()
        p.Wait()
    fast = p._persist.comm._h.g.fast
    c.true((p._persist.quick[0] is not None) == (fast is not None),
           "a prepared request has its quick start once its group has the fast call")
    slow = _Prepared.__call__

    def refused(self: Any) -> Any:
        raise AssertionError("the prepared start ran")

    _Prepared.__call__ = refused           # type: ignore[method-assign]
    try:
        for k in range(3):
            x[:] = r + k
            try:
                p.Start()
                p.Wait()
                quick = True
            except AssertionError:
                quick = False
            c.eq(quick, fast is not None, f"start {k} through the quick call alone")
            if quick:
                c.eq(y, np.full(2, float(sum(range(n)) + n * k)), f"quick start {k}'s values")
    finally:
        _Prepared.__call__ = slow          # type: ignore[method-assign]
    if fast is None:
        p.Start()
        p.Wait()
    persist = p._persist
    p.Free()
    c.true(persist.quick is None and persist.start is None, "Free drops the quick start")
    comm.Barrier()


def persistent_order_checks(c: Checker, MPI, comm) -> None:
    _prepared_roots(c, MPI, comm)
    _quick_start(c, MPI, comm)
    for name, make in _kinds(MPI, comm).items():
        _opposite_orders(c, MPI, comm, name, make)
    _crossed_waits(c, MPI, comm)
    _free_and_memory(c, MPI, comm)
    comm.Barrier()


@pytest.mark.timeout(160)
@pytest.mark.parametrize("n", SIZES)
def test_persistent_order(n):
    check(job(n), "persistent_order")


@pytest.mark.timeout(160)
def test_persistent_order_over_tcp():
    check(job(3, "tcp"), "persistent_order")
