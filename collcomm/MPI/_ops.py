"""Reduction operations: ``MPI.SUM`` … ``MPI.MAXLOC``, ``Op.Create`` and what the core gets.

An :class:`Op` serves two worlds:

* **objects** (``comm.allreduce(obj, op)``): ``op(x, y)`` combines two Python values,
  ``x`` from the lower rank: ``SUM`` is ``x + y``, ``MAX`` the larger (elementwise for
  numpy arrays), ``LAND`` ``bool(x) and bool(y)``, ``MAXLOC``/``MINLOC`` pick among
  ``(value, index)`` pairs (ties: the smaller index), ``REPLACE`` ``y``, ``NO_OP`` ``x``;
  an ``Op.Create(fn)`` op calls ``fn(x, y, None)`` and returns its result, as mpi4py does.
* **buffers** (``comm.Allreduce(a, b, op)``): :func:`core_op` gives the op the core
  understands for a datatype: a built-in :class:`~collcomm.ops.ReduceOp`, or a combiner
  (``ReduceOp.custom``) for ``MAXLOC``/``MINLOC`` on the value-index pairs and for user
  functions ``fn(invec, inoutvec, datatype)`` (``inoutvec = invec ∘ inoutvec``, invec from
  the lower ranks). Such combiners are made once per (op, datatype), so the group's call
  plan caches them. A user op created with ``commute=False`` is reported as *ordered*:
  the caller then combines in rank order itself (:func:`fold`). An op that does not suit the datatype
  (``MAXLOC`` on ``MPI.DOUBLE``, ``SUM`` on a pair, ``REPLACE`` in a reduction) raises
  ``MPI.Exception(ERR_OP)``; the core checks the rest (``BAND`` on floats…).
"""
from __future__ import annotations

import operator
from typing import Any, Callable

import numpy as np

from .. import ops as core_ops
from . import _staging, _typemap
from ..ops import ReduceOp
from ._handles import HandleInts
from ._errors import ERR_OP, Exception as MPIException
from ._types import Datatype


def _maxlike(pick_y: Callable[[Any, Any], bool]) -> Callable[[Any, Any], Any]:
    def f(x: Any, y: Any) -> Any:
        if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            return np.where(pick_y(x, y), y, x)
        return y if pick_y(x, y) else x
    return f


def _loc(better: Callable[[Any, Any], bool]) -> Callable[[Any, Any], Any]:
    def f(x: Any, y: Any) -> Any:
        (u, i), (v, j) = x, y
        if better(v, u):
            return (v, j)
        if better(u, v):
            return (u, i)
        return (u, min(i, j))
    return f


def _logical(fn: Callable[[Any, Any], Any], np_fn: Any) -> Callable[[Any, Any], Any]:
    def f(x: Any, y: Any) -> Any:
        if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            return np_fn(x, y)
        return fn(bool(x), bool(y))
    return f


class _OpRec:
    __slots__ = ("name", "builtin", "pyfn", "user", "commute", "predefined", "cache")

    def __init__(self, name: str, builtin: ReduceOp | None, pyfn: Callable[[Any, Any], Any] | None,
                 user: Callable[..., Any] | None = None, commute: bool = True,
                 predefined: bool = True) -> None:
        self.name, self.builtin, self.pyfn, self.user = name, builtin, pyfn, user
        self.commute, self.predefined = commute, predefined
        self.cache: dict[Any, ReduceOp] = {}


