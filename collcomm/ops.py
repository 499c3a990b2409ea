"""Reduction ops: names, validation and the in-place combiners algorithms use.

A :class:`ReduceOp` names an elementwise reduction (torch style: ``ReduceOp.SUM``). The
algorithms never see it: :func:`resolve` turns an op and a dtype into a
:data:`~collcomm.algorithms.base.ReduceFn`, ``fn(acc, other)``, that leaves
``acc ⊕ other`` in ``acc``, after checking that the op makes sense for the dtype:

=====================  =====================================================
op                     dtypes allowed
=====================  =====================================================
SUM, PRODUCT           every numeric dtype; on bool SUM is ``or``, PRODUCT ``and``
MIN, MAX               every numeric dtype except complex
AVG                    floating, complex, bfloat16 (summed, then :func:`finish_avg`)
BAND, BOR, BXOR        integer and bool
LAND, LOR, LXOR        every numeric dtype (result is 1 / 0)
user callable          anything; ``f(acc, other)`` returns the combination
=====================  =====================================================

bfloat16 data travels as a ``uint16`` view of its bits (pass ``dtype="bfloat16"``): it is
combined in float32 (bits << 16) and rounded back to nearest-even.
"""
from __future__ import annotations

from typing import Any, Callable, ClassVar

import numpy as np

from .errors import InvalidArgumentError

ReduceFn = Callable[[np.ndarray, np.ndarray], None]

BFLOAT16 = "bfloat16"

__all__ = [
    "BFLOAT16",
    "MPI_NAMES",
    "ReduceOp",
    "bf16_to_f32",
    "f32_to_bf16",
    "finish_avg",
    "is_avg",
    "resolve",
]


class ReduceOp:
    """An elementwise reduction: a built-in (``ReduceOp.SUM`` ...) or a user function.

    Built-ins are singletons compared by identity; ``ReduceOp.PROD`` is ``ReduceOp.PRODUCT``.
    ``ReduceOp.from_any`` accepts a member, a name (``"sum"``, ``"mean"``, ``"MPI_MAX"``), a
    numpy ufunc (``np.add``) or any callable ``f(a, b) -> c``.
    """

    __slots__ = ("name", "fn")

    SUM: ClassVar[ReduceOp]
    PRODUCT: ClassVar[ReduceOp]
    PROD: ClassVar[ReduceOp]
    MIN: ClassVar[ReduceOp]
    MAX: ClassVar[ReduceOp]
    AVG: ClassVar[ReduceOp]
    BAND: ClassVar[ReduceOp]
    BOR: ClassVar[ReduceOp]
    BXOR: ClassVar[ReduceOp]
    LAND: ClassVar[ReduceOp]
    LOR: ClassVar[ReduceOp]
    LXOR: ClassVar[ReduceOp]

    def __init__(self, name: str, fn: Callable[[Any, Any], Any] | None = None) -> None:
        self.name = name
        self.fn = fn  # only for user ops

    @property
    def is_builtin(self) -> bool:
        return self.fn is None

    def __repr__(self) -> str:
        if self.fn is None:
            return f"ReduceOp.{self.name}"
        return f"ReduceOp.custom({_callable_name(self.fn)})"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ReduceOp):
            return NotImplemented
        return self.name == other.name and self.fn is other.fn

    def __hash__(self) -> int:
        return hash((self.name, id(self.fn)))

    def __reduce__(self) -> Any:
        # Built-ins unpickle to the same singleton.
        if self.fn is None:
            return (_builtin, (self.name,))
        return (ReduceOp, (self.name, self.fn))

    @classmethod
    def custom(cls, fn: Callable[[Any, Any], Any]) -> ReduceOp:
        """Wrap a user function ``f(a, b) -> c`` (assumed commutative and associative)."""
        if not callable(fn):
            raise InvalidArgumentError(f"ReduceOp.custom expects a callable, got {fn!r}")
        return cls("CUSTOM", fn)

    @classmethod
    def from_any(cls, op: Any) -> ReduceOp:
        """Normalise ``op``: member, name string, numpy ufunc, or user callable."""
        if isinstance(op, ReduceOp):
            return op
        if isinstance(op, str):
            key = op.strip().lower()
            for prefix in ("reduceop.", "mpi."):
                if key.startswith(prefix):
                    key = key[len(prefix):]
            member = _NAMES.get(key)
            if member is None:
                raise InvalidArgumentError(f"unknown reduce op {op!r}; allowed: {_ALLOWED_OPS}")
            return member
        if isinstance(op, np.ufunc):
            member = _UFUNCS.get(op.__name__)
            if member is not None:
                return member
            if op.nin != 2:
                raise InvalidArgumentError(
                    f"reduce op ufunc {op.__name__} takes {op.nin} inputs; a binary one is needed"
                )
            return cls.custom(op)
        # Foreign enum-like ops by their name: enum members, and torch's (ReduceOp.MAX is a
        # RedOpType member, which is callable; ReduceOp(ReduceOp.SUM) holds one in .op)
        name = getattr(op, "name", None)
        if not isinstance(name, str):
            name = getattr(getattr(op, "op", None), "name", None)
        module = getattr(type(op), "__module__", None)
        from_torch = isinstance(module, str) and (module == "torch" or module.startswith("torch."))
        if isinstance(name, str) and (from_torch or not callable(op)):
            if name.lower() in _NAMES:
                return _NAMES[name.lower()]
            if from_torch:       # (PREMUL_SUM, UNUSED: never a function to call)
                raise InvalidArgumentError(f"unknown reduce op {op!r}; allowed: {_ALLOWED_OPS}")
        if callable(op):
            return cls.custom(op)
        raise InvalidArgumentError(f"unknown reduce op {op!r}; allowed: {_ALLOWED_OPS}")


