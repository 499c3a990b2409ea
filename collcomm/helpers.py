"""The training-script helper layer (seed 004's ``distributed.py``, seed 002's ScaleTorch).

Every helper works unchanged in a single process that never called
``init_process_group``: it then behaves as a world of one (rank 0, size 1, identity
reductions). Values may be Python numbers, numpy arrays or torch CPU tensors; results keep
the input's kind.

Example, 4 ranks with losses 0.5, 0.3, 0.7, 0.4::

    >>> reduce_tensor(loss, op="sum")    # 1.9 on every rank
    >>> reduce_tensor(loss, op="mean")   # 0.475 on every rank
    >>> gather_tensor(loss, dst=0)       # Rank 0: [0.5, 0.3, 0.7, 0.4]   others: None
"""
from __future__ import annotations

from typing import Any

import numpy as np

from . import api
from .core import runtime
from .buffers import is_tensor
from .errors import InvalidArgumentError
from .ops import ReduceOp

__all__ = ["barrier", "broadcast_tensor", "gather_tensor", "get_device", "get_rank",
           "get_world_size", "is_distributed", "is_main_process", "reduce_tensor"]

_OPS = {"mean": ReduceOp.AVG, "avg": ReduceOp.AVG, "average": ReduceOp.AVG,
        "sum": ReduceOp.SUM, "max": ReduceOp.MAX, "min": ReduceOp.MIN,
        "prod": ReduceOp.PRODUCT, "product": ReduceOp.PRODUCT}


def is_distributed() -> bool:
    """True once ``init_process_group`` was called (in a world of any size)."""
    return runtime.is_initialized()


def get_rank(group: Any = None) -> int:
    return api.get_rank(group) if is_distributed() else 0


def get_world_size(group: Any = None) -> int:
    return api.get_world_size(group) if is_distributed() else 1


def is_main_process() -> bool:
    return get_rank() == 0


def get_device() -> str:
    """The device collectives run on: always ``"cpu"``."""
    return "cpu"


def barrier(group: Any = None) -> None:
    if is_distributed():
        api.barrier(group)


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


def reduce_tensor(tensor: Any, op: str = "mean", group: Any = None) -> Any:
    """A NEW value: the ``op`` ("mean" or "sum"; also "max", "min", "prod") over every rank."""
    rop = _OPS.get(op.lower() if isinstance(op, str) else op)
    if rop is None:
        raise InvalidArgumentError(f"reduce_tensor: op must be one of {sorted(_OPS)}, got {op!r}")
    value, kind = _as_array(tensor)
    if rop is ReduceOp.AVG:
        value = _floating(value)
    if is_distributed():
        api.all_reduce(value, rop, group)
    return _back(value, kind)


def _floating(value: Any) -> Any:
    """``value`` itself if it is floating/complex, else a float copy (mean of ints)."""
    if is_tensor(value):
        return value if (value.is_floating_point() or value.is_complex()) else value.double()
    if value.dtype.kind in "fc" or value.dtype.name == "bfloat16":
        return value
    return value.astype(np.float64)


def gather_tensor(tensor: Any, dst: int = 0, group: Any = None) -> list[Any] | None:
    """The list of every rank's value on ``dst``; None on the other ranks.

    Every rank must pass a value of the same shape and dtype (as ``gather`` requires).
    """
    value, kind = _as_array(tensor)
    if not is_distributed():
        return [_back(value, kind)]
    n = api.get_world_size(group)
    if api.get_rank() == dst:
        outs = [_empty_like(value) for _ in range(n)]
        api.gather(value, outs, dst=dst, group=group)
        return [_back(o, kind) for o in outs]
    api.gather(value, None, dst=dst, group=group)
    return None


def _empty_like(value: Any) -> Any:
    if is_tensor(value):
        return value.new_empty(value.shape)
    return np.empty_like(value)


def broadcast_tensor(tensor: Any, src: int = 0, group: Any = None) -> Any:
    """``src``'s value on every rank. Arrays/tensors are overwritten in place and returned;
    Python numbers come back as a new value."""
    if not is_distributed():
        return tensor
    if is_tensor(tensor) or (isinstance(tensor, np.ndarray) and tensor.flags.c_contiguous
                             and tensor.flags.writeable):
        api.broadcast(tensor, src=src, group=group)
        return tensor
    value, kind = _as_array(tensor)
    api.broadcast(value, src=src, group=group)
    return _back(value, kind)
