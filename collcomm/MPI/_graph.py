"""Graph topologies: ``Create_graph`` → ``Graphcomm``, ``Create_dist_graph_adjacent`` and
``Create_dist_graph`` → ``Distgraphcomm``.

``Create_graph(index, edges)`` (MPI-1): every rank gives the whole graph; node r's
neighbours are ``edges[index[r-1]:index[r]]``, in and out alike (an ``index`` that starts
at 0 and ends at ``len(edges)`` is CSR offsets, one entry more than nodes, as mpi4py reads
it); ranks past the graph's nodes get ``COMM_NULL``. ``Create_dist_graph_adjacent(sources, destinations)``: each rank
gives its own in- and out-neighbours (and weights, or ``UNWEIGHTED``), in the order the
neighbourhood collectives use them; no message is needed. ``Create_dist_graph(sources,
degrees, destinations)``: each rank gives any edges of the graph (``degrees[i]`` edges out
of ``sources[i]``, their ends next in ``destinations``); one object all-to-all hands every
edge to both its ends, which list them by the rank that gave them, then in the order given
(MPI leaves the order to the implementation).

collcomm keeps rank order (``reorder`` is accepted and ignored); creating one is collective
over the parent communicator, whose context and creation count name the new one.
"""
from __future__ import annotations

from typing import Any, Sequence

from ._comm import COMM_NULL, Comm, Intracomm
from ._consts import DIST_GRAPH, GRAPH, UNDEFINED, UNWEIGHTED, WEIGHTS_EMPTY
from ._errors import ERR_ARG, ERR_RANK, ERR_TOPOLOGY, Exception as MPIException
from ._neighbor_exchange import Neighbors
from ._topo import Topocomm


class _Graph:
    """An MPI-1 graph: ``index`` (cumulative degrees) and ``edges`` over ``len(index)`` nodes."""

    __slots__ = ("index", "edges")
    kind = GRAPH

    def __init__(self, index: Sequence[int], edges: Sequence[int]) -> None:
        self.index, self.edges = [int(i) for i in index], [int(e) for e in edges]

    def of(self, rank: int) -> list[int]:
        return self.edges[(self.index[rank - 1] if rank else 0):self.index[rank]]

    def neighbors(self, rank: int, call: str = "") -> Neighbors:
        """In and out alike; refused (every rank knows the whole graph) unless each pair has
        as many edges one way as the other, which the neighbourhood collectives need."""
        for a in range(len(self.index)):
            for b in set(self.of(a)):
                if self.of(a).count(b) != self.of(b).count(a):
                    raise MPIException(ERR_TOPOLOGY, f"{call}: the graph has {self.of(a).count(b)} edge(s) "
                                                     f"{a} -> {b} but {self.of(b).count(a)} back: neighbourhood "
                                                     "collectives need a symmetric graph")
        mine = self.of(rank)
        return Neighbors(mine, mine)


class _DistGraph:
    """A rank's part of a distributed graph: its in- and out-neighbours, weights or None."""

    __slots__ = ("sources", "destinations", "sourceweights", "destweights")
    kind = DIST_GRAPH

    def __init__(self, sources: Sequence[int], destinations: Sequence[int],
                 sourceweights: Sequence[int] | None, destweights: Sequence[int] | None) -> None:
        self.sources, self.destinations = [int(s) for s in sources], [int(d) for d in destinations]
        self.sourceweights = None if sourceweights is None else [int(w) for w in sourceweights]
        self.destweights = None if destweights is None else [int(w) for w in destweights]

    def neighbors(self, rank: int, call: str = "") -> Neighbors:
        return Neighbors(self.sources, self.destinations)


def _ranks(values: Any, n: int, call: str, what: str) -> list[int]:
    out = [int(v) for v in values]
    bad = [v for v in out if not 0 <= v < n]
    if bad:
        raise MPIException(ERR_ARG, f"{call}: {what} must be ranks in [0, {n}), got {bad[0]}")
    return out


def _weights(weights: Any, count: int, call: str, what: str) -> list[int] | None:
    """A weight list; None for ``UNWEIGHTED`` (or None); ``WEIGHTS_EMPTY``: weighted, no edges."""
    if weights is None or weights is UNWEIGHTED:
        return None
    out = [] if weights is WEIGHTS_EMPTY else [int(w) for w in weights]
    if len(out) != count:         # (mpi4py: ValueError)
        raise ValueError(f"{call}: {what}: expecting {count} weights, got {len(out)}")
    return out


def create_graph(comm: Comm, index: Sequence[int], edges: Sequence[int], reorder: bool) -> Comm:
    call = "Create_graph"
    g = comm._grp(call)
    index, edges = _csr(index, edges)
    nnodes = len(index)
    if nnodes > g.size or any(b < a for a, b in zip([0] + index, index)) or (index and index[-1] != len(edges)):
        raise MPIException(ERR_ARG, f"{call}: index must be non-decreasing cumulative degrees over at most "
                                    f"{g.size} nodes ending at len(edges) = {len(edges)}, got {index}")
    _ranks(edges, nnodes, call, "edges")
    ctx = comm._h.next_ctx("graph", tuple(index), tuple(edges))
    if g.rank >= nnodes:
        return Intracomm(COMM_NULL)
    return comm._derive(g.subgroup(g.ranks[:nnodes], ctx, f"{g.name}.graph"), "", _Graph(index, edges))


def graph_map(comm: Comm, index: Sequence[int], edges: Sequence[int]) -> int:
    g = comm._grp("Graph_map")
    return g.rank if g.rank < len(_csr(index, edges)[0]) else UNDEFINED


