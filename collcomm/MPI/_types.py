"""Datatypes: ``MPI.INT``, ``MPI.DOUBLE``, the value-index pairs, derived types, and the
typecode mapping.

A :class:`Datatype` is a handle on a :class:`~._derived._Type`, which describes one element
of a message: ``np``, the numpy dtype of one basic element (a structured dtype for the
pairs ``FLOAT_INT`` … ``2INT``, laid out as C lays out ``struct {value; int index;}``);
``base`` and ``mult``, the numpy dtype and the number of its items that carry one element
to the core (1-D arrays of a plain numeric dtype): the type itself for the basic types,
an unsigned/complex integer of the pair's exact size for the pairs (so an algorithm never
splits a pair); ``core``, the dtype the core is told (``"bfloat16"`` for ``BFLOAT16_T``,
whose bits travel as uint16). The derived-type constructors (``Create_vector`` …
``Create_resized``) are in :mod:`._derived`; recipes and MPI_Pack in :mod:`._type_contents`.

When a buffer comes without a datatype, the type is read from its format the way
mpi4py reads it: numpy's type characters (``'i'`` → ``MPI.INT``, ``'d'`` → ``MPI.DOUBLE``,
``'l'`` → ``MPI.LONG``, ``'?'`` → ``MPI.C_BOOL``, ``'F'`` → ``MPI.C_FLOAT_COMPLEX``, …),
``array.array`` typecodes and memoryview formats alike. ``[buf, 'i']`` and
``[buf, 'f8']`` name types by code too.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from . import _derived
from ._type_extras import TypeExtras
from ._handles import HandleInts
from ._derived import _Type
from ._type_contents import TypeContents
from ._errors import ERR_TYPE, Exception as MPIException, not_implemented


class Datatype(TypeContents, TypeExtras, HandleInts):
    """An MPI datatype (see the module docstring). ``Datatype(t)`` refers to the same type."""

    __slots__ = ("_t",)
    _REC = "_t"

    def __new__(cls, datatype: Any = None) -> Any:
        # (made as mpi4py makes its handles, by __new__: a subclass's __new__(cls, datatype)
        # that passes datatype on gets the copy; __init__ then does it again)
        self = object.__new__(cls)
        Datatype.__init__(self, datatype)
        return self

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
        """(lower bound, extent) in bytes: the extent is the stride between consecutive elements."""
        lay = self._valid("Get_extent").layout
        return lay.lb, lay.extent

    def Get_true_extent(self) -> tuple[int, int]:  # noqa: N802
        """(true lower bound, true extent): where the data lies, a predefined pair's last
        padding left out (``DOUBLE_INT``: 12; its extent 16)."""
        t = self._valid("Get_true_extent")
        if t.gaps:
            return t.layout.true_lb, t.layout.true_ub - t.layout.true_lb
        if not t.mult:
            return 0, 0
        unit = t.size // t.mult
        return 0, t.base.itemsize * (t.mult - 1) + unit

    size = property(Get_size)
    extent = property(lambda self: self.Get_extent()[1])
    lb = property(lambda self: self.Get_extent()[0])
    ub = property(lambda self: sum(self.Get_extent()))
    true_extent = property(lambda self: self.Get_true_extent()[1])
    true_lb = property(lambda self: self.Get_true_extent()[0])
    true_ub = property(lambda self: sum(self.Get_true_extent()))

    def Get_name(self) -> str:  # noqa: N802
        return self._t.name if self._t is not None else "MPI_DATATYPE_NULL"

    def Set_name(self, name: str) -> None:  # noqa: N802
        self._valid("Set_name").name = str(name)

    name = property(Get_name, Set_name)
    is_named = property(lambda self: bool(self._t and self._t.predefined))
    is_predefined = is_named

    @property
    def typechar(self) -> str:
        t = self._valid("typechar")      # (a derived type other than a Dup: "V", as mpi4py)
        return t.code if t.recipe[0] in ("NAMED", "DUP") and not t.pair else "V"

    @property
    def typestr(self) -> str:
        t = self._valid("typestr")
        if t.pair or t.np is None or self.typechar == "V":
            return f"V{self.Get_extent()[1]}"
        return t.np.str.lstrip("<>|=")

    def tocode(self) -> str:
        return self.typechar

    @classmethod
    def fromcode(cls, code: str) -> "Datatype":
        return from_code(code, "Datatype.fromcode")

    # -- making and freeing (derived types: _derived.py) ------------------------------------
    def _new(self, t: _Type) -> "Datatype":
        d = Datatype()
        d._t = t
        return d

    def Dup(self) -> "Datatype":  # noqa: N802
        return self._new(_derived.dup(self._valid("Dup")))

    Create_dup = Dup

    def Create_contiguous(self, count: int) -> "Datatype":  # noqa: N802
        """``count`` consecutive elements of this type as one element."""
        return self._new(_derived.contiguous(self._valid("Create_contiguous"), count))

    def Create_vector(self, count: int, blocklength: int, stride: int) -> "Datatype":  # noqa: N802
        """``count`` blocks of ``blocklength`` elements, block starts ``stride`` elements apart."""
        return self._new(_derived.vector(self._valid("Create_vector"), count, blocklength, stride, False))

    def Create_hvector(self, count: int, blocklength: int, stride: int) -> "Datatype":  # noqa: N802
        """As Create_vector, ``stride`` in bytes."""
        return self._new(_derived.vector(self._valid("Create_hvector"), count, blocklength, stride, True))

    def Create_indexed(self, blocklengths: Any, displacements: Any) -> "Datatype":  # noqa: N802
        """Blocks of ``blocklengths[i]`` elements at ``displacements[i]`` elements."""
        return self._new(_derived.indexed(self._valid("Create_indexed"), blocklengths, displacements,
                                          False, False))

    def Create_hindexed(self, blocklengths: Any, displacements: Any) -> "Datatype":  # noqa: N802
        """As Create_indexed, displacements in bytes."""
        return self._new(_derived.indexed(self._valid("Create_hindexed"), blocklengths, displacements,
                                          True, False))

    def Create_indexed_block(self, blocklength: int, displacements: Any) -> "Datatype":  # noqa: N802
        return self._new(_derived.indexed(self._valid("Create_indexed_block"), blocklength, displacements,
                                          False, True))

    def Create_hindexed_block(self, blocklength: int, displacements: Any) -> "Datatype":  # noqa: N802
        return self._new(_derived.indexed(self._valid("Create_hindexed_block"), blocklength, displacements,
                                          True, True))

    def Create_subarray(self, sizes: Any, subsizes: Any, starts: Any,  # noqa: N802
                        order: int = 0) -> "Datatype":
        """The block ``subsizes`` at ``starts`` of an array ``sizes`` (C order by default;
        ``MPI.ORDER_FORTRAN``); the extent is the whole array's."""
        return self._new(_derived.subarray(self._valid("Create_subarray"), sizes, subsizes, starts, order))

    @classmethod
    def Create_struct(cls, blocklengths: Any, displacements: Any, datatypes: Any) -> "Datatype":  # noqa: N802
        """Blocks of ``blocklengths[i]`` elements of ``datatypes[i]`` at byte ``displacements[i]``."""
        types = [as_datatype(t, "Datatype.Create_struct")._t for t in datatypes]
        return Datatype()._new(_derived.struct(blocklengths, displacements, types))  # type: ignore[arg-type]

    def Create_resized(self, lb: int, extent: int) -> "Datatype":  # noqa: N802
        """The same data with lower bound ``lb`` and extent ``extent`` (bytes)."""
        return self._new(_derived.resized(self._valid("Create_resized"), lb, extent))

    Resized = Create_resized

    def Create_darray(self, *args: Any, **kwargs: Any) -> "Datatype":  # noqa: N802
        raise not_implemented("Datatype.Create_darray", "distributed-array types; build the "
                              "block with Create_subarray")

    @classmethod
    def Get_value_index(cls, value: "Datatype", index: "Datatype") -> "Datatype":  # noqa: N802
        """The predefined value-index pair type of ``value`` and ``index`` (``DOUBLE``,
        ``INT`` → ``DOUBLE_INT``), MPI.DATATYPE_NULL when there is none."""
        if index != _BY_NAME["INT"]:
            return DATATYPE_NULL
        for name, pair in (("FLOAT", "FLOAT_INT"), ("DOUBLE", "DOUBLE_INT"), ("LONG", "LONG_INT"),
                           ("INT", "TWOINT"), ("SHORT", "SHORT_INT"), ("LONG_DOUBLE", "LONG_DOUBLE_INT")):
            if value == _BY_NAME[name] and pair in _BY_NAME:
                return _BY_NAME[pair]
        return DATATYPE_NULL

    def Commit(self) -> "Datatype":  # noqa: N802
        self._valid("Commit").committed = True
        return self

    def Free(self) -> None:  # noqa: N802
        t = self._valid("Free")
        if t.predefined:
            raise MPIException(ERR_TYPE, f"Datatype.Free: {t.name} is predefined and cannot be freed")
        self._t = None

    free = Free


