"""CPU tensors as the flat numpy arrays the core works on, and torch's reduce ops as collcomm's.

:func:`view` gives a 1-D numpy array over a tensor's own storage (no copy, and not
``Tensor.numpy()``, which would leave the storage unresizable for good: tensor_memory.py): bfloat16 data is viewed as ``uint16`` with the logical dtype ``"bfloat16"``
passed to the core, float16/complex/bool/integers as themselves; dtypes numpy has no
name for (the float8 family, ...) travel as raw bytes through the collectives that only
move data and are refused by the ones that reduce. A non-contiguous tensor is the one
case that copies: its data goes through a contiguous temporary, and an output is copied
back into it at the end of the call (:meth:`View.finish`).

Tensors on any device other than the CPU are refused with an error naming the device:
the collcomm backend is for CPU tensors (use nccl for CUDA tensors).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.distributed as dist

from ..buffer_runs import apart_or_own, joined
from ..errors import InvalidArgumentError
from ..ops import ReduceOp
from ..tensor_memory import numpy_typestr, tensor_array

__all__ = ["View", "call_array", "fast_array", "fast_op", "finisher", "flat_like", "reduce_op", "view", "views"]

BFLOAT16 = "bfloat16"
RAW = "raw"        # bytes of a dtype numpy cannot name: data movement only

_RED = dist.ReduceOp.RedOpType
_OPS = {_RED.SUM: ReduceOp.SUM, _RED.AVG: ReduceOp.AVG, _RED.PRODUCT: ReduceOp.PRODUCT,
        _RED.MIN: ReduceOp.MIN, _RED.MAX: ReduceOp.MAX, _RED.BAND: ReduceOp.BAND,
        _RED.BOR: ReduceOp.BOR, _RED.BXOR: ReduceOp.BXOR}


@dataclass(slots=True)
class View:
    """One tensor seen by the core: ``arr`` shares the tensor's memory unless ``tmp`` is set."""

    tensor: torch.Tensor
    arr: np.ndarray
    dtype: Any                       # numpy dtype, "bfloat16", or "raw"
    tmp: torch.Tensor | None = None  # the contiguous stand-in of a non-contiguous tensor

    @property
    def numel(self) -> int:
        return int(self.arr.size)

    def finish(self) -> None:
        """Copy a stand-in's result back into the tensor (outputs only; no-op otherwise)."""
        if self.tmp is not None:
            self.tensor.copy_(self.tmp)


def _refuse(call: str, where: str, what: str, problem: str) -> InvalidArgumentError:
    return InvalidArgumentError(f"{call} on {where}: {what} {problem}")


def view(t: Any, call: str, where: str, what: str = "tensor", reducing: bool = False) -> View:
    """``t`` as a flat array (see the module docstring). ``reducing``: the call combines
    values, so raw-byte dtypes are refused."""
    if not isinstance(t, torch.Tensor):
        raise _refuse(call, where, what, f"must be a torch.Tensor, got {type(t).__name__}")
    if not t.is_cpu:
        raise _refuse(call, where, what,
                      f"is on device {t.device}: the collcomm backend handles CPU tensors only "
                      "(move it with .cpu(), or use nccl for CUDA tensors)")
    if t.layout != torch.strided:
        raise _refuse(call, where, what, f"must be a dense (strided) tensor, got layout {t.layout}")
    if t.requires_grad:
        t = t.detach()
    src, tmp = t, None
    if not t.is_contiguous() or t.is_conj() or t.is_neg():
        src = tmp = t.resolve_conj().resolve_neg().contiguous()
    if src.dtype == torch.bfloat16:
        return View(t, tensor_array(src, "<u2"), BFLOAT16, tmp)
    if numpy_typestr(src) is None:
        if reducing:
            raise _refuse(call, where, what, f"has dtype {t.dtype}, which collcomm cannot reduce")
        return View(t, tensor_array(src, "|u1"), RAW, tmp)
    arr = tensor_array(src)
    return View(t, arr, arr.dtype, tmp)


