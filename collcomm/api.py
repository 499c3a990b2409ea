"""The functional API: ``import collcomm as dist`` in place of ``torch.distributed`` (CPU).

Names, argument order, defaults and return conventions are torch 2.x's. Every collective
follows one template::

    def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False):
        g = group_of(group, "all_reduce")          # InvalidArgumentError before init
        buf = as_output(tensor, ...)               # torch's argument forms -> numpy arrays
        if not is_member(g): return None           # torch: ranks outside the group skip
        return core.all_reduce(g, buf.arr, op, dtype=buf.dtype, async_op=async_op)

and everything else (op/dtype checks, the group's call plan, the call signature, async
work) happens in :mod:`collcomm.core.collectives`, the layer every front end shares,
so a bad argument raises :class:`~collcomm.errors.InvalidArgumentError` on the rank that
passed it before any message is sent. Ranks (``src``, ``dst``, ``peer``) are global ranks;
``group_src``/``group_dst``/``group_peer`` give a rank of ``group`` instead (torch 2.6+).

Outputs are written in place, into the caller's memory: they must be contiguous and
writable (see :mod:`collcomm.buffers`).

The collectives that take lists of tensors (``all_gather``, ``reduce_scatter``,
``all_to_all``, ``gather``, ``scatter``) are in :mod:`collcomm.api_lists`, point-to-point
(``send``/``recv``/``isend``/``irecv``/``batch_isend_irecv``) in :mod:`collcomm.api_p2p`,
both re-exported here; the argument helpers they share in :mod:`collcomm.api_args`.

Example (2 ranks)::

    >>> t = np.array([1, 2, 3, 4, 5]) if dist.get_rank() == 0 else np.zeros(5, dtype=int)
    >>> dist.broadcast(t, src=0)
    >>> t          # Rank 0: [1 2 3 4 5]   Rank 1: [1 2 3 4 5]
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .api_args import fast_root, group_of, group_text, is_member, local_rank
from .api_lists import all_gather, all_to_all, gather, reduce_scatter, scatter
from .api_p2p import P2POp, P2PWork, batch_isend_irecv, irecv, isend, recv, send  # noqa: F401
from .buffers import as_input, as_output, check_like
from .core import collectives as core
from .core import runtime
from .core.work import Work
from .errors import InvalidArgumentError
from .ops import ReduceOp

__all__ = [
    "P2POp", "all_gather", "all_gather_into_tensor", "all_reduce", "all_to_all",
    "all_to_all_single", "barrier", "batch_isend_irecv", "broadcast", "gather", "get_backend",
    "get_global_rank", "get_group_rank", "get_process_group_ranks", "get_rank",
    "get_world_size", "irecv", "is_available", "isend", "monitored_barrier", "recv", "reduce",
    "reduce_scatter", "reduce_scatter_tensor", "scatter", "send",
]

BACKEND = "collcomm"


# ----------------------------------------------------------------------------- queries
def is_available() -> bool:
    return True


def get_rank(group: Any = None) -> int:
    """This process's rank in ``group`` (default the world); -1 if it is not a member."""
    g = group_of(group, "get_rank")
    return g.rank if is_member(g) else -1


def get_world_size(group: Any = None) -> int:
    """The number of ranks in ``group`` (default the world); -1 if this rank is not a member."""
    g = group_of(group, "get_world_size")
    return g.size if is_member(g) else -1


def get_backend(group: Any = None) -> str:
    g = group_of(group, "get_backend")
    if not is_member(g):
        raise InvalidArgumentError(f"get_backend: {group_text(g)}: invalid process group specified")
    return BACKEND


def get_global_rank(group: Any, group_rank: int) -> int:
    """The global rank of ``group_rank`` in ``group``."""
    g = group_of(group, "get_global_rank")
    if not is_member(g):
        raise InvalidArgumentError(f"get_global_rank: {group_text(g)}: this rank is not in the group")
    if not isinstance(group_rank, (int, np.integer)) or not 0 <= int(group_rank) < g.size:
        raise InvalidArgumentError(
            f"get_global_rank on {g.describe()}: group_rank must be in [0, {g.size}), got {group_rank!r}")
    return g.to_global(int(group_rank))


def get_group_rank(group: Any, global_rank: int) -> int:
    """The rank of ``global_rank`` inside ``group``; InvalidArgumentError if it is not in it."""
    g = group_of(group, "get_group_rank")
    if not is_member(g):
        raise InvalidArgumentError(f"get_group_rank: {group_text(g)}: this rank is not in the group")
    local = g.to_local(int(global_rank))
    if local < 0:
        raise InvalidArgumentError(
            f"get_group_rank on {g.describe()}: global rank {global_rank} is not part of the group "
            f"(its global ranks are {g.ranks})")
    return local


