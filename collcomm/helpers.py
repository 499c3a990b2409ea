"""The training-script helper layer (seed 004's ``distributed.py``, seed 002's ScaleTorch).

Every helper works unchanged in a single process that never called
``init_process_group``: it then behaves as a world of one (rank 0, size 1, identity
reductions). Values may be Python numbers, numpy arrays or torch CPU tensors; results keep
the input's kind. The helpers call the core (:mod:`collcomm.core.collectives`) directly.

Example, 4 ranks with losses 0.5, 0.3, 0.7, 0.4::

    >>> reduce_tensor(loss, op="sum")    # 1.9 on every rank
    >>> reduce_tensor(loss, op="mean")   # 0.475 on every rank
    >>> gather_tensor(loss, dst=0)       # Rank 0: [0.5, 0.3, 0.7, 0.4]   others: None

Gradient sync without DDP, the seeds' best practice (bucketing + overlap)::

    >>> allreduce_gradients(model.parameters())          # every .grad averaged, in place
    >>> buckets = GradientBuckets(bucket_bytes=25 << 20)  # or by hand, during backward:
    >>> for p in reversed(params): ...; buckets.add(p)    # starts each bucket when full
    >>> buckets.wait()

:class:`GradientBuckets` packs gradients into buckets in the order they are added (reverse
parameter order: the order backward produces them), one bucket per dtype at a time; a
bucket's all_reduce starts asynchronously the moment the bucket holds ``bucket_bytes``,
so packing (and the caller's compute) overlaps the communication of earlier buckets; when
each bucket's all_reduce finishes, its values are copied back into the original arrays.
"""
from __future__ import annotations

from typing import Any, Iterable

import numpy as np

from .buffers import as_output, is_tensor, like
from .core import collectives as core
from .core import runtime
from .core.group import ProcessGroup
from .core.work import Work
from .errors import CollcommError, InvalidArgumentError
from .ops import ReduceOp

__all__ = ["GradientBuckets", "allreduce_gradients", "barrier", "broadcast_tensor",
           "gather_tensor", "get_device", "get_rank", "get_world_size", "is_distributed",
           "is_main_process", "reduce_tensor"]

_OPS = {"mean": ReduceOp.AVG, "avg": ReduceOp.AVG, "average": ReduceOp.AVG,
        "sum": ReduceOp.SUM, "max": ReduceOp.MAX, "min": ReduceOp.MIN,
        "prod": ReduceOp.PRODUCT, "product": ReduceOp.PRODUCT}

#: DDP's default bucket size.
DEFAULT_BUCKET_BYTES = 25 << 20


def _op(op: Any, name: str) -> ReduceOp:
    rop = _OPS.get(op.lower() if isinstance(op, str) else op)
    if rop is None:
        raise InvalidArgumentError(f"{name}: op must be one of {sorted(_OPS)}, got {op!r}")
    return rop


def _group(group: Any, name: str) -> ProcessGroup | None:
    """The group to use; None if this rank is not a member (the call is then a no-op)."""
    g = runtime.resolve_group(group, name)
    return g if isinstance(g, ProcessGroup) else None


def is_distributed() -> bool:
    """True once ``init_process_group`` was called (in a world of any size)."""
    return runtime.is_initialized()


def get_rank(group: Any = None) -> int:
    if not is_distributed():
        runtime.world_of_one("collcomm.helpers.get_rank")
        return 0
    g = _group(group, "get_rank")
    return g.rank if g is not None else -1


def get_world_size(group: Any = None) -> int:
    if not is_distributed():
        runtime.world_of_one("collcomm.helpers.get_world_size")
        return 1
    g = _group(group, "get_world_size")
    return g.size if g is not None else -1


def is_main_process() -> bool:
    return get_rank() == 0


def get_device() -> str:
    """The device collectives run on: always ``"cpu"``."""
    return "cpu"


def barrier(group: Any = None) -> None:
    if not is_distributed():
        runtime.world_of_one("collcomm.helpers.barrier")
        return
    g = _group(group, "barrier")
    if g is not None:
        core.barrier(g)


