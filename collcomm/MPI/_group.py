"""``MPI.Group``: an ordered set of processes, named by their ranks in ``COMM_WORLD``.

Groups are local objects (no communication): ``Get_rank`` (UNDEFINED when this process is
not a member), ``Incl``/``Excl``/``Range_incl``/``Range_excl`` (ranks of this group),
``Union``/``Intersection``/``Difference`` (in MPI's order: the first group's members
first), ``Translate_ranks`` and ``Compare`` (IDENT: same members in the same order,
SIMILAR: same members, UNEQUAL). Every empty group equals ``GROUP_EMPTY``.
``comm.Create(group)`` / ``comm.Create_group(group)`` turn one into a communicator.
"""
from __future__ import annotations

from typing import Any, Sequence

from ._handles import HandleInts
from ._consts import IDENT, PROC_NULL, SIMILAR, UNDEFINED, UNEQUAL
from ._errors import ERR_ARG, ERR_GROUP, ERR_RANK, Exception as MPIException


class _GroupRec:
    __slots__ = ("members", "me", "index")

    def __init__(self, members: Sequence[int], me: int) -> None:
        self.members = tuple(int(m) for m in members)   # global (world) ranks, in group order
        self.me = me                                      # this process's global rank (-1: unknown)
        self.index = {m: i for i, m in enumerate(self.members)}


class Group(HandleInts):
    """A group of processes (see the module docstring). ``Group(g)`` refers to the same group."""

    __slots__ = ("_r",)
    _REC = "_r"

    def __new__(cls, group: Any = None) -> Any:
        # (made as mpi4py makes its handles, by __new__: a subclass's __new__(cls, group)
        # that passes group on gets the copy; __init__ then does it again)
        self = object.__new__(cls)
        Group.__init__(self, group)
        return self

    def __init__(self, group: "Group | None" = None) -> None:
        self._r: _GroupRec | None = None if group is None else group._r

    @classmethod
    def _of(cls, members: Sequence[int], me: int) -> "Group":
        g = cls()
        g._r = _GroupRec(members, me)
        return g

    def _valid(self, call: str) -> _GroupRec:
        if self._r is None:
            raise MPIException(ERR_GROUP, f"Group.{call}: the group is MPI.GROUP_NULL")
        return self._r

    # -- identity --------------------------------------------------------------------------
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Group):
            return False
        a, b = self._r, other._r
        if a is None or b is None:
            return a is b
        return a is b or (not a.members and not b.members)

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    __hash__ = None  # type: ignore[assignment]

    def __bool__(self) -> bool:
        return self._r is not None

    def __repr__(self) -> str:
        return "<collcomm.MPI.Group null>" if self._r is None else f"<collcomm.MPI.Group {list(self._r.members)}>"

    def __reduce__(self) -> Any:
        if self._r is None:
            return (Group, ())
        if not self._r.members:
            return (_empty, ())
        raise ValueError("cannot serialize a non-empty group")

    # -- queries ---------------------------------------------------------------------------
    def Get_size(self) -> int:  # noqa: N802
        return len(self._valid("Get_size").members)

    def Get_rank(self) -> int:  # noqa: N802
        r = self._valid("Get_rank")
        return r.index.get(r.me, UNDEFINED)

    size = property(Get_size)
    rank = property(Get_rank)

    def Translate_ranks(self, ranks: Sequence[int] | None = None, group: "Group | None" = None) -> list[int]:  # noqa: N802
        """The rank in ``group`` of each of ``ranks`` (ranks of this group; default all);
        UNDEFINED where a process is not in ``group``; without ``group`` the ranks themselves."""
        r = self._valid("Translate_ranks")
        ranks = list(range(len(r.members))) if ranks is None else [int(x) for x in ranks]
        out = []
        for x in ranks:
            if x == PROC_NULL:
                out.append(PROC_NULL)
                continue
            if not 0 <= x < len(r.members):
                raise MPIException(ERR_RANK, f"Group.Translate_ranks: rank {x} is not in [0, {len(r.members)})")
            if group is None:
                out.append(x)
            else:
                out.append(group._valid("Translate_ranks").index.get(r.members[x], UNDEFINED))
        return out

    def Compare(self, group: "Group") -> int:  # noqa: N802
        a, b = self._valid("Compare"), group._valid("Compare")
        if a.members == b.members:
            return IDENT
        return SIMILAR if set(a.members) == set(b.members) else UNEQUAL

    # -- new groups ------------------------------------------------------------------------
    def Dup(self) -> "Group":  # noqa: N802
        r = self._valid("Dup")
        return Group._of(r.members, r.me)

    def _pick(self, ranks: Sequence[int], call: str) -> list[int]:
        r = self._valid(call)
        out = [int(x) for x in ranks]
        bad = [x for x in out if not 0 <= x < len(r.members)]
        if bad or len(set(out)) != len(out):
            raise MPIException(ERR_RANK, f"Group.{call}: ranks must be distinct ranks of the group in "
                                         f"[0, {len(r.members)}), got {out}")
        return out

    def Incl(self, ranks: Sequence[int]) -> "Group":  # noqa: N802
        r = self._valid("Incl")
        return Group._of([r.members[x] for x in self._pick(ranks, "Incl")], r.me)

    def Excl(self, ranks: Sequence[int]) -> "Group":  # noqa: N802
        r = self._valid("Excl")
        drop = set(self._pick(ranks, "Excl"))
        return Group._of([m for i, m in enumerate(r.members) if i not in drop], r.me)

    @staticmethod
    def _ranges(triplets: Sequence[tuple[int, int, int]], call: str) -> list[int]:
        out: list[int] = []
        for first, last, stride in triplets:
            if stride == 0:
                raise MPIException(ERR_ARG, f"Group.{call}: stride 0 in range ({first}, {last}, 0)")
            out += list(range(first, last + (1 if stride > 0 else -1), stride))
        return out

    def Range_incl(self, ranks: Sequence[tuple[int, int, int]]) -> "Group":  # noqa: N802
        return self.Incl(self._ranges(ranks, "Range_incl"))

    def Range_excl(self, ranks: Sequence[tuple[int, int, int]]) -> "Group":  # noqa: N802
        return self.Excl(self._ranges(ranks, "Range_excl"))

    @classmethod
    def Union(cls, group1: "Group", group2: "Group") -> "Group":  # noqa: N802
        a, b = group1._valid("Union"), group2._valid("Union")
        return cls._of(list(a.members) + [m for m in b.members if m not in a.index], max(a.me, b.me))

    @classmethod
    def Intersection(cls, group1: "Group", group2: "Group") -> "Group":  # noqa: N802
        a, b = group1._valid("Intersection"), group2._valid("Intersection")
        return cls._of([m for m in a.members if m in b.index], max(a.me, b.me))

    Intersect = Intersection

    @classmethod
    def Difference(cls, group1: "Group", group2: "Group") -> "Group":  # noqa: N802
        a, b = group1._valid("Difference"), group2._valid("Difference")
        return cls._of([m for m in a.members if m not in b.index], max(a.me, b.me))

    def Free(self) -> None:  # noqa: N802
        self._valid("Free")
        self._r = None

    free = Free


GROUP_NULL = Group()
GROUP_EMPTY = Group._of((), -1)


def _empty() -> Group:
    return GROUP_EMPTY
