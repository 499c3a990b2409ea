"""Datatypes: ``MPI.INT``, ``MPI.DOUBLE``, the value-index pairs, and the typecode mapping.

A :class:`Datatype` describes one element of a message. collcomm keeps, for each:

* ``np``: the numpy dtype of one element (a structured dtype for the pairs
  ``FLOAT_INT`` … ``2INT``, laid out as C lays out ``struct {value; int index;}``);
* ``base`` and ``mult``: the numpy dtype and the number of its items that carry one
  element to the core (1-D arrays of a plain numeric dtype): the type itself for the
  basic types, an unsigned/complex integer of the pair's exact size for the pairs (so an
  algorithm never splits a pair), ``mult`` copies of the base type for
  ``Create_contiguous``; ``core`` is the dtype the core is told (``"bfloat16"`` for
  ``BFLOAT16_T``, whose bits travel as uint16).

When a buffer comes without a datatype, the type is read from its format the way
mpi4py reads it: numpy's type characters (``'i'`` → ``MPI.INT``, ``'d'`` → ``MPI.DOUBLE``,
``'l'`` → ``MPI.LONG``, ``'?'`` → ``MPI.C_BOOL``, ``'F'`` → ``MPI.C_FLOAT_COMPLEX``, …),
``array.array`` typecodes and memoryview formats alike. ``[buf, 'i']`` and
``[buf, 'f8']`` name types by code too.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ._errors import ERR_TYPE, Exception as MPIException, not_implemented


class _Type:
    __slots__ = ("name", "np", "base", "mult", "core", "code", "predefined", "pair", "size")

    def __init__(self, name: str, npdt: Any, code: str, *, base: Any = None, mult: int = 1,
                 core: Any = None, predefined: bool = True, pair: bool = False) -> None:
        self.name, self.code, self.predefined, self.pair = name, code, predefined, pair
        self.np = None if npdt is None else np.dtype(npdt)
        self.base = self.np if base is None else np.dtype(base)
        self.mult = mult
        self.core = self.base if core is None else core
        # MPI's size: the bytes of data, without a pair's padding (MPI_DOUBLE_INT: 12, its
        # extent 16); the extent is base.itemsize * mult, the element's bytes in memory
        packed = sum(f[0].itemsize for f in self.np.fields.values()) if pair else self.base.itemsize
        self.size = packed * mult


class Datatype:
    """An MPI datatype (see the module docstring). ``Datatype(t)`` refers to the same type."""

    __slots__ = ("_t",)

    def __init__(self, datatype: "Datatype | None" = None) -> None:
        self._t: _Type | None = None if datatype is None else datatype._t

    # -- identity ----------------------------------------------------------------------
    def __eq__(self, other: object) -> bool:
        return isinstance(other, Datatype) and self._t is other._t

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    __hash__ = None  # type: ignore[assignment]

    def __bool__(self) -> bool:
        return self._t is not None

    def __repr__(self) -> str:
        return f"<collcomm.MPI.Datatype {self._t.name if self._t else 'MPI_DATATYPE_NULL'}>"

    def __reduce__(self) -> Any:
        if self._t is not None and self._t.predefined:
            key = next(k for k, v in _BY_NAME.items() if v._t is self._t)
            return (_predefined, (key,))
        if self._t is None:
            return (Datatype, ())
        raise ValueError(f"cannot serialize the derived datatype {self._t.name!r}")

    def _valid(self, call: str) -> _Type:
        if self._t is None:
            raise MPIException(ERR_TYPE, f"Datatype.{call}: the datatype is MPI.DATATYPE_NULL")
        return self._t

    # -- sizes and names ---------------------------------------------------------------
    def Get_size(self) -> int:  # noqa: N802
        """The bytes of data in one element (a value-index pair's without its padding)."""
        return self._valid("Get_size").size

    def Get_extent(self) -> tuple[int, int]:  # noqa: N802
        """(lower bound, extent) in bytes: the extent is one element's bytes in memory."""
        t = self._valid("Get_extent")
        return 0, t.base.itemsize * t.mult

    def Get_true_extent(self) -> tuple[int, int]:  # noqa: N802
        """(true lower bound, true extent): the last element's padding left out
        (``DOUBLE_INT``: 12; its extent 16)."""
        t = self._valid("Get_true_extent")
        if not t.mult:
            return 0, 0
        unit = t.size // t.mult
        return 0, t.base.itemsize * (t.mult - 1) + unit

    size = property(Get_size)
    extent = property(lambda self: self.Get_extent()[1])
    lb = property(lambda self: 0)
    ub = property(lambda self: self.Get_extent()[1])
    true_extent = property(lambda self: self.Get_true_extent()[1])
    true_lb = lb
    true_ub = true_extent

    def Get_name(self) -> str:  # noqa: N802
        return self._t.name if self._t is not None else "MPI_DATATYPE_NULL"

    def Set_name(self, name: str) -> None:  # noqa: N802
        self._valid("Set_name").name = str(name)

    name = property(Get_name, Set_name)
    is_named = property(lambda self: bool(self._t and self._t.predefined))
    is_predefined = is_named

    @property
    def typechar(self) -> str:
        return self._valid("typechar").code

    @property
    def typestr(self) -> str:
        t = self._valid("typestr")
        if t.pair or t.np is None:
            return f"V{self.Get_extent()[1]}"
        return t.np.str.lstrip("<>|=")

    def tocode(self) -> str:
        return self.typechar

    @classmethod
    def fromcode(cls, code: str) -> "Datatype":
        return from_code(code, "Datatype.fromcode")

    # -- making and freeing --------------------------------------------------------------
    def Dup(self) -> "Datatype":  # noqa: N802
        t = self._valid("Dup")
        d = Datatype()
        d._t = _Type(f"Dup {t.name}", t.np, t.code, base=t.base, mult=t.mult, core=t.core,
                     predefined=False, pair=t.pair)
        return d

    Create_dup = Dup

    def Create_contiguous(self, count: int) -> "Datatype":  # noqa: N802
        """``count`` consecutive elements of this type as one element."""
        t = self._valid("Create_contiguous")
        if int(count) < 0:
            raise MPIException(ERR_TYPE, f"Create_contiguous: count must be >= 0, got {count}")
        d = Datatype()
        d._t = _Type(f"contiguous({count}) of {t.name}", t.np, t.code, base=t.base,
                     mult=t.mult * int(count), core=t.core, predefined=False, pair=t.pair)
        return d

    def Commit(self) -> "Datatype":  # noqa: N802
        self._valid("Commit")
        return self

    def Free(self) -> None:  # noqa: N802
        t = self._valid("Free")
        if t.predefined:
            raise MPIException(ERR_TYPE, f"Datatype.Free: {t.name} is predefined and cannot be freed")
        self._t = None

    free = Free

    def _unsupported(self, *args: Any, **kwargs: Any) -> "Datatype":
        raise not_implemented("Datatype.Create_vector/indexed/struct/subarray/darray/resized",
                              "derived datatypes other than Create_contiguous and Dup")

    Create_vector = Create_hvector = Create_indexed = Create_hindexed = _unsupported
    Create_indexed_block = Create_hindexed_block = Create_subarray = Create_darray = _unsupported
    Create_resized = Resized = _unsupported


def _predefined(name: str) -> Datatype:
    return _BY_NAME[name]


def _make(name: str, npdt: Any, code: str, **kw: Any) -> Datatype:
    d = Datatype()
    d._t = _Type(name, npdt, code, **kw)
    return d


DATATYPE_NULL = Datatype()
_TABLE: list[tuple[str, Any, str, dict[str, Any]]] = [
    ("PACKED", np.uint8, "B", {}), ("BYTE", np.uint8, "B", {}),
    ("AINT", np.intp, "p", {}), ("OFFSET", np.int64, "q", {}), ("COUNT", np.int64, "q", {}),
    ("CHAR", "S1", "c", {"base": np.uint8}), ("WCHAR", "U1", "w", {"base": np.uint32}),
    ("SIGNED_CHAR", np.int8, "b", {}), ("SHORT", np.short, "h", {}), ("INT", np.intc, "i", {}),
    ("LONG", np.int_, "l", {}), ("LONG_LONG", np.longlong, "q", {}),
    ("UNSIGNED_CHAR", np.uint8, "B", {}), ("UNSIGNED_SHORT", np.ushort, "H", {}),
    ("UNSIGNED", np.uintc, "I", {}), ("UNSIGNED_LONG", np.uint, "L", {}),
    ("UNSIGNED_LONG_LONG", np.ulonglong, "Q", {}),
    ("FLOAT", np.float32, "f", {}), ("DOUBLE", np.float64, "d", {}),
    ("LONG_DOUBLE", np.longdouble, "g", {}), ("C_BOOL", np.bool_, "?", {}),
    ("INT8_T", np.int8, "i1", {}), ("INT16_T", np.int16, "i2", {}), ("INT32_T", np.int32, "i4", {}),
    ("INT64_T", np.int64, "i8", {}), ("UINT8_T", np.uint8, "u1", {}), ("UINT16_T", np.uint16, "u2", {}),
    ("UINT32_T", np.uint32, "u4", {}), ("UINT64_T", np.uint64, "u8", {}),
    ("FLOAT16_T", np.float16, "e", {}), ("FLOAT32_T", np.float32, "f4", {}),
    ("FLOAT64_T", np.float64, "f8", {}), ("BFLOAT16_T", np.uint16, "bf16", {"core": "bfloat16"}),
    ("C_FLOAT_COMPLEX", np.complex64, "F", {}), ("C_DOUBLE_COMPLEX", np.complex128, "D", {}),
    ("C_LONG_DOUBLE_COMPLEX", np.clongdouble, "G", {}),
    ("CXX_BOOL", np.bool_, "?", {}), ("CXX_FLOAT_COMPLEX", np.complex64, "F", {}),
    ("CXX_DOUBLE_COMPLEX", np.complex128, "D", {}), ("CXX_LONG_DOUBLE_COMPLEX", np.clongdouble, "G", {}),
    # Fortran types, as their C equivalents
    ("CHARACTER", "S1", "c", {"base": np.uint8}), ("LOGICAL", np.int32, "i4", {}),
    ("INTEGER", np.int32, "i4", {}), ("REAL", np.float32, "f4", {}),
    ("DOUBLE_PRECISION", np.float64, "f8", {}), ("COMPLEX", np.complex64, "c8", {}),
    ("DOUBLE_COMPLEX", np.complex128, "c16", {}),
    ("LOGICAL1", np.int8, "i1", {}), ("LOGICAL2", np.int16, "i2", {}), ("LOGICAL4", np.int32, "i4", {}),
    ("LOGICAL8", np.int64, "i8", {}), ("INTEGER1", np.int8, "i1", {}), ("INTEGER2", np.int16, "i2", {}),
    ("INTEGER4", np.int32, "i4", {}), ("INTEGER8", np.int64, "i8", {}),
    ("REAL2", np.float16, "f2", {}), ("REAL4", np.float32, "f4", {}), ("REAL8", np.float64, "f8", {}),
    ("COMPLEX8", np.complex64, "c8", {}), ("COMPLEX16", np.complex128, "c16", {}),
]
_BY_NAME: dict[str, Datatype] = {"DATATYPE_NULL": DATATYPE_NULL}
for _n, _dt, _code, _kw in _TABLE:
    _BY_NAME[_n] = _make(f"MPI_{_n}", _dt, _code, **_kw)

# value-index pairs (MPI_MAXLOC / MPI_MINLOC): C struct layout, carried as one wide item
_CARRIER = {8: np.uint64, 16: np.complex128, 32: np.clongdouble}
for _n, _vt, _mpiname in (("SHORT_INT", np.short, "MPI_SHORT_INT"), ("TWOINT", np.intc, "MPI_2INT"),
                          ("LONG_INT", np.int_, "MPI_LONG_INT"), ("FLOAT_INT", np.float32, "MPI_FLOAT_INT"),
                          ("DOUBLE_INT", np.float64, "MPI_DOUBLE_INT"),
                          ("LONG_DOUBLE_INT", np.longdouble, "MPI_LONG_DOUBLE_INT")):
    _pair = np.dtype([("value", _vt), ("index", np.intc)], align=True)
    if _pair.itemsize in _CARRIER:
        _BY_NAME[_n] = _make(_mpiname, _pair, f"V{_pair.itemsize}", base=_CARRIER[_pair.itemsize], pair=True)
_BY_NAME["INT_INT"] = _BY_NAME["TWOINT"]

# mpi4py's aliases: other names for the same types
for _alias, _of in (("UNSIGNED_INT", "UNSIGNED"), ("SIGNED_SHORT", "SHORT"), ("SIGNED_INT", "INT"),
                    ("SIGNED_LONG", "LONG"), ("SIGNED_LONG_LONG", "LONG_LONG"), ("BOOL", "C_BOOL"),
                    ("SINT8_T", "INT8_T"), ("SINT16_T", "INT16_T"), ("SINT32_T", "INT32_T"),
                    ("SINT64_T", "INT64_T"), ("F_BOOL", "LOGICAL"), ("F_INT", "INTEGER"),
                    ("F_FLOAT", "REAL"), ("F_DOUBLE", "DOUBLE_PRECISION"), ("F_COMPLEX", "COMPLEX"),
                    ("F_FLOAT_COMPLEX", "COMPLEX"), ("F_DOUBLE_COMPLEX", "DOUBLE_COMPLEX"),
                    ("C_COMPLEX", "C_FLOAT_COMPLEX")):
    _BY_NAME[_alias] = _BY_NAME[_of]

#: What the module exports (``MPI.INT`` …).
PREDEFINED: dict[str, Datatype] = dict(_BY_NAME)

# typecodes: numpy / array / memoryview characters and mpi4py's longer codes
_CODES: dict[str, Datatype] = {}
for _name in ("C_BOOL", "SIGNED_CHAR", "SHORT", "INT", "LONG", "LONG_LONG", "UNSIGNED_CHAR",
              "UNSIGNED_SHORT", "UNSIGNED", "UNSIGNED_LONG", "UNSIGNED_LONG_LONG", "FLOAT16_T",
              "FLOAT", "DOUBLE", "LONG_DOUBLE", "C_FLOAT_COMPLEX", "C_DOUBLE_COMPLEX",
              "C_LONG_DOUBLE_COMPLEX", "CHAR", "WCHAR"):
    _CODES[_BY_NAME[_name]._t.code] = _BY_NAME[_name]  # type: ignore[union-attr]
_CODES.update({
    "i1": _BY_NAME["INT8_T"], "i2": _BY_NAME["INT16_T"], "i4": _BY_NAME["INT32_T"],
    "i8": _BY_NAME["INT64_T"], "u1": _BY_NAME["UINT8_T"], "u2": _BY_NAME["UINT16_T"],
    "u4": _BY_NAME["UINT32_T"], "u8": _BY_NAME["UINT64_T"], "f2": _BY_NAME["FLOAT16_T"],
    "f4": _BY_NAME["FLOAT"], "f8": _BY_NAME["DOUBLE"], "f16": _BY_NAME["LONG_DOUBLE"],
    "c8": _BY_NAME["C_FLOAT_COMPLEX"], "c16": _BY_NAME["C_DOUBLE_COMPLEX"],
    "c32": _BY_NAME["C_LONG_DOUBLE_COMPLEX"], "b1": _BY_NAME["C_BOOL"],
    "Zf": _BY_NAME["C_FLOAT_COMPLEX"], "Zd": _BY_NAME["C_DOUBLE_COMPLEX"],
    "Zg": _BY_NAME["C_LONG_DOUBLE_COMPLEX"], "n": _BY_NAME["LONG"], "N": _BY_NAME["UNSIGNED_LONG"],
    "p": _BY_NAME["AINT"], "P": _BY_NAME["UNSIGNED_LONG"], "a": _BY_NAME["CHAR"],
    "S": _BY_NAME["CHAR"], "S1": _BY_NAME["CHAR"], "s": _BY_NAME["CHAR"], "1s": _BY_NAME["CHAR"],
    "U": _BY_NAME["WCHAR"], "U1": _BY_NAME["WCHAR"], "u": _BY_NAME["UINT16_T"],
    "bf16": _BY_NAME["BFLOAT16_T"],
})

#: mpi4py's private tables, which programs use to pick a datatype for an array
#: (``[a, MPI._typedict[a.dtype.char]]``): every typecode; the C types' codes; Fortran's
TYPEDICT: dict[str, Datatype] = {k: v for k, v in _CODES.items() if k != "bf16"}
TYPEDICT.update({k: _BY_NAME["INT64_T"] for k in ("M", "M8", "m", "m8")})   # datetime64, timedelta64
TYPEDICT_C: dict[str, Datatype] = {k: v for k, v in TYPEDICT.items() if len(k) == 1 and k in "?bhilqBHILQfdgFDG"
                                   or k in ("b1", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8",
                                            "f2", "f4", "f8", "f16", "c8", "c16", "c32")}
TYPEDICT_F: dict[str, Datatype] = {code: _BY_NAME[name] for code, name in (
    ("l", "LOGICAL"), ("i", "INTEGER"), ("r", "REAL"), ("s", "REAL"), ("d", "DOUBLE_PRECISION"),
    ("c", "COMPLEX"), ("z", "DOUBLE_COMPLEX"), ("l1", "LOGICAL1"), ("l2", "LOGICAL2"),
    ("l4", "LOGICAL4"), ("l8", "LOGICAL8"), ("i1", "INTEGER1"), ("i2", "INTEGER2"),
    ("i4", "INTEGER4"), ("i8", "INTEGER8"), ("r4", "REAL4"), ("r8", "REAL8"),
    ("c8", "COMPLEX8"), ("c16", "COMPLEX16")) if name in _BY_NAME}


def typecode(datatype: Datatype) -> str | None:
    """mpi4py's ``MPI._typecode``: a predefined type's typecode; None for a value-index
    pair, a derived type or DATATYPE_NULL."""
    t = datatype._t
    return None if t is None or t.pair or not t.predefined else t.code


def from_code(code: str, call: str) -> Datatype:
    """The datatype of a typecode (``'i'``, ``'f8'``, a memoryview format like ``'<d'``)."""
    key = code.lstrip("@=<>!") if len(code) > 1 else code
    dt = _CODES.get(key)
    if dt is None:
        raise KeyError(f"{call}: cannot map {code!r} to an MPI datatype")
    return dt


_BY_NUMPY: dict[np.dtype, Datatype] = {}


def from_numpy(dtype: np.dtype, call: str) -> Datatype:
    """The datatype mpi4py infers for a numpy dtype (by its type character)."""
    dt = _BY_NUMPY.get(dtype)
    if dt is None:
        if dtype.fields is not None or dtype.kind in "OVMm" or dtype.hasobject:
            raise KeyError(f"{call}: cannot map numpy dtype {dtype} to an MPI datatype "
                           "(pass [buf, datatype] to say how to read it)")
        dt = from_code(dtype.char if dtype.kind not in "SU" or dtype.itemsize in (1, 4) else dtype.str, call)
        _BY_NUMPY[dtype] = dt
    return dt


def as_datatype(spec: Any, call: str) -> Datatype:
    """A Datatype from a Datatype or a typecode string."""
    if isinstance(spec, Datatype):
        if spec._t is None:
            raise MPIException(ERR_TYPE, f"{call}: the datatype is MPI.DATATYPE_NULL")
        return spec
    if isinstance(spec, str):
        return from_code(spec, call)
    raise TypeError(f"{call}: expected a Datatype or a typecode string, got {type(spec).__name__}")
