"""Communicators: ``Comm``, ``Intracomm``, ``COMM_WORLD``, ``COMM_SELF``, ``COMM_NULL``.

A communicator is a handle (:class:`_CommRec`) on a core
:class:`~collcomm.core.group.ProcessGroup`; its ranks are the group's local ranks and its
messages live in the group's private tag space. ``Comm(c)`` makes another Python object
on the same handle (``==`` compares handles, as in mpi4py). ``COMM_WORLD`` and
``COMM_SELF`` bind to their groups on first use (see :mod:`._env`).

New communicators are new groups: ``Dup``/``Clone``/``Idup`` (same members), ``Create``
(members of a group, COMM_NULL elsewhere), ``Create_group`` (only the members call it),
``Split`` / ``Split_type`` (the core's MPI_Comm_split; ``COMM_TYPE_SHARED`` splits by
host) and ``Create_cart`` (:mod:`._topo`). Calls that every rank of the parent makes get
their group's context id from the parent's context and a count of such calls, so no
message is needed to agree on it; ``Split`` exchanges (color, key) through the core.

The methods that move data come from mixins: point to point (:mod:`._p2p`), buffer
collectives (:mod:`._coll`) and object collectives (:mod:`._cobj`).
"""
from __future__ import annotations

import threading
from typing import Any, Callable

from ..core.group import ProcessGroup
from ..core.tags import make_ctx
from ..errors import CollcommError
from . import _env
from ._handles import CommHandleInts
from ._attrs import _KEYVALS, Attributes
from ._request import ORPHANS, reap_orphans
from ._cobj import ObjectCollectives
from ._coll_persistent import PersistentCollectives
from ._coll_scan import ScanCollectives
from ._collv import VectorCollectives
from ._consts import CART, CONGRUENT, DIST_GRAPH, GRAPH, IDENT, SIMILAR, UNDEFINED, UNEQUAL
from ._errors import ERR_ARG, ERR_COMM, ERR_GROUP, Exception as MPIException, not_implemented, translate
from ._group import Group
from ._misc import ERRORS_RETURN, Errhandler, Info, INFO_NULL
from ._p2p import PointToPoint
from ._pobj import ObjectPointToPoint
from ._request import Done, Request


class _CommRec:
    """The handle: what every Python object of one communicator shares."""

    __slots__ = ("g", "kind", "name", "topo", "attrs", "derived", "tagged", "group", "errhandler",
                 "info", "lock", "neighbor")

    def __init__(self, g: ProcessGroup | None, kind: str, name: str = "", topo: Any = None) -> None:
        self.g, self.kind, self.name, self.topo = g, kind, name, topo
        self.attrs: dict[int, Any] = {}
        self.derived = 0                      # collective creations so far (context ids)
        self.tagged: dict[Any, int] = {}      # Create_group calls per (tag, members)
        self.group: Group | None = None
        self.errhandler = ERRORS_RETURN
        self.info = INFO_NULL
        self.lock = threading.Lock()
        self.neighbor: Any = None   # a topology's neighbour calls (_neighbor_exchange.Neighborhood)

    def resolve(self, call: str) -> ProcessGroup:
        if self.kind == "world":
            self.g = _env.world_group(call)
        elif self.kind == "self":
            world = _env.world_group(call)
            self.g = world.subgroup([world.global_rank], make_ctx("mpi-self", world.global_rank), "SELF")
        elif self.kind == "null":
            raise MPIException(ERR_COMM, f"{call}: the communicator is MPI.COMM_NULL")
        else:
            raise MPIException(ERR_COMM, f"{call}: the communicator was freed or its job was left")
        assert self.g is not None
        return self.g

    def next_ctx(self, what: str, *extra: Any) -> int:
        g = self.g
        assert g is not None
        with self.lock:
            self.derived += 1
            return make_ctx("mpi", what, g.ctx, self.derived, *extra)


_NAMED: dict[str, "Comm"] = {}


