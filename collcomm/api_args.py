"""Argument helpers the functional front ends share (:mod:`collcomm.api`,
:mod:`collcomm.api_p2p`, :mod:`collcomm.objects`): the group a call runs on, whether this
rank is in it, and torch's rank arguments (a global ``src``/``dst``/``peer`` or a
``group_src``/``group_dst``/``group_peer``) turned into a rank of the group, each refused
with an :class:`~collcomm.errors.InvalidArgumentError` naming the call and the group.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .core import runtime
from .core.group import ProcessGroup
from .errors import InvalidArgumentError

__all__ = ["group_of", "group_text", "is_member", "local_rank", "no_list_here", "p2p_group", "p2p_peer"]


def group_of(group: Any, collective: str) -> Any:
    """The group ``collective`` runs on (``None``: the world); raises before init."""
    world = runtime._world         # the common cases without resolve_group's calls (the
    if world is not None:          # same checks: initialised, a live group)
        if group is None:
            return world
        if type(group) is ProcessGroup and not group._closed:
            return group
    return runtime.resolve_group(group, collective)


def is_member(g: Any) -> bool:
    """Whether this rank belongs to ``g`` (torch: ranks outside a group skip its calls)."""
    return isinstance(g, ProcessGroup)


def group_text(g: Any) -> str:
    """``g`` as error messages name it, or this rank as a non-member."""
    if is_member(g):
        return g.describe()
    world = runtime.get_world("collcomm")
    return f"global rank {world.global_rank} (not a member of the group)"


def local_rank(g: ProcessGroup, collective: str, what: str, global_rank: Any,
               group_rank: Any, default: int | None = None) -> int:
    """torch's _canonicalize_group_rank: a global ``src``/``dst`` or ``group_src``/``group_dst``."""
    if group_rank is not None:
        if global_rank is not None:
            raise InvalidArgumentError(
                f"{collective} on {g.describe()}: give either {what}={global_rank!r} (a global rank) "
                f"or group_{what}={group_rank!r} (a rank of the group), not both")
        if not isinstance(group_rank, (int, np.integer)) or not 0 <= int(group_rank) < g.size:
            raise InvalidArgumentError(
                f"{collective} on {g.describe()}: group_{what} must be a rank of the group in "
                f"[0, {g.size}), got {group_rank!r}")
        return int(group_rank)
    if global_rank is None:
        if default is None:
            raise InvalidArgumentError(f"{collective} on {g.describe()}: {what} is required")
        return default
    if not isinstance(global_rank, (int, np.integer)) or isinstance(global_rank, bool):
        raise InvalidArgumentError(
            f"{collective} on {g.describe()}: {what} must be an int (a global rank), got {global_rank!r}")
    local = g.to_local(int(global_rank))
    if local < 0:
        world = runtime.get_world(collective)
        raise InvalidArgumentError(
            f"{collective} on {g.describe()}: {what}={global_rank} is not a rank of the group "
            f"(expected one of the global ranks {g.ranks}; the world has {world.size} ranks)")
    return local


def fast_root(g: ProcessGroup, global_rank: Any, group_rank: Any, default: int | None) -> int | None:
    """The group rank a rooted collective's fast call takes on a group other than the
    world (torch's ``src``/``dst`` global, or ``group_src``/``group_dst``), or None where
    only the regular path may decide (it checks and raises as :func:`local_rank`)."""
    if group_rank is not None:
        ok = global_rank is None and type(group_rank) is int and 0 <= group_rank < g.size
        return group_rank if ok else None
    if global_rank is None:
        return default
    if type(global_rank) is not int:
        return None
    local = g.to_local(global_rank)
    return local if local >= 0 else None


def no_list_here(xs: Any, collective: str, g: ProcessGroup, what: str, root_what: str,
                  root: int) -> None:
    if xs is None or (isinstance(xs, (list, tuple)) and len(xs) == 0):
        return
    raise InvalidArgumentError(
        f"{collective} on {g.describe()}: {what} must not be given on ranks other than the "
        f"{root_what} (global rank {g.to_global(root)}); got a {type(xs).__name__}")

def p2p_group(group: Any, name: str) -> ProcessGroup:
    g = group_of(group, name)
    if not is_member(g):
        raise InvalidArgumentError(
            f"{name}: {group_text(g)}: this rank is not in the group it was given; point-to-point "
            "calls need a group this rank belongs to")
    return g


def p2p_peer(g: ProcessGroup, name: str, what: str, peer: Any, group_peer: Any,
              allow_any: bool = False) -> int | None:
    if peer is None and group_peer is None and allow_any:
        return None
    local = local_rank(g, name, what, peer, group_peer)
    if local == g.rank:
        raise InvalidArgumentError(
            f"{name} on {g.describe()}: {what} is this rank itself (global rank {g.global_rank}); "
            "a rank cannot send to or receive from itself")
    return local
