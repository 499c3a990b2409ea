"""``Datatype``'s attributes (``Create_keyval``, ``Get_attr``...), ``Match_size``, the
``Create_f90_*`` types and the ``envelope``/``contents`` properties (a mixin of
:class:`._types.Datatype`, mpi4py 4's names).

The attributes of a datatype live with its record (every handle of the type sees them);
the keyvals are the communicators' (one table, as in collcomm's ``Comm.Create_keyval``).
``Match_size`` and ``Create_f90_*`` answer as Open MPI does under mpi4py (``REAL`` of 8
bytes is ``REAL8``, of 2 an error; no 16-byte reals: numpy has no IEEE quad).
"""
from __future__ import annotations

from typing import Any, Callable

from ._attrs import _KEYVALS, Attributes
from ._consts import TYPECLASS_COMPLEX, TYPECLASS_INTEGER, TYPECLASS_REAL
from ._errors import ERR_ARG, ERR_KEYVAL, Exception as MPIException

#: Match_size(typeclass, size) -> the predefined type's name (as Open MPI answers)
_MATCH = {
    TYPECLASS_REAL: {4: "REAL", 8: "REAL8"},
    TYPECLASS_INTEGER: {1: "INTEGER1", 2: "INTEGER2", 4: "INTEGER", 8: "INTEGER8"},
    TYPECLASS_COMPLEX: {8: "COMPLEX", 16: "COMPLEX16"},
}


class TypeExtras:
    """The mixin (see the module docstring)."""

    __slots__ = ()
    _t: Any
    _valid: Callable[..., Any]
    _new: Callable[..., Any]

    # -- attributes ---------------------------------------------------------------------------
    Create_keyval = Attributes.Create_keyval
    Free_keyval = Attributes.Free_keyval

    def _attrs(self, call: str) -> dict[int, Any]:
        t = self._valid(call)
        attrs = getattr(t, "attrs", None)
        if attrs is None:
            attrs = t.attrs = {}
        return attrs

    def Get_attr(self, keyval: int) -> Any:  # noqa: N802
        return self._attrs("Get_attr").get(int(keyval))

    def Set_attr(self, keyval: int, attrval: Any) -> None:  # noqa: N802
        if int(keyval) not in _KEYVALS:
            raise MPIException(ERR_KEYVAL, f"Datatype.Set_attr: keyval {keyval} was not made by Create_keyval")
        self._attrs("Set_attr")[int(keyval)] = attrval

    def Delete_attr(self, keyval: int) -> None:  # noqa: N802
        value = self._attrs("Delete_attr").pop(int(keyval), None)
        delete_fn = _KEYVALS.get(int(keyval), (None, None))[1]
        if delete_fn is not None and value is not None:
            delete_fn(self, keyval, value)

    # -- properties -----------------------------------------------------------------------------
    @property
    def envelope(self) -> tuple[int, int, int, int, int]:
        return self.Get_envelope()  # type: ignore[attr-defined]

    @property
    def contents(self) -> Any:
        return self.Get_contents()  # type: ignore[attr-defined]

    # -- types by size and precision -------------------------------------------------------------
    @classmethod
    def Match_size(cls, typeclass: int, size: int) -> Any:  # noqa: N802
        """The predefined Fortran type of ``typeclass`` (``TYPECLASS_REAL``, ``_INTEGER``,
        ``_COMPLEX``) whose elements are ``size`` bytes."""
        from ._types import PREDEFINED
        name = _MATCH.get(int(typeclass), {}).get(int(size))
        if name is None:
            raise MPIException(ERR_ARG, f"Datatype.Match_size: no type of class {typeclass} has {size} bytes")
        return cls(PREDEFINED[name])

    @classmethod
    def Create_f90_real(cls, p: int, r: int) -> Any:  # noqa: N802
        """A real type of at least ``p`` decimal digits and exponent range ``r`` (FLOAT or
        DOUBLE; more is an error)."""
        return cls._f90("F90_REAL", "Create_f90_real", {"p": int(p), "r": int(r)},
                        "FLOAT" if p <= 6 and r <= 37 else "DOUBLE" if p <= 15 and r <= 307 else None)

    @classmethod
    def Create_f90_complex(cls, p: int, r: int) -> Any:  # noqa: N802
        return cls._f90("F90_COMPLEX", "Create_f90_complex", {"p": int(p), "r": int(r)},
                        "COMPLEX" if p <= 6 and r <= 37 else "DOUBLE_COMPLEX" if p <= 15 and r <= 307 else None)

    @classmethod
    def Create_f90_integer(cls, r: int) -> Any:  # noqa: N802
        """An integer type holding ``r`` decimal digits (8 to 64 bits)."""
        name = next((n for digits, n in ((2, "INT8_T"), (4, "SHORT"), (9, "INT"), (18, "LONG")) if r <= digits), None)
        return cls._f90("F90_INTEGER", "Create_f90_integer", {"r": int(r)}, name)

    @classmethod
    def _f90(cls, combiner: str, call: str, params: dict[str, int], of: str | None) -> Any:
        from . import _derived
        from ._types import PREDEFINED
        if of is None:
            raise MPIException(ERR_ARG, f"Datatype.{call}: no type has {params}")
        t = _derived.dup(PREDEFINED[of]._t)
        t.name, t.recipe = f"{combiner} {of}", (combiner, dict(params), [])
        d = cls()
        d._t = t
        return d