class Op(HandleInts):
    """A reduction operation (see the module docstring). ``Op(op)`` refers to the same op."""

    __slots__ = ("_o",)
    _REC = "_o"

    def __new__(cls, op: Any = None) -> Any:
        # (made as mpi4py makes its handles, by __new__: a subclass's __new__(cls, op)
        # that passes op on gets the copy; __init__ then does it again)
        self = object.__new__(cls)
        Op.__init__(self, op)
        return self

    def __init__(self, op: "Op | None" = None) -> None:
        self._o: _OpRec | None = None if op is None else op._o

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Op) and self._o is other._o

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    __hash__ = None  # type: ignore[assignment]

    def __bool__(self) -> bool:
        return self._o is not None

    def __repr__(self) -> str:
        return f"<collcomm.MPI.Op {self._o.name if self._o else 'MPI_OP_NULL'}>"

    def __reduce__(self) -> Any:
        if self._o is None:
            return (Op, ())
        if self._o.predefined:
            return (_predefined, (self._o.name,))
        raise ValueError(f"cannot serialize the user-defined op {self._o.name}")

    def _valid(self, call: str) -> _OpRec:
        if self._o is None:
            raise MPIException(ERR_OP, f"{call}: the op is MPI.OP_NULL")
        return self._o

    def __call__(self, x: Any, y: Any) -> Any:
        """Combine two Python objects (``x`` from the lower rank)."""
        o = self._valid("Op.__call__")
        if o.user is not None:
            return o.user(x, y, None)
        assert o.pyfn is not None
        return o.pyfn(x, y)

    @classmethod
    def Create(cls, function: Callable[[Any, Any, Any], None], commute: bool = False) -> "Op":  # noqa: N802
        """A user op: ``function(invec, inoutvec, datatype)`` leaves ``invec ∘ inoutvec`` in
        ``inoutvec`` (buffers of bytes; read them with ``np.frombuffer``)."""
        if not callable(function):
            raise TypeError(f"Op.Create: function must be callable, got {type(function).__name__}")
        op = cls()
        op._o = _OpRec(getattr(function, "__name__", "user op"), None, None, function,
                       bool(commute), predefined=False)
        return op

    def Free(self) -> None:  # noqa: N802
        o = self._valid("Op.Free")
        if o.predefined:
            raise MPIException(ERR_OP, f"Op.Free: MPI_{o.name} is predefined and cannot be freed")
        self._o = None

    free = Free

    def Is_commutative(self) -> bool:  # noqa: N802
        return self._valid("Op.Is_commutative").commute

    is_commutative = property(Is_commutative)
    is_predefined = property(lambda self: bool(self._o and self._o.predefined))

    def Reduce_local(self, inbuf: Any, inoutbuf: Any) -> None:  # noqa: N802
        """``inoutbuf = inbuf ∘ inoutbuf``, locally (no communication)."""
        from . import _msg

        st: list[Any] = []
        a, dt = _msg.simple(inbuf, "Reduce_local", "inbuf")
        b, dt_b = _msg.simple(inoutbuf, "Reduce_local", "inoutbuf", writable=True, staged=st)
        if a.size != b.size or dt._t is not dt_b._t:
            raise ValueError(f"Reduce_local: inbuf holds {a.size} {dt.Get_name()} items and inoutbuf "
                             f"{b.size} {dt_b.Get_name()}; they must match")
        local_combine(self, dt, a, b, "Reduce_local")
        _staging.unpack_staged(st)


def local_combine(op: Op, dt: Datatype, lower: np.ndarray, acc: np.ndarray, call: str) -> None:
    """``acc = lower ∘ acc`` (arrays of ``dt``'s base dtype), in this process."""
    o = op._valid(call)
    if o.user is not None:
        _call_user(o.user, lower, acc, dt)
        return
    rop, _ = core_op(op, dt, call)
    fn = core_ops.resolve(rop, dt._t.core, call)  # type: ignore[union-attr]
    tmp = lower.copy()
    fn(tmp, acc)          # lower ∘ acc, then into acc
    np.copyto(acc, tmp)


def _bytes(a: np.ndarray) -> memoryview:
    return memoryview(a.reshape(-1).view(np.uint8))


def _pair_fn(pair: np.dtype, is_max: bool) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    def combine(acc: np.ndarray, other: np.ndarray) -> np.ndarray:
        a, b = acc.view(pair), other.view(pair)
        better = b["value"] > a["value"] if is_max else b["value"] < a["value"]
        take = better | ((b["value"] == a["value"]) & (b["index"] < a["index"]))
        a[take] = b[take]
        return acc
    return combine


def _user_fn(user: Callable[..., Any], dt: Datatype) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    def combine(acc: np.ndarray, other: np.ndarray) -> np.ndarray:
        out = other.copy()             # acc ∘ other, computed in the copy of other
        _call_user(user, acc, out, dt)
        return out
    return combine


def _call_user(user: Callable[..., Any], lower: np.ndarray, acc: np.ndarray, dt: Datatype) -> None:
    """``user(lower, acc, dt)`` on whole elements laid out as the datatype says (a derived
    type with gaps is unpacked into temporaries for it, and ``acc`` packed back)."""
    t = dt._t
    assert t is not None
    if not t.gaps:
        user(_bytes(lower), _bytes(acc), dt)
        return
    per = t.base.itemsize * t.mult
    count = acc.nbytes // per if per else 0
    lo, hi = _typemap.span(t.layout, count, 0)
    origin = max(0, -lo)        # (data before the origin: laid out, but not in the fn's view, as in mpi4py)
    size = origin + max(hi, count * t.layout.extent)
    laid = [np.zeros(size, dtype=np.uint8), np.zeros(size, dtype=np.uint8)]
    for mem, packed in zip(laid, (lower, acc)):
        _staging.unpack_message(mem, t, count, origin, packed.view(np.uint8))
    user(memoryview(laid[0])[origin:], memoryview(laid[1])[origin:], dt)
    acc.view(np.uint8)[:] = _staging.pack_message(laid[1], t, count, origin)


