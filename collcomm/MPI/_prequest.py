"""``Prequest``: a persistent request (``Send_init``, ``Recv_init``, ``Bcast_init`` …).

It holds the function that begins its operation (:func:`persistent` makes one, inactive);
``Start()`` calls it for a new operation, and completing the operation (``Wait``, a
successful ``Test``, :class:`~._request.Request`'s class methods) leaves the request
inactive instead of null, until the next ``Start()``; ``Free()`` makes it null.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

from ._errors import ERR_REQUEST, Exception as MPIException
from ._request import Request


class _Persistent:
    __slots__ = ("start",)

    def __init__(self, start: Callable[[], Any]) -> None:
        self.start = start


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
        super().Free()            # (an active receive of a derived type is still unpacked)
        self._persist = None

    free = Free


def persistent(start: Callable[[], Any]) -> Prequest:
    """An inactive Prequest whose Start() calls ``start()`` for a new operation."""
    p = Prequest()
    p._persist = _Persistent(start)
    return p
