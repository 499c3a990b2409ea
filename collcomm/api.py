"""The functional API: ``import collcomm as dist`` in place of ``torch.distributed`` (CPU).

Names, argument order, defaults and return conventions are torch 2.x's. Every collective
follows one template::

    def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False):
        g = _group(group, "all_reduce")            # InvalidArgumentError before init
        buf = as_output(tensor, ...)               # torch's argument forms -> numpy arrays
        if not _member(g): return None             # torch: ranks outside the group skip
        return core.all_reduce(g, buf.arr, op, dtype=buf.dtype, async_op=async_op)

and everything else (op/dtype checks, the group's call plan, the call signature, async
work) happens in :mod:`collcomm.core.collectives`, the layer every front end shares,
so a bad argument raises :class:`~collcomm.errors.InvalidArgumentError` on the rank that
passed it before any message is sent. Ranks (``src``, ``dst``, ``peer``) are global ranks;
``group_src``/``group_dst``/``group_peer`` give a rank of ``group`` instead (torch 2.6+).

Outputs are written in place, into the caller's memory: they must be contiguous and
writable (see :mod:`collcomm.buffers`). Lists of output tensors are filled from one
contiguous receive buffer (one copy per element).

Example (2 ranks)::

    >>> t = np.array([1, 2, 3, 4, 5]) if dist.get_rank() == 0 else np.zeros(5, dtype=int)
    >>> dist.broadcast(t, src=0)
    >>> t          # Rank 0: [1 2 3 4 5]   Rank 1: [1 2 3 4 5]
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np


from .algorithms import signature
from .core import collectives as core
from .core import p2p as core_p2p
from .core import runtime
from .buffers import Buf, as_input, as_output, as_outputs, check_like
from .errors import CollcommError, InvalidArgumentError, MismatchError, with_context
from .core.group import MAX_USER_TAG, ProcessGroup
from .ops import ReduceOp
from .transport.base import Handle, Status
from .core.work import Work

__all__ = [
    "P2POp", "all_gather", "all_gather_into_tensor", "all_reduce", "all_to_all",
    "all_to_all_single", "barrier", "batch_isend_irecv", "broadcast", "gather", "get_backend",
    "get_global_rank", "get_group_rank", "get_process_group_ranks", "get_rank",
    "get_world_size", "irecv", "is_available", "isend", "monitored_barrier", "recv", "reduce",
    "reduce_scatter", "reduce_scatter_tensor", "scatter", "send",
]

BACKEND = "collcomm"


# ----------------------------------------------------------------------------- helpers
def _group(group: Any, collective: str) -> Any:
    return runtime.resolve_group(group, collective)


def _member(g: Any) -> bool:
    return isinstance(g, ProcessGroup)


def _where(g: Any) -> str:
    if _member(g):
        return g.describe()
    world = runtime.get_world("collcomm")
    return f"global rank {world.global_rank} (not a member of the group)"


def _local_rank(g: ProcessGroup, collective: str, what: str, global_rank: Any,
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


def _no_list_here(xs: Any, collective: str, g: ProcessGroup, what: str, root_what: str,
                  root: int) -> None:
    if xs is None or (isinstance(xs, (list, tuple)) and len(xs) == 0):
        return
    raise InvalidArgumentError(
        f"{collective} on {g.describe()}: {what} must not be given on ranks other than the "
        f"{root_what} (global rank {g.to_global(root)}); got a {type(xs).__name__}")


def _copy_out(outs: Sequence[Buf], flat: np.ndarray) -> None:
    pos = 0
    for b in outs:
        np.copyto(b.arr, flat[pos:pos + b.numel])
        pos += b.numel


def _concat(bufs: Sequence[Buf], dtype: np.dtype) -> np.ndarray:
    if not bufs:
        return np.empty(0, dtype=dtype)
    return np.concatenate([b.arr for b in bufs]).astype(dtype, copy=False)


# ----------------------------------------------------------------------------- queries
def is_available() -> bool:
    return True


def get_rank(group: Any = None) -> int:
    """This process's rank in ``group`` (default the world); -1 if it is not a member."""
    g = _group(group, "get_rank")
    return g.rank if _member(g) else -1


