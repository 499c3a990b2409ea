"""User buffers → flat numpy views, plus the argument checks every collective shares.

The functional API accepts numpy arrays, torch CPU tensors (when torch is importable) and
any object exposing the buffer protocol. Each is turned into a :class:`Buf`: a 1-D
C-contiguous numpy array over the *same memory* (no copy), the dtype the reduction ops
understand (a numpy dtype, or the string ``"bfloat16"`` with the data viewed as ``uint16``)
and the original shape.

* :func:`as_output` is for buffers a collective writes (outputs, and the in-place tensor
  of ``all_reduce``/``broadcast``): they must be contiguous and writable, else
  :class:`~collcomm.errors.InvalidArgumentError` — a copy would silently lose the result.
* :func:`as_input` is for buffers a collective only reads: a non-contiguous input is
  copied once; anything ``np.asarray`` understands (lists, scalars) is accepted.

torch is never imported here: a tensor can only exist if the user imported torch, so
``sys.modules`` tells whether to look for one.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from .errors import InvalidArgumentError
from .tensor_memory import tensor_array

BFLOAT16 = "bfloat16"

__all__ = ["BFLOAT16", "Buf", "as_input", "as_output", "as_outputs", "check_like",
           "dtype_name", "is_tensor", "like", "new_array_like"]


def _torch() -> Any:
    return sys.modules.get("torch")


def is_tensor(x: Any) -> bool:
    """True if ``x`` is a torch tensor (False when torch was never imported)."""
    torch = _torch()
    return torch is not None and isinstance(x, torch.Tensor)


_DTYPE_NAMES: dict[Any, str] = {}


def dtype_name(dtype: Any) -> str:
    """numpy's name of ``dtype`` ("float32"; "bfloat16" passes through). Cached: numpy
    computes ``dtype.name`` in Python (~3 µs), and every checked call asks for it."""
    if isinstance(dtype, str):
        return dtype
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = np.dtype(dtype).name
        if len(_DTYPE_NAMES) < 256:
            _DTYPE_NAMES[dtype] = name
    return name


@dataclass(frozen=True)
class Buf:
    """A user buffer seen as a flat array. ``arr`` shares memory with the user's object."""

    arr: np.ndarray             # 1-D, C-contiguous
    dtype: Any                  # np.dtype, or "bfloat16" (arr is then uint16 bits)
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return int(self.arr.size)

    def describe(self) -> str:
        return f"{dtype_name(self.dtype)}{list(self.shape)}"

    def rows(self) -> tuple[int, int]:
        """(size of dim 0, elements per dim-0 row); a 0-d buffer is one row of one element."""
        if not self.shape:
            return 1, 1
        n0 = self.shape[0]
        per = int(np.prod(self.shape[1:], dtype=np.int64)) if len(self.shape) > 1 else 1
        return n0, per


def _refuse(collective: str, where: str, what: str, problem: str) -> InvalidArgumentError:
    return InvalidArgumentError(f"{collective} on {where}: {what} {problem}")


def _from_tensor(t: Any, collective: str, where: str, what: str, writable: bool) -> Buf:
    torch = _torch()
    if t.device.type != "cpu":
        raise _refuse(collective, where, what,
                      f"must be a CPU tensor, got one on device {t.device}")
    if t.is_sparse or t.layout != torch.strided:
        raise _refuse(collective, where, what, f"must be a dense (strided) tensor, got layout {t.layout}")
    t = t.detach()
    if not t.is_contiguous():
        if writable:
            raise _refuse(collective, where, what,
                          f"must be contiguous to be written in place, got shape {tuple(t.shape)} "
                          f"with strides {t.stride()} (call .contiguous() first)")
        t = t.contiguous()
    if t.is_conj() or t.is_neg():
        if writable:
            raise _refuse(collective, where, what, "must not be a lazy conjugate/negative view")
        t = t.resolve_conj().resolve_neg()
    shape = tuple(t.shape)
    if t.dtype == torch.bfloat16:
        arr = tensor_array(t, "<u2")
        dtype: Any = BFLOAT16
    else:
        try:
            arr = tensor_array(t)       # (not t.numpy(): the storage stays resizable)
        except (TypeError, RuntimeError) as exc:
            raise _refuse(collective, where, what, f"has unsupported dtype {t.dtype}") from exc
        dtype = arr.dtype
    return Buf(arr, dtype, shape)


