"""Groups made several at a time, as torch.distributed makes them: ``new_subgroups``,
``new_subgroups_by_enumeration`` and ``split_group``.

* ``new_subgroups(group_size)``: the world (or ``group``) cut into consecutive blocks of
  ``group_size`` ranks; every rank of it calls, and gets ``(its block, every block)``.
  Without ``group_size`` a block is a host's ranks (torch's default is a host's GPUs).
* ``new_subgroups_by_enumeration(ranks_per_subgroup_list)``: groups of the given global
  ranks, a rank in at most one; ``(its group or None, every group)``.
* ``split_group(parent_pg, split_ranks)``: the parent's ranks (ranks *of the parent*) split
  into disjoint groups; every rank of the parent calls and gets its own group, or None.

Each group is one :func:`collcomm.new_group`: with the world as the parent every rank of
the world makes every group (as torch does); with another parent only its members call,
so the groups are made with ``use_local_synchronization`` (named by their ranks). Bad
arguments raise :class:`~collcomm.errors.InvalidArgumentError` (a ``ValueError``, as
torch raises) on every rank that passes them, before any group is made.
"""
from __future__ import annotations

from typing import Any, Sequence

from .api_args import group_of, group_text, is_member
from .core import runtime
from .errors import InvalidArgumentError

__all__ = ["new_subgroups", "new_subgroups_by_enumeration", "split_group"]


def _parent(group: Any, call: str) -> Any:
    g = group_of(group, call)
    if not is_member(g):
        raise InvalidArgumentError(f"{call}: {group_text(g)}: this rank is not in the group")
    return g


def _make(g: Any, ranks: list[int], timeout: Any, backend: Any, pg_options: Any, desc: Any) -> Any:
    local = g.size != runtime.get_world("new_group").size      # (a parent other than the world)
    return runtime.new_group(ranks, timeout=timeout, backend=backend, pg_options=pg_options,
                             use_local_synchronization=local, group_desc=desc)


def new_subgroups(group_size: int | None = None, group: Any = None, timeout: Any = None,
                  backend: Any = None, pg_options: Any = None, group_desc: str | None = None
                  ) -> tuple[Any, list[Any]]:
    """``(this rank's block, every block)`` of ``group`` (default the world) cut into
    consecutive blocks of ``group_size`` ranks (default: the ranks of one host)."""
    g = _parent(group, "new_subgroups")
    if group_size is None:
        group_size = g.hosts.count(g.hosts[g.rank])
    if not isinstance(group_size, int) or isinstance(group_size, bool) or group_size <= 0:
        raise InvalidArgumentError(f"new_subgroups: group_size must be a positive integer, got {group_size!r}")
    if group_size > g.size or g.size % group_size:
        raise InvalidArgumentError(f"new_subgroups on {g.describe()}: group_size {group_size} must divide "
                                   f"the group's size {g.size}")
    blocks = [[g.to_global(r) for r in range(i, i + group_size)] for i in range(0, g.size, group_size)]
    made = [_make(g, ranks, timeout, backend, pg_options, group_desc) for ranks in blocks]
    return made[g.rank // group_size], made


def new_subgroups_by_enumeration(ranks_per_subgroup_list: Sequence[Sequence[int]], timeout: Any = None,
                                 backend: Any = None, pg_options: Any = None,
                                 group_desc: str | None = None) -> tuple[Any, list[Any]]:
    """``(this rank's group or None, every group)`` of the given lists of global ranks."""
    g = _parent(None, "new_subgroups_by_enumeration")
    lists = _disjoint(ranks_per_subgroup_list, g.size, "new_subgroups_by_enumeration", "global")
    made = [_make(g, ranks, timeout, backend, pg_options, group_desc) for ranks in lists]
    mine = next((m for m, ranks in zip(made, lists) if g.rank in ranks), None)
    return mine, made


def split_group(parent_pg: Any = None, split_ranks: Sequence[Sequence[int]] | None = None,
                timeout: Any = None, pg_options: Any = None, group_desc: str | None = None,
                backend: Any = None) -> Any:
    """This rank's group among ``split_ranks`` (lists of ranks of ``parent_pg``, disjoint);
    None if it is in none of them."""
    g = _parent(parent_pg, "split_group")
    if split_ranks is None:
        raise InvalidArgumentError("split_group: split_ranks must be given (lists of the parent's ranks)")
    lists = _disjoint(split_ranks, g.size, "split_group", "parent group")
    mine = next((ranks for ranks in lists if g.rank in ranks), None)
    if mine is None:
        return None
    return runtime.new_group([g.to_global(r) for r in mine], timeout=timeout, backend=backend,
                             pg_options=pg_options, use_local_synchronization=True, group_desc=group_desc)


def _disjoint(lists: Any, size: int, call: str, kind: str) -> list[list[int]]:
    """The lists as lists of ints in [0, size), no rank in two of them."""
    out: list[list[int]] = []
    seen: dict[int, int] = {}
    for i, ranks in enumerate(lists):
        row = [int(r) for r in ranks]
        if not row:
            raise InvalidArgumentError(f"{call}: subgroup {i} is empty")
        for r in row:
            if not 0 <= r < size:
                raise InvalidArgumentError(f"{call}: rank {r} of subgroup {i} is not a {kind} rank "
                                           f"(there are {size})")
            if r in seen:
                raise InvalidArgumentError(f"{call}: rank {r} is in subgroup {seen[r]} and in subgroup {i}")
            seen[r] = i
        out.append(row)
    return out