def _builtin(name: str) -> ReduceOp:
    return getattr(ReduceOp, name)


def _callable_name(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)


for _n in ("SUM", "PRODUCT", "MIN", "MAX", "AVG", "BAND", "BOR", "BXOR", "LAND", "LOR", "LXOR"):
    setattr(ReduceOp, _n, ReduceOp(_n))
ReduceOp.PROD = ReduceOp.PRODUCT

_NAMES: dict[str, ReduceOp] = {
    "sum": ReduceOp.SUM, "add": ReduceOp.SUM, "+": ReduceOp.SUM,
    "product": ReduceOp.PRODUCT, "prod": ReduceOp.PRODUCT, "mul": ReduceOp.PRODUCT,
    "multiply": ReduceOp.PRODUCT, "*": ReduceOp.PRODUCT,
    "min": ReduceOp.MIN, "minimum": ReduceOp.MIN,
    "max": ReduceOp.MAX, "maximum": ReduceOp.MAX,
    "avg": ReduceOp.AVG, "mean": ReduceOp.AVG, "average": ReduceOp.AVG,
    "band": ReduceOp.BAND, "bitwise_and": ReduceOp.BAND, "&": ReduceOp.BAND,
    "bor": ReduceOp.BOR, "bitwise_or": ReduceOp.BOR, "|": ReduceOp.BOR,
    "bxor": ReduceOp.BXOR, "bitwise_xor": ReduceOp.BXOR, "^": ReduceOp.BXOR,
    "land": ReduceOp.LAND, "logical_and": ReduceOp.LAND, "and": ReduceOp.LAND,
    "lor": ReduceOp.LOR, "logical_or": ReduceOp.LOR, "or": ReduceOp.LOR,
    "lxor": ReduceOp.LXOR, "logical_xor": ReduceOp.LXOR,
}
# MPI spellings: "MPI_SUM" (lower-cased on lookup) and the bare MPI names above.
MPI_NAMES: dict[str, ReduceOp] = {
    "MPI_SUM": ReduceOp.SUM, "MPI_PROD": ReduceOp.PRODUCT, "MPI_MIN": ReduceOp.MIN,
    "MPI_MAX": ReduceOp.MAX, "MPI_BAND": ReduceOp.BAND, "MPI_BOR": ReduceOp.BOR,
    "MPI_BXOR": ReduceOp.BXOR, "MPI_LAND": ReduceOp.LAND, "MPI_LOR": ReduceOp.LOR,
    "MPI_LXOR": ReduceOp.LXOR,
}
_NAMES.update({k.lower(): v for k, v in MPI_NAMES.items()})

_ALLOWED_OPS = (
    "ReduceOp.SUM, PRODUCT (PROD), MIN, MAX, AVG, BAND, BOR, BXOR, LAND, LOR, LXOR, their "
    "names ('sum', 'prod', 'mean', 'MPI_SUM', ...), a binary numpy ufunc or a callable f(a, b)"
)

