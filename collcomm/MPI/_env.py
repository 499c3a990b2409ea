"""The MPI environment: joining the job, leaving it, clocks, names, memory, buffers.

``MPI.COMM_WORLD`` joins the job on first use (mpi4py joins at import; collcomm waits so
that ``import collcomm`` and ``from collcomm import MPI`` stay cheap): it reads the
launcher's environment through :func:`collcomm.core.runtime.init_process_group` —
``collcomm run``, ``mpiexec`` (Open MPI, MPICH/Hydra), ``srun``, torchrun, or nothing (a
world of one). A world the program already joined through ``collcomm.init_process_group``
is used as it is. ``Init``/``Init_thread`` join at once; ``Finalize`` leaves (the job also
leaves at exit, as with mpi4py); ``Is_initialized`` answers as mpi4py does after import.

When a job of several ranks is joined here, an uncaught exception on any rank ends the
job promptly, as ``python -m mpi4py`` does with ``MPI_Abort``: the traceback is printed
(and reported to ``collcomm run``), then :func:`abort` stops the ranks of this host, removes
the job's rendezvous file if it met in one, and exits with status 1 without the clean
goodbye, so ranks elsewhere see it lost within about a second even when no launcher stops
them (``collcomm run``, ``mpiexec``, ``srun`` do).
"""
from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from typing import Any

import numpy as np

from ..core import runtime
from ..core.group import ProcessGroup
from ._consts import THREAD_MULTIPLE
from ._errors import ERR_OTHER, Exception as MPIException, not_implemented

_lock = threading.Lock()
_state = {"finalized": False, "ours": False}
_attached: list[Any] = []


def world_group(call: str = "COMM_WORLD") -> ProcessGroup:
    """The world group, joining the job first if nobody has."""
    g = runtime._world
    if g is not None and not g._closed:
        return g
    with _lock:
        if _state["finalized"]:
            raise MPIException(ERR_OTHER, f"{call}: MPI.Finalize() was called; the job was left")
        if not runtime.is_initialized():
            runtime.init_process_group()
            _state["ours"] = True
            if runtime.get_world(call).size > 1:
                _install_abort_hook()
        return runtime.get_world(call)


def _install_abort_hook() -> None:
    previous = sys.excepthook

    def abort_on_uncaught(etype: type[BaseException], exc: BaseException, tb: Any) -> None:
        try:
            previous(etype, exc, tb)
        finally:
            abort(1)

    abort_on_uncaught._collcomm_mpi = True  # type: ignore[attr-defined]
    sys.excepthook = abort_on_uncaught


