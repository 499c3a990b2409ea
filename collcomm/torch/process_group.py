"""``ProcessGroupCollcomm``: torch.distributed's process-group interface over the collcomm core.

torch calls one method per operation, with lists of tensors and an options object (root
ranks are already ranks of the group); this class turns the tensors into flat numpy views
(:mod:`collcomm.torch.tensors`) and calls :mod:`collcomm.core.collectives` or the group's
point-to-point methods. What the core checks (roots, sizes, dtypes, ops) it is left to
check; what only torch's list forms need (one tensor per rank, equal sizes) is checked
here. Semantics are gloo's:

* in place where torch is (``all_reduce``, ``broadcast``, the root of ``reduce``);
  ``reduce`` leaves the other ranks' tensors untouched; list outputs are filled from one
  receive buffer (one copy each); single-tensor forms (``all_gather_into_tensor``,
  ``reduce_scatter_tensor``, ``all_to_all_single``) are zero-copy;
* ``AVG`` and ``PREMUL_SUM`` (each rank's input times a factor, then
  summed; the factor may be a number or a one-element tensor) are supported;
* ``all_gather`` with output tensors of different sizes works (an all_to_all underneath);
* blocking calls (``opts.asyncOp`` false: what torch's Python API passes for
  ``async_op=False``) run in the caller's thread; the others run on the group's worker in
  program order and return a pending :class:`~collcomm.torch.work.CollWork`;
* a blocking call of plain contiguous CPU tensors first goes to the group's fast call
  (:mod:`collcomm.torch.fast`, :mod:`collcomm.core.fastpath`: the whole call in C, or
  nothing and the steps above); in a group of one an async call too (see :meth:`_fast`);
* every wait is bounded by the group's timeout (``init_process_group(timeout=)`` /
  ``new_group(timeout=)``); ``barrier`` also honours ``opts.timeout``, the one per-call
  timeout torch's Python API sets.

Point to point and ``monitored_barrier`` are in :mod:`collcomm.torch.p2p`; gather, scatter and
all-to-all in :mod:`collcomm.torch.data_moves`; the all_reduce of a sparse COO tensor in
:mod:`collcomm.torch.sparse`.
"""
from __future__ import annotations

from datetime import timedelta
from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import AllgatherOptions  # not in torch.distributed

from ..core import attach
from ..core import collectives as core
from ..core.group import ProcessGroup
from ..core.work import Work as CoreWork
from ..errors import CollcommError, InvalidArgumentError
from .errors import translate
from .p2p import PointToPoint
from . import fast as fast_calls
from .data_moves import DataMoves
from .sparse import all_reduce_sparse, is_sparse
from .tensors import (View, copy_out, core_dtype, fast_array, fast_op, finisher, gathered_into, reduce_op,
                      same_kind, scale, view, views)
from .work import CollWork, Start, done, gathered, seconds

__all__ = ["BACKEND_NAME", "ProcessGroupCollcomm"]

BACKEND_NAME = "collcomm"
_NO_TIME = timedelta(0)

def _then(*steps: Callable[[], None] | None) -> Callable[[], None] | None:
    todo = [s for s in steps if s is not None]
    if not todo:
        return None
    if len(todo) == 1:
        return todo[0]

    def run() -> None:
        for s in todo:
            s()
    return run