class Comm(PointToPoint, ObjectPointToPoint, PersistentCollectives, VectorCollectives, ObjectCollectives,
           Attributes, CommHandleInts):
    """A communicator (see the module docstring)."""

    __slots__ = ("_h",)
    def __new__(cls, comm: Any = None) -> Any:
        # (made as mpi4py makes its handles, by __new__: a subclass's __new__(cls, comm)
        # that passes comm on gets the copy; __init__ then does it again)
        self = object.__new__(cls)
        Comm.__init__(self, comm)
        return self

    def __init__(self, comm: "Comm | None" = None) -> None:
        self._h: _CommRec = _NULL_REC if comm is None else comm._h

    # -- the group underneath ---------------------------------------------------------------
    def _grp(self, call: str = "Comm") -> ProcessGroup:
        g = self._h.g
        if g is None or g._closed:
            g = self._h.resolve(call)
        if ORPHANS:                 # (freed receives of derived types: unpacked once in)
            reap_orphans()
        return g

    @staticmethod
    def _call(fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except CollcommError as exc:
            raise translate(exc) from exc

    @staticmethod
    def _wrap(rec: _CommRec) -> "Comm":
        if rec.topo is not None:
            from ._graph import Distgraphcomm, Graphcomm
            from ._topo import Cartcomm
            cls = {CART: Cartcomm, GRAPH: Graphcomm, DIST_GRAPH: Distgraphcomm}[rec.topo.kind]
            c: Comm = cls.__new__(cls)
        else:
            c = Intracomm.__new__(Intracomm)
        c._h = rec
        return c

    def _derive(self, g: Any, name: str = "", topo: Any = None) -> "Comm":
        if not isinstance(g, ProcessGroup):
            return Intracomm(COMM_NULL)
        rec = _CommRec(g, "derived", name, topo)
        for keyval, value in self._h.attrs.items():     # MPI: attributes copied by copy_fn
            copy_fn = _KEYVALS.get(keyval, (None, None))[0]
            if copy_fn is not None:
                new = copy_fn(self, keyval, value)
                if new is not NotImplemented:
                    rec.attrs[keyval] = new
        return self._wrap(rec)

    # -- identity ----------------------------------------------------------------------------
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Comm):
            return False
        a, b = self._h, other._h
        return a is b or (a.kind == "null" and b.kind == "null")

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    __hash__ = None  # type: ignore[assignment]

    def __bool__(self) -> bool:
        return self._h.kind != "null"

    def __repr__(self) -> str:
        return f"<collcomm.MPI.{type(self).__name__} {self._h.name or self._h.kind}>"

    def __reduce__(self) -> Any:
        for name in ("COMM_WORLD", "COMM_SELF", "COMM_NULL"):
            if self._h is _NAMED[name]._h or (name == "COMM_NULL" and self._h.kind == "null"):
                return (_named, (name,))
        raise ValueError(f"cannot serialize the communicator {self!r} (only COMM_WORLD, COMM_SELF "
                         "and COMM_NULL pickle)")

    # -- size, rank, group, name ---------------------------------------------------------------
    def Get_size(self) -> int:  # noqa: N802
        return self._grp("Get_size").size

    def Get_rank(self) -> int:  # noqa: N802
        return self._grp("Get_rank").rank

    size = property(Get_size)
    rank = property(Get_rank)

    def Get_group(self) -> Group:  # noqa: N802
        g = self._grp("Get_group")
        if self._h.group is None:
            self._h.group = Group._of(g.ranks, g.global_rank)
        return Group(self._h.group)

    group = property(Get_group)

    def Get_name(self) -> str:  # noqa: N802
        if self._h.kind == "null":
            raise MPIException(ERR_COMM, "Get_name: the communicator is MPI.COMM_NULL")
        return self._h.name

    def Set_name(self, name: str) -> None:  # noqa: N802
        if self._h.kind == "null":
            raise MPIException(ERR_COMM, "Set_name: the communicator is MPI.COMM_NULL")
        self._h.name = str(name)

    name = property(Get_name, Set_name)

    def Compare(self, comm: "Comm") -> int:  # noqa: N802
        if self._h is comm._h:
            return IDENT
        a, b = self._grp("Compare").ranks, comm._grp("Compare").ranks
        if a == b:
            return CONGRUENT
        return SIMILAR if set(a) == set(b) else UNEQUAL

    # -- kinds and topology ---------------------------------------------------------------------
    def Is_inter(self) -> bool:  # noqa: N802
        self._grp("Is_inter")
        return False

    def Is_intra(self) -> bool:  # noqa: N802
        return not self.Is_inter()

    is_inter = property(Is_inter)
    is_intra = property(Is_intra)

    def Get_topology(self) -> int:  # noqa: N802
        self._grp("Get_topology")
        return getattr(self._h.topo, "kind", UNDEFINED)     # CART, GRAPH, DIST_GRAPH

    topology = property(Get_topology)
    is_topo = property(lambda self: self.Get_topology() != UNDEFINED)

    # -- new communicators -----------------------------------------------------------------------
    def Dup(self, info: Info | None = None) -> "Comm":  # noqa: N802
        g = self._grp("Dup")
        new = self._derive(g.subgroup(g.ranks, self._h.next_ctx("dup"), f"{g.name}.dup"), "", self._h.topo)
        cls = type(self)
        if cls is not type(new) and isinstance(self, type(new)):   # (a subclass's Dup is of its
            copy = cls.__new__(cls)                                  # class, as mpi4py's)
            copy._h = new._h
            return copy
        return new

    def Clone(self) -> "Comm":  # noqa: N802
        return self.Dup()

    def Dup_with_info(self, info: Info) -> "Comm":  # noqa: N802
        return self.Dup(info)

    def Idup(self, info: Info | None = None) -> tuple["Comm", Request]:  # noqa: N802
        new = self.Dup(info)
        r = Request()
        r._op = Done(new)
        return new, r

    def Idup_with_info(self, info: Info) -> tuple["Comm", Request]:  # noqa: N802
        return self.Idup(info)

    def _members(self, group: Group, call: str) -> list[int]:
        g = self._grp(call)
        members = list(group._valid(call).members)
        outside = [m for m in members if m not in g.ranks]
        if outside:
            raise MPIException(ERR_GROUP, f"{call}: processes {outside} (world ranks) of the group are "
                                          f"not in this communicator")
        return members

    def Create(self, group: Group) -> "Comm":  # noqa: N802
        """Collective: the members of ``group`` get a communicator, the others COMM_NULL."""
        members = self._members(group, "Create")
        g = self._grp("Create")
        ctx = self._h.next_ctx("create", tuple(members))
        if not members:
            return Intracomm(COMM_NULL)
        return self._derive(g.subgroup(members, ctx, f"{g.name}.create"))

    def Create_group(self, group: Group, tag: int = 0) -> "Comm":  # noqa: N802
        """Collective over the members of ``group`` only (the others do not call it)."""
        members = self._members(group, "Create_group")
        g = self._grp("Create_group")
        if g.global_rank not in members:
            raise MPIException(ERR_GROUP, "Create_group: this process is not in the group")
        key = (int(tag), tuple(members))
        with self._h.lock:
            self._h.tagged[key] = k = self._h.tagged.get(key, 0) + 1
        return self._derive(g.subgroup(members, make_ctx("mpi-create-group", g.ctx, key, k), f"{g.name}.group"))

    def Split(self, color: int = 0, key: int = 0) -> "Comm":  # noqa: N802
        """Ranks of one ``color`` form a communicator ordered by (``key``, rank);
        ``color=UNDEFINED`` gives COMM_NULL."""
        g = self._grp("Split")
        if color != UNDEFINED and int(color) < 0:
            raise MPIException(ERR_ARG, f"Split: color must be >= 0 or MPI.UNDEFINED, got {color}")
        sub = self._call(lambda: g.split(None if color == UNDEFINED else int(color), int(key)))
        return self._derive(sub) if sub is not None else Intracomm(COMM_NULL)

    def Split_type(self, split_type: int, key: int = 0, info: Info = INFO_NULL) -> "Comm":  # noqa: N802
        """``COMM_TYPE_SHARED`` (and the other COMM_TYPE_*): the ranks of each host."""
        g = self._grp("Split_type")
        if split_type == UNDEFINED:
            return self.Split(UNDEFINED, key)
        hosts = list(dict.fromkeys(g.hosts))
        return self.Split(hosts.index(g.hosts[g.rank]), key)

    def Free(self) -> None:  # noqa: N802
        h = self._h
        if h.kind in ("world", "self") or h.kind == "null":
            raise MPIException(ERR_COMM, f"Free: {h.name or 'MPI_COMM_NULL'} cannot be freed")
        g, h.g, h.kind = h.g, None, "null"
        nbh, h.neighbor = h.neighbor, None
        try:
            if nbh is not None:
                nbh.free()
        finally:
            if g is not None:
                g.close()

    free = Free

    def Disconnect(self) -> None:  # noqa: N802
        self.Free()

    def Abort(self, errorcode: int = 0) -> None:  # noqa: N802
        """End the job: this process exits at once with ``errorcode``; the launcher stops
        the others (and they see it lost within a second)."""
        _env.abort(errorcode)

    # -- dynamic processes: out of scope ---------------------------------------------------------
    @classmethod
    def Get_parent(cls) -> "Comm":  # noqa: N802
        """No process of a collcomm job was spawned: always COMM_NULL."""
        from ._absent import Intercomm
        return Intercomm(COMM_NULL)

    @classmethod
    def Join(cls, fd: int) -> "Comm":  # noqa: N802
        raise not_implemented("Comm.Join", "dynamic process management is out of scope")


