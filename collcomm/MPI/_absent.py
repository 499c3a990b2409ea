"""What collcomm.MPI leaves out, by name: one-sided windows (``Win``), MPI-IO (``File``),
intercommunicators (``Intercomm``), sessions (``Session``) and generalized requests (``Grequest``).

The classes and their null handles exist (``MPI.WIN_NULL``, ``MPI.Intercomm(MPI.COMM_NULL)``
…) so that programs import and compare them; every call that would create or use one
raises ``NotImplementedError`` naming the call — never a silent wrong answer.
"""
from __future__ import annotations

from typing import Any

from ._comm import Comm
from ._env import _absent as _absent_fn
from ._errors import not_implemented
from ._request import Request


class _Absent:
    """Attribute access on an absent feature raises NotImplementedError naming it."""

    _what = ""
    _why = ""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise not_implemented(f"{type(self).__name__}.{name}", self._why)

    def __bool__(self) -> bool:
        return False

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self)

    __hash__ = None  # type: ignore[assignment]


def _absent_classmethod(cls_name: str, name: str, why: str) -> Any:
    def f(cls: Any, *args: Any, **kwargs: Any) -> Any:
        raise not_implemented(f"{cls_name}.{name}", why)
    f.__name__ = name
    return classmethod(f)


_RMA = "one-sided communication (windows) is out of scope"
_IO = "MPI-IO is out of scope"
_SESSION = "MPI sessions are out of scope; use COMM_WORLD"


class Win(_Absent):
    """One-sided communication window (not provided)."""

    _why = _RMA
    Create = _absent_classmethod("Win", "Create", _RMA)
    Allocate = _absent_classmethod("Win", "Allocate", _RMA)
    Allocate_shared = _absent_classmethod("Win", "Allocate_shared", _RMA)
    Create_dynamic = _absent_classmethod("Win", "Create_dynamic", _RMA)


class File(_Absent):
    """MPI-IO file (not provided)."""

    _why = _IO
    Open = _absent_classmethod("File", "Open", _IO)
    Delete = _absent_classmethod("File", "Delete", _IO)


class Session(_Absent):
    """MPI-4 session (not provided)."""

    _why = _SESSION
    Init = _absent_classmethod("Session", "Init", _SESSION)


class Grequest(Request):
    """Generalized request (not provided)."""

    __slots__ = ()
    Start = _absent_classmethod("Grequest", "Start", "generalized requests are out of scope")


_INTER = "intercommunicators are out of scope"


class Intercomm(Comm):
    """Intercommunicator: only its null handle exists (``Comm.Get_parent()`` returns it)."""

    __slots__ = ()

    Create_from_groups = _absent_classmethod("Intercomm", "Create_from_groups", _INTER)

    def _absent(self, *args: Any, **kwargs: Any) -> Any:
        raise not_implemented("Intercomm.Get_remote_group/Get_remote_size/Merge", _INTER)

    Get_remote_group = Get_remote_size = Merge = _absent
    remote_group = remote_size = property(_absent)


WIN_NULL = Win()
FILE_NULL = File()
SESSION_NULL = Session()


def _absent_method(cls_name: str, name: str, why: str) -> Any:
    def f(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise not_implemented(f"{cls_name}.{name}", why)
    f.__name__ = name
    return f


_ULFM = "fault-tolerant MPI (ULFM: agree, shrink, revoke) is out of scope; a lost peer raises PeerLostError"
_PARTITIONED = "partitioned point to point (MPI 4) is out of scope"
for _name in ("Agree", "Iagree", "Shrink", "Ishrink", "Revoke", "Is_revoked", "Ack_failed", "Get_failed"):
    setattr(Comm, _name, _absent_method("Comm", _name, _ULFM))
for _name in ("Psend_init", "Precv_init"):
    setattr(Comm, _name, _absent_method("Comm", _name, _PARTITIONED))


def _absent_on_prequest() -> None:
    from ._group import Group
    from ._prequest import Prequest
    from ._status import Status
    for name in ("Pready", "Pready_list", "Pready_range", "Parrived"):
        setattr(Prequest, name, _absent_method("Prequest", name, _PARTITIONED))
    Status.tomemory = _absent_method("Status", "tomemory",  # type: ignore[attr-defined]
                                     "a status is a Python object here, not MPI_Status memory")
    Group.Create_from_session_pset = _absent_classmethod("Group", "Create_from_session_pset",  # type: ignore[attr-defined]
                                                         _SESSION)


_absent_on_prequest()
_ABI = "collcomm.MPI is no MPI library: it has no ABI and no hardware resource info"
Get_abi_version = _absent_fn("Get_abi_version", _ABI)
Get_abi_info = _absent_fn("Get_abi_info", _ABI)
Get_abi_fortran_info = _absent_fn("Get_abi_fortran_info", _ABI)
Get_hw_resource_info = _absent_fn("Get_hw_resource_info", _ABI)
