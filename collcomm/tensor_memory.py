"""A CPU tensor's memory as a flat numpy array, without ``Tensor.numpy()``'s side effect.

``Tensor.numpy()`` marks the tensor's storage as not resizable, for good (numpy might hold
its memory), so a tensor that had once gone through a collcomm call could never be
resized again: ``x.resize_(n)``, ``x.untyped_storage().resize_(0)`` (how FSDP frees a
parameter's memory), ``torch.cat(..., out=x)`` growing ``x``, a DDP bucket's buffer, all
raised "Trying to resize storage that is not resizable" where gloo leaves them alone.
:func:`tensor_array` makes the array over the same memory through numpy's array interface
instead; the array keeps the tensor (and so its storage) alive for as long as it lives.

torch is never imported here: the dtype table is filled from the tensors it is given.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .errors import InvalidArgumentError

__all__ = ["numpy_typestr", "tensor_array"]

#: torch dtype -> numpy typestr (None: numpy has no such dtype), filled on first use
_TYPESTR: dict[Any, str | None] = {}


def numpy_typestr(t: Any) -> str | None:
    """The numpy typestr of ``t``'s dtype (``'<f4'``), None where numpy has none (bfloat16,
    the float8 family, ...). Found once per dtype from an empty tensor of its own."""
    try:
        return _TYPESTR[t.dtype]
    except KeyError:
        pass
    try:
        found: str | None = t.new_empty(0).numpy().dtype.str
    except (TypeError, RuntimeError):
        found = None
    _TYPESTR[t.dtype] = found
    return found


class _Held:
    """What the array is made over: the memory's description, and the tensor it belongs to."""

    __slots__ = ("__array_interface__", "tensor")


def tensor_array(t: Any, typestr: str | None = None) -> np.ndarray:
    """A writable 1-D array over the memory of ``t`` (a contiguous CPU tensor, its dtype's
    elements, or the items of ``typestr`` over the same bytes: ``'<u2'`` for bfloat16,
    ``'|u1'`` for raw bytes); TypeError where numpy has no dtype for ``t``'s and no
    ``typestr`` is given (as ``Tensor.numpy()`` raises), InvalidArgumentError where the
    tensor's storage is smaller than its elements (freed by ``untyped_storage().resize_(0)``:
    reading it would read memory it no longer has)."""
    numel, esize = t.numel(), t.element_size()
    if typestr is None:
        typestr = numpy_typestr(t)
        if typestr is None:
            raise TypeError(f"numpy has no dtype for {t.dtype}")
        n = numel
    else:
        n = numel * esize // _itemsize(typestr)
    if n:
        have = t.untyped_storage().nbytes()
        if (t.storage_offset() + numel) * esize > have:
            raise InvalidArgumentError(
                f"a {t.dtype} tensor of shape {tuple(t.shape)} has a storage of {have} bytes, "
                "fewer than its elements need (resized or freed with untyped_storage().resize_?)")
    held = _Held()
    held.tensor = t
    held.__array_interface__ = {"data": (t.data_ptr(), False), "typestr": typestr, "version": 3,
                                "shape": (n,)}
    return np.asarray(held)


_ITEMSIZE: dict[str, int] = {}


def _itemsize(typestr: str) -> int:
    size = _ITEMSIZE.get(typestr)
    if size is None:
        size = _ITEMSIZE[typestr] = np.dtype(typestr).itemsize
    return size