def get_world_size(group: Any = None) -> int:
    """The number of ranks in ``group`` (default the world); -1 if this rank is not a member."""
    g = _group(group, "get_world_size")
    return g.size if _member(g) else -1


def get_backend(group: Any = None) -> str:
    g = _group(group, "get_backend")
    if not _member(g):
        raise InvalidArgumentError(f"get_backend: {_where(g)}: invalid process group specified")
    return BACKEND


def get_global_rank(group: Any, group_rank: int) -> int:
    """The global rank of ``group_rank`` in ``group``."""
    g = _group(group, "get_global_rank")
    if not _member(g):
        raise InvalidArgumentError(f"get_global_rank: {_where(g)}: this rank is not in the group")
    if not isinstance(group_rank, (int, np.integer)) or not 0 <= int(group_rank) < g.size:
        raise InvalidArgumentError(
            f"get_global_rank on {g.describe()}: group_rank must be in [0, {g.size}), got {group_rank!r}")
    return g.to_global(int(group_rank))


def get_group_rank(group: Any, global_rank: int) -> int:
    """The rank of ``global_rank`` inside ``group``; InvalidArgumentError if it is not in it."""
    g = _group(group, "get_group_rank")
    if not _member(g):
        raise InvalidArgumentError(f"get_group_rank: {_where(g)}: this rank is not in the group")
    local = g.to_local(int(global_rank))
    if local < 0:
        raise InvalidArgumentError(
            f"get_group_rank on {g.describe()}: global rank {global_rank} is not part of the group "
            f"(its global ranks are {g.ranks})")
    return local


def get_process_group_ranks(group: Any) -> list[int]:
    """The global ranks of ``group``, in group-rank order."""
    g = _group(group, "get_process_group_ranks")
    if not _member(g):
        raise InvalidArgumentError(f"get_process_group_ranks: {_where(g)}: this rank is not in the group")
    return list(g.ranks)


# ----------------------------------------------------------------------------- collectives
def barrier(group: Any = None, async_op: bool = False, device_ids: Any = None, *, algorithm: str = "auto") -> Work | None:
    """Return only when every rank of ``group`` has entered the barrier."""
    g = _group(group, "barrier")
    fast = g.fast
    if fast is not None and not async_op and algorithm == "auto" and fast.barrier("barrier"):
        return None
    if not _member(g):
        return None
    return core.barrier(g, async_op=async_op, algorithm=algorithm)


def monitored_barrier(group: Any = None, timeout: Any = None, wait_all_ranks: bool = False) -> None:
    """A barrier that fails with CommTimeoutError after ``timeout`` (default: the group's)."""
    g = _group(group, "monitored_barrier")
    if not _member(g):
        return None
    secs = None if timeout is None else runtime._timeout_seconds(timeout)
    core.barrier(g, name="monitored_barrier", timeout=secs)
    return None


def broadcast(tensor: Any, src: int | None = None, group: Any = None, async_op: bool = False,
              group_src: int | None = None, *, algorithm: str = "auto") -> Work | None:
    """Copy ``tensor`` of rank ``src`` into ``tensor`` of every rank of the group (in place)."""
    name = "broadcast"
    g = _group(group, name)
    fast = g.fast    # the fast call (core/fastpath.py); src is local only in the world
    if (fast is not None and group is None and group_src is None and not async_op
            and algorithm == "auto" and fast.broadcast(tensor, src, name)):
        return None
    buf = as_output(tensor, name, _where(g), "tensor")
    if not _member(g):
        return None
    root = _local_rank(g, name, "src", src, group_src)
    return core.broadcast(g, buf.arr, root, dtype=buf.dtype, async_op=async_op, algorithm=algorithm)


def all_reduce(tensor: Any, op: Any = ReduceOp.SUM, group: Any = None,
               async_op: bool = False, *, algorithm: str = "auto") -> Work | None:
    """Every rank's ``tensor`` becomes the elementwise ``op`` over all ranks (in place)."""
    name = "all_reduce"
    g = _group(group, name)
    fast = g.fast    # the fast call (core/fastpath.py): done, or nothing done
    if fast is not None and not async_op and algorithm == "auto" and fast.all_reduce(tensor, tensor, op, name):
        return None
    buf = as_output(tensor, name, _where(g), "tensor")
    if not _member(g):
        return None
    return core.all_reduce(g, buf.arr, op, dtype=buf.dtype, async_op=async_op, algorithm=algorithm)


