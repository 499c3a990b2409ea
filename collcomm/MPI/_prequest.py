"""``Prequest``: a persistent request (``Send_init``, ``Recv_init``, ``Bcast_init`` …).

It holds the function that begins its operation (:func:`persistent` makes one, inactive);
``Start()`` calls it for a new operation, and completing the operation (``Wait``, a
successful ``Test``, :class:`~._request.Request`'s class methods) leaves the request
inactive instead of null, until the next ``Start()``; ``Free()`` makes it null (and frees
a persistent collective's own communicator, :func:`._coll_persistent.private_comm`).
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

from ._errors import ERR_REQUEST, Exception as MPIException
from ._request import Request


class _Persistent:
    __slots__ = ("start", "comm")

    def __init__(self, start: Callable[[], Any], comm: Any = None) -> None:
        self.start = start
        self.comm = comm        # a persistent collective's own communicator (freed with it)


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
        if self._persist is None:
            raise MPIException(ERR_REQUEST, "Prequest.Start: the request was freed")
        if self._op is not None:
            raise MPIException(ERR_REQUEST, "Prequest.Start: the request is still active; "
                                            "complete it (Wait/Test) before starting it again")
        self._op = self._persist.start()

    start = Start

    @classmethod
    def Startall(cls, requests: Sequence["Prequest"]) -> None:  # noqa: N802
        for r in requests:
            r.Start()

    startall = Startall

    def Free(self) -> None:  # noqa: N802
        persist = self._persist
        comm = persist.comm if persist is not None else None
        if comm is not None and self._op is not None and not self._op.test():
            raise MPIException(ERR_REQUEST, "Prequest.Free: the persistent collective is still active; "
                                            "complete it (Wait/Test) before freeing it")
        super().Free()            # (an active receive of a derived type is still unpacked)
        self._persist = None
        if comm is not None:
            comm.Free()

    free = Free


def persistent(start: Callable[[], Any], comm: Any = None) -> Prequest:
    """An inactive Prequest whose Start() calls ``start()`` for a new operation; ``comm``:
    the communicator it runs on if its own (freed by Free())."""
    p = Prequest()
    p._persist = _Persistent(start, comm)
    return p