class ProcessGroupCollcomm(PointToPoint, DataMoves, dist.ProcessGroup):
    """The object ``init_process_group("collcomm")`` / ``new_group(backend="collcomm")`` make.

    ``core_group`` is the collcomm :class:`~collcomm.core.group.ProcessGroup` underneath.
    """

    def __init__(self, group: ProcessGroup, rank: int, size: int) -> None:
        super().__init__(rank, size)
        self.core_group = group
        self._where = group.describe()
        # a group of one: an async call may run at once too (it never waits for anyone)
        self._alone = group.size == 1

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return BACKEND_NAME

    # torch keeps a group's name and description in its backends, which a Python group has
    # not: keep them here (``pg.group_name``, DeviceMesh, the group registry read them).
    def setGroupName(self, name: str) -> None:  # noqa: N802
        self._group_name = name

    def getGroupName(self) -> str:  # noqa: N802
        return getattr(self, "_group_name", "")

    def setGroupDesc(self, desc: str) -> None:  # noqa: N802
        self._group_desc = desc

    def getGroupDesc(self) -> str:  # noqa: N802
        return getattr(self, "_group_desc", "")

    def __repr__(self) -> str:
        return f"ProcessGroupCollcomm(rank={self.rank()}, size={self.size()}, {self._where})"

    # -- the call template ----------------------------------------------------------------
    def _run(self, name: str, opts: Any, result: Any, starts: Sequence[Start]) -> dist.Work:
        """Start every core call of one torch call, inline or on the worker (see module doc)."""
        async_op = bool(getattr(opts, "asyncOp", True))
        try:
            works = [start(async_op) for start in starts]
        except CollcommError as exc:
            raise translate(exc) from None
        if async_op:
            return CollWork(name, [w for w in works if w is not None], result)
        return done(name, result)

    def _view(self, t: Any, call: str, what: str, reducing: bool = False) -> View:
        return view(t, call, self._where, what, reducing)

    def _views(self, ts: Any, call: str, what: str, reducing: bool = False) -> list[View]:
        return views(ts, call, self._where, what, reducing)

    def _op(self, opts: Any, call: str) -> tuple[Any, Any]:
        return reduce_op(opts.reduceOp, call, self._where)

    def _fail(self, call: str, text: str) -> InvalidArgumentError:
        return InvalidArgumentError(f"{call} on {self._where}: {text}")

    def _per_rank(self, vs: Sequence[View], call: str, what: str, numel: int | None = None) -> None:
        n = self.size()
        if len(vs) != n:
            raise self._fail(call, f"{what} must hold one tensor per rank of the group: expected "
                                   f"{n}, got {len(vs)}")
        if numel is not None:
            for i, v in enumerate(vs):
                if v.numel != numel:
                    raise self._fail(call, f"{what}[{i}] has {v.tensor.numel()} elements "
                                           f"(shape {list(v.tensor.shape)}), expected "
                                           f"{numel // scale(v)} like the other tensor")

    @staticmethod
    def _premul(t: torch.Tensor, factor: Any) -> torch.Tensor:
        """A scaled copy of ``t`` (PREMUL_SUM inputs that must stay untouched)."""
        return t.detach().contiguous() * factor

    # -- all_reduce -------------------------------------------------------------------------
    def _fast(self, opts: Any) -> Any:
        """The group's fast call for a blocking call, or any call in a group of one, else None.

        A group of one runs an ``async_op=True`` call at once too, returning a completed
        Work: it waits for no one, and the fast call declines while earlier async calls
        are pending (the group pauses it), so calls keep their order. With peers it would
        not be the same call: an async call must return before its peers join it (rank 0:
        ``all_reduce(async_op=True)`` then ``send``; rank 1: ``recv`` then ``all_reduce``)."""
        fast = self.core_group.fast
        inline = not getattr(opts, "asyncOp", True) or self._alone
        return fast if fast is not None and inline else None

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        opts = opts or dist.AllreduceOptions()
        fast = self.core_group.fast                       # self._fast(opts), inline
        if fast is not None:
            if not getattr(opts, "asyncOp", True) or self._alone:
                if fast_calls.all_reduce(fast, tensors, opts.reduceOp):
                    return done("all_reduce", tensors)
            else:                 # async, one plain tensor: queued by the core at once
                work = self._async_all_reduce(tensors, opts.reduceOp)
                if work is not None:
                    return work
        if is_sparse(tensors):            # (the fast calls decline them: not contiguous)
            all_reduce_sparse(self.core_group, tensors, opts.reduceOp)
            return done("all_reduce", tensors)
        op, factor = self._op(opts, "all_reduce")
        vs = self._views(tensors, "all_reduce", "tensors", reducing=True)
        g = self.core_group
        for v in vs:
            if factor is not None:
                (v.tmp if v.tmp is not None else v.tensor).mul_(factor)
        starts = [lambda a, v=v: core.all_reduce(g, v.arr, op, dtype=v.dtype, async_op=a,
                                                 name="all_reduce", after=finisher(v))
                  for v in vs]
        return self._run("all_reduce", opts, tensors, starts)

    def _async_all_reduce(self, tensors: list[torch.Tensor], op: Any) -> dist.Work | None:
        """An ``async_op=True`` all_reduce of one plain tensor, straight to the core (which
        queues it, to run through the fast call: core/async_calls.py), without the views
        and closures of the general path; None: not such a call (the general path runs).
        Its array is ``fast_array``'s, which keeps the tensor alive while the call is queued."""
        if len(tensors) != 1:
            return None
        a, rop = fast_array(tensors[0]), fast_op(op)
        if a is None or rop is None:
            return None
        try:
            w = core.all_reduce(self.core_group, a.reshape(-1), rop, async_op=True, name="all_reduce")
        except CollcommError as exc:
            raise translate(exc) from None
        return CollWork("all_reduce", [w], tensors)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        """One all_reduce per dtype over the tensors flattened into one buffer."""
        opts = opts or dist.AllreduceCoalescedOptions()
        op, factor = self._op(opts, "all_reduce_coalesced")
        vs = self._views(tensors, "all_reduce_coalesced", "tensors", reducing=True)
        g = self.core_group
        by_dtype: dict[torch.dtype, list[View]] = {}
        for v in vs:
            by_dtype.setdefault(v.tensor.dtype, []).append(v)
        starts = []
        for group_views in by_dtype.values():
            flat = torch.cat([v.tensor.reshape(-1) for v in group_views])
            if factor is not None:
                flat.mul_(factor)
            fv = self._view(flat, "all_reduce_coalesced", "flattened tensors", reducing=True)

            def back(flat: torch.Tensor = flat, group_views: list[View] = group_views) -> None:
                pieces = flat.split([v.tensor.numel() for v in group_views])
                for v, piece in zip(group_views, pieces):
                    v.tensor.copy_(piece.view(v.tensor.shape))

            starts.append(lambda a, fv=fv, back=back: core.all_reduce(
                g, fv.arr, op, dtype=fv.dtype, async_op=a, name="all_reduce_coalesced", after=back))
        return self._run("all_reduce_coalesced", opts, tensors, starts)

    # -- broadcast ---------------------------------------------------------------------------
    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        opts = opts or dist.BroadcastOptions()
        fast = self.core_group.fast
        if (fast is not None and (not getattr(opts, "asyncOp", True) or self._alone)
                and fast_calls.broadcast(fast, tensors, opts.rootRank)):
            return done("broadcast", tensors)
        vs = self._views(tensors, "broadcast", "tensors")
        g, root = self.core_group, opts.rootRank
        starts = [lambda a, v=v: core.broadcast(g, v.arr, root, dtype=core_dtype(v), async_op=a,
                                                name="broadcast", after=finisher(v))
                  for v in vs]
        return self._run("broadcast", opts, tensors, starts)

    # -- reduce ------------------------------------------------------------------------------
    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        opts = opts or dist.ReduceOptions()
        g, root = self.core_group, opts.rootRank
        fast = self._fast(opts)
        if fast is not None and fast_calls.reduce(fast, tensors, opts.reduceOp, root, g.rank):
            return done("reduce", tensors)
        op, factor = self._op(opts, "reduce")
        is_root = g.rank == root
        starts = []
        for i, t in enumerate(tensors):
            v = self._view(t, "reduce", f"tensors[{i}]", reducing=True)
            send = v
            if factor is not None:
                if is_root:
                    (v.tmp if v.tmp is not None else v.tensor).mul_(factor)
                else:
                    send = self._view(self._premul(t, factor), "reduce", f"tensors[{i}]", True)
            starts.append(lambda a, v=v, send=send: core.reduce(
                g, send.arr, v.arr if is_root else None, op, root, dtype=v.dtype, async_op=a,
                name="reduce", after=finisher(v) if is_root else None))
        return self._run("reduce", opts, tensors, starts)

    # -- all_gather --------------------------------------------------------------------------
    def _all_gather_list(self, outs: list[View], inp: View, a: bool, call: str) -> CoreWork | None:
        g, n = self.core_group, self.size()
        if all(o.numel == inp.numel for o in outs):
            flat, after = gathered_into(outs, inp, g.rank)
            return core.all_gather(g, inp.arr, flat, dtype=core_dtype(inp), async_op=a, name=call,
                                   after=after)
        # outputs of different sizes: rank j's block goes to every rank, sized by its output
        flat = np.empty(sum(o.numel for o in outs), dtype=inp.arr.dtype)
        send = np.tile(inp.arr, n)
        return core.all_to_all(g, send, [inp.numel] * n, flat, [o.numel for o in outs],
                               dtype=core_dtype(inp), async_op=a, name=call,
                               after=copy_out(outs, flat))

    def allgather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor],
                  opts: Any = None, _call: str = "all_gather", _result: Any = None) -> dist.Work:
        opts = opts or AllgatherOptions()
        fast = self._fast(opts) if _call == "all_gather" else None
        if fast is not None and fast_calls.all_gather(fast, output_tensors, input_tensors):
            return done(_call, gathered(output_tensors))
        ins = self._views(input_tensors, _call, "input_tensors")
        if not isinstance(output_tensors, (list, tuple)) or len(output_tensors) != len(ins):
            raise self._fail(_call, "output_tensors must hold one list of tensors per input tensor")
        starts = []
        for i, inp in enumerate(ins):
            outs = self._views(output_tensors[i], _call, f"output_tensors[{i}]")
            self._per_rank(outs, _call, f"output_tensors[{i}]")
            same_kind(outs, inp, _call, self._where, f"output_tensors[{i}]")
            starts.append(lambda a, outs=outs, inp=inp: self._all_gather_list(outs, inp, a, _call))
        return self._run(_call, opts, gathered(output_tensors) if _result is None else _result, starts)

    def allgather_coalesced(self, output_lists: list[list[torch.Tensor]],
                            input_list: list[torch.Tensor], opts: Any = None) -> dist.Work:
        """``output_lists[rank][i]`` gets that rank's ``input_list[i]`` (torch's layout, and
        gloo's): one all_gather per input, over ``[output_lists[r][i] for r in ranks]``."""
        call, n = "all_gather_coalesced", self.size()
        if (not isinstance(output_lists, (list, tuple)) or len(output_lists) != n
                or not isinstance(input_list, (list, tuple))
                or any(not isinstance(o, (list, tuple)) or len(o) != len(input_list) for o in output_lists)):
            raise self._fail(call, f"output_lists must hold one list per rank of the group ({n}), "
                                   f"each with one tensor per input tensor ({len(input_list)})")
        per_input = [[output_lists[r][i] for r in range(n)] for i in range(len(input_list))]
        return self.allgather(per_input, input_list, opts, _call=call, _result=output_lists)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor,  # noqa: A002
                          opts: Any = None) -> dist.Work:
        fast = self.core_group.fast
        if (fast is not None and (not getattr(opts, "asyncOp", True) or self._alone)
                and fast_calls.all_gather_single(fast, output, input)):
            return done("all_gather_into_tensor", [output])
        return self.all_gather_single_coalesced([output], [input], opts, _call="all_gather_into_tensor")

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                    opts: Any = None,
                                    _call: str = "all_gather_into_tensor_coalesced") -> dist.Work:
        opts = opts or AllgatherOptions()
        g = self.core_group
        starts = []
        for i, (o, t) in enumerate(zip(outputs, inputs)):
            vo, vi = self._view(o, _call, f"output[{i}]"), self._view(t, _call, f"input[{i}]")
            starts.append(lambda a, vo=vo, vi=vi: core.all_gather(
                g, vi.arr, vo.arr, dtype=core_dtype(vi), async_op=a, name=_call,
                after=finisher(vo)))
        return self._run(_call, opts, list(outputs), starts)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    # -- reduce_scatter ------------------------------------------------------------------------
    def reduce_scatter(self, output_tensors: list[torch.Tensor],
                       input_tensors: list[list[torch.Tensor]], opts: Any = None) -> dist.Work:
        opts = opts or dist.ReduceScatterOptions()
        op, factor = self._op(opts, "reduce_scatter")
        g = self.core_group
        starts = []
        for i, o in enumerate(output_tensors):
            out = self._view(o, "reduce_scatter", f"output[{i}]", reducing=True)
            ins = self._views(input_tensors[i], "reduce_scatter", "input_list", reducing=True)
            self._per_rank(ins, "reduce_scatter", "input_list", out.numel)
            same_kind(ins, out, "reduce_scatter", self._where, "input_list")
            flat = torch.cat([v.tensor.reshape(-1) for v in ins])
            if factor is not None:
                flat.mul_(factor)
            send = self._view(flat, "reduce_scatter", "input_list", reducing=True)
            starts.append(lambda a, out=out, send=send: core.reduce_scatter(
                g, send.arr, out.arr, op, dtype=out.dtype, async_op=a, after=finisher(out)))
        return self._run("reduce_scatter", opts, output_tensors, starts)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor,  # noqa: A002
                              opts: Any = None) -> dist.Work:
        fast = self.core_group.fast
        if (fast is not None and (not getattr(opts, "asyncOp", True) or self._alone)
                and fast_calls.reduce_scatter_single(fast, output, input, opts.reduceOp)):
            return done("reduce_scatter_tensor", [output])
        return self.reduce_scatter_single_coalesced([output], [input], opts,
                                                    _call="reduce_scatter_tensor")

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs: list[torch.Tensor],
                                        inputs: list[torch.Tensor], opts: Any = None,
                                        _call: str = "reduce_scatter_tensor_coalesced") -> dist.Work:
        opts = opts or dist.ReduceScatterOptions()
        op, factor = self._op(opts, _call)
        g = self.core_group
        starts = []
        for i, (o, t) in enumerate(zip(outputs, inputs)):
            vo = self._view(o, _call, f"output[{i}]", reducing=True)
            vi = self._view(t if factor is None else self._premul(t, factor), _call, f"input[{i}]",
                            reducing=True)
            starts.append(lambda a, vo=vo, vi=vi: core.reduce_scatter(
                g, vi.arr, vo.arr, op, dtype=vo.dtype, async_op=a, name=_call,
                after=finisher(vo)))
        return self._run(_call, opts, list(outputs), starts)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # -- barrier -------------------------------------------------------------------------------
    def barrier(self, opts: Any = None) -> dist.Work:
        opts = opts or dist.BarrierOptions()
        g, timeout = self.core_group, getattr(opts, "timeout", None)
        # seconds(timeout), without its call where torch left the timeout unset (negative)
        limit = None if type(timeout) is timedelta and timeout <= _NO_TIME else seconds(timeout)
        fast = g.fast
        if (fast is not None and (not getattr(opts, "asyncOp", True) or self._alone)
                and fast_calls.barrier(fast, limit)):
            return done("barrier", [])
        start: Start = lambda a: core.barrier(g, async_op=a, timeout=limit)  # noqa: E731
        return self._run("barrier", opts, [], [start])

    # -- life cycle ------------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Called by ``destroy_process_group``: finish pending calls, leave cleanly."""
        attach.release(self.core_group)

    def abort(self) -> None:
        attach.release(self.core_group)
