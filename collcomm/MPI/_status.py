"""``MPI.Status``: what a receive or probe found (source, tag, error, byte count).

``Get_count(datatype)`` is the number of whole ``datatype`` elements (``UNDEFINED`` when the
bytes are not a whole number of them); ``Get_elements`` counts basic elements (a
contiguous type counts its parts, a value-index pair one). A fresh status says
``ANY_SOURCE``, ``ANY_TAG``, ``SUCCESS``, 0 bytes, like an empty MPI status.
"""
from __future__ import annotations

from typing import Any

from ._consts import ANY_SOURCE, ANY_TAG, UNDEFINED
from ._errors import SUCCESS, Exception as MPIException
from ._derived import basic_dtypes
from ._types import Datatype


class Status:
    """What a receive (or probe) found: ``source``, ``tag``, ``error``, the byte ``count``."""

    __slots__ = ("source", "tag", "error", "count", "cancelled")

    def __init__(self, status: "Status | None" = None) -> None:
        if status is not None and not isinstance(status, Status):
            raise TypeError(f"Status: expected a Status to copy, got {type(status).__name__}")
        if status is None:
            self.source, self.tag, self.error, self.count, self.cancelled = ANY_SOURCE, ANY_TAG, SUCCESS, 0, False
        else:
            self.source, self.tag, self.error = status.source, status.tag, status.error
            self.count, self.cancelled = status.count, status.cancelled

    def py2f(self) -> list[int]:
        """The status as Open MPI's Fortran array of F_STATUS_SIZE integers: source, tag,
        error (F_SOURCE, F_TAG, F_ERROR), then the byte count (low, high 32 bits) and the
        cancelled flag."""
        return [self.source, self.tag, self.error, self.count & 0xFFFFFFFF, self.count >> 32, int(self.cancelled)]

    @classmethod
    def f2py(cls, arg: Any) -> "Status":
        """A status from such an array (``py2f``'s)."""
        f = [int(x) for x in arg]
        st = cls()
        st.source, st.tag, st.error = f[0], f[1], f[2]
        if len(f) >= 6:
            st.count, st.cancelled = f[3] | (f[4] << 32), bool(f[5])
        return st

    def _set(self, source: int, tag: int, nbytes: int, cancelled: bool = False) -> None:
        self.source, self.tag, self.error, self.count, self.cancelled = source, tag, SUCCESS, nbytes, cancelled

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Status) and all(
            getattr(self, k) == getattr(other, k) for k in self.__slots__)

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (f"<collcomm.MPI.Status source={self.source} tag={self.tag} error={self.error} "
                f"count={self.count}{' cancelled' if self.cancelled else ''}>")

    def __getstate__(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for k, v in state.items():
            setattr(self, k, v)

    def Get_source(self) -> int:  # noqa: N802
        return self.source

    def Set_source(self, source: int) -> None:  # noqa: N802
        self.source = int(source)

    def Get_tag(self) -> int:  # noqa: N802
        return self.tag

    def Set_tag(self, tag: int) -> None:  # noqa: N802
        self.tag = int(tag)

    def Get_error(self) -> int:  # noqa: N802
        return self.error

    def Set_error(self, error: int) -> None:  # noqa: N802
        self.error = int(error)

    def Get_count(self, datatype: Datatype | None = None) -> int:  # noqa: N802
        """Whole ``datatype`` elements received (bytes by default); UNDEFINED if partial."""
        t = None if datatype is None else datatype._t
        size = 1 if t is None else t.base.itemsize * t.mult   # (the bytes one element moves, packed)
        if size == 0:
            return 0
        return self.count // size if self.count % size == 0 else UNDEFINED

    def Get_elements(self, datatype: Datatype) -> int:  # noqa: N802
        """Basic elements received (a contiguous type counts its parts, a pair one)."""
        t = datatype._t
        if t is None:
            raise MPIException(3, "Status.Get_elements: datatype is MPI.DATATYPE_NULL")
        if t.mixed:                 # (a struct of mixed types: whole elements, then the basic ones)
            whole = t.base.itemsize * t.mult
            if not whole:
                return 0
            k, rest = divmod(self.count, whole)
            got = 0
            for d in basic_dtypes(t) if rest else ():
                if rest < d.itemsize:
                    break
                rest, got = rest - d.itemsize, got + 1
            return k * t.nbasic + got if not rest else UNDEFINED
        unit = t.base.itemsize      # (a value-index pair is one: predefined, as Open MPI counts)
        return self.count // unit if unit and self.count % unit == 0 else UNDEFINED

    def Set_elements(self, datatype: Datatype, count: int) -> None:  # noqa: N802
        t = datatype._t
        if t is None:
            raise MPIException(3, "Status.Set_elements: datatype is MPI.DATATYPE_NULL")
        self.count = int(count) * t.base.itemsize     # (basic elements: Get_elements' unit)

    def Is_cancelled(self) -> bool:  # noqa: N802
        return self.cancelled

    def Set_cancelled(self, flag: bool) -> None:  # noqa: N802
        self.cancelled = bool(flag)