def get_process_group_ranks(group: Any) -> list[int]:
    """The global ranks of ``group``, in group-rank order."""
    g = group_of(group, "get_process_group_ranks")
    if not is_member(g):
        raise InvalidArgumentError(f"get_process_group_ranks: {group_text(g)}: this rank is not in the group")
    return list(g.ranks)


# ----------------------------------------------------------------------------- collectives
def barrier(group: Any = None, async_op: bool = False, device_ids: Any = None, *, algorithm: str = "auto") -> Work | None:
    """Return only when every rank of ``group`` has entered the barrier."""
    g = runtime._world if group is None else None    # (the world: group_of's first case)
    if g is None:
        g = group_of(group, "barrier")
    fast = g.fast
    if fast is not None and not async_op and algorithm == "auto" and fast.barrier("barrier"):
        return None
    if not is_member(g):
        return None
    return core.barrier(g, async_op=async_op, algorithm=algorithm)


def monitored_barrier(group: Any = None, timeout: Any = None, wait_all_ranks: bool = False) -> None:
    """A barrier that fails with CommTimeoutError after ``timeout`` (default: the group's)."""
    g = group_of(group, "monitored_barrier")
    if not is_member(g):
        return None
    secs = None if timeout is None else runtime._timeout_seconds(timeout)
    core.barrier(g, name="monitored_barrier", timeout=secs)
    return None


def _plain_output(tensor: Any) -> np.ndarray | None:
    """A writable C-contiguous ndarray's flat view (what ``as_output`` makes of it), or None
    for anything ``as_output`` must look at."""
    if type(tensor) is np.ndarray and tensor.flags.c_contiguous and tensor.flags.writeable:
        return tensor.reshape(-1)
    return None


def broadcast(tensor: Any, src: int | None = None, group: Any = None, async_op: bool = False,
              group_src: int | None = None, *, algorithm: str = "auto") -> Work | None:
    """Copy ``tensor`` of rank ``src`` into ``tensor`` of every rank of the group (in place)."""
    name = "broadcast"
    g = group_of(group, name)
    fast = g.fast    # the fast call (core/fastpath.py) takes a group rank (the world's: src)
    if fast is not None and algorithm == "auto":
        root = src if group is None and group_src is None else fast_root(g, src, group_src, None)
        if not async_op:
            if root is not None and fast.broadcast(tensor, root, name):
                return None
        else:
            if root is not None and (work := fast.broadcast_async(tensor, root, name)) is not None:
                return work       # small: started at once in two parts, as all_reduce's
            if (flat := _plain_output(tensor)) is not None:
                root = local_rank(g, name, "src", src, group_src)     # queued, as all_reduce's
                return core.broadcast(g, flat, root, async_op=True)
    buf = as_output(tensor, name, group_text(g), "tensor")
    if not is_member(g):
        return None
    root = local_rank(g, name, "src", src, group_src)
    return core.broadcast(g, buf.arr, root, dtype=buf.dtype, async_op=async_op, algorithm=algorithm)


def all_reduce(tensor: Any, op: Any = ReduceOp.SUM, group: Any = None,
               async_op: bool = False, *, algorithm: str = "auto") -> Work | None:
    """Every rank's ``tensor`` becomes the elementwise ``op`` over all ranks (in place)."""
    name = "all_reduce"
    g = group_of(group, name)
    fast = g.fast    # the fast call (core/fastpath.py): done, or nothing done
    if fast is not None and algorithm == "auto":
        if not async_op:
            if fast.all_reduce(tensor, tensor, op, name):
                return None
        elif (work := fast.all_reduce_async(tensor, tensor, op, name)) is not None:
            return work           # small: started at once, its second part queued
        elif (flat := _plain_output(tensor)) is not None:
            # queued to run through the fast call (core/async_calls.py)
            return core.all_reduce(g, flat, op, async_op=True)
    buf = as_output(tensor, name, group_text(g), "tensor")
    if not is_member(g):
        return None
    return core.all_reduce(g, buf.arr, op, dtype=buf.dtype, async_op=async_op, algorithm=algorithm)


def reduce(tensor: Any, dst: int | None = None, op: Any = ReduceOp.SUM, group: Any = None,
           async_op: bool = False, group_dst: int | None = None, *, algorithm: str = "auto") -> Work | None:
    """``tensor`` on ``dst`` becomes the elementwise ``op`` over all ranks; others keep theirs."""
    name = "reduce"
    g = group_of(group, name)
    fast = g.fast    # the fast call takes a group rank (the world's: dst)
    if fast is not None and not async_op and algorithm == "auto":
        root = dst if group is None and group_dst is None else fast_root(g, dst, group_dst, None)
        if (type(root) is int
                and fast.reduce(tensor, tensor if root == g.rank else None, op, root, name)):
            return None
    buf = as_output(tensor, name, group_text(g), "tensor")
    if not is_member(g):
        return None
    root = local_rank(g, name, "dst", dst, group_dst)
    recv = buf.arr if g.rank == root else None
    return core.reduce(g, buf.arr, recv, op, root, dtype=buf.dtype, async_op=async_op,
                       algorithm=algorithm)