def fast_array(t: Any) -> np.ndarray | None:
    """``t``'s memory as a numpy array when the fast call can take it as it is (a dense,
    contiguous CPU tensor of a numpy dtype, no autograd, no lazy conj/neg bits); else None
    (the regular path then says what is wrong, or handles it)."""
    if (type(t) is not torch.Tensor or not t.is_cpu or t.requires_grad or not t.is_contiguous()
            or t.dtype == torch.bfloat16 or t.is_conj() or t.is_neg() or numpy_typestr(t) is None):
        return None
    return tensor_array(t)


class _Memory:
    """What a numpy array is made over to view memory it does not own (its array interface)."""

    __slots__ = ("__array_interface__",)

    def __init__(self, ptr: int, numel: int, typestr: str) -> None:
        self.__array_interface__ = {"data": (ptr, False), "shape": (numel,), "typestr": typestr,
                                    "version": 3}


#: call_array's arrays by (address, elements, torch dtype), at most CALL_ARRAYS_MAX (then
#: the table starts again), and the keys seen lately, at most SEEN_MAX: a key is kept when
#: it comes again within that window, as a reused tensor's does (a training loop's buffers),
#: and not when tensors made afresh for every call cycle through hundreds of addresses.
_CALL_ARRAYS: dict[tuple[int, int, torch.dtype], np.ndarray] = {}
_SEEN: set[tuple[int, int, torch.dtype]] = set()
CALL_ARRAYS_MAX = 512
SEEN_MAX = 128


def call_array(t: Any) -> np.ndarray | None:
    """:func:`fast_array` for a call that ends before it returns (a blocking collective),
    without building one per call: the same checks, then an array over the same memory, kept
    by (address, elements, dtype) once that memory has been seen twice.

    Such an array does not own or keep alive what it views; it is handed out only while a
    live, contiguous tensor has exactly that address, element count and dtype, so it then
    views exactly that tensor's data, whatever happened to the memory in between. It must
    not outlive the call (a receive that completes later takes :func:`fast_array`'s).
    Costs (world of one, thread CPU, session 21): a kept key 0.6 µs, else an array's making
    (``numpy()`` then took 0.7 µs; :func:`tensor_array` ~0.4 µs more) + 0.25, and keeping
    one 0.9 µs more."""
    if (type(t) is not torch.Tensor or not t.is_cpu or t.requires_grad or not t.is_contiguous()
            or t.is_conj() or t.is_neg()):
        return None
    try:
        key = (t.data_ptr(), t.numel(), t.dtype)
    except RuntimeError:    # (a tensor without storage: the regular path says so)
        return None
    arr = _CALL_ARRAYS.get(key)
    if arr is not None:     # only numpy's dtypes get there: bfloat16 never does
        return arr
    if key[2] is torch.bfloat16 or numpy_typestr(t) is None:
        return None
    arr = tensor_array(t)
    if key in _SEEN:
        if len(_CALL_ARRAYS) >= CALL_ARRAYS_MAX:
            _CALL_ARRAYS.clear()
        _CALL_ARRAYS[key] = np.asarray(_Memory(key[0], key[1], arr.dtype.str))
    elif key[0] and key[1]:         # not an empty tensor (whose address may be 0)
        if len(_SEEN) >= SEEN_MAX:
            _SEEN.clear()
        _SEEN.add(key)
    return arr


def finisher(v: View) -> Callable[[], None] | None:
    """What copies ``v``'s temporary back into its tensor at the end of a call, if any."""
    return v.finish if v.tmp is not None else None


#: the fast call's ops by RedOpType value (None: AVG; PREMUL_SUM and later are past the end)
_FAST_OPS = [None] * (max(int(k) for k in _OPS) + 1)
for _kind, _rop in _OPS.items():
    _FAST_OPS[int(_kind)] = None if _rop is ReduceOp.AVG else _rop


#: torch's ReduceOp, whose hash is its RedOpType's value (checked here, else not relied on)
_REDUCE_OP = dist.ReduceOp


def _hash_is_kind() -> bool:
    try:
        ops = [dist.ReduceOp(k) for k in _OPS] + [dist._make_nccl_premul_sum(2.0)]
        return (all(type(o) is _REDUCE_OP and hash(o) == int(o.op) for o in ops)
                and int(ops[-1].op) >= len(_FAST_OPS))
    except Exception:  # noqa: BLE001 - a torch without these: the slower way below
        return False