def _csr(index: Sequence[int], edges: Sequence[int]) -> tuple[list[int], list[int]]:
    """``index`` and ``edges`` as ints; an index that starts at 0 and ends at ``len(edges)``
    is read as CSR offsets (one more entry than nodes), as mpi4py does."""
    index, edges = [int(i) for i in index], [int(e) for e in edges]
    if index and index[0] == 0 and index[-1] == len(edges):
        index = index[1:]
    return index, edges


def create_dist_graph_adjacent(comm: Comm, sources: Sequence[int], destinations: Sequence[int],
                               sourceweights: Any, destweights: Any) -> Comm:
    call = "Create_dist_graph_adjacent"
    g = comm._grp(call)
    ctx = comm._h.next_ctx("dist_graph")    # (first: a rank refused below stays in step)
    src = _ranks([] if sources is None else sources, g.size, call, "sources")           # (None: none,
    dst = _ranks([] if destinations is None else destinations, g.size, call, "destinations")  # as mpi4py)
    sw, dw = _weights(sourceweights, len(src), call, "sourceweights"), _weights(destweights, len(dst), call,
                                                                                 "destweights")
    if (sw is None) != (dw is None):   # (an unweighted side without edges: the other's weighted)
        if (src if sw is None else dst):
            raise MPIException(ERR_ARG, f"{call}: give both weight lists or neither (MPI.UNWEIGHTED)")
        sw, dw = sw or [], dw or []
    topo = _DistGraph(src, dst, sw, dw)
    return comm._derive(g.subgroup(g.ranks, ctx, f"{g.name}.dist_graph"), "", topo)


def create_dist_graph(comm: Comm, sources: Sequence[int], degrees: Sequence[int], destinations: Sequence[int],
                      weights: Any) -> Comm:
    call = "Create_dist_graph"
    g = comm._grp(call)
    src, degs = _ranks(sources, g.size, call, "sources"), [int(d) for d in degrees]
    dst = _ranks(destinations, g.size, call, "destinations")
    if len(degs) != len(src) or any(d < 0 for d in degs) or sum(degs) != len(dst):   # (mpi4py: ValueError)
        raise ValueError(f"{call}: expecting one degree >= 0 per source, summing to "
                         f"len(destinations) = {len(dst)}, got {degs}")
    wts = _weights(weights, len(dst), call, "weights")
    edges, at = [], 0
    for s, k in zip(src, degs):
        edges += [(s, d, None if wts is None else wts[at + j]) for j, d in enumerate(dst[at:at + k])]
        at += k
    # weighted if any rank gave weights (a rank without edges may say WEIGHTS_EMPTY or not)
    weighted = comm.allreduce(wts is not None, op=lambda a, b, *_: a or b)  # type: ignore[attr-defined]
    got = comm.alltoall([[e for e in edges if q in (e[0], e[1])] for q in range(g.size)])  # type: ignore[attr-defined]
    me = g.rank
    ins = [(s, w) for part in got for s, d, w in part if d == me]
    outs = [(d, w) for part in got for s, d, w in part if s == me]
    topo = _DistGraph([s for s, _ in ins], [d for d, _ in outs],
                      [1 if w is None else w for _, w in ins] if weighted else None,
                      [1 if w is None else w for _, w in outs] if weighted else None)
    ctx = comm._h.next_ctx("dist_graph")
    return comm._derive(g.subgroup(g.ranks, ctx, f"{g.name}.dist_graph"), "", topo)


class Graphcomm(Topocomm):
    """A communicator with an MPI-1 graph topology (see the module docstring)."""

    __slots__ = ()
    _kind, _what = GRAPH, "graph "
    _graph = Topocomm._topology

    def Get_dims(self) -> tuple[int, int]:  # noqa: N802
        topo = self._graph("Get_dims")
        return len(topo.index), len(topo.edges)

    def Get_topo(self) -> tuple[list[int], list[int]]:  # noqa: N802
        topo = self._graph("Get_topo")
        return list(topo.index), list(topo.edges)

    def Get_neighbors_count(self, rank: int) -> int:  # noqa: N802
        return len(self.Get_neighbors(rank))

    def Get_neighbors(self, rank: int) -> list[int]:  # noqa: N802
        topo = self._graph("Get_neighbors")
        if not 0 <= int(rank) < len(topo.index):
            raise MPIException(ERR_RANK, f"Get_neighbors: rank must be in [0, {len(topo.index)}), got {rank}")
        return topo.of(int(rank))

    dims = property(Get_dims)
    nnodes = property(lambda self: self.Get_dims()[0])
    nedges = property(lambda self: self.Get_dims()[1])
    topo = property(Get_topo)
    index = property(lambda self: self.Get_topo()[0])
    edges = property(lambda self: self.Get_topo()[1])
    nneighbors = property(lambda self: self.Get_neighbors_count(self.Get_rank()))  # type: ignore[attr-defined]
    neighbors = property(lambda self: self.Get_neighbors(self.Get_rank()))  # type: ignore[attr-defined]


class Distgraphcomm(Topocomm):
    """A communicator with a distributed graph topology (see the module docstring)."""

    __slots__ = ()
    _kind, _what = DIST_GRAPH, "distributed graph "
    _dist = Topocomm._topology

    def Get_dist_neighbors_count(self) -> tuple[int, int, bool]:  # noqa: N802
        topo = self._dist("Get_dist_neighbors_count")
        return len(topo.sources), len(topo.destinations), topo.sourceweights is not None

    def Get_dist_neighbors(self) -> tuple[list[int], list[int], tuple[list[int], list[int]] | None]:  # noqa: N802
        topo = self._dist("Get_dist_neighbors")
        weights = None if topo.sourceweights is None else (list(topo.sourceweights), list(topo.destweights or []))
        return list(topo.sources), list(topo.destinations), weights