def _as_array(value: Any) -> tuple[Any, str]:
    """(a fresh array/tensor holding ``value``, its kind: 'tensor', 'array' or 'scalar')."""
    if is_tensor(value):
        return value.detach().clone().contiguous(), "tensor"
    if isinstance(value, np.ndarray):
        return np.array(value, copy=True, order="C"), "array"
    if isinstance(value, np.generic):
        return np.array(value), "npscalar"
    if isinstance(value, (bool, int, float, complex)):
        return np.array(value), "scalar"
    return np.array(value), "array"


def _back(arr: Any, kind: str) -> Any:
    if kind == "scalar":
        return arr.item()
    if kind == "npscalar":
        return arr[()]
    return arr


def _floating(value: Any) -> Any:
    """``value`` itself if it is floating/complex, else a float copy (mean of ints)."""
    if is_tensor(value):
        return value if (value.is_floating_point() or value.is_complex()) else value.double()
    if value.dtype.kind in "fc" or value.dtype.name == "bfloat16":
        return value
    return value.astype(np.float64)


def reduce_tensor(tensor: Any, op: str = "mean", group: Any = None) -> Any:
    """A NEW value: the ``op`` ("mean" or "sum"; also "max", "min", "prod") over every rank."""
    rop = _op(op, "reduce_tensor")
    value, kind = _as_array(tensor)
    if rop is ReduceOp.AVG:
        value = _floating(value)
    if is_distributed():
        g = _group(group, "reduce_tensor")
        if g is not None:
            buf = as_output(value, "reduce_tensor", g.describe())
            core.all_reduce(g, buf.arr, rop, dtype=buf.dtype, name="reduce_tensor")
    else:
        runtime.world_of_one("collcomm.helpers.reduce_tensor")
    return _back(value, kind)


def _local_root(g: ProcessGroup, root: int, name: str, what: str) -> int:
    local = g.to_local(int(root))
    if local < 0:
        raise InvalidArgumentError(f"{name} on {g.describe()}: {what}={root} is not a rank of the "
                                   f"group (its global ranks are {g.ranks})")
    return local


def gather_tensor(tensor: Any, dst: int = 0, group: Any = None) -> list[Any] | None:
    """The list of every rank's value on ``dst`` (a global rank); None on the other ranks.

    Every rank must pass a value of the same shape and dtype (as ``gather`` requires).
    """
    value, kind = _as_array(tensor)
    if not is_distributed():
        runtime.world_of_one("collcomm.helpers.gather_tensor")
        return [_back(value, kind)]
    g = _group(group, "gather_tensor")
    if g is None:
        return None
    root = _local_root(g, dst, "gather_tensor", "dst")
    buf = as_output(value, "gather_tensor", g.describe())
    if g.rank != root:
        core.gather(g, buf.arr, None, root, dtype=buf.dtype, name="gather_tensor")
        return None
    flat = np.empty(buf.arr.size * g.size, dtype=buf.arr.dtype)
    core.gather(g, buf.arr, flat, root, dtype=buf.dtype, name="gather_tensor")
    return [_back(like(value, part, buf.dtype), kind) for part in np.split(flat, g.size)]


def broadcast_tensor(tensor: Any, src: int = 0, group: Any = None) -> Any:
    """``src``'s value (``src`` a global rank) on every rank. Arrays/tensors are overwritten
    in place and returned; Python numbers come back as a new value."""
    if not is_distributed():
        runtime.world_of_one("collcomm.helpers.broadcast_tensor")
        return tensor
    g = _group(group, "broadcast_tensor")
    if g is None:
        return tensor
    root = _local_root(g, src, "broadcast_tensor", "src")
    if is_tensor(tensor) or (isinstance(tensor, np.ndarray) and tensor.flags.c_contiguous
                             and tensor.flags.writeable):
        value, kind = tensor, "same"
    else:
        value, kind = _as_array(tensor)
    buf = as_output(value, "broadcast_tensor", g.describe())
    core.broadcast(g, buf.arr, root, dtype=buf.dtype, name="broadcast_tensor")
    return value if kind == "same" else _back(value, kind)