def reduce(tensor: Any, dst: int | None = None, op: Any = ReduceOp.SUM, group: Any = None,
           async_op: bool = False, group_dst: int | None = None, *, algorithm: str = "auto") -> Work | None:
    """``tensor`` on ``dst`` becomes the elementwise ``op`` over all ranks; others keep theirs."""
    name = "reduce"
    g = _group(group, name)
    fast = g.fast    # src/dst are local ranks only in the world
    if (fast is not None and group is None and group_dst is None and type(dst) is int
            and not async_op and algorithm == "auto"
            and fast.reduce(tensor, tensor if dst == g.rank else None, op, dst, name)):
        return None
    buf = as_output(tensor, name, _where(g), "tensor")
    if not _member(g):
        return None
    root = _local_rank(g, name, "dst", dst, group_dst)
    recv = buf.arr if g.rank == root else None
    return core.reduce(g, buf.arr, recv, op, root, dtype=buf.dtype, async_op=async_op,
                       algorithm=algorithm)


def all_gather(tensor_list: list[Any], tensor: Any, group: Any = None,
               async_op: bool = False, *, algorithm: str = "auto") -> Work | None:
    """``tensor_list[i]`` of every rank receives rank i's ``tensor``."""
    name = "all_gather"
    g = _group(group, name)
    fast = g.fast
    if fast is not None and not async_op and algorithm == "auto" and fast.all_gather(tensor, tensor_list, name):
        return None
    where = _where(g)
    inp = as_input(tensor, name, where, "tensor")
    if not _member(g):
        return None
    outs = as_outputs(tensor_list, g.size, name, where, "tensor_list", inp, "tensor")
    recv = np.empty(inp.numel * g.size, dtype=inp.arr.dtype)
    return core.all_gather(g, inp.arr, recv, dtype=inp.dtype, async_op=async_op, algorithm=algorithm,
                           after=lambda: _copy_out(outs, recv))


def all_gather_into_tensor(output_tensor: Any, input_tensor: Any, group: Any = None,
                           async_op: bool = False, *, algorithm: str = "auto") -> Work | None:
    """``output_tensor`` (world_size × input's elements) receives every rank's input, in rank order."""
    name = "all_gather_into_tensor"
    g = _group(group, name)
    fast = g.fast
    if (fast is not None and not async_op and algorithm == "auto"
            and fast.all_gather(input_tensor, output_tensor, name)):
        return None
    where = _where(g)
    out = as_output(output_tensor, name, where, "output_tensor")
    inp = as_input(input_tensor, name, where, "input_tensor")
    if not _member(g):
        return None
    check_like(out, inp, name, where, "output_tensor", "input_tensor", inp.numel * g.size)
    return core.all_gather(g, inp.arr, out.arr, dtype=inp.dtype, async_op=async_op,
                           algorithm=algorithm, name=name)


def reduce_scatter(output: Any, input_list: list[Any], op: Any = ReduceOp.SUM, group: Any = None,
                   async_op: bool = False, *, algorithm: str = "auto") -> Work | None:
    """Reduce ``input_list[i]`` over all ranks into ``output`` of rank i."""
    name = "reduce_scatter"
    g = _group(group, name)
    where = _where(g)
    out = as_output(output, name, where, "output")
    if not _member(g):
        return None
    ins = as_outputs(input_list, g.size, name, where, "input_list", out, "output", writable=False)
    return core.reduce_scatter(g, _concat(ins, out.arr.dtype), out.arr, op, dtype=out.dtype,
                               async_op=async_op, algorithm=algorithm)