def fast_op(op: Any) -> Any:
    """The collcomm op of a plain torch ``ReduceOp`` (not AVG, not PREMUL_SUM), else None."""
    if _HASH_IS_KIND and type(op) is _REDUCE_OP:
        i = hash(op)           # 0.1 µs; op.op alone is 0.3 µs
        return _FAST_OPS[i] if 0 <= i < len(_FAST_OPS) else None
    try:
        kind = op.op
    except AttributeError:
        kind = op
    if type(kind) is not _RED:
        return None
    i = int(kind)
    return _FAST_OPS[i] if i < len(_FAST_OPS) else None


_HASH_IS_KIND = _hash_is_kind()


def views(ts: Sequence[Any], call: str, where: str, what: str, reducing: bool = False) -> list[View]:
    if not isinstance(ts, (list, tuple)):
        raise _refuse(call, where, what, f"must be a list of tensors, got {type(ts).__name__}")
    return [view(t, call, where, f"{what}[{i}]", reducing) for i, t in enumerate(ts)]


def same_kind(vs: Sequence[View], ref: View, call: str, where: str, what: str) -> None:
    """Every view must have ``ref``'s dtype (gloo's rule for lists of tensors)."""
    for i, v in enumerate(vs):
        if v.tensor.dtype != ref.tensor.dtype:
            raise _refuse(call, where, f"{what}[{i}]",
                          f"has dtype {v.tensor.dtype}, expected {ref.tensor.dtype} (the input's)")


def flat_like(ref: View, numel: int) -> np.ndarray:
    """A fresh flat array for ``numel`` elements of ``ref``'s kind (bytes for raw dtypes)."""
    if ref.dtype == RAW:
        return np.empty(numel * ref.tensor.element_size(), dtype=np.uint8)
    return np.empty(numel, dtype=ref.arr.dtype)


def scale(ref: View) -> int:
    """Array elements per tensor element (bytes per element for raw dtypes, else 1)."""
    return ref.tensor.element_size() if ref.dtype == RAW else 1


def core_dtype(v: View) -> Any:
    return None if v.dtype == RAW else v.dtype


def gathered_into(outs: Sequence[View], inp: View, block: int) -> tuple[np.ndarray, Callable[[], None] | None]:
    """The receive buffer of a gather (or all_gather) of ``inp`` into ``outs`` at rank
    ``block`` and the ``after`` step: the outputs' own memory and none when they lie back
    to back (:mod:`collcomm.buffer_runs`), else a fresh buffer and the copy out."""
    flat = flat_like(inp, len(outs) * inp.numel // scale(inp))
    if all(o.tmp is None for o in outs):
        run = apart_or_own(joined([o.arr for o in outs], True), inp.arr, block)
        if run is not None and run.dtype == flat.dtype and run.size == flat.size:
            return run, None
    return flat, copy_out(outs, flat)


def sent_from(ins: Sequence[View], out: View, block: int) -> np.ndarray:
    """The send buffer of a scatter of ``ins`` whose own block ``block`` goes to ``out``:
    the inputs' own memory when they lie back to back (:mod:`collcomm.buffer_runs`), else
    their concatenation."""
    run = apart_or_own(joined([v.arr for v in ins], False), out.arr, block)
    if run is not None and run.dtype == ins[0].arr.dtype:
        return run
    return np.concatenate([v.arr for v in ins])


def copy_out(outs: Sequence[View], flat: np.ndarray) -> Callable[[], None]:
    """An ``after`` step: consecutive slices of ``flat`` into each output, in order."""
    def after() -> None:
        pos = 0
        for v in outs:
            n = v.arr.size
            np.copyto(v.arr, flat[pos:pos + n])
            pos += n
            v.finish()
    return after


def reduce_op(op: Any, call: str, where: str) -> tuple[Any, float | torch.Tensor | None]:
    """(collcomm op, PREMUL_SUM factor or None) for torch's ``ReduceOp``."""
    try:
        kind = op.op
    except AttributeError:
        kind = op
    if kind == _RED.PREMUL_SUM:
        state = op.__getstate__()
        return ReduceOp.SUM, state[1]
    try:
        return _OPS[kind], None
    except (KeyError, TypeError):
        raise InvalidArgumentError(f"{call} on {where}: reduce op {op!r} is not supported") from None
