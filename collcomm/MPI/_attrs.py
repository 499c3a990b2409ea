"""Communicator attributes, info, error handlers and buffered-send buffers (a mixin of
:class:`~collcomm.MPI.Comm`).

``Get_attr`` answers MPI's predefined keys (``TAG_UB`` = 2**31 - 1, ``UNIVERSE_SIZE`` = the
world size, ``APPNUM`` = 0, ``WTIME_IS_GLOBAL`` = 0, ``IO`` = ``ANY_SOURCE``, ``HOST`` =
``PROC_NULL``) and user keys from ``Create_keyval`` (copied to a ``Dup`` by their
``copy_fn``). Error handlers are remembered; errors are always raised (mpi4py's default).
"""
from __future__ import annotations

from typing import Any, Callable

from . import _env
from ._consts import (
    ANY_SOURCE, APPNUM, HOST, IO, LASTUSEDCODE, PROC_NULL, TAG_UB, TAG_UB_VALUE, UNIVERSE_SIZE, WTIME_IS_GLOBAL,
)
from ._errors import ERR_KEYVAL, Exception as MPIException, last_used_code
from ._misc import Errhandler, Info

_KEYVALS: dict[int, tuple[Callable[..., Any] | None, Callable[..., Any] | None]] = {}


class Attributes:
    """Attributes, info, error handlers, buffers."""

    __slots__ = ()
    _grp: Callable[..., Any]
    _h: Any

    # -- attributes, info, error handlers ----------------------------------------------------------
    def Get_attr(self, keyval: int) -> Any:  # noqa: N802
        g = self._grp("Get_attr")
        builtin = {TAG_UB: TAG_UB_VALUE, HOST: PROC_NULL, IO: ANY_SOURCE, WTIME_IS_GLOBAL: 0,
                   UNIVERSE_SIZE: _env.world_group("Get_attr").size, APPNUM: 0,
                   LASTUSEDCODE: last_used_code()}
        if keyval in builtin and keyval not in _KEYVALS:
            return builtin[keyval]
        del g
        return self._h.attrs.get(int(keyval))

    def Set_attr(self, keyval: int, attrval: Any) -> None:  # noqa: N802
        if int(keyval) not in _KEYVALS:
            raise MPIException(ERR_KEYVAL, f"Set_attr: keyval {keyval} was not made by Create_keyval")
        self._h.attrs[int(keyval)] = attrval

    def Delete_attr(self, keyval: int) -> None:  # noqa: N802
        value = self._h.attrs.pop(int(keyval), None)
        delete_fn = _KEYVALS.get(int(keyval), (None, None))[1]
        if delete_fn is not None and value is not None:
            delete_fn(self, keyval, value)

    @classmethod
    def Create_keyval(cls, copy_fn: Callable[..., Any] | None = None,  # noqa: N802
                      delete_fn: Callable[..., Any] | None = None, nopython: bool = False) -> int:
        keyval = 100 + len(_KEYVALS)
        _KEYVALS[keyval] = (copy_fn, delete_fn)
        return keyval

    @classmethod
    def Free_keyval(cls, keyval: int) -> int:  # noqa: N802
        _KEYVALS.pop(int(keyval), None)
        return -1

    def Get_info(self) -> Info:  # noqa: N802
        return Info.Create(self._h.info)

    def Set_info(self, info: Info) -> None:  # noqa: N802
        self._h.info = Info.Create(info)

    info = property(Get_info, Set_info)

    def Get_errhandler(self) -> Errhandler:  # noqa: N802
        return self._h.errhandler

    def Set_errhandler(self, errhandler: Errhandler) -> None:  # noqa: N802
        """Stored; collcomm.MPI always reports errors by raising (mpi4py's default)."""
        self._h.errhandler = errhandler

    def Call_errhandler(self, errorcode: int) -> None:  # noqa: N802
        raise MPIException(int(errorcode), "Call_errhandler")

    @classmethod
    def Create_errhandler(cls, errhandler_fn: Callable[..., Any]) -> Errhandler:  # noqa: N802
        return Errhandler()

    # -- buffered-send buffers (MPI 4.1: per communicator) ---------------------------------------
    def Attach_buffer(self, buf: Any) -> None:  # noqa: N802
        _env.Attach_buffer(buf)

    def Detach_buffer(self) -> Any:  # noqa: N802
        return _env.Detach_buffer()

    def Flush_buffer(self) -> None:  # noqa: N802
        return None

    def Iflush_buffer(self) -> Any:  # noqa: N802
        """A request complete at once (sends are eager: nothing waits in a buffer)."""
        return _env.Iflush_buffer()
