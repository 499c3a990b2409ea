"""Cartesian topologies: ``Compute_dims``, ``Create_cart`` → ``Cartcomm``; ``Topocomm``, the
base of every topology communicator (graph ones: :mod:`._graph`).

A Cartcomm is a communicator whose ranks are laid out row-major on a grid ``dims`` (the
last dimension varies fastest), each dimension periodic or not. ``Get_coords`` /
``Get_cart_rank`` convert, ``Shift(direction, disp)`` gives the (source, dest) pair of a
shift (``PROC_NULL`` off a non-periodic edge), ``Sub(remain_dims)`` gives the
communicator of the grid line/plane through this rank (the ranks that share its
coordinates in the dropped dimensions). This is how MPI lays out a TP × CP × PP × DP grid:
``cart = comm.Create_cart([dp, pp, cp, tp])``, then ``cart.Sub([False, False, False,
True])`` is this rank's TP group.

collcomm keeps rank order (``reorder`` is accepted and ignored); ranks beyond the grid get
``COMM_NULL``. Creating a Cartcomm or a Sub needs no messages: every rank computes the
members from the grid.

A topology's neighbours (``Topocomm.inedges`` / ``outedges``, the neighbourhood
collectives of :mod:`._neighbor`): on a grid, per dimension the rank one step down then
the rank one step up (``Shift(d, 1)``; ``PROC_NULL`` past a non-periodic edge, this rank
itself along a periodic dimension of size 1), in and out alike. Each neighbour edge has a
*key* that pairs a send with the receive it fills: a block sent one step up lands in the
receiver's slot for its neighbour one step down, so on a periodic dimension of size 2
(the same rank both ways) the two blocks still cross as a shift would carry them, as
Open MPI does.
"""
from __future__ import annotations

from typing import Any, Sequence

from ..core.tags import make_ctx
from ._comm import COMM_NULL, Comm, Intracomm
from ._consts import CART, PROC_NULL, UNDEFINED
from ._errors import ERR_ARG, ERR_DIMS, ERR_RANK, ERR_TOPOLOGY, Exception as MPIException
from ._neighbor import NeighborCollectives
from ._neighbor_exchange import Neighborhood, Neighbors, Plan


def _factors(n: int) -> list[int]:
    out, p = [], 2
    while p * p <= n:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    if n > 1:
        out.append(n)
    return out


