"""``Prequest``: a persistent request (``Send_init``, ``Recv_init``, ``Bcast_init`` …).

It holds the function that begins its operation (:func:`persistent` makes one, inactive);
``Start()`` calls it for a new operation, and completing the operation (``Wait``, a
successful ``Test``, :class:`~._request.Request`'s class methods) leaves the request
inactive instead of null, until the next ``Start()``; ``Free()`` makes it null (and frees
a persistent collective's own communicator, :func:`._coll_persistent.private_comm`).
"""
from __future__ import annotations

import sys
from typing import Any, Callable, Sequence

from ._errors import ERR_REQUEST, Exception as MPIException
from ._request import Request
from ._request_makers import workop_started


def quick_call(fn: Any) -> Any:
    """A quick start made: ``fn()``, or for a tuple ``(entry, *args)`` (a persistent
    collective's, :class:`._coll_persistent._Prepared`) ``workop_started(entry, *args)``."""
    if type(fn) is tuple:
        return workop_started(*fn)
    return fn()


class _Persistent:
    """What the copies of one persistent request share: how to start it, and a persistent
    collective's own communicator (freed by Free(), or when the last copy is dropped
    while the request is inactive: :meth:`__del__`). ``quick``: a one-item list shared
    with ``start`` (a persistent collective's ``_Prepared``), whose item, once set, starts
    the call in C without a Python frame (None: it declined; ``start`` then runs)."""

    __slots__ = ("start", "comm", "quick")

    def __init__(self, start: Callable[[], Any] | None, comm: Any = None) -> None:
        self.start = start
        self.comm = comm
        self.quick: list[Any] | None = getattr(start, "quick", None)

    def free(self) -> None:
        comm, self.comm, self.start, self.quick = self.comm, None, None, None
        if comm is not None:
            comm.Free()

    def __del__(self) -> None:
        # dropped without Free(): free the communicator unless a started call is still
        # queued or running there (an active request: freeing it is erroneous in MPI)
        comm = self.comm
        g = getattr(getattr(comm, "_h", None), "g", None)
        if g is None or sys.is_finalizing():     # (at exit the job is being left anyway)
            return
        calls = g.async_calls
        lock = calls.exec_lock
        try:
            if calls.queued() or not lock.acquire(blocking=False):
                return
            try:
                self.free()
            finally:
                lock.release()
        except Exception:  # noqa: BLE001 - (interpreter shutdown; the job already gone)
            pass


class Prequest(Request):
    """A persistent request (``Send_init``, ``Recv_init``, ``Bcast_init`` …): ``Start()``
    begins the operation again; completing it leaves the request inactive, not null."""

    __slots__ = ("_persist",)

    def __init__(self, request: "Request | None" = None) -> None:
        super().__init__(request)
        self._persist: _Persistent | None = getattr(request, "_persist", None)

    def _key(self) -> Any:
        return self._persist

    def _completed(self) -> None:
        self._op = None          # inactive; Start() makes it active again

    def Start(self) -> None:  # noqa: N802
        if self._persist is None or self._persist.start is None:
            raise MPIException(ERR_REQUEST, "Prequest.Start: the request was freed")
        if self._op is not None:
            raise MPIException(ERR_REQUEST, "Prequest.Start: the request is still active; "
                                            "complete it (Wait/Test) before starting it again")
        quick = self._persist.quick
        if quick is not None and (fn := quick[0]) is not None and (op := quick_call(fn)) is not None:
            self._op = op
            return
        self._op = self._persist.start()

    start = Start

    @classmethod
    def Startall(cls, requests: Sequence["Prequest"]) -> None:  # noqa: N802
        for r in requests:         # (Start's quick way inline, else Start itself)
            p = r._persist
            if (r._op is None and p is not None and p.start is not None and (quick := p.quick) is not None
                    and (fn := quick[0]) is not None and (op := quick_call(fn)) is not None):
                r._op = op
            else:
                r.Start()

    startall = Startall

    def Free(self) -> None:  # noqa: N802
        persist = self._persist
        if persist is not None and persist.comm is not None and self._op is not None:
            try:
                active = not self._op.test()
            except Exception:  # noqa: BLE001 - it ended with an error: inactive, freed
                active = False
            if active:
                raise MPIException(ERR_REQUEST, "Prequest.Free: the persistent collective is still "
                                                "active; complete it (Wait/Test) before freeing it")
        super().Free()            # (an active receive of a derived type is still unpacked)
        self._persist = None
        if persist is not None:
            persist.free()

    free = Free


def _native_waits() -> bool:
    """Let the native waits and tests (native/_mpi_wait.c) complete Prequests as they do
    Requests (``_completed`` leaves ``_op`` None in both); False without the core."""
    from .. import native
    from . import _request_makers  # noqa: F401 - (registers Request with the core first)

    register = getattr(native.core, "mpi_wait_types", None) if native.core is not None else None
    return bool(register is not None and register(Prequest))


#: whether the native waits and tests take Prequests too
NATIVE_WAITS = _native_waits()


def _native_start() -> bool:
    """``Prequest.Start`` (and ``start``) made the native core's (native/_mpi_prequest.c:
    the same steps without a Python frame on the common way, this class's method for the
    rest), and ``Startall`` (``startall``) a C loop over them; False without the core."""
    from .. import native

    make = getattr(native.core, "mpi_prequest_start", None) if native.core is not None else None
    descr = make(Prequest, _Persistent, Prequest.Start) if make is not None else None
    if descr is None:
        return False
    Prequest.Start = Prequest.start = descr   # type: ignore[method-assign]
    startall = getattr(native.core, "mpi_prequest_startall", None)
    if startall is not None:    # (each Start in order, the C one for a Prequest: _mpi_pstart.c)
        Prequest.Startall = Prequest.startall = classmethod(startall)   # type: ignore[method-assign,assignment]
    return True


#: the Python Start and Startall (the C ones, where installed, fall back to the first; the
#: tests run both ways)
PY_START, PY_STARTALL = Prequest.Start, Prequest.Startall

#: whether Prequest.Start is the native core's
NATIVE_START = _native_start()


def persistent(start: Callable[[], Any], comm: Any = None) -> Prequest:
    """An inactive Prequest whose Start() calls ``start()`` for a new operation; ``comm``:
    the communicator it runs on if its own (freed by Free())."""
    p = Prequest()
    p._persist = _Persistent(start, comm)
    return p
