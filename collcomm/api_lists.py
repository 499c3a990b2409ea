"""The functional API's list forms: torch's collectives that take lists of tensors.

``all_gather(tensor_list, tensor)``, ``reduce_scatter(output, input_list)``,
``all_to_all(output_tensor_list, input_tensor_list)``, ``gather(tensor, gather_list)`` and
``scatter(tensor, scatter_list)``, re-exported by :mod:`collcomm.api` (and so
``collcomm.all_gather`` & co). They follow the template of :mod:`collcomm.api`; the lists
travel as one contiguous buffer: input lists are concatenated into it, output lists filled
from it (one copy per element); a scatter's, gather's or all_gather's list whose buffers lie
back to back in memory (views of one buffer, in order) is that buffer, no copy either way. all_gather, gather and scatter first offer a plain list or
tuple as it is to the fast call (core/fastpath.py).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .api_args import fast_root, group_of, group_text, is_member, local_rank, no_list_here
from .buffer_runs import apart_or_own, joined
from .buffers import Buf, as_input, as_output, as_outputs, check_like
from .core import collectives as core
from .core.work import Work
from .ops import ReduceOp

__all__ = ["all_gather", "all_to_all", "gather", "reduce_scatter", "scatter"]

#: the list forms the fast call takes as such (torch's tensor lists; anything else, even a
#: contiguous array, goes the regular way, which refuses what is not a list)
_LISTS = (list, tuple)


def _copy_out(outs: Sequence[Buf], flat: np.ndarray) -> None:
    """Fill the output list ``outs`` from the contiguous receive buffer ``flat``, in order."""
    pos = 0
    for b in outs:
        np.copyto(b.arr, flat[pos:pos + b.numel])
        pos += b.numel


def _concat(bufs: Sequence[Buf], dtype: np.dtype, other: np.ndarray | None = None,
            block: int = 0) -> np.ndarray:
    """The input list ``bufs`` as one contiguous send buffer of ``dtype``; with ``other``
    (the call's one-rank buffer, its block ``block``), the list's own memory when it lies
    back to back (:mod:`collcomm.buffer_runs`)."""
    if not bufs:
        return np.empty(0, dtype=dtype)
    if other is not None:
        run = apart_or_own(joined([b.arr for b in bufs], False), other, block)
        if run is not None and run.dtype == dtype:
            return run
    return np.concatenate([b.arr for b in bufs]).astype(dtype, copy=False)


def _receive_into(outs: Sequence[Buf], send: np.ndarray, rank: int) -> tuple[np.ndarray, Any]:
    """The receive buffer of a gather of ``send`` into the output list ``outs`` at ``rank``,
    and what to run after the call: the list's own memory and nothing when it lies back
    to back (:mod:`collcomm.buffer_runs`), else a new buffer and the copy out."""
    run = apart_or_own(joined([b.arr for b in outs], True), send, rank)
    if run is not None and run.dtype == send.dtype and run.size == send.size * len(outs):
        return run, None
    recv = np.empty(send.size * len(outs), dtype=send.dtype)
    return recv, lambda: _copy_out(outs, recv)


def all_gather(tensor_list: list[Any], tensor: Any, group: Any = None,
               async_op: bool = False, *, algorithm: str = "auto") -> Work | None:
    """``tensor_list[i]`` of every rank receives rank i's ``tensor``."""
    name = "all_gather"
    g = group_of(group, name)
    fast = g.fast
    if (fast is not None and not async_op and algorithm == "auto" and type(tensor_list) in _LISTS
            and fast.all_gather(tensor, tensor_list, name)):
        return None
    where = group_text(g)
    inp = as_input(tensor, name, where, "tensor")
    if not is_member(g):
        return None
    outs = as_outputs(tensor_list, g.size, name, where, "tensor_list", inp, "tensor")
    recv, after = _receive_into(outs, inp.arr, g.rank)
    return core.all_gather(g, inp.arr, recv, dtype=inp.dtype, async_op=async_op, algorithm=algorithm,
                           after=after)


def reduce_scatter(output: Any, input_list: list[Any], op: Any = ReduceOp.SUM, group: Any = None,
                   async_op: bool = False, *, algorithm: str = "auto") -> Work | None:
    """Reduce ``input_list[i]`` over all ranks into ``output`` of rank i."""
    name = "reduce_scatter"
    g = group_of(group, name)
    where = group_text(g)
    out = as_output(output, name, where, "output")
    if not is_member(g):
        return None
    ins = as_outputs(input_list, g.size, name, where, "input_list", out, "output", writable=False)
    return core.reduce_scatter(g, _concat(ins, out.arr.dtype), out.arr, op, dtype=out.dtype,
                               async_op=async_op, algorithm=algorithm)


def all_to_all(output_tensor_list: list[Any], input_tensor_list: list[Any], group: Any = None,
               async_op: bool = False, *, algorithm: str = "auto") -> Work | None:
    """``output_tensor_list[j]`` of rank i receives ``input_tensor_list[i]`` of rank j."""
    name = "all_to_all"
    g = group_of(group, name)
    where = group_text(g)
    if not is_member(g):
        return None
    ins = as_outputs(input_tensor_list, g.size, name, where, "input_tensor_list", writable=False)
    outs = as_outputs(output_tensor_list, g.size, name, where, "output_tensor_list")
    for i, b in enumerate(ins + outs):
        check_like(b, outs[0], name, where,
                   f"input_tensor_list[{i}]" if i < len(ins) else f"output_tensor_list[{i - len(ins)}]",
                   "output_tensor_list[0]", b.numel)
    send_counts = [b.numel for b in ins]
    recv_counts = [b.numel for b in outs]
    send = _concat(ins, outs[0].arr.dtype)
    recv = np.empty(sum(recv_counts), dtype=outs[0].arr.dtype)
    return core.all_to_all(g, send, send_counts, recv, recv_counts, dtype=outs[0].dtype,
                           async_op=async_op, algorithm=algorithm, after=lambda: _copy_out(outs, recv))


def gather(tensor: Any, gather_list: list[Any] | None = None, dst: int | None = None,
           group: Any = None, async_op: bool = False, group_dst: int | None = None, *, algorithm: str = "auto") -> Work | None:
    """``gather_list[i]`` on ``dst`` (default 0) receives rank i's ``tensor``; give no list elsewhere."""
    name = "gather"
    g = group_of(group, name)
    fast = g.fast    # a list or tuple only on dst (a group rank), nothing elsewhere
    if fast is not None and not async_op and algorithm == "auto":
        root = ((0 if dst is None else dst) if group is None and group_dst is None
                else fast_root(g, dst, group_dst, 0))
        if (type(root) is int
                and (type(gather_list) in _LISTS if root == g.rank else gather_list is None)
                and fast.gather(tensor, gather_list, root, name)):
            return None
    where = group_text(g)
    inp = as_input(tensor, name, where, "tensor")
    if not is_member(g):
        return None
    if dst is None and group_dst is None:
        dst = 0
    root = local_rank(g, name, "dst", dst, group_dst)
    if g.rank == root:
        outs = as_outputs(gather_list, g.size, name, where, "gather_list", inp, "tensor")
    else:
        no_list_here(gather_list, name, g, "gather_list", "destination", root)
        outs = []

    if not outs:
        return core.gather(g, inp.arr, None, root, dtype=inp.dtype, async_op=async_op,
                           algorithm=algorithm)
    recv, after = _receive_into(outs, inp.arr, root)
    return core.gather(g, inp.arr, recv, root, dtype=inp.dtype, async_op=async_op,
                       algorithm=algorithm, after=after)


def scatter(tensor: Any, scatter_list: list[Any] | None = None, src: int | None = None,
            group: Any = None, async_op: bool = False, group_src: int | None = None, *, algorithm: str = "auto") -> Work | None:
    """``tensor`` of rank i receives ``scatter_list[i]`` of ``src`` (default 0); give no list elsewhere."""
    name = "scatter"
    g = group_of(group, name)
    fast = g.fast    # a list or tuple only on src (a group rank), nothing elsewhere
    if fast is not None and not async_op and algorithm == "auto":
        root = ((0 if src is None else src) if group is None and group_src is None
                else fast_root(g, src, group_src, 0))
        if (type(root) is int
                and (type(scatter_list) in _LISTS if root == g.rank else scatter_list is None)
                and fast.scatter(scatter_list, tensor, root, name)):
            return None
    where = group_text(g)
    out = as_output(tensor, name, where, "tensor")
    if not is_member(g):
        return None
    if src is None and group_src is None:
        src = 0
    root = local_rank(g, name, "src", src, group_src)
    if g.rank == root:
        ins = as_outputs(scatter_list, g.size, name, where, "scatter_list", out, "tensor", writable=False)
    else:
        no_list_here(scatter_list, name, g, "scatter_list", "source", root)
        ins = []

    send = _concat(ins, out.arr.dtype, out.arr, root) if g.rank == root else None
    return core.scatter(g, send, out.arr, root, dtype=out.dtype, async_op=async_op,
                        algorithm=algorithm)