def Compute_dims(nnodes: int, dims: int | Sequence[int]) -> list[int]:  # noqa: N802
    """A balanced grid of ``nnodes`` processes: the zero entries of ``dims`` (or ``dims``
    free dimensions) filled so the sizes are as close as possible, largest first."""
    dims = [0] * int(dims) if isinstance(dims, int) else [int(d) for d in dims]
    nnodes = int(nnodes)
    if nnodes < 1 or any(d < 0 for d in dims):
        raise MPIException(ERR_DIMS, f"Compute_dims: nnodes must be >= 1 and dims >= 0, got {nnodes}, {dims}")
    fixed = 1
    for d in dims:
        fixed *= d or 1
    free = [i for i, d in enumerate(dims) if d == 0]
    if nnodes % fixed or (not free and fixed != nnodes):
        raise MPIException(ERR_DIMS, f"Compute_dims: {nnodes} processes do not fit the fixed dimensions {dims}")
    if not free:
        return dims
    sizes = [1] * len(free)
    for p in sorted(_factors(nnodes // fixed), reverse=True):
        sizes[sizes.index(min(sizes))] *= p
    for i, s in zip(free, sorted(sizes, reverse=True)):
        dims[i] = s
    return dims


class _Grid:
    __slots__ = ("dims", "periods")
    kind = CART

    def __init__(self, dims: Sequence[int], periods: Sequence[bool]) -> None:
        self.dims = [int(d) for d in dims]
        self.periods = [bool(p) for p in periods]

    def coords(self, rank: int) -> list[int]:
        out = []
        for d in reversed(self.dims):
            out.append(rank % d)
            rank //= d
        return out[::-1]

    def rank(self, coords: Sequence[int], call: str) -> int:
        if len(coords) != len(self.dims):
            raise MPIException(ERR_ARG, f"{call}: expecting {len(self.dims)} coordinates, got {len(coords)}")
        r = 0
        for c, d, p in zip(coords, self.dims, self.periods):
            c = int(c)
            if p:
                c %= d
            elif not 0 <= c < d:
                raise MPIException(ERR_ARG, f"{call}: coordinate {c} is outside the non-periodic dimension of size {d}")
            r = r * d + c
        return r

    def shifted(self, rank: int, direction: int, by: int) -> int:
        """The rank ``by`` steps along ``direction`` from ``rank`` (PROC_NULL off an edge)."""
        c = self.coords(rank)
        c[direction] += by
        if not self.periods[direction] and not 0 <= c[direction] < self.dims[direction]:
            return PROC_NULL
        return self.rank(c, "Shift")

    def neighbors(self, rank: int, call: str = "") -> Neighbors:
        """Down then up along each dimension, in and out; keys (dimension, direction of
        travel: 0 down, 1 up): the slot for the neighbour down receives what it sent up."""
        ranks: list[int] = []
        for d in range(len(self.dims)):
            ranks += [self.shifted(rank, d, -1), self.shifted(rank, d, 1)]
        sent = [(d, way) for d in range(len(self.dims)) for way in (0, 1)]
        return Neighbors(ranks, ranks, [(d, 1 - way) for d, way in sent], sent)


def _size(dims: Sequence[int]) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


def create_cart(comm: Comm, dims: Sequence[int], periods: Sequence[bool] | None, reorder: bool) -> Comm:
    g = comm._grp("Create_cart")
    dims = [int(d) for d in dims]
    if periods is None or isinstance(periods, (bool, int)):    # (one for every dimension, as mpi4py)
        periods = [bool(periods)] * len(dims)
    periods = list(periods)
    if any(d <= 0 for d in dims) or len(periods) != len(dims):
        raise MPIException(ERR_ARG, f"Create_cart: dims must be positive with one period each, got {dims}, {periods}")
    n = _size(dims)
    if n > g.size:
        raise MPIException(ERR_ARG, f"Create_cart: a {dims} grid needs {n} processes, the communicator has {g.size}")
    ctx = comm._h.next_ctx("cart", tuple(dims))
    if g.rank >= n:
        return Intracomm(COMM_NULL)
    return comm._derive(g.subgroup(g.ranks[:n], ctx, f"{g.name}.cart"), "", _Grid(dims, periods))


def cart_map(comm: Comm, dims: Sequence[int]) -> int:
    g = comm._grp("Cart_map")
    return g.rank if g.rank < _size(dims) else UNDEFINED


class Topocomm(NeighborCollectives, Intracomm):
    """A communicator with a topology: its neighbours and the neighbourhood collectives."""

    __slots__ = ()
    _kind: int | None = None     # the topology a subclass stands for (None: any), and its name
    _what = ""

    def __init__(self, comm: Comm | None = None) -> None:
        super().__init__(comm)
        if comm is not None and comm._h.kind != "null" and not self._fits(comm._h.topo):
            raise TypeError(f"{type(self).__name__}: expecting a communicator with a {self._what}topology")

    def _fits(self, topo: Any) -> bool:
        return topo is not None and (self._kind is None or topo.kind == self._kind)

    def _topology(self, call: str) -> Any:
        """The communicator's topology (_Grid, _Graph, _DistGraph), of this class's kind."""
        self._grp(call)
        topo = self._h.topo
        if not self._fits(topo):
            raise MPIException(ERR_TOPOLOGY, f"{call}: the communicator has no {self._what}topology")
        return topo

    def _neighbor_plan(self, call: str) -> Neighborhood:
        """This communicator's neighbourhood calls: the hidden twin they talk on and this
        rank's plan, made on first use (the twin's context derives from this communicator's,
        so every rank makes the same one without a message: :mod:`._neighbor_exchange`)."""
        g = self._grp(call)
        h = self._h
        nbh = h.neighbor
        if nbh is None:
            plan = Plan(self._neighbors(call), g.rank, call)
            with h.lock:
                if h.neighbor is None:
                    twin = Intracomm._wrap(type(h)(g.subgroup(g.ranks, make_ctx("mpi-neighbor", g.ctx),
                                                              f"{g.name}.neighbor"), "derived"))
                    h.neighbor = Neighborhood(twin, plan, g)
                nbh = h.neighbor
        return nbh

    def _neighbor_call(self) -> int:
        """This call's number on the communicator (after _neighbor_plan), as its tag base."""
        h = self._h
        with h.lock:
            return h.neighbor.take()

    def _neighbors(self, call: str) -> Neighbors:
        topo = self._h.topo
        if topo is None:     # (any kind: Topocomm._topology would take the subclass's)
            raise MPIException(ERR_TOPOLOGY, f"{call}: the communicator has no topology")
        return topo.neighbors(self._grp(call).rank, call)

    @property
    def degrees(self) -> tuple[int, int]:
        nb = self._neighbors("degrees")
        return len(nb.sources), len(nb.destinations)

    indegree = property(lambda self: self.degrees[0])
    outdegree = property(lambda self: self.degrees[1])

    @property
    def inoutedges(self) -> tuple[list[int], list[int]]:
        nb = self._neighbors("inoutedges")
        return list(nb.sources), list(nb.destinations)

    inedges = property(lambda self: self.inoutedges[0])
    outedges = property(lambda self: self.inoutedges[1])


class Cartcomm(Topocomm):
    """A communicator on a Cartesian grid (see the module docstring)."""

    __slots__ = ()
    _kind, _what = CART, "Cartesian "
    _grid = Topocomm._topology

    def Get_dim(self) -> int:  # noqa: N802
        return len(self._grid("Get_dim").dims)

    dim = ndim = property(Get_dim)

    def Get_topo(self) -> tuple[list[int], list[int], list[int]]:  # noqa: N802
        grid = self._grid("Get_topo")
        return list(grid.dims), [int(p) for p in grid.periods], grid.coords(self._grp().rank)

    topo = property(Get_topo)
    dims = property(lambda self: self.Get_topo()[0])
    periods = property(lambda self: self.Get_topo()[1])
    coords = property(lambda self: self.Get_topo()[2])

    def Get_cart_rank(self, coords: Sequence[int]) -> int:  # noqa: N802
        return self._grid("Get_cart_rank").rank(coords, "Get_cart_rank")

    def Get_coords(self, rank: int) -> list[int]:  # noqa: N802
        grid, g = self._grid("Get_coords"), self._grp()
        if not 0 <= rank < g.size:
            raise MPIException(ERR_RANK, f"Get_coords: rank must be in [0, {g.size}), got {rank}")
        return grid.coords(int(rank))

    def Shift(self, direction: int, disp: int) -> tuple[int, int]:  # noqa: N802
        """(the rank that sends to this one, the rank this one sends to) for a shift of
        ``disp`` along ``direction``; PROC_NULL past a non-periodic edge."""
        grid = self._grid("Shift")
        if not 0 <= direction < len(grid.dims):
            raise MPIException(ERR_DIMS, f"Shift: direction must be in [0, {len(grid.dims)}), got {direction}")
        me = self._grp().rank
        return grid.shifted(me, direction, -int(disp)), grid.shifted(me, direction, int(disp))

    def Sub(self, remain_dims: Sequence[bool]) -> "Cartcomm":  # noqa: N802
        """The grid slice through this rank keeping the dimensions marked True."""
        grid, g = self._grid("Sub"), self._grp()
        keep = [bool(k) for k in remain_dims]
        if len(keep) != len(grid.dims):
            raise MPIException(ERR_ARG, f"Sub: expecting {len(grid.dims)} flags, got {len(keep)}")
        me = grid.coords(g.rank)
        members = [g.ranks[r] for r in range(g.size)
                   if all(k or c == m for k, c, m in zip(keep, grid.coords(r), me))]
        fixed = tuple(m for k, m in zip(keep, me) if not k)
        ctx = self._h.next_ctx("sub", tuple(keep), fixed)
        sub = _Grid([d for k, d in zip(keep, grid.dims) if k], [p for k, p in zip(keep, grid.periods) if k])
        return self._derive(g.subgroup(members, ctx, f"{g.name}.sub"), "", sub)  # type: ignore[return-value]
