"""Cartesian topologies: ``Compute_dims``, ``Create_cart`` → ``Cartcomm``.

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
members from the grid. Neighbourhood collectives and graph topologies are not provided.
"""
from __future__ import annotations

from typing import Any, Sequence

from ._comm import COMM_NULL, Comm, Intracomm
from ._consts import PROC_NULL, UNDEFINED
from ._errors import ERR_ARG, ERR_DIMS, ERR_RANK, ERR_TOPOLOGY, Exception as MPIException, not_implemented


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


def _size(dims: Sequence[int]) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


def create_cart(comm: Comm, dims: Sequence[int], periods: Sequence[bool] | None, reorder: bool) -> Comm:
    g = comm._grp("Create_cart")
    dims = [int(d) for d in dims]
    periods = [False] * len(dims) if periods is None else list(periods)
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


class Topocomm(Intracomm):
    """A communicator with a topology (only Cartesian ones here)."""

    __slots__ = ()

    def _absent(self, *args: Any, **kwargs: Any) -> Any:
        raise not_implemented("Topocomm.Neighbor_*", "neighbourhood collectives are not provided; "
                              "use Cartcomm.Shift with Sendrecv")

    Neighbor_allgather = Neighbor_allgatherv = Neighbor_alltoall = Neighbor_alltoallv = _absent
    Neighbor_alltoallw = Ineighbor_allgather = Ineighbor_allgatherv = Ineighbor_alltoall = _absent
    Ineighbor_alltoallv = Ineighbor_alltoallw = neighbor_allgather = neighbor_alltoall = _absent


class Cartcomm(Topocomm):
    """A communicator on a Cartesian grid (see the module docstring)."""

    __slots__ = ()

    def __init__(self, comm: Comm | None = None) -> None:
        super().__init__(comm)
        if comm is not None and comm._h.kind != "null" and comm._h.topo is None:
            raise TypeError("Cartcomm: expecting a communicator with a Cartesian topology")

    def _grid(self, call: str) -> _Grid:
        self._grp(call)
        grid = self._h.topo
        if grid is None:
            raise MPIException(ERR_TOPOLOGY, f"{call}: the communicator has no Cartesian topology")
        return grid

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
        me = grid.coords(self._grp().rank)

        def moved(by: int) -> int:
            c = list(me)
            c[direction] += by
            d = grid.dims[direction]
            if not grid.periods[direction] and not 0 <= c[direction] < d:
                return PROC_NULL
            return grid.rank(c, "Shift")

        return moved(-int(disp)), moved(int(disp))

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