def all_gather_into_tensor(output_tensor: Any, input_tensor: Any, group: Any = None,
                           async_op: bool = False, *, algorithm: str = "auto") -> Work | None:
    """``output_tensor`` (world_size × input's elements) receives every rank's input, in rank order."""
    name = "all_gather_into_tensor"
    g = group_of(group, name)
    fast = g.fast
    if (fast is not None and not async_op and algorithm == "auto"
            and fast.all_gather(input_tensor, output_tensor, name)):
        return None
    where = group_text(g)
    out = as_output(output_tensor, name, where, "output_tensor")
    inp = as_input(input_tensor, name, where, "input_tensor")
    if not is_member(g):
        return None
    check_like(out, inp, name, where, "output_tensor", "input_tensor", inp.numel * g.size)
    return core.all_gather(g, inp.arr, out.arr, dtype=inp.dtype, async_op=async_op,
                           algorithm=algorithm, name=name)


def reduce_scatter_tensor(output: Any, input: Any, op: Any = ReduceOp.SUM, group: Any = None,
                          async_op: bool = False, *, algorithm: str = "auto") -> Work | None:
    """Reduce ``input`` (world_size × output's elements) over all ranks; chunk i → ``output`` of rank i."""
    name = "reduce_scatter_tensor"
    g = group_of(group, name)
    fast = g.fast
    if (fast is not None and not async_op and algorithm == "auto"
            and fast.reduce_scatter(input, output, op, name)):
        return None
    where = group_text(g)
    out = as_output(output, name, where, "output")
    inp = as_input(input, name, where, "input")
    if not is_member(g):
        return None
    if inp.numel % g.size:
        raise InvalidArgumentError(
            f"{name} on {where}: input has {inp.numel} elements, which is not divisible by the "
            f"group size {g.size}")
    check_like(out, inp, name, where, "output", "input", inp.numel // g.size)
    return core.reduce_scatter(g, inp.arr, out.arr, op, dtype=out.dtype, async_op=async_op,
                               algorithm=algorithm, name=name)


def _splits(sizes: Any, n0: int, n: int, name: str, where: str, what: str, tensor_what: str) -> list[int]:
    if sizes is None or (isinstance(sizes, (list, tuple)) and len(sizes) == 0):
        if n0 % n:
            raise InvalidArgumentError(
                f"{name} on {where}: {tensor_what} has {n0} rows (dim 0), not divisible by the group "
                f"size {n}; pass {what}")
        return [n0 // n] * n
    sizes = [int(s) for s in sizes]
    if len(sizes) != n:
        raise InvalidArgumentError(
            f"{name} on {where}: {what} must have one entry per rank: expected {n}, got {len(sizes)}")
    if any(s < 0 for s in sizes) or sum(sizes) != n0:
        raise InvalidArgumentError(
            f"{name} on {where}: {what} {sizes} must be non-negative and sum to the {n0} rows "
            f"(dim 0) of {tensor_what}; they sum to {sum(sizes)}")
    return sizes


def all_to_all_single(output: Any, input: Any, output_split_sizes: list[int] | None = None,
                      input_split_sizes: list[int] | None = None, group: Any = None,
                      async_op: bool = False, *, algorithm: str = "auto") -> Work | None:
    """Split ``input`` along dim 0, send block j to rank j; ``output`` gets rank j's block in slot j."""
    name = "all_to_all_single"
    g = group_of(group, name)
    fast = g.fast    # equal blocks only
    if (fast is not None and output_split_sizes is None and input_split_sizes is None
            and not async_op and algorithm == "auto" and fast.all_to_all(input, output, name)):
        return None
    where = group_text(g)
    out = as_output(output, name, where, "output")
    inp = as_input(input, name, where, "input")
    if not is_member(g):
        return None
    check_like(out, inp, name, where, "output", "input", out.numel)
    in_rows, in_per = inp.rows()
    out_rows, out_per = out.rows()
    if in_per != out_per and inp.numel and out.numel:
        raise InvalidArgumentError(
            f"{name} on {where}: input rows have {in_per} elements (shape {list(inp.shape)}) but output "
            f"rows have {out_per} (shape {list(out.shape)}); all dims but the first must match")
    in_split = _splits(input_split_sizes, in_rows, g.size, name, where, "input_split_sizes", "input")
    out_split = _splits(output_split_sizes, out_rows, g.size, name, where, "output_split_sizes", "output")
    send_counts = [s * in_per for s in in_split]
    recv_counts = [s * out_per for s in out_split]
    return core.all_to_all(g, inp.arr, send_counts, out.arr, recv_counts, dtype=out.dtype,
                           async_op=async_op, algorithm=algorithm, name=name)