def _from_array(a: np.ndarray, collective: str, where: str, what: str, writable: bool) -> Buf:
    if a.dtype.hasobject:
        raise _refuse(collective, where, what,
                      "has dtype object; use the *_object collectives for Python objects")
    if writable:
        if not a.flags.writeable:
            raise _refuse(collective, where, what,
                          f"is read-only ({a.dtype.name}{list(a.shape)}); it is written in place")
        if not a.flags.c_contiguous:
            raise _refuse(collective, where, what,
                          f"must be C-contiguous to be written in place, got shape {list(a.shape)} "
                          f"with strides {list(a.strides)} (use np.ascontiguousarray first)")
        flat = a.reshape(-1)
    else:
        flat = np.ascontiguousarray(a).reshape(-1)
    if a.dtype.kind not in "biufc" and a.dtype.name == BFLOAT16:  # ml_dtypes.bfloat16
        return Buf(flat.view(np.uint16), BFLOAT16, tuple(a.shape))
    return Buf(flat, a.dtype, tuple(a.shape))


def _view(x: Any, collective: str, where: str, what: str, writable: bool) -> Buf:
    if isinstance(x, np.ndarray):
        return _from_array(x, collective, where, what, writable)
    if is_tensor(x):
        return _from_tensor(x, collective, where, what, writable)
    try:
        mv = memoryview(x)
    except TypeError:
        mv = None
    if mv is not None:
        if writable and mv.readonly:
            raise _refuse(collective, where, what, f"is a read-only buffer ({type(x).__name__})")
        if writable and not mv.c_contiguous:
            raise _refuse(collective, where, what, f"must be a C-contiguous buffer ({type(x).__name__})")
        try:
            arr = np.asarray(mv)
        except (TypeError, ValueError) as exc:
            raise _refuse(collective, where, what,
                          f"has buffer format {mv.format!r} that numpy does not understand") from exc
        return _from_array(arr, collective, where, what, writable)
    if writable:
        raise _refuse(collective, where, what,
                      f"must be a writable numpy array, torch CPU tensor or buffer, got {type(x).__name__}")
    try:
        arr = np.asarray(x)
    except Exception as exc:  # noqa: BLE001 - anything numpy cannot take
        raise _refuse(collective, where, what, f"is not array-like: {type(x).__name__}") from exc
    return _from_array(arr, collective, where, what, False)


def as_output(x: Any, collective: str, where: str, what: str = "output") -> Buf:
    """A writable, contiguous view of ``x`` (never a copy); InvalidArgumentError otherwise."""
    return _view(x, collective, where, what, writable=True)


def as_input(x: Any, collective: str, where: str, what: str = "input") -> Buf:
    """A flat contiguous view of ``x`` (a copy only if ``x`` is not contiguous)."""
    return _view(x, collective, where, what, writable=False)


def check_like(buf: Buf, ref: Buf, collective: str, where: str, what: str, ref_what: str,
               numel: int | None = None) -> None:
    """``buf`` must have ``ref``'s dtype and ``numel`` elements (default: ``ref``'s)."""
    if buf.dtype is not ref.dtype and dtype_name(buf.dtype) != dtype_name(ref.dtype):
        raise _refuse(collective, where, what,
                      f"has dtype {dtype_name(buf.dtype)} but {ref_what} has dtype "
                      f"{dtype_name(ref.dtype)}; they must match")
    expected = ref.numel if numel is None else numel
    if buf.numel != expected:
        raise _refuse(collective, where, what,
                      f"has {buf.numel} elements (shape {list(buf.shape)}), expected {expected}")


def as_outputs(xs: Any, n: int, collective: str, where: str, what: str, ref: Buf | None = None,
               ref_what: str = "input", writable: bool = True) -> list[Buf]:
    """A list/tuple of ``n`` buffers, each like ``ref`` when given."""
    if not isinstance(xs, (list, tuple)):
        raise _refuse(collective, where, what, f"must be a list of {n} tensors, got {type(xs).__name__}")
    if len(xs) != n:
        raise _refuse(collective, where, what,
                      f"must have one tensor per rank of the group: expected {n}, got {len(xs)}")
    conv = as_output if writable else as_input
    bufs = [conv(x, collective, where, f"{what}[{i}]") for i, x in enumerate(xs)]
    if ref is not None:
        for i, b in enumerate(bufs):
            check_like(b, ref, collective, where, f"{what}[{i}]", ref_what)
    return bufs


def like(x: Any, arr: np.ndarray, dtype: Any = None) -> Any:
    """``arr`` (flat, new memory) wrapped as the kind of object ``x`` is, in ``x``'s shape."""
    shape = tuple(getattr(x, "shape", ()))
    if is_tensor(x):
        torch = _torch()
        if dtype == BFLOAT16 or x.dtype == torch.bfloat16:
            return torch.from_numpy(arr.view(np.int16).reshape(shape)).view(torch.bfloat16)
        return torch.from_numpy(arr.reshape(shape))
    return arr.reshape(shape)


def new_array_like(ref: Buf, numel: int | None = None) -> np.ndarray:
    """A fresh flat array with ``ref``'s element type (uint16 bits for bfloat16)."""
    return np.empty(ref.numel if numel is None else numel, dtype=ref.arr.dtype)


def total(bufs: Sequence[Buf]) -> int:
    return sum(b.numel for b in bufs)
