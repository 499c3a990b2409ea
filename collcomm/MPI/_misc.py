"""Small MPI objects with no communication: ``Info`` and ``Errhandler``.

``Info`` is a string-to-string dictionary (MPI hints; collcomm takes none, but keeps them
for ``Get_info``). Errors are always reported by raising ``MPI.Exception`` (mpi4py's default,
``ERRORS_RETURN``); ``Set_errhandler`` is accepted and remembered.
"""
from __future__ import annotations

import os
import sys
from typing import Any, Iterable, Iterator, Mapping

from ._handles import HandleInts


class Info(HandleInts):
    """A dictionary of hints (``Info.Create({...})``, ``info["key"]``, ``Get``/``Set``)."""

    __slots__ = ("_d",)
    _REC = "_d"

    def __new__(cls, info: Any = None) -> Any:
        # (made as mpi4py makes its handles, by __new__: a subclass's __new__(cls, info)
        # that passes info on gets the copy; __init__ then does it again)
        self = object.__new__(cls)
        Info.__init__(self, info)
        return self

    def __init__(self, info: "Info | None" = None) -> None:
        self._d: dict[str, str] | None = None if info is None else info._d

    @classmethod
    def Create(cls, items: "Info | Mapping[str, str] | Iterable[tuple[str, str]] | None" = None) -> "Info":  # noqa: N802
        i = cls()
        i._d = {}
        if isinstance(items, Info):
            i._d.update(items._d or {})
        elif items is not None:
            i._d.update(dict(items))
        return i

    @classmethod
    def Create_env(cls, args: Any = None) -> "Info":  # noqa: N802
        return cls.Create({"command": os.path.basename(sys.argv[0]) if sys.argv else "",
                           "maxprocs": os.environ.get("WORLD_SIZE", "1")})

    def _v(self) -> dict[str, str]:
        if self._d is None:
            from ._errors import Exception as MPIException
            raise MPIException(34, "Info: the info object is MPI.INFO_NULL")
        return self._d

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Info) and self._d is other._d

    __hash__ = None  # type: ignore[assignment]

    def __bool__(self) -> bool:
        return self._d is not None

    def __len__(self) -> int:
        return len(self._d or {})

    def __iter__(self) -> Iterator[str]:
        return iter(dict(self._d or {}))

    def __contains__(self, key: object) -> bool:
        return key in (self._d or {})

    def __getitem__(self, key: str) -> str:
        return self._v()[key]

    def __setitem__(self, key: str, value: str) -> None:
        self._v()[str(key)] = str(value)

    def __delitem__(self, key: str) -> None:
        del self._v()[key]

    def Free(self) -> None:  # noqa: N802
        self._d = None

    def Dup(self) -> "Info":  # noqa: N802
        return Info.Create(self)

    def Get(self, key: str) -> str | None:  # noqa: N802
        return self._v().get(key)

    def Set(self, key: str, value: str) -> None:  # noqa: N802
        self[key] = value

    def Delete(self, key: str) -> None:  # noqa: N802
        del self[key]

    def Get_nkeys(self) -> int:  # noqa: N802
        return len(self._v())

    def Get_nthkey(self, n: int) -> str:  # noqa: N802
        return list(self._v())[n]

    def get(self, key: str, default: str | None = None) -> str | None:
        return (self._d or {}).get(key, default)

    def keys(self) -> list[str]:
        return list(self._d or {})

    def values(self) -> list[str]:
        return list((self._d or {}).values())

    def items(self) -> list[tuple[str, str]]:
        return list((self._d or {}).items())

    def update(self, items: Any = (), **kwds: str) -> None:
        self._v().update(dict(items), **kwds)

    def pop(self, key: str, *default: str) -> str:
        return self._v().pop(key, *default)

    def popitem(self) -> tuple[str, str]:
        """Remove and return the last (key, value) set (``KeyError`` when empty)."""
        return self._v().popitem()

    def copy(self) -> "Info":
        return self.Dup()

    def clear(self) -> None:
        self._v().clear()

    free = Free


INFO_NULL = Info()
INFO_ENV = Info.Create({"maxprocs": os.environ.get("WORLD_SIZE", "1")})


class Errhandler(HandleInts):
    """An error handler handle; collcomm.MPI raises MPI.Exception whatever is set."""

    __slots__ = ("_name",)
    _REC = "_name"

    def __new__(cls, errhandler: Any = None) -> Any:
        # (made as mpi4py makes its handles, by __new__: a subclass's __new__(cls, errhandler)
        # that passes errhandler on gets the copy; __init__ then does it again)
        self = object.__new__(cls)
        Errhandler.__init__(self, errhandler)
        return self

    def __init__(self, errhandler: "Errhandler | None" = None) -> None:
        self._name = None if errhandler is None else errhandler._name

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Errhandler) and self._name == other._name

    __hash__ = None  # type: ignore[assignment]

    def __bool__(self) -> bool:
        return self._name is not None

    def Free(self) -> None:  # noqa: N802
        self._name = None

    free = Free


def _errhandler(name: str) -> Errhandler:
    e = Errhandler()
    e._name = name
    return e


ERRHANDLER_NULL = Errhandler()
ERRORS_RETURN = _errhandler("ERRORS_RETURN")
ERRORS_ARE_FATAL = _errhandler("ERRORS_ARE_FATAL")
ERRORS_ABORT = _errhandler("ERRORS_ABORT")
