"""Collectives on picklable Python objects: torch's ``*_object`` functions.

Pickling, the wire format (protocol 5, large buffers out of band) and the bodies that move
packed objects through a group live in :mod:`collcomm.core.pickled` (one object a rank in
one or two calls of plain bytes through the fast call: :mod:`collcomm.core.pickled_small`;
``broadcast_object_list`` keeps the general way, each entry its own pickle), shared with
``collcomm.MPI``; this module maps torch's arguments onto them. The reductions
(``all_reduce_object``, ``reduce_object``) gather the objects, then fold them in rank order
with Python semantics (SUM → ``a + b``, MAX → ``max``, a callable → ``f(a, b)``), so every
rank computes the same value.
"""
from __future__ import annotations

import functools
import operator
from typing import Any, Callable

import numpy as np

from .api_args import group_of, group_text, is_member, local_rank, no_list_here, p2p_group, p2p_peer
from .errors import InvalidArgumentError, MismatchError
from .core.group import ProcessGroup
from .core import pickled_small as small
from .core.pickled import (  # noqa: F401 - alloc, pack, unpack, Packed re-exported for callers
    OUT_OF_BAND_MIN, STANDARD, Packed, alloc, bcast_objects, pack, recv_packed, send_packed, unpack,
)
from .ops import ReduceOp

__all__ = [
    "all_gather_object", "all_reduce_object", "broadcast_object_list", "gather_object",
    "recv_object_list", "reduce_object", "scatter_object_list", "send_object_list",
]


def _check_list(xs: Any, collective: str, where: str, what: str, n: int | None = None) -> None:
    if not isinstance(xs, list):
        raise InvalidArgumentError(
            f"{collective} on {where}: {what} must be a list (it is filled in place), got {type(xs).__name__}")
    if n is not None and len(xs) != n:
        raise InvalidArgumentError(
            f"{collective} on {where}: {what} must have one entry per rank of the group: "
            f"expected {n}, got {len(xs)}")


def _root(g: ProcessGroup, name: str, what: str, glob: Any, local: Any) -> int:
    if glob is None and local is None:
        glob = 0
    return local_rank(g, name, what, glob, local)


# ----------------------------------------------------------------------------- collectives
def broadcast_object_list(object_list: list[Any], src: int | None = None, group: Any = None,
                          device: Any = None, group_src: int | None = None) -> None:
    """Every rank's ``object_list`` becomes (unpickled copies of) ``src``'s, in place."""
    name = "broadcast_object_list"
    g = group_of(group, name)
    _check_list(object_list, name, group_text(g), "object_list")
    if not is_member(g):
        return None
    root = _root(g, name, "src", src, group_src)
    # (the general way: each entry its own pickle, as torch does, so entries that are one
    # object on the source stay distinct objects on the others)
    objs = bcast_objects(g, object_list if g.rank == root else None, root, name, copy_at_root=False)
    if g.rank != root:
        if len(objs) != len(object_list):
            raise MismatchError(
                f"{name} on {g.describe()}: object_list has {len(object_list)} entries on this "
                f"rank but the source (global rank {g.to_global(root)}) sent {len(objs)}; they must match")
        object_list[:] = objs
    return None


def all_gather_object(object_list: list[Any], obj: Any, group: Any = None) -> None:
    """``object_list[i]`` of every rank becomes rank i's ``obj`` (``object_list`` has group-size entries)."""
    name = "all_gather_object"
    g = group_of(group, name)
    if not is_member(g):
        return None
    _check_list(object_list, name, g.describe(), "object_list", g.size)
    object_list[:] = small.allgather(g, obj, name, STANDARD)
    return None


def gather_object(obj: Any, object_gather_list: list[Any] | None = None, dst: int | None = None,
                  group: Any = None, group_dst: int | None = None) -> None:
    """``object_gather_list[i]`` on ``dst`` (default 0) becomes rank i's ``obj``; pass None elsewhere."""
    name = "gather_object"
    g = group_of(group, name)
    if not is_member(g):
        return None
    root = _root(g, name, "dst", dst, group_dst)
    if g.rank == root:
        _check_list(object_gather_list, name, g.describe(), "object_gather_list", g.size)
    else:
        no_list_here(object_gather_list, name, g, "object_gather_list", "destination", root)
    out = small.gather(g, obj, root, name, STANDARD)
    if out is not None:
        assert object_gather_list is not None
        object_gather_list[:] = out
    return None