def reduce_scatter_tensor(output: Any, input: Any, op: Any = ReduceOp.SUM, group: Any = None,
                          async_op: bool = False, *, algorithm: str = "auto") -> Work | None:
    """Reduce ``input`` (world_size × output's elements) over all ranks; chunk i → ``output`` of rank i."""
    name = "reduce_scatter_tensor"
    g = _group(group, name)
    fast = g.fast
    if (fast is not None and not async_op and algorithm == "auto"
            and fast.reduce_scatter(input, output, op, name)):
        return None
    where = _where(g)
    out = as_output(output, name, where, "output")
    inp = as_input(input, name, where, "input")
    if not _member(g):
        return None
    if inp.numel % g.size:
        raise InvalidArgumentError(
            f"{name} on {where}: input has {inp.numel} elements, which is not divisible by the "
            f"group size {g.size}")
    check_like(out, inp, name, where, "output", "input", inp.numel // g.size)
    return core.reduce_scatter(g, inp.arr, out.arr, op, dtype=out.dtype, async_op=async_op,
                               algorithm=algorithm, name=name)


def all_to_all(output_tensor_list: list[Any], input_tensor_list: list[Any], group: Any = None,
               async_op: bool = False, *, algorithm: str = "auto") -> Work | None:
    """``output_tensor_list[j]`` of rank i receives ``input_tensor_list[i]`` of rank j."""
    name = "all_to_all"
    g = _group(group, name)
    where = _where(g)
    if not _member(g):
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
    g = _group(group, name)
    fast = g.fast    # equal blocks only
    if (fast is not None and output_split_sizes is None and input_split_sizes is None
            and not async_op and algorithm == "auto" and fast.all_to_all(input, output, name)):
        return None
    where = _where(g)
    out = as_output(output, name, where, "output")
    inp = as_input(input, name, where, "input")
    if not _member(g):
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


def gather(tensor: Any, gather_list: list[Any] | None = None, dst: int | None = None,
           group: Any = None, async_op: bool = False, group_dst: int | None = None, *, algorithm: str = "auto") -> Work | None:
    """``gather_list[i]`` on ``dst`` (default 0) receives rank i's ``tensor``; give no list elsewhere."""
    name = "gather"
    g = _group(group, name)
    fast = g.fast    # the list only on dst (a rank of the world), nothing elsewhere
    if fast is not None and group is None and group_dst is None and not async_op and algorithm == "auto":
        root = 0 if dst is None else dst
        here = root == g.rank
        if (type(root) is int and (here or gather_list is None)
                and fast.gather(tensor, gather_list if here else None, root, name)):
            return None
    where = _where(g)
    inp = as_input(tensor, name, where, "tensor")
    if not _member(g):
        return None
    if dst is None and group_dst is None:
        dst = 0
    root = _local_rank(g, name, "dst", dst, group_dst)
    if g.rank == root:
        outs = as_outputs(gather_list, g.size, name, where, "gather_list", inp, "tensor")
    else:
        _no_list_here(gather_list, name, g, "gather_list", "destination", root)
        outs = []

    if not outs:
        return core.gather(g, inp.arr, None, root, dtype=inp.dtype, async_op=async_op,
                           algorithm=algorithm)
    recv = np.empty(inp.numel * g.size, dtype=inp.arr.dtype)
    return core.gather(g, inp.arr, recv, root, dtype=inp.dtype, async_op=async_op,
                       algorithm=algorithm, after=lambda: _copy_out(outs, recv))


def scatter(tensor: Any, scatter_list: list[Any] | None = None, src: int | None = None,
            group: Any = None, async_op: bool = False, group_src: int | None = None, *, algorithm: str = "auto") -> Work | None:
    """``tensor`` of rank i receives ``scatter_list[i]`` of ``src`` (default 0); give no list elsewhere."""
    name = "scatter"
    g = _group(group, name)
    fast = g.fast    # the list only on src (a rank of the world), nothing elsewhere
    if fast is not None and group is None and group_src is None and not async_op and algorithm == "auto":
        root = 0 if src is None else src
        here = root == g.rank
        if (type(root) is int and (here or scatter_list is None)
                and fast.scatter(scatter_list if here else None, tensor, root, name)):
            return None
    where = _where(g)
    out = as_output(tensor, name, where, "tensor")
    if not _member(g):
        return None
    if src is None and group_src is None:
        src = 0
    root = _local_rank(g, name, "src", src, group_src)
    if g.rank == root:
        ins = as_outputs(scatter_list, g.size, name, where, "scatter_list", out, "tensor", writable=False)
    else:
        _no_list_here(scatter_list, name, g, "scatter_list", "source", root)
        ins = []

    send = _concat(ins, out.arr.dtype) if g.rank == root else None
    return core.scatter(g, send, out.arr, root, dtype=out.dtype, async_op=async_op,
                        algorithm=algorithm)


# ----------------------------------------------------------------------------- point to point
def _p2p_context(name: str, g: ProcessGroup, peer: int | None) -> str:
    """What an error of a point-to-point call is prefixed with (``peer``: global, None = any)."""
    who = "any rank" if peer is None else f"global rank {peer}"
    return f"{name} {'to' if name == 'isend' else 'from'} {who} on {g.describe()}"


def _size_error(context: str, status: Status, buf: Buf) -> MismatchError:
    return MismatchError(f"{context}: received {status.nbytes} bytes, expected "
                         f"{buf.arr.nbytes} ({buf.describe()}); sizes must match")


class P2PWork:
    """The handle of an ``isend``/``irecv``: ``wait()``, ``is_completed()``, ``source_rank()``."""

    def __init__(self, name: str, handle: Handle, g: ProcessGroup, buf: Buf, peer: int | None) -> None:
        self.name = name
        self._handle = handle
        self._group = g
        self._buf = buf          # keeps the (possibly copied) payload alive until done
        self._peer = peer        # global rank, None = any
        self._status: Status | None = None
        self._exc: BaseException | None = None

    def _context(self) -> str:
        return _p2p_context(self.name, self._group, self._peer)

    def wait(self, timeout: float | None = None) -> bool:
        if self._exc is not None:
            raise self._exc
        if self._status is None:
            try:
                status = self._handle.wait(timeout)
            except CollcommError as exc:
                if timeout is not None and type(exc).__name__ == "CommTimeoutError":
                    raise with_context(exc, self._context()) from exc  # retryable: keep handle
                self._exc = with_context(exc, self._context())
                raise self._exc from exc
            if self.name == "irecv" and status.nbytes != self._buf.arr.nbytes:
                self._exc = _size_error(self._context(), status, self._buf)
                raise self._exc
            self._status = status
        return True

    def is_completed(self) -> bool:
        if self._status is not None or self._exc is not None:
            return True
        try:
            done = self._handle.test()
        except CollcommError:
            return True
        return done

    def is_success(self) -> bool:
        return self._status is not None

    def exception(self) -> BaseException | None:
        return self._exc

    def source_rank(self) -> int:
        """The global rank the message came from (irecv) or went to (isend); waits first."""
        self.wait()
        assert self._status is not None
        return self._status.source

    def result(self) -> list[Any]:
        self.wait()
        return []


def _p2p_group(group: Any, name: str) -> ProcessGroup:
    g = _group(group, name)
    if not _member(g):
        raise InvalidArgumentError(
            f"{name}: {_where(g)}: this rank is not in the group it was given; point-to-point "
            "calls need a group this rank belongs to")
    return g


def _p2p_peer(g: ProcessGroup, name: str, what: str, peer: Any, group_peer: Any,
              allow_any: bool = False) -> int | None:
    if peer is None and group_peer is None and allow_any:
        return None
    local = _local_rank(g, name, what, peer, group_peer)
    if local == g.rank:
        raise InvalidArgumentError(
            f"{name} on {g.describe()}: {what} is this rank itself (global rank {g.global_rank}); "
            "a rank cannot send to or receive from itself")
    return local


_P2P_SIGS: dict[Any, int] = {}


def _p2p_sig(dtype: Any) -> int:
    """``signature.p2p(dtype)``, computed once per dtype."""
    sig = _P2P_SIGS.get(dtype)
    if sig is None:
        sig = _P2P_SIGS[dtype] = signature.p2p(dtype)
    return sig


def _isend(tensor: Any, dst: int | None, group: Any, tag: int, group_dst: int | None,
           name: str, rec: list[Any] | None = None) -> tuple[Handle, ProcessGroup, Buf, int]:
    g = _p2p_group(group, name)
    buf = as_input(tensor, name, g.describe(), "tensor")
    peer = _p2p_peer(g, name, "dst", dst, group_dst)
    assert peer is not None
    return g.p2p_isend(buf.arr, peer, tag, _p2p_sig(buf.dtype), rec), g, buf, peer


def _irecv(tensor: Any, src: int | None, group: Any, tag: int, group_src: int | None,
           name: str, rec: list[Any] | None = None) -> tuple[Handle, ProcessGroup, Buf, int | None]:
    g = _p2p_group(group, name)
    buf = as_output(tensor, name, g.describe(), "tensor")
    peer = _p2p_peer(g, name, "src", src, group_src, allow_any=True)
    return g.p2p_irecv(buf.arr, peer, tag, _p2p_sig(buf.dtype), rec), g, buf, peer


def _native(tensor: Any, peer: Any, group: Any, tag: Any, group_peer: Any,
            writable: bool, name: str) -> tuple[Any, ProcessGroup, int] | None:
    """(the group's native p2p entry, the group, the local peer) when a blocking send/recv
    may go native (core/p2p.py): a numeric C-contiguous numpy array (writable to receive),
    a global peer of the group other than this rank, a valid tag; else None (every check
    the regular path makes before it records the call is made here, so a native attempt
    that does nothing hands its record to the regular path, which cannot refuse it)."""
    if (type(tensor) is not np.ndarray or group_peer is not None or type(peer) is not int
            or type(tag) is not int or not 0 <= tag <= MAX_USER_TAG):
        return None
    g = runtime._world if group is None else None
    if g is None:
        g = runtime.resolve_group(group, name)
        if type(g) is not ProcessGroup:
            return None
    try:
        f = g._p2p_native
    except AttributeError:
        f = core_p2p.native(g)
    if f is None or tensor.dtype.kind not in "biufc":
        return None
    if g is runtime._world:
        local = peer if 0 <= peer < g.size else -1     # the world's ranks are its global ranks
    else:
        local = g.to_local(peer)
    if local < 0 or local == g.rank:
        return None
    if writable:      # (a send of a non-contiguous array: C declines, the regular path copies)
        flags = tensor.flags
        if not flags.c_contiguous or not flags.writeable:
            return None
    return f, g, local


def isend(tensor: Any, dst: int | None = None, group: Any = None, tag: int = 0,
          group_dst: int | None = None) -> P2PWork:
    """Start sending ``tensor`` to global rank ``dst``; returns a handle with ``wait()``."""
    h, g, buf, peer = _isend(tensor, dst, group, tag, group_dst, "isend")
    return P2PWork("isend", h, g, buf, g.to_global(peer))


def irecv(tensor: Any, src: int | None = None, group: Any = None, tag: int = 0,
          group_src: int | None = None) -> P2PWork:
    """Start receiving into ``tensor`` from global rank ``src`` (None: any rank of the group)."""
    h, g, buf, peer = _irecv(tensor, src, group, tag, group_src, "irecv")
    return P2PWork("irecv", h, g, buf, None if peer is None else g.to_global(peer))


def send(tensor: Any, dst: int | None = None, group: Any = None, tag: int = 0,
         group_dst: int | None = None) -> None:
    """Send ``tensor`` to global rank ``dst`` and wait until it left this buffer."""
    rec = None
    fast = _native(tensor, dst, group, tag, group_dst, False, "isend")
    if fast is not None:     # one C call (native/_p2p.c), or nothing done
        f, g, local = fast
        rec = core_p2p.record(g, "isend", local)
        if f.send(tensor, local, tag, _p2p_sig(tensor.dtype)):
            core_p2p.finished(rec, True)
            return
    try:
        h, g, buf, peer = _isend(tensor, dst, group, tag, group_dst, "isend", rec)
    except CollcommError:
        core_p2p.finished(rec, False)    # refused at once (e.g. transport closed)
        raise
    try:
        h.wait()
    except CollcommError as exc:   # what isend(...).wait() raises, without the P2PWork
        raise with_context(exc, _p2p_context("isend", g, g.to_global(peer))) from exc


def recv(tensor: Any, src: int | None = None, group: Any = None, tag: int = 0,
         group_src: int | None = None) -> int:
    """Receive into ``tensor`` from ``src`` (None: any rank); returns the sender's global rank."""
    rec = None
    fast = _native(tensor, src, group, tag, group_src, True, "irecv")
    if fast is not None:     # one C call (native/_p2p.c), or nothing consumed
        f, g, local = fast
        rec = core_p2p.record(g, "irecv", local)
        try:
            n = f.recv(tensor, local, tag, MAX_USER_TAG, _p2p_sig(tensor.dtype))
        except CollcommError as exc:   # what the regular wait raises, with its context
            core_p2p.finished(rec, False)
            raise with_context(exc, _p2p_context("irecv", g, src)) from exc
        if n is not None:
            core_p2p.finished(rec, True)
            if n != tensor.nbytes:
                raise _size_error(_p2p_context("irecv", g, src), Status(src, n, tag),
                                  as_output(tensor, "irecv", g.describe(), "tensor"))
            return src
    try:
        h, g, buf, peer = _irecv(tensor, src, group, tag, group_src, "irecv", rec)
    except CollcommError:
        core_p2p.finished(rec, False)
        raise
    try:
        status = h.wait()
    except CollcommError as exc:   # what irecv(...).source_rank() raises, without the P2PWork
        raise with_context(exc, _p2p_context("irecv", g, None if peer is None else g.to_global(peer))) from exc
    if status.nbytes != buf.arr.nbytes:
        raise _size_error(_p2p_context("irecv", g, None if peer is None else g.to_global(peer)), status, buf)
    return status.source


class P2POp:
    """One operation of :func:`batch_isend_irecv`: ``P2POp(dist.isend, tensor, peer)``."""

    def __init__(self, op: Callable[..., Any], tensor: Any, peer: int | None = None,
                 group: Any = None, tag: int = 0, group_peer: int | None = None) -> None:
        if op not in (isend, irecv) and getattr(op, "__name__", "") not in ("isend", "irecv"):
            raise InvalidArgumentError(
                f"P2POp: op must be collcomm.isend or collcomm.irecv, got {op!r}")
        if peer is None and group_peer is None:
            raise InvalidArgumentError("P2POp: peer (a global rank) or group_peer is required")
        self.op = isend if getattr(op, "__name__", "") == "isend" else irecv
        self.tensor, self.peer, self.group, self.tag, self.group_peer = tensor, peer, group, tag, group_peer

    def __repr__(self) -> str:
        return f"P2POp({self.op.__name__}, peer={self.peer}, tag={self.tag})"


def batch_isend_irecv(p2p_op_list: list[P2POp]) -> list[P2PWork]:
    """Start every op of the list (all validated first); returns their handles in order."""
    if not isinstance(p2p_op_list, (list, tuple)) or not all(isinstance(p, P2POp) for p in p2p_op_list):
        raise InvalidArgumentError(
            f"batch_isend_irecv: expected a list of P2POp, got {p2p_op_list!r:.200}")
    prepared = []
    for i, p in enumerate(p2p_op_list):
        name = p.op.__name__
        g = _p2p_group(p.group, "batch_isend_irecv")
        what = f"p2p_op_list[{i}].tensor"
        buf = (as_input if name == "isend" else as_output)(p.tensor, "batch_isend_irecv", g.describe(), what)
        peer = _p2p_peer(g, "batch_isend_irecv", "peer", p.peer, p.group_peer)
        g._p2p_tag(p.tag, "batch_isend_irecv")
        prepared.append((name, g, buf, peer, p.tag))
    works = []
    for name, g, buf, peer, tag in prepared:
        if name == "isend":
            h = g.p2p_isend(buf.arr, peer, tag, _p2p_sig(buf.dtype))
        else:
            h = g.p2p_irecv(buf.arr, peer, tag, _p2p_sig(buf.dtype))
        works.append(P2PWork(name, h, g, buf, g.to_global(peer)))
    return works

