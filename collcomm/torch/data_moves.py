"""Gather, scatter and all-to-all of :class:`~collcomm.torch.ProcessGroupCollcomm`: the calls
that move data without reducing it between ranks in lists of tensors (one per rank).

As in :mod:`collcomm.torch.process_group`: a blocking call of plain CPU tensors first goes
to the group's fast call (:mod:`collcomm.torch.fast`); otherwise the lists are checked
here (one tensor per rank, equal sizes, one dtype), flattened into one buffer and handed
to the core, and the outputs are copied back from one receive buffer (a list whose
tensors lie back to back in memory is that buffer itself: :mod:`collcomm.buffer_runs`). ``all_to_all_single``
takes torch's split sizes (in rows of the first dimension).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch
import torch.distributed as dist

from ..core import collectives as core
from . import fast as fast_calls
from .tensors import View, copy_out, core_dtype, finisher, flat_like, gathered_into, same_kind, scale, sent_from
from .work import Start, done, gathered

__all__ = ["DataMoves"]


class DataMoves:
    """A mixin of ProcessGroupCollcomm (which provides ``core_group``, ``_run``, ``_fast``,
    ``_view``, ``_views``, ``_per_rank``, ``_fail`` and ``_where``)."""

    # -- gather / scatter ----------------------------------------------------------------------
    def gather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor],
               opts: Any = None) -> dist.Work:
        opts = opts or dist.GatherOptions()
        g, root = self.core_group, opts.rootRank
        fast = self._fast(opts)
        if fast is not None and fast_calls.gather(fast, output_tensors, input_tensors, root, g.rank):
            return done("gather", gathered(output_tensors))
        inp = self._view(input_tensors[0], "gather", "tensor")
        if g.rank == root and 0 <= root < g.size:
            outs = self._views(output_tensors[0] if output_tensors else [], "gather", "gather_list")
            self._per_rank(outs, "gather", "gather_list", inp.numel)
            same_kind(outs, inp, "gather", self._where, "gather_list")
            flat, after = gathered_into(outs, inp, root)
            start: Start = lambda a: core.gather(g, inp.arr, flat, root, dtype=core_dtype(inp),  # noqa: E731
                                                 async_op=a, after=after)
        else:
            start = lambda a: core.gather(g, inp.arr, None, root, dtype=core_dtype(inp),  # noqa: E731
                                          async_op=a)
        return self._run("gather", opts, gathered(output_tensors), [start])

    def scatter(self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]],
                opts: Any = None) -> dist.Work:
        opts = opts or dist.ScatterOptions()
        g, root = self.core_group, opts.rootRank
        fast = self._fast(opts)
        if fast is not None and fast_calls.scatter(fast, output_tensors, input_tensors, root, g.rank):
            return done("scatter", output_tensors)
        out = self._view(output_tensors[0], "scatter", "tensor")
        send = None
        if g.rank == root and 0 <= root < g.size:
            ins = self._views(input_tensors[0] if input_tensors else [], "scatter", "scatter_list")
            self._per_rank(ins, "scatter", "scatter_list", out.numel)
            same_kind(ins, out, "scatter", self._where, "scatter_list")
            send = sent_from(ins, out, root) if ins else flat_like(out, 0)
        start: Start = lambda a: core.scatter(g, send, out.arr, root, dtype=core_dtype(out),  # noqa: E731
                                              async_op=a, after=finisher(out))
        return self._run("scatter", opts, output_tensors, [start])

    # -- all_to_all ----------------------------------------------------------------------------
    def _split_counts(self, v: View, splits: Sequence[int], call: str, what: str) -> list[int]:
        n, s = self.size(), scale(v)
        if not splits:
            if v.numel % n:
                raise self._fail(call, f"{what} has {v.tensor.numel()} elements, which the {n} "
                                       "ranks cannot split evenly (give split sizes)")
            return [v.numel // n] * n
        shape = v.tensor.shape
        row = int(np.prod(shape[1:], dtype=np.int64)) if len(shape) > 1 else 1
        return [int(c) * row * s for c in splits]

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor,  # noqa: A002
                          output_split_sizes: list[int], input_split_sizes: list[int],
                          opts: Any = None) -> dist.Work:
        opts = opts or dist.AllToAllOptions()
        call = "all_to_all_single"
        fast = self._fast(opts)
        if fast is not None and fast_calls.all_to_all_single(fast, output, input, output_split_sizes,
                                                             input_split_sizes):
            return done(call, [output])
        vo, vi = self._view(output, call, "output"), self._view(input, call, "input")
        send_counts = self._split_counts(vi, input_split_sizes, call, "input")
        recv_counts = self._split_counts(vo, output_split_sizes, call, "output")
        g = self.core_group
        start: Start = lambda a: core.all_to_all(  # noqa: E731
            g, vi.arr, send_counts, vo.arr, recv_counts, dtype=core_dtype(vi), async_op=a,
            name=call, after=finisher(vo))
        return self._run(call, opts, [output], [start])

    alltoall_base = all_to_all_single

    def alltoall(self, output_tensors: list[torch.Tensor], input_tensors: list[torch.Tensor],
                 opts: Any = None) -> dist.Work:
        opts = opts or dist.AllToAllOptions()
        call = "all_to_all"
        outs = self._views(output_tensors, call, "output_tensor_list")
        ins = self._views(input_tensors, call, "input_tensor_list")
        self._per_rank(outs, call, "output_tensor_list")
        self._per_rank(ins, call, "input_tensor_list")
        same_kind(outs + ins, ins[0], call, self._where, "tensors") if ins else None
        send = np.concatenate([v.arr for v in ins])
        flat = np.empty(sum(v.numel for v in outs), dtype=send.dtype)
        g = self.core_group
        start: Start = lambda a: core.all_to_all(  # noqa: E731
            g, send, [v.numel for v in ins], flat, [v.numel for v in outs],
            dtype=core_dtype(ins[0]), async_op=a, name=call, after=copy_out(outs, flat))
        return self._run(call, opts, output_tensors, [start])