def scatter_object_list(scatter_object_output_list: list[Any],
                        scatter_object_input_list: list[Any] | None = None, src: int | None = None,
                        group: Any = None, group_src: int | None = None) -> None:
    """``scatter_object_output_list[0]`` of rank i becomes ``scatter_object_input_list[i]`` of ``src``."""
    name = "scatter_object_list"
    g = group_of(group, name)
    where = group_text(g)
    if not isinstance(scatter_object_output_list, list) or len(scatter_object_output_list) < 1:
        raise InvalidArgumentError(
            f"{name} on {where}: scatter_object_output_list must be a non-empty list, got "
            f"{scatter_object_output_list!r:.80}")
    if not is_member(g):
        return None
    root = _root(g, name, "src", src, group_src)
    if g.rank == root:
        _check_list(scatter_object_input_list, name, where, "scatter_object_input_list", g.size)
    scatter_object_output_list[0] = small.scatter(
        g, scatter_object_input_list if g.rank == root else None, root, name, STANDARD)
    return None


# ----------------------------------------------------------------------------- point to point
def send_object_list(object_list: list[Any], dst: int | None = None, group: Any = None,
                     device: Any = None, group_dst: int | None = None) -> None:
    """Send the objects of ``object_list`` to global rank ``dst`` (received by recv_object_list)."""
    name = "send_object_list"
    g = p2p_group(group, name)
    _check_list(object_list, name, g.describe(), "object_list")
    peer = p2p_peer(g, name, "dst", dst, group_dst)
    send_packed(lambda a, p: g.p2p_isend(a, p), pack(object_list, name), peer)


def recv_object_list(object_list: list[Any], src: int | None = None, group: Any = None,
                     device: Any = None, group_src: int | None = None) -> int:
    """Fill ``object_list`` with the objects ``src`` (None: any rank) sent; returns the sender's global rank."""
    name = "recv_object_list"
    g = p2p_group(group, name)
    _check_list(object_list, name, g.describe(), "object_list")
    peer = p2p_peer(g, name, "src", src, group_src, allow_any=True)

    def irecv(arr: np.ndarray, p: Any) -> Any:
        # after the first message p is the sender's *global* rank (from the status)
        local = p if p is None or peer is not None else g.to_local(p)
        return g.p2p_irecv(arr, local)

    p, source = recv_packed(irecv, peer)
    objs = unpack(p)
    if len(objs) != len(object_list):
        raise MismatchError(
            f"{name} on {g.describe()}: object_list has {len(object_list)} entries but global rank "
            f"{source} sent {len(objs)}; they must match")
    object_list[:] = objs
    return int(source)


# ----------------------------------------------------------------------------- reductions
def _max(a: Any, b: Any) -> Any:
    return np.maximum(a, b) if isinstance(a, np.ndarray) or isinstance(b, np.ndarray) else max(a, b)


def _min(a: Any, b: Any) -> Any:
    return np.minimum(a, b) if isinstance(a, np.ndarray) or isinstance(b, np.ndarray) else min(a, b)


_PY_OPS: dict[str, Callable[[Any, Any], Any]] = {
    "SUM": operator.add, "AVG": operator.add, "PRODUCT": operator.mul,
    "MIN": _min, "MAX": _max,
    "BAND": operator.and_, "BOR": operator.or_, "BXOR": operator.xor,
    "LAND": lambda a, b: a and b, "LOR": lambda a, b: a or b,
    "LXOR": lambda a, b: bool(a) != bool(b),
}


def python_op(op: Any, collective: str) -> tuple[Callable[[Any, Any], Any], bool]:
    """``(f(a, b), is_avg)`` for ``op`` applied to Python objects."""
    try:
        rop = ReduceOp.from_any(op)
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(f"{collective}: {exc}") from None
    if rop.fn is not None:
        return rop.fn, False
    return _PY_OPS[rop.name], rop is ReduceOp.AVG


def _fold(values: list[Any], f: Callable[[Any, Any], Any], avg: bool) -> Any:
    result = functools.reduce(f, values)
    return result / len(values) if avg else result


def all_reduce_object(obj: Any, op: Any = ReduceOp.SUM, group: Any = None) -> Any:
    """The ``op``-combination of every rank's ``obj`` (rank order), returned on every rank."""
    name = "all_reduce_object"
    g = group_of(group, name)
    f, avg = python_op(op, name)
    if not is_member(g):
        return None
    values: list[Any] = [None] * g.size
    all_gather_object(values, obj, g)
    return _fold(values, f, avg)


def reduce_object(obj: Any, op: Any = ReduceOp.SUM, dst: int = 0, group: Any = None) -> Any:
    """The ``op``-combination of every rank's ``obj`` on global rank ``dst``; None elsewhere."""
    name = "reduce_object"
    g = group_of(group, name)
    f, avg = python_op(op, name)
    if not is_member(g):
        return None
    root = local_rank(g, name, "dst", dst, None)
    values = small.gather(g, obj, root, name, STANDARD)
    return None if values is None else _fold(values, f, avg)