def abort(errorcode: int) -> None:
    """MPI_Abort: end the job now. The ranks of this host that share memory with this one
    get SIGTERM (as mpiexec does on MPI_Abort), then this process exits with
    ``errorcode`` without the clean goodbye; ranks on other hosts see it lost within about
    a second, and every launcher stops the rest."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - exiting anyway
            pass
    job = runtime._job
    # the rendezvous file first: once the others get SIGTERM, the launcher may stop this
    # process too (mpiexec ends the job when a rank dies), before a later step could run
    _remove_rendezvous_file(job)
    channels = getattr(getattr(job, "transport", None), "channels", {}) or {}
    for ch in list(channels.values()):
        pid = getattr(ch, "peer_pid", None)
        if pid and pid != os.getpid():
            try:
                os.kill(pid, signal.SIGTERM)
            except OSError:
                pass
    code = int(errorcode) & 0xFF
    os._exit(code if code else 1)


def _remove_rendezvous_file(job: Any) -> None:
    """The job ends here: remove its rendezvous file (a file store, such as
    ``/tmp/collcomm-rdzv-<job>`` under mpiexec or srun). The last rank to close it would,
    but the other ranks are stopped now without closing it, and this one exits without."""
    from ..rendezvous.file_store import FileStore

    store = getattr(job, "store", None)
    if isinstance(store, FileStore):
        try:
            store.cleanup()
        except Exception:  # noqa: BLE001 - exiting anyway
            pass


# ----------------------------------------------------------------------------- init / finalize
def Init() -> None:  # noqa: N802
    world_group("Init")


def Init_thread(required: int = THREAD_MULTIPLE) -> int:  # noqa: N802
    world_group("Init_thread")
    return THREAD_MULTIPLE


def Finalize() -> None:  # noqa: N802
    with _lock:
        if _state["finalized"]:
            raise MPIException(ERR_OTHER, "Finalize: MPI.Finalize() was already called")
        _state["finalized"] = True
    if runtime.is_initialized():
        runtime.destroy_process_group()


def Is_initialized() -> bool:  # noqa: N802
    """True once the job is joined; like mpi4py after ``from mpi4py import MPI``, asking
    joins it (every rank imports and asks alike)."""
    if _state["finalized"]:
        return True
    world_group("Is_initialized")
    return True


def Is_finalized() -> bool:  # noqa: N802
    return _state["finalized"]


def Query_thread() -> int:  # noqa: N802
    return THREAD_MULTIPLE


def Is_thread_main() -> bool:  # noqa: N802
    return threading.current_thread() is threading.main_thread()


# ----------------------------------------------------------------------------- names and clocks
def Wtime() -> float:  # noqa: N802
    return time.perf_counter()


def Wtick() -> float:  # noqa: N802
    return time.get_clock_info("perf_counter").resolution


def Get_processor_name() -> str:  # noqa: N802
    return socket.gethostname()


def Get_version() -> tuple[int, int]:  # noqa: N802
    return (3, 1)


def get_vendor() -> tuple[str, tuple[int, int, int]]:
    from .. import __version__

    major, minor, patch = (int(x) for x in (__version__.split(".") + ["0", "0"])[:3])
    return ("collcomm", (major, minor, patch))


def Get_library_version() -> str:  # noqa: N802
    name, (a, b, c) = get_vendor()
    return f"{name} {a}.{b}.{c} (mpi4py-compatible front end over shared memory and TCP; MPI {Get_version()[0]}.{Get_version()[1]} subset)"


def Pcontrol(level: int) -> None:  # noqa: N802
    return None


# ----------------------------------------------------------------------------- memory
class buffer(bytearray):  # noqa: N801 - mpi4py's name (MPI.buffer / MPI.memory)
    """Memory from ``Alloc_mem``: a bytearray with ``address`` and ``nbytes``."""

    @staticmethod
    def allocate(nbytes: int, clear: bool = False) -> "buffer":
        return buffer(int(nbytes))

    @property
    def address(self) -> int:
        return int(np.frombuffer(self, dtype=np.uint8).__array_interface__["data"][0]) if len(self) else 0

    @property
    def nbytes(self) -> int:
        return len(self)

    readonly = property(lambda self: False)
    format = property(lambda self: "B")
    itemsize = property(lambda self: 1)
    obj = property(lambda self: None, doc="the object whose memory it is (None: its own)")

    def release(self) -> None:
        return None

    def tobytes(self, order: Any = None) -> bytes:
        return bytes(self)

    def toreadonly(self) -> memoryview:
        """A read-only view of the same memory."""
        return memoryview(self).toreadonly()

    def cast(self, format: str, shape: Any = None) -> memoryview:  # noqa: A002 - mpi4py's name
        """A view of the same memory as ``format`` items (``memoryview.cast``)."""
        view = memoryview(self)
        return view.cast(format) if shape is None else view.cast(format, shape)

    @staticmethod
    def frombuffer(obj: Any, readonly: bool = False) -> Any:
        raise NotImplementedError("MPI.buffer.frombuffer is not implemented by collcomm.MPI: its buffer "
                                  "owns its memory (a bytearray); pass the object itself, or a memoryview "
                                  "or numpy.frombuffer of it, as the buffer")

    @staticmethod
    def fromaddress(address: int, nbytes: int, readonly: bool = False) -> Any:
        raise NotImplementedError("MPI.buffer.fromaddress is not implemented by collcomm.MPI: memory by "
                                  "absolute address (as MPI.BOTTOM) is not supported")


memory = buffer


def Alloc_mem(size: int, info: Any = None) -> buffer:  # noqa: N802
    if int(size) < 0:
        raise MPIException(13, f"Alloc_mem: size must be >= 0, got {size}")
    return buffer(int(size))


def Free_mem(mem: Any) -> None:  # noqa: N802
    return None


def Get_address(location: Any) -> int:  # noqa: N802
    a = np.frombuffer(location, dtype=np.uint8)
    return int(a.__array_interface__["data"][0])


def Aint_add(base: int, disp: int) -> int:  # noqa: N802
    return int(base) + int(disp)


def Aint_diff(addr1: int, addr2: int) -> int:  # noqa: N802
    return int(addr1) - int(addr2)


# ----------------------------------------------------------------------------- buffered sends
def Attach_buffer(buf: Any) -> None:  # noqa: N802
    """Buffered sends (``Bsend``) complete locally anyway (every send is eager), so the
    buffer is only kept for ``Detach_buffer`` to return."""
    _attached[:] = [buf]


def Detach_buffer() -> Any:  # noqa: N802
    return _attached.pop() if _attached else None


def Flush_buffer() -> None:  # noqa: N802
    return None


def Iflush_buffer() -> Any:  # noqa: N802
    from ._request import Done, Request

    r = Request()
    r._op = Done()
    return r


# ----------------------------------------------------------------------------- not here
def _absent(name: str, why: str) -> Any:
    def f(*args: Any, **kwargs: Any) -> Any:
        raise not_implemented(name, why)
    f.__name__ = name
    return f


_DYNAMIC = "dynamic process management is out of scope"
Open_port = _absent("Open_port", _DYNAMIC)
Close_port = _absent("Close_port", _DYNAMIC)
Publish_name = _absent("Publish_name", _DYNAMIC)
Unpublish_name = _absent("Unpublish_name", _DYNAMIC)
Lookup_name = _absent("Lookup_name", _DYNAMIC)
Register_datarep = _absent("Register_datarep", "MPI-IO is out of scope")
