"""collcomm.MPI graph topologies and neighbourhood collectives.

* ``neighbor_checks``: a section of the shared MPI job (tests/mpi_checks.py), sizes 1-5
  and over TCP: every neighbourhood collective (buffer forms, ``I…``, ``…_init``, objects,
  a derived type, ``alltoallw`` with a datatype per block) on grids (periodic dimensions of
  size 1 and 2, where a rank is a neighbour twice or its own; non-periodic edges), an MPI-1
  graph and random distributed multigraphs with weights, against values each rank computes
  from the whole topology (the n-th edge to a peer meets the n-th from it; on a grid a
  block sent one step up lands in the receiver's slot for its neighbour one step down);
  the topology queries; the errors.
* ``test_same_results_as_mpi4py``: tests/mpi_neighbor_prog.py under mpi4py + Open MPI and
  under collcomm.MPI on 4 ranks, the JSON lines compared.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

from tests.mpi_checks import SIZES, Checker, check, job
from tests.test_mpi_vs_mpi4py import _mpiexec, compare_with_mpi4py


def _grid_edges(cart) -> tuple[list[int], list[tuple[int, int]]]:
    """A grid rank's neighbours (down, up per dimension) and, for each of its receive slots,
    (the sender, the sender's block): the neighbour down sent its block up (2d + 1)."""
    ranks, fills = [], []
    for d in range(cart.Get_dim()):
        down, up = cart.Shift(d, 1)
        ranks += [down, up]
        fills += [(down, 2 * d + 1), (up, 2 * d)]
    return ranks, fills


def _pairings(sources: list[list[int]], dests: list[list[int]], me: int) -> list[tuple[int, int]]:
    """For each receive slot of ``me``: (sender, the sender's block index), pairing the n-th
    edge from a sender with the n-th edge to ``me`` in the sender's destinations."""
    seen: dict[int, int] = {}
    out = []
    for p in sources[me]:
        k = seen.get(p, 0)
        seen[p] = k + 1
        out.append((p, [i for i, q in enumerate(dests[p]) if q == me][k]))
    return out


def _exchange_checks(c: Checker, MPI, t, fills: list[tuple[int, int]], outdeg: int, what: str) -> None:
    """Every collective on topology communicator ``t`` against ``fills`` (per receive slot:
    (sender or PROC_NULL, its block))."""
    me, indeg = t.rank, len(fills)

    def want(per: int, value) -> np.ndarray:   # slot j: sender's block, or -1 from PROC_NULL
        out = np.full(per * indeg, -1.0)
        for j, (p, i) in enumerate(fills):
            if p != MPI.PROC_NULL:
                out[j * per:(j + 1) * per] = value(p, i)
        return out

    blk = lambda p, i: 10.0 * p + i + np.arange(3) / 4     # noqa: E731 - block i of rank p
    sb = np.concatenate([blk(me, i) for i in range(outdeg)]) if outdeg else np.zeros(0)
    for form in ("blocking", "nonblocking", "persistent"):
        rb = np.full(3 * indeg, -1.0)
        if form == "blocking":
            t.Neighbor_alltoall(sb, rb)
        elif form == "nonblocking":
            t.Ineighbor_alltoall([sb, 3, MPI.DOUBLE], [rb, 3, MPI.DOUBLE]).Wait()
        else:
            p = t.Neighbor_alltoall_init(sb, rb)
            for _ in range(2):
                rb[:] = -1
                p.Start()
                p.Wait()
            p.Free()
        c.eq(rb, want(3, blk), f"{what}: Neighbor_alltoall {form}")
    rb, ra = np.full(2 * indeg, -1.0), np.full(3 * indeg, -1.0)
    first = t.Ineighbor_allgather(np.array([me, -me], dtype="d"), rb)   # two in flight at once,
    second = t.Ineighbor_alltoall(sb, ra)                                # completed in reverse
    MPI.Request.Waitall([second, first])
    c.eq(rb, want(2, lambda p, i: [p, -p]), f"{what}: Ineighbor_allgather")
    c.eq(ra, want(3, blk), f"{what}: Ineighbor_alltoall while an Ineighbor_allgather is in flight")
    # v forms: block i of rank p holds i + 1 ints; received at displacements 5 apart
    counts = [i + 1 for _, i in fills]
    sv = np.arange(sum(range(1, outdeg + 1)), dtype="i") + 100 * me
    sdis = [sum(range(1, i + 1)) for i in range(outdeg)]
    rv = np.full(5 * indeg, -1, dtype="i")
    t.Neighbor_alltoallv([sv, [i + 1 for i in range(outdeg)], sdis, MPI.INT],
                         [rv, counts, [5 * j for j in range(indeg)], MPI.INT])
    wv = np.full(5 * indeg, -1, dtype="i")
    for j, (p, i) in enumerate(fills):
        if p != MPI.PROC_NULL:
            wv[5 * j:5 * j + i + 1] = np.arange(sum(range(1, i + 1)), sum(range(1, i + 2))) + 100 * p
    c.eq(rv, wv, f"{what}: Neighbor_alltoallv")
    rg = np.full(3 * indeg, -1, dtype="i")
    t.Neighbor_allgatherv(np.array([me], dtype="i"), [rg, [1] * indeg, [3 * j + 1 for j in range(indeg)], MPI.INT])
    wg = np.full(3 * indeg, -1, dtype="i")
    for j, (p, _) in enumerate(fills):
        if p != MPI.PROC_NULL:
            wg[3 * j + 1] = p
    c.eq(rg, wg, f"{what}: Neighbor_allgatherv")
    # a derived type both sides: every other double, 2 per block
    ev = MPI.DOUBLE.Create_vector(2, 1, 2).Create_resized(0, 32).Commit()
    sd = np.arange(4.0 * outdeg) + 1000 * me
    rd = np.full(4 * indeg, -1.0)
    t.Neighbor_alltoall([sd, 1, ev], [rd, 1, ev])
    wd = np.full(4 * indeg, -1.0)
    for j, (p, i) in enumerate(fills):
        if p != MPI.PROC_NULL:
            wd[4 * j] = 1000 * p + 4 * i
            wd[4 * j + 2] = 1000 * p + 4 * i + 2
    c.eq(rd, wd, f"{what}: Neighbor_alltoall of a vector type (the gaps untouched)")
    ev.Free()
    # alltoallw: a record's double field, at byte displacements 16 apart
    rec = np.dtype([("i", "i4"), ("d", "f8")], align=True)
    sw = np.zeros(outdeg, dtype=rec)
    sw["d"] = np.arange(outdeg) + 0.5 * me
    rw = np.zeros(indeg, dtype=rec)
    rw["d"] = -1
    t.Neighbor_alltoallw([sw, ([1] * outdeg, [16 * i + 8 for i in range(outdeg)]), [MPI.DOUBLE] * outdeg],
                         [rw, ([1] * indeg, [16 * j + 8 for j in range(indeg)]), [MPI.DOUBLE] * indeg])
    c.eq(rw["d"], [-1 if p == MPI.PROC_NULL else i + 0.5 * p for p, i in fills], f"{what}: Neighbor_alltoallw")
    c.eq(t.neighbor_alltoall([(me, i) for i in range(outdeg)]),
         [None if p == MPI.PROC_NULL else (p, i) for p, i in fills], f"{what}: neighbor_alltoall (objects)")
    c.eq(t.neighbor_allgather(f"r{me}"), [None if p == MPI.PROC_NULL else f"r{p}" for p, _ in fills],
         f"{what}: neighbor_allgather (objects)")


def _order_checks(c: Checker, MPI, comm) -> None:
    """The calls' numbering: persistent requests started in different orders on different
    ranks (each keeps its ``_init``'s number), restarted with new data; a call refused on
    one rank (a read-only receive buffer) leaves the others' numbering in step; a block
    to itself moves as bytes, as a message would (DOUBLE out, BYTE in)."""
    r, n = comm.rank, comm.size
    ring = comm.Create_cart([n], [True])
    down, up = ring.Shift(0, 1)
    a_send, b_send = np.zeros(2), np.zeros(2)
    a_recv, b_recv = np.zeros(2), np.zeros(2)
    a = ring.Neighbor_allgather_init(a_send[:1], a_recv)
    b = ring.Neighbor_alltoall_init(b_send, b_recv)
    for k in range(3):
        a_send[0], b_send[:] = 100 * r + k, [1000 * r + k, -1000 * r - k]
        first, second = (a, b) if (r + k) % 2 == 0 else (b, a)
        first.Start()
        second.Start()
        MPI.Request.Waitall([a, b])
        c.eq(a_recv, [100 * down + k, 100 * up + k], f"persistent allgather, start {k}, started in any order")
        c.eq(b_recv, [-1000 * down - k, 1000 * up + k], f"persistent alltoall, start {k}, started in any order")
    a.Free()
    b.Free()
    frozen = np.zeros(2)
    frozen.flags.writeable = False
    if r == 0:
        c.raises(lambda: ring.Neighbor_alltoall(np.ones(2), frozen), BufferError, "a read-only receive buffer")
    got = np.zeros(2)
    ring.Neighbor_alltoall(np.array([r, -r], dtype="d"), got)
    c.eq(got, [-down, up], "the next call after one refused on rank 0")
    selfish = comm.Create_cart([1, n], [True, False])      # along dimension 0: itself, both ways
    sd = np.arange(4.0) + 10 * r
    rb = np.zeros(32, dtype=np.uint8)
    selfish.Neighbor_alltoall([sd, 1, MPI.DOUBLE], [rb, 8, MPI.BYTE])
    c.eq(rb.view(np.float64)[:2], [sd[1], sd[0]], "a DOUBLE to itself received as 8 BYTEs")


def neighbor_checks(c: Checker, MPI, comm) -> None:
    r, n = comm.rank, comm.size
    # grids: a ring (n = 1: its own neighbour both ways; n = 2: the same one both ways), a
    # line (PROC_NULL at the ends), 2-D with a periodic dimension of size 1
    for dims, periods in (([n], [True]), ([n], [False]), ([1, n], [True, True]), ([n, 1], [False, True])):
        cart = comm.Create_cart(dims, periods)
        ranks, fills = _grid_edges(cart)
        what = f"grid {dims} periods {periods}"
        c.eq((cart.degrees, cart.inedges, cart.outedges), ((len(ranks), len(ranks)), ranks, ranks), f"{what}: edges")
        _exchange_checks(c, MPI, cart, fills, len(ranks), what)
    # an MPI-1 graph: the ring both ways plus 0 <-> last twice (a symmetric multigraph)
    nbrs = [[(i - 1) % n, (i + 1) % n] for i in range(n)]
    if n > 1:
        nbrs[0] += [n - 1, n - 1]
        nbrs[n - 1] += [0, 0]
    index = np.cumsum([len(x) for x in nbrs]).tolist()
    edges = [e for x in nbrs for e in x]
    graph = comm.Create_graph(index, edges)
    c.true(isinstance(graph, MPI.Graphcomm) and graph.Get_topology() == MPI.GRAPH, "Create_graph gives a Graphcomm")
    c.eq((graph.Get_dims(), graph.Get_topo(), graph.Get_neighbors(r), graph.Get_neighbors_count(r)),
         ((n, len(edges)), (index, edges), nbrs[r], len(nbrs[r])), "graph queries")
    c.eq((graph.nnodes, graph.nedges, graph.neighbors, graph.inedges), (n, len(edges), nbrs[r], nbrs[r]),
         "graph properties")
    _exchange_checks(c, MPI, graph, _pairings(nbrs, nbrs, r), len(nbrs[r]), "graph")
    c.true(graph.Dup().Get_topology() == MPI.GRAPH, "Dup keeps a graph topology")
    # random directed multigraphs, each rank's side given to Create_dist_graph_adjacent
    for seed in range(3):
        rng = np.random.default_rng(seed * 10 + n)
        dests = [[int(q) for q in rng.integers(0, n, rng.integers(0, 4))] for _ in range(n)]
        srcs = [[p for p in range(n) for q in dests[p] if q == me] for me in range(n)]
        for me in range(n):       # the same in-edges in a shuffled order per rank
            rng.shuffle(srcs[me])
        sw, dw = [10 * p for p in srcs[r]], [q + 1 for q in dests[r]]
        dg = comm.Create_dist_graph_adjacent(srcs[r], dests[r], sw, dw)
        what = f"dist graph seed {seed}"
        c.true(isinstance(dg, MPI.Distgraphcomm) and dg.Get_topology() == MPI.DIST_GRAPH, f"{what}: a Distgraphcomm")
        c.eq((dg.Get_dist_neighbors_count(), dg.Get_dist_neighbors()),
             ((len(srcs[r]), len(dests[r]), True), (srcs[r], dests[r], (sw, dw))), f"{what}: queries")
        _exchange_checks(c, MPI, dg, _pairings(srcs, dests, r), len(dests[r]), what)
    # the general form: rank 0 gives every edge i -> i + 1 (weighted), the others none
    if r == 0:
        gen = comm.Create_dist_graph(list(range(n)), [1] * n, [(i + 1) % n for i in range(n)], list(range(n)))
    else:
        gen = comm.Create_dist_graph([], [], [], MPI.WEIGHTS_EMPTY)
    c.eq(gen.Get_dist_neighbors(), ([(r - 1) % n], [(r + 1) % n], ([(r - 1) % n], [r])), "Create_dist_graph")
    # WEIGHTS_EMPTY: weighted without edges on one side (UNWEIGHTED is another marker)
    we = comm.Create_dist_graph_adjacent([], [r], sourceweights=MPI.WEIGHTS_EMPTY, destweights=[7])
    c.eq(we.Get_dist_neighbors(), ([], [r], ([], [7])), "WEIGHTS_EMPTY")
    c.true(MPI.UNWEIGHTED is not MPI.WEIGHTS_EMPTY, "UNWEIGHTED and WEIGHTS_EMPTY differ")
    c.eq(gen.neighbor_allgather(r), [(r - 1) % n], "Create_dist_graph: neighbor_allgather")
    _order_checks(c, MPI, comm)
    un = comm.Create_dist_graph_adjacent([], [])
    c.eq((un.Get_dist_neighbors_count(), un.Get_dist_neighbors()), ((0, 0, False), ([], [], None)), "no neighbours")
    un.Neighbor_alltoall(np.zeros(0), np.zeros(0))
    # errors, raised before any traffic
    c.raises(lambda: graph.Neighbor_allgather(MPI.IN_PLACE, np.zeros(2 * len(nbrs[r]))), MPI.Exception,
             "IN_PLACE in a neighbourhood collective", MPI.ERR_ARG)
    c.raises(lambda: comm.Create_dist_graph_adjacent([n], []), MPI.Exception, "a source outside the group",
             MPI.ERR_ARG)
    lopsided = comm.Create_dist_graph_adjacent([r], [])      # itself as a source, not as a destination
    c.raises(lambda: lopsided.Neighbor_alltoall(np.zeros(0), np.zeros(1)), MPI.Exception,
             "a rank its own source more often than its own destination", MPI.ERR_TOPOLOGY)
    c.raises(lambda: comm.Create_graph([2], [0, 5]), MPI.Exception, "a graph edge outside its nodes", MPI.ERR_ARG)
    c.raises(lambda: MPI.Graphcomm(comm), TypeError, "Graphcomm of a plain communicator")
    c.raises(lambda: MPI.Distgraphcomm(graph), TypeError, "Distgraphcomm of a graph communicator")
    c.raises(lambda: graph.Get_neighbors(n), MPI.Exception, "Get_neighbors of a rank past the graph", MPI.ERR_RANK)
    one_way = comm.Create_graph(list(range(1, n + 1)), [(i + 1) % n for i in range(n)])   # i -> i+1 only
    if n >= 3:                  # (fewer: i -> i+1 is i+1 -> i too)
        c.raises(lambda: one_way.Neighbor_allgather(np.zeros(1), np.zeros(1)), MPI.Exception,
                 "an asymmetric graph's neighbourhood collective, on every rank", MPI.ERR_TOPOLOGY)
    c.raises(lambda: graph.neighbor_alltoall([1]) if len(nbrs[r]) != 1 else graph.neighbor_alltoall([]),
             ValueError, "neighbor_alltoall with a wrong number of objects")
    if n > 1:
        loops = (list(range(1, n)), list(range(n - 1)))        # n - 1 nodes, each its own neighbour
        short = comm.Create_graph(*loops)
        c.true((short == MPI.COMM_NULL) == (r == n - 1), "ranks beyond the graph get COMM_NULL")
        c.eq(comm.Graph_map(*loops), MPI.UNDEFINED if r == n - 1 else r, "Graph_map")
        csr = comm.Create_graph([0, 1, 2], [1, 0])             # CSR offsets, as mpi4py reads them
        c.true((csr == MPI.COMM_NULL) == (r >= 2), "Create_graph of CSR offsets: 2 nodes")
        if r < 2:
            c.eq((csr.Get_dims(), csr.neighbors), ((2, 2), [1 - r]), "Create_graph of CSR offsets")
    c.raises(lambda: comm.Create_dist_graph_adjacent([r], [r], [1, 2], [1]), ValueError,
             "a weight list of the wrong length (ValueError, as mpi4py)")
    c.raises(lambda: MPI.Topocomm(comm), TypeError, "Topocomm of a plain communicator")
    ring = comm.Create_cart([n], [True])
    c.raises(lambda: ring.Neighbor_alltoall(np.zeros(3), np.zeros(3)), ValueError,
             "3 elements for 2 neighbours: no silent flooring (ValueError, as mpi4py)")
    c.raises(lambda: comm.Allgather(np.zeros(1), np.zeros(n + 1)), ValueError,
             "n + 1 elements for n ranks: no silent flooring")
    if n > 1:                   # a receive too small, on rank 0 only: its Wait raises ERR_TRUNCATE
        small = np.zeros(2 if r == 0 else 4)
        q = ring.Ineighbor_alltoall([np.zeros(4), 2, MPI.DOUBLE], [small, 1 if r == 0 else 2, MPI.DOUBLE])
        if r == 0:
            c.raises(q.Wait, MPI.Exception, "a truncated Ineighbor_alltoall's Wait", MPI.ERR_TRUNCATE)
        else:
            q.Wait()
    c.eq(graph.neighbor_alltoall(None), [None] * len(nbrs[r]), "neighbor_alltoall(None): None to each")


@pytest.mark.timeout(160)
@pytest.mark.parametrize("n", SIZES)
def test_neighbor(n):
    check(job(n), "neighbor")


@pytest.mark.timeout(160)
def test_neighbor_over_tcp():
    check(job(3, "tcp"), "neighbor")


@pytest.mark.timeout(200)
@pytest.mark.skipif(_mpiexec() is None, reason="mpi4py + Open MPI's mpiexec not installed (pip install '.[bench]')")
def test_same_results_as_mpi4py():
    compare_with_mpi4py(os.path.join(os.path.dirname(__file__), "mpi_neighbor_prog.py"), lambda d: d["rank"], n=4)
