"""Integer handles: ``py2f``/``f2py``, ``toint``/``fromint``, ``handle``/``fromhandle``.

mpi4py converts its handles to and from the MPI library's integers (a Fortran handle, a C
handle's bits). collcomm.MPI has no MPI library underneath, so the integers are its own:
each handle's record (the object every copy of a handle shares: a communicator's
``_CommRec``, a datatype's ``_Type``...) is numbered the first time it is asked for, per
kind of handle, and the number gives back a handle on the same record, in this process
only; they mean nothing to a C or Fortran MPI library. The null handle of each kind is 0
(a communicator's: 2, and ``COMM_WORLD``/``COMM_SELF`` 0 and 1, as in Open MPI). A record
once numbered stays referenced by the table (as a library's handle table keeps it).
"""
from __future__ import annotations

import threading
from typing import Any

from ._errors import ERR_ARG, Exception as MPIException

_lock = threading.Lock()
#: per kind: (number -> record, id(record) -> number)
_tables: dict[str, tuple[dict[int, Any], dict[int, int]]] = {}


def number(kind: str, rec: Any, null: Any, fixed: dict[int, Any] | None = None, first: int = 1) -> int:
    """The integer of record ``rec`` of ``kind`` (``null``'s: 0 unless ``fixed`` says)."""
    for value, known in (fixed or {}).items():
        if rec is known:
            return value
    if rec is null:
        return 0
    with _lock:
        by_int, by_id = _tables.setdefault(kind, ({}, {}))
        n = by_id.get(id(rec))
        if n is None:
            n = first + len(by_int)
            by_int[n], by_id[id(rec)] = rec, n
        return n


def record(kind: str, value: Any, null: Any, fixed: dict[int, Any] | None = None) -> Any:
    """The record of integer ``value`` of ``kind`` (``null`` for 0, unless ``fixed`` says)."""
    n = int(value)
    if fixed and n in fixed:
        return fixed[n]
    if n == 0 and not fixed:
        return null
    with _lock:
        rec = _tables.get(kind, ({}, {}))[0].get(n)
    if rec is None:
        raise MPIException(ERR_ARG, f"{kind}.f2py: {n} is no handle of this process")
    return rec


class HandleInts:
    """``py2f``, ``f2py``, ``toint``, ``fromint``, ``handle`` and ``fromhandle`` for a handle
    class whose record sits in slot ``_REC`` (its null record ``_null_rec()``)."""

    __slots__ = ()
    _REC = ""

    @classmethod
    def _null_rec(cls) -> Any:
        return None

    @classmethod
    def _fixed(cls) -> dict[int, Any] | None:
        return None

    def _record(self) -> Any:
        """What is numbered: the record every copy of the handle shares (the null record
        for a handle freed since)."""
        return getattr(self, self._REC)

    @classmethod
    def _from_record(cls, rec: Any) -> Any:
        obj = cls.__new__(cls)
        object.__setattr__(obj, cls._REC, rec)
        return obj

    @classmethod
    def _handle_kind(cls) -> str:
        for base in cls.__mro__:             # (the handle class that defines _REC)
            if "_REC" in base.__dict__:
                return base.__name__
        return cls.__name__

    def py2f(self) -> int:
        return number(self._handle_kind(), self._record(), self._null_rec(), self._fixed(),
                      3 if self._fixed() else 1)

    toint = py2f

    @property
    def handle(self) -> int:
        """This process's integer for the handle (collcomm.MPI's own: see _handles.py)."""
        return self.py2f()

    @classmethod
    def f2py(cls, arg: int) -> Any:
        return cls._from_record(record(cls._handle_kind(), arg, cls._null_rec(), cls._fixed()))

    fromint = f2py
    fromhandle = f2py


class CommHandleInts(HandleInts):
    """A communicator's integer handles: ``COMM_WORLD`` 0, ``COMM_SELF`` 1, ``COMM_NULL``
    (and any communicator freed since) 2, as Open MPI numbers them; ``f2py``/``fromint``
    give the communicator's own class (a Cartesian one's: ``Cartcomm``…), as mpi4py's
    fromhandle does."""

    __slots__ = ()
    _REC = "_h"

    @classmethod
    def _null_rec(cls) -> Any:
        from ._comm import _NULL_REC
        return _NULL_REC

    @classmethod
    def _fixed(cls) -> dict[int, Any]:
        from ._comm import _NULL_REC, COMM_SELF, COMM_WORLD
        return {0: COMM_WORLD._h, 1: COMM_SELF._h, 2: _NULL_REC}

    def _record(self) -> Any:
        rec = self._h  # type: ignore[attr-defined]
        return self._null_rec() if rec.kind == "null" else rec

    @classmethod
    def _from_record(cls, rec: Any) -> Any:
        from ._comm import Comm
        if rec.kind != "null" and (rec.topo is not None or cls is Comm):
            return Comm._wrap(rec)          # (the topology's class, or Intracomm)
        obj = cls.__new__(cls)
        obj._h = rec
        return obj
