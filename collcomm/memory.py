"""Zero-copy buffers: arrays (or torch tensors) that live in the job's shared memory.

``collcomm.empty(shape, dtype, group=None)`` is collective over ``group`` (every rank calls
it, with the same shape and dtype, like torch's symmetric memory): each rank gets its own
array, and every other rank of the host can read it directly. Collectives on such arrays
skip copying them into the staging area (see algorithms/shm_direct.py). Over TCP, or in a
world of one, they are ordinary arrays and everything still works.

    x = collcomm.zeros(1 << 20, dtype=np.float32)   # on every rank
    x[:] = local_gradients
    collcomm.all_reduce(x)                           # read in place by the other ranks
"""
from __future__ import annotations

import sys
from typing import Any

import numpy as np

from .core import runtime
from .errors import InvalidArgumentError
from .core.group import ProcessGroup
from .tensor_memory import tensor_array

__all__ = ["empty", "zeros", "full", "empty_like", "is_shared"]


def _numpy_dtype(dtype: Any) -> tuple[np.dtype, Any]:
    """(numpy dtype to allocate, torch dtype to view it as or None)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(dtype, torch.dtype):
        if dtype == torch.bfloat16:
            return np.dtype(np.uint16), dtype
        return np.dtype(torch.empty(0, dtype=dtype).numpy().dtype), dtype
    return np.dtype(dtype), None


def empty(shape: Any, dtype: Any = np.float32, group: Any = None) -> Any:
    """An uninitialised array of ``shape`` in shared memory (collective over ``group``).

    ``dtype`` may be a torch dtype: the result is then a CPU tensor over the same memory.
    """
    g = runtime.resolve_group(group, "empty")
    if not isinstance(g, ProcessGroup):
        raise InvalidArgumentError(f"empty: this rank is not a member of {group!r}")
    np_dtype, torch_dtype = _numpy_dtype(dtype)
    shape_t = (int(shape),) if np.ndim(shape) == 0 else tuple(int(s) for s in shape)
    if any(s < 0 for s in shape_t):
        raise InvalidArgumentError(f"empty on {g.describe()}: negative dimension in shape {shape_t}")
    count = int(np.prod(shape_t, dtype=np.int64))
    raw = g.allocate(count * np_dtype.itemsize)
    arr = raw.view(np_dtype).reshape(shape_t)
    if torch_dtype is None:
        return arr
    import torch

    t = torch.from_numpy(arr)
    return t.view(torch.bfloat16) if torch_dtype == torch.bfloat16 else t


def zeros(shape: Any, dtype: Any = np.float32, group: Any = None) -> Any:
    out = empty(shape, dtype, group)
    out[...] = 0
    return out


def full(shape: Any, fill_value: Any, dtype: Any = np.float32, group: Any = None) -> Any:
    out = empty(shape, dtype, group)
    out[...] = fill_value
    return out


def empty_like(x: Any, group: Any = None) -> Any:
    """Like ``x`` (numpy array or torch tensor): same shape and dtype, in shared memory."""
    return empty(tuple(x.shape), x.dtype, group)


def is_shared(x: Any) -> bool:
    """True if ``x`` lives in this job's shared heap (collectives read it in place)."""
    world = runtime.get_world("is_shared")
    engine = world.transport
    if engine is None or not hasattr(engine, "heap"):
        return False
    if hasattr(x, "numpy") and not isinstance(x, np.ndarray):
        # a tensor: its memory through tensor_memory (numpy() would leave it unresizable)
        arr = tensor_array(x, "|u1") if x.is_contiguous() else x.numpy()
    else:
        arr = np.asarray(x)
    return engine.heap.lookup(arr.reshape(-1) if arr.flags.c_contiguous else arr) is not None