# ----------------------------------------------------------------------------- gradient buckets

def _gradient(x: Any) -> Any:
    """The array to reduce for ``x``: a torch Parameter's ``.grad`` (None if it has none),
    else ``x`` itself (a numpy array, a tensor, a gradient)."""
    if is_tensor(x) and getattr(x, "requires_grad", False) and x.is_leaf:
        return x.grad
    return x


class GradientBuckets:
    """Bucketed, overlapped all_reduce of gradients (see the module docstring).

    ``add(x)`` as each gradient becomes ready; ``wait()`` at the end (it also starts the
    last, partly filled buckets). Reusable: after ``wait()`` the next ``add`` starts over.
    """

    def __init__(self, bucket_bytes: int = DEFAULT_BUCKET_BYTES, op: str = "mean",
                 group: Any = None) -> None:
        if not isinstance(bucket_bytes, (int, np.integer)) or bucket_bytes < 1:
            raise InvalidArgumentError(f"GradientBuckets: bucket_bytes must be a positive int, "
                                       f"got {bucket_bytes!r}")
        self.bucket_bytes = int(bucket_bytes)
        self.op = _op(op, "GradientBuckets")
        self.group = _group(group, "allreduce_gradients") if is_distributed() else None
        self._open: dict[Any, tuple[list[np.ndarray], int]] = {}   # dtype -> (arrays, bytes)
        self._works: list[Work] = []
        self.buckets_started = 0

    def add(self, x: Any) -> None:
        """One gradient is ready: put it in its dtype's bucket; start the bucket when full."""
        grad = _gradient(x)
        if grad is None or self.group is None:
            return
        buf = as_output(grad, "allreduce_gradients", self.group.describe(), "gradient")
        key = buf.dtype
        arrays, nbytes = self._open.get(key, ([], 0))
        arrays.append(buf.arr)
        nbytes += buf.arr.nbytes
        if nbytes >= self.bucket_bytes:
            self._open.pop(key, None)
            self._start(arrays, key)
        else:
            self._open[key] = (arrays, nbytes)

    def flush(self) -> None:
        """Start every partly filled bucket."""
        while self._open:
            key, (arrays, _) = self._open.popitem()
            self._start(arrays, key)

    def wait(self) -> None:
        """Start what is left, then wait for every bucket (its values are then in place)."""
        self.flush()
        works, self._works = self._works, []
        errors = []
        for w in works:
            try:
                w.wait()
            except CollcommError as exc:
                errors.append(exc)
        if errors:
            raise errors[0]

    def _start(self, arrays: list[np.ndarray], dtype: Any) -> None:
        g = self.group
        assert g is not None
        flat = np.concatenate(arrays) if len(arrays) > 1 else arrays[0]

        def unflatten() -> None:
            if flat is arrays[0]:
                return
            pos = 0
            for a in arrays:
                np.copyto(a, flat[pos:pos + a.size])
                pos += a.size

        work = core.all_reduce(g, flat, self.op, dtype=dtype, async_op=True,
                               name="allreduce_gradients", after=unflatten)
        assert work is not None
        self._works.append(work)
        self.buckets_started += 1


def allreduce_gradients(params_or_arrays: Iterable[Any], bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                        op: str = "mean", group: Any = None, async_op: bool = False
                        ) -> GradientBuckets | None:
    """All-reduce every gradient in place, in buckets of ``bucket_bytes``, last first.

    ``params_or_arrays``: torch Parameters (their ``.grad`` is reduced; those without one
    are skipped), gradient tensors or numpy arrays. ``op``: "mean" (default) or "sum" (also
    "max", "min", "prod"). With ``async_op=True`` the buckets are started and the
    :class:`GradientBuckets` is returned; call its ``wait()`` before using the gradients.
    In a process without ``init_process_group`` nothing is sent (a world of one).
    """
    buckets = GradientBuckets(bucket_bytes, op, group)
    for x in reversed(list(params_or_arrays)):
        buckets.add(x)
    if async_op:
        buckets.flush()
        return buckets
    buckets.wait()
    return None