def core_op(op: Any, dt: Datatype, call: str, keeps_order: bool = False) -> tuple[Any, bool]:
    """(the op to hand the core for ``dt``, whether the caller must combine in rank order).
    ``keeps_order``: the core call combines in rank order itself (scan), so a
    non-commutative user op can go to it as it is."""
    o = op._o if type(op) is Op else None
    t = dt._t
    if o is not None and o.builtin is not None and not t.pair and not t.mixed:  # type: ignore[union-attr]
        return o.builtin, False                                  # the common case, first
    if not isinstance(op, Op):
        raise TypeError(f"{call}: op must be an MPI.Op, got {type(op).__name__}")
    o = op._valid(call)
    assert t is not None
    if o.builtin is not None:
        if t.mixed:
            raise MPIException(ERR_OP, f"{call}: MPI_{o.name} does not apply to a derived datatype "
                                       "of mixed basic types (a struct); use a user-defined op")
        if t.pair:
            raise MPIException(ERR_OP, f"{call}: MPI_{o.name} does not apply to the pair type "
                                       f"{t.name}; use MPI.MAXLOC or MPI.MINLOC")
        return o.builtin, False
    if o.name in ("MAXLOC", "MINLOC"):
        if not t.pair:
            raise MPIException(ERR_OP, f"{call}: MPI_{o.name} needs a value-index pair datatype "
                                       f"(MPI.FLOAT_INT, DOUBLE_INT, LONG_INT, SHORT_INT, 2INT, "
                                       f"LONG_DOUBLE_INT), got {t.name}")
        rop = o.cache.get(t.np)
        if rop is None:
            rop = o.cache[t.np] = ReduceOp.custom(_pair_fn(t.np, o.name == "MAXLOC"))  # type: ignore[arg-type]
        return rop, False
    if o.user is not None:
        if (not o.commute or t.gaps) and not keeps_order:
            return None, True     # (a type with gaps: whole elements, combined here)
        rop = o.cache.get(t)      # (keyed by the type itself: a freed handle leaves it whole)
        if rop is None:
            rop = o.cache[t] = ReduceOp.custom(_user_fn(o.user, Datatype(dt)))
        return rop, False
    raise MPIException(ERR_OP, f"{call}: MPI_{o.name} is not a reduction (it is for one-sided accumulate)")


def _predefined(name: str) -> Op:
    return PREDEFINED[name]


def _make(name: str, builtin: ReduceOp | None, pyfn: Callable[[Any, Any], Any]) -> Op:
    op = Op()
    op._o = _OpRec(name, builtin, pyfn)
    return op


OP_NULL = Op()
PREDEFINED: dict[str, Op] = {
    "MAX": _make("MAX", ReduceOp.MAX, _maxlike(lambda x, y: y > x)),
    "MIN": _make("MIN", ReduceOp.MIN, _maxlike(lambda x, y: y < x)),
    "SUM": _make("SUM", ReduceOp.SUM, operator.add),
    "PROD": _make("PROD", ReduceOp.PRODUCT, operator.mul),
    "LAND": _make("LAND", ReduceOp.LAND, _logical(lambda a, b: a and b, np.logical_and)),
    "BAND": _make("BAND", ReduceOp.BAND, operator.and_),
    "LOR": _make("LOR", ReduceOp.LOR, _logical(lambda a, b: a or b, np.logical_or)),
    "BOR": _make("BOR", ReduceOp.BOR, operator.or_),
    "LXOR": _make("LXOR", ReduceOp.LXOR, _logical(lambda a, b: a != b, np.logical_xor)),
    "BXOR": _make("BXOR", ReduceOp.BXOR, operator.xor),
    "MAXLOC": _make("MAXLOC", None, _loc(lambda v, u: v > u)),
    "MINLOC": _make("MINLOC", None, _loc(lambda v, u: v < u)),
    "REPLACE": _make("REPLACE", None, lambda x, y: y),
    "NO_OP": _make("NO_OP", None, lambda x, y: x),
}
PREDEFINED["OP_NULL"] = OP_NULL


def py_combine(op: Any, call: str) -> Callable[[Any, Any], Any]:
    """``f(x, y)`` for the object methods: an Op, or any callable ``f(x, y)``."""
    if isinstance(op, Op):
        op._valid(call)
        return op.__call__
    if callable(op):
        return op
    raise TypeError(f"{call}: op must be an MPI.Op or a callable f(x, y), got {type(op).__name__}")
SUM = PREDEFINED["SUM"]


def pinned_op(op: Any) -> Any:
    """An op handle of its own for a persistent request (the program may free its own)."""
    return Op(op) if isinstance(op, Op) else op


def fold(op: Any, dt: Datatype, parts: np.ndarray, n: int, out: np.ndarray) -> None:
    """``out = parts[0] ∘ parts[1] ∘ … ∘ parts[n-1]`` in rank order (n equal blocks)."""
    k = parts.size // n if n else 0
    acc = parts[:k].copy()
    for r in range(1, n):
        nxt = parts[r * k:(r + 1) * k].copy()
        local_combine(op, dt, acc, nxt, "fold")     # nxt = acc ∘ block r
        acc = nxt
    np.copyto(out, acc)