class Intracomm(Comm, ScanCollectives):
    """A communicator of one group (every collcomm communicator is one)."""

    __slots__ = ()

    def __init__(self, comm: Comm | None = None) -> None:
        super().__init__(comm)

    def Create_cart(self, dims: Any, periods: Any = None, reorder: bool = False) -> "Comm":  # noqa: N802
        from ._topo import create_cart
        return create_cart(self, dims, periods, reorder)

    def Cart_map(self, dims: Any, periods: Any = None) -> int:  # noqa: N802
        from ._topo import cart_map
        return cart_map(self, dims)

    @classmethod
    def Create_from_group(cls, group: Group, stringtag: str = "org.mpi4py", info: Info = INFO_NULL,  # noqa: N802
                          errhandler: Errhandler | None = None) -> "Comm":
        """Collective over the members of ``group``: a communicator of them."""
        world = COMM_WORLD._grp("Create_from_group")
        members = list(group._valid("Create_from_group").members)
        if world.global_rank not in members:
            raise MPIException(ERR_GROUP, "Create_from_group: this process is not in the group")
        return COMM_WORLD._derive(world.subgroup(members, make_ctx("mpi-from-group", str(stringtag), tuple(members)),
                                                 str(stringtag)))

    def Create_graph(self, index: Any, edges: Any, reorder: bool = False) -> "Comm":  # noqa: N802
        from ._graph import create_graph
        return create_graph(self, index, edges, reorder)

    def Graph_map(self, index: Any, edges: Any) -> int:  # noqa: N802
        from ._graph import graph_map
        return graph_map(self, index, edges)

    def Create_dist_graph_adjacent(self, sources: Any, destinations: Any, sourceweights: Any = None,  # noqa: N802
                                   destweights: Any = None, info: Info = INFO_NULL, reorder: bool = False) -> "Comm":
        from ._graph import create_dist_graph_adjacent
        return create_dist_graph_adjacent(self, sources, destinations, sourceweights, destweights)

    def Create_dist_graph(self, sources: Any, degrees: Any, destinations: Any, weights: Any = None,  # noqa: N802
                          info: Info = INFO_NULL, reorder: bool = False) -> "Comm":
        from ._graph import create_dist_graph
        return create_dist_graph(self, sources, degrees, destinations, weights)

    def _absent(self, *args: Any, **kwargs: Any) -> Any:
        raise not_implemented("Intracomm.Create_intercomm/Spawn/Accept/Connect",
                              "intercommunicators and dynamic processes are out of scope")

    Create_intercomm = Spawn = Spawn_multiple = Accept = Connect = _absent


def _named(name: str) -> Comm:
    return _NAMED[name]


_NULL_REC = _CommRec(None, "null", "MPI_COMM_NULL")
COMM_NULL = Comm()
COMM_WORLD = Intracomm()
COMM_WORLD._h = _CommRec(None, "world", "MPI_COMM_WORLD")
COMM_SELF = Intracomm()
COMM_SELF._h = _CommRec(None, "self", "MPI_COMM_SELF")
_NAMED.update(COMM_WORLD=COMM_WORLD, COMM_SELF=COMM_SELF, COMM_NULL=COMM_NULL)