_UFUNCS: dict[str, ReduceOp] = {
    "add": ReduceOp.SUM, "multiply": ReduceOp.PRODUCT,
    "minimum": ReduceOp.MIN, "fmin": ReduceOp.MIN,
    "maximum": ReduceOp.MAX, "fmax": ReduceOp.MAX,
    "bitwise_and": ReduceOp.BAND, "bitwise_or": ReduceOp.BOR, "bitwise_xor": ReduceOp.BXOR,
    "logical_and": ReduceOp.LAND, "logical_or": ReduceOp.LOR, "logical_xor": ReduceOp.LXOR,
}

# --------------------------------------------------------------------------- bfloat16


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bits (uint16) -> float32 values (a new array)."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(values: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """float32 values -> bfloat16 bits (uint16), rounding to nearest-even; NaN stays NaN."""
    x = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = (x + (np.uint32(0x7FFF) + ((x >> 16) & np.uint32(1)))) >> 16
    nan = np.isnan(values)
    if nan.any():
        rounded[nan] = (x[nan] >> 16) | np.uint32(0x0040)
    if out is None:
        return rounded.astype(np.uint16)
    np.copyto(out, rounded, casting="unsafe")
    return out


# --------------------------------------------------------------------------- resolve

_BINARY: dict[str, np.ufunc] = {
    "SUM": np.add, "AVG": np.add, "PRODUCT": np.multiply,
    "MIN": np.minimum, "MAX": np.maximum,
    "BAND": np.bitwise_and, "BOR": np.bitwise_or, "BXOR": np.bitwise_xor,
    "LAND": np.logical_and, "LOR": np.logical_or, "LXOR": np.logical_xor,
}

_ALLOWED = {
    "SUM": "every numeric dtype",
    "PRODUCT": "every numeric dtype",
    "MIN": "integer, bool, floating and bfloat16 (not complex)",
    "MAX": "integer, bool, floating and bfloat16 (not complex)",
    "AVG": "floating, complex and bfloat16 (not integer or bool)",
    "BAND": "integer and bool",
    "BOR": "integer and bool",
    "BXOR": "integer and bool",
    "LAND": "every numeric dtype",
    "LOR": "every numeric dtype",
    "LXOR": "every numeric dtype",
}


def _kind(dtype: Any) -> tuple[str, str]:
    """(kind, printable name): kind is 'b', 'i', 'u', 'f', 'c', 'bf16' or '' (unsupported)."""
    if isinstance(dtype, str) and dtype.lower() in ("bfloat16", "bf16"):
        return "bf16", BFLOAT16
    if getattr(dtype, "name", None) == "bfloat16" or str(dtype).rsplit(".", 1)[-1] == "bfloat16":
        return "bf16", BFLOAT16
    try:
        dt = np.dtype(dtype)
    except TypeError:
        return "", repr(dtype)
    kind = dt.kind if dt.kind in "biufc" else ""
    return kind, dt.name


_RESOLVED: dict[tuple[Any, Any], ReduceFn] = {}


def resolve(op: Any, dtype: Any, collective: str = "all_reduce", rank: int | None = None) -> ReduceFn:
    """Check ``op`` against ``dtype`` and return the in-place combiner ``fn(acc, other)``.

    Raises InvalidArgumentError naming the collective, the rank, the op, the dtype and what
    is allowed. Built-in ops on numpy dtypes are checked once and then served from a cache.
    """
    key = (op, dtype) if isinstance(op, ReduceOp) and op.fn is None and isinstance(dtype, np.dtype) else None
    if key is not None:
        fn = _RESOLVED.get(key)
        if fn is None:
            fn = _RESOLVED[key] = _resolve(op, dtype, collective, rank)
        return fn
    return _resolve(op, dtype, collective, rank)


def _resolve(op: Any, dtype: Any, collective: str, rank: int | None) -> ReduceFn:
    where = collective if rank is None else f"{collective} on rank {rank}"
    try:
        rop = ReduceOp.from_any(op)
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(f"{where}, dtype {_kind(dtype)[1]}: {exc}") from None
    kind, dname = _kind(dtype)
    if not kind:
        raise InvalidArgumentError(
            f"{where}: dtype {dname} is not supported by {rop}; "
            "numeric dtypes (bool, integer, floating, complex) and bfloat16 are"
        )
    if rop.fn is not None:
        return _custom_fn(rop, kind, dname, where)
    name = rop.name
    bad = (
        (name in ("BAND", "BOR", "BXOR") and kind not in "biu")
        or (name in ("MIN", "MAX") and kind == "c")
        or (name == "AVG" and kind not in ("f", "c", "bf16"))
    )
    if bad:
        raise InvalidArgumentError(
            f"{where}: op {rop} is not allowed for dtype {dname}; "
            f"{rop} allows {_ALLOWED[name]}"
        )
    return _tagged(_builtin_fn(name, kind), name, kind)


def _builtin_fn(name: str, kind: str) -> ReduceFn:
    ufunc = _BINARY[name]
    if kind == "b":
        ufunc = {"SUM": np.logical_or, "PRODUCT": np.logical_and}.get(name, ufunc)
    if kind == "bf16":
        return _bf16_fn(ufunc)
    if name in ("LAND", "LOR", "LXOR") and kind != "b":
        def logical(acc: np.ndarray, other: np.ndarray) -> None:
            np.copyto(acc, ufunc(acc, other), casting="unsafe")
        return logical

    def combine(acc: np.ndarray, other: np.ndarray) -> None:
        ufunc(acc, other, out=acc)

    return combine


def _tagged(fn: ReduceFn, name: str, kind: str) -> ReduceFn:
    """Mark a built-in combiner with what it computes, ``fn.native = (op name, dtype kind)``
    (AVG sums), so the native shared-memory core can do the same thing in C
    (collcomm/native). User functions carry no tag and always run in Python."""
    fn.native = ("SUM" if name == "AVG" else name, kind)  # type: ignore[attr-defined]
    return fn


def _bf16_fn(ufunc: np.ufunc) -> ReduceFn:
    def combine(acc: np.ndarray, other: np.ndarray) -> None:
        a = bf16_to_f32(acc)
        res = ufunc(a, bf16_to_f32(other))
        if res.dtype == np.bool_:
            res = res.astype(np.float32)
        f32_to_bf16(res, out=acc)

    return combine


def _custom_fn(rop: ReduceOp, kind: str, dname: str, where: str) -> ReduceFn:
    f = rop.fn
    assert f is not None

    def check(res: Any, acc: np.ndarray) -> np.ndarray:
        res = np.asarray(res)
        if res.shape != acc.shape:
            raise InvalidArgumentError(
                f"{where}: user reduce op {rop} returned shape {res.shape} for inputs of "
                f"shape {acc.shape} (dtype {dname}); it must return the elementwise "
                "combination, of the inputs' shape"
            )
        return res

    if kind == "bf16":
        def combine_bf16(acc: np.ndarray, other: np.ndarray) -> None:
            a = bf16_to_f32(acc)
            res = check(f(a, bf16_to_f32(other)), acc)
            f32_to_bf16(np.asarray(res, dtype=np.float32), out=acc)
        return combine_bf16

    def combine(acc: np.ndarray, other: np.ndarray) -> None:
        res = f(acc, other)
        if res is acc:
            return
        np.copyto(acc, check(res, acc), casting="unsafe")

    return combine


def is_avg(op: Any) -> bool:
    """True if ``op`` means AVG (the caller sums, then calls :func:`finish_avg`)."""
    try:
        return ReduceOp.from_any(op) is ReduceOp.AVG
    except InvalidArgumentError:
        return False


def finish_avg(arr: np.ndarray, n: int, dtype: Any = None) -> None:
    """Divide ``arr`` by ``n`` in place (the end of an AVG: SUM, then this).

    A ``uint16`` array (or ``dtype="bfloat16"``) holds bfloat16 bits and is divided as
    float32, then rounded back.
    """
    kind = _kind(dtype)[0] if dtype is not None else ""
    if kind == "bf16" or (dtype is None and arr.dtype == np.uint16):
        f32_to_bf16(bf16_to_f32(arr) / np.float32(n), out=arr)
    elif arr.dtype.kind in "fc":
        np.divide(arr, n, out=arr)
    else:
        raise InvalidArgumentError(
            f"AVG is not allowed for dtype {arr.dtype.name}; {_ALLOWED['AVG']} are"
        )