def _predefined(name: str) -> Datatype:
    return _BY_NAME[name]


def _make(name: str, npdt: Any, code: str, **kw: Any) -> Datatype:
    return Datatype()._new(_Type(name, npdt, code, **kw))


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


def _plain_types() -> Any:
    """The native core's ``mpi_plain`` (native/_mpi_plain.c: a buffer spec that stands
    for its array as it is, e.g. ``[x, MPI.DOUBLE]`` of a float64 array, given as that
    array) once it knows the predefined datatypes whose element is one numpy scalar;
    None without the core."""
    from .. import native
    core = native.core
    if core is None or not hasattr(core, "mpi_plain_types"):
        return None
    triples = [(d._t, d._t.base, d._t.base.itemsize) for d in _BY_NAME.values()
               if d._t is not None and not d._t.pair and d._t.mult == 1 and not d._t.gaps
               and d._t.base.kind in "biufc" and d._t.core is d._t.base]   # (not BFLOAT16_T: uint16
    # elements the core reduces as bfloat16, which an array of them would not say)
    unique = list({id(t[0]): t for t in triples}.values())
    return core.mpi_plain if core.mpi_plain_types(Datatype, unique, np.frombuffer, np.asarray) else None


#: mpi_plain(spec, per, writable) -> the array, or the spec itself (None: no core)
PLAIN = _plain_types()

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
