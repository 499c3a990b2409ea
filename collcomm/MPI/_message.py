"""``Message``: what ``Mprobe``/``mprobe`` take (MPI's matched probe), received with
``Recv``/``Irecv`` into a buffer or ``recv``/``irecv`` as an object (:mod:`._pobj`'s
object receive, its body asked for by id: a held large message keeps its own).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..core import p2p
from ..errors import CollcommError
from ._consts import ANY_SOURCE, ANY_TAG
from ._errors import ERR_ARG, Exception as MPIException, translate
from ._msg import simple
from ._p2p_ops import TAG_BITS, _Recv, _done_request, _request, Unpacked
from ._pobj import _ObjRecv
from ._request import Request, Status
from ._staging import Receiving


class Message:
    """A message taken by ``Mprobe``/``mprobe``: receive it with ``Recv``/``Irecv`` (into a
    buffer) or ``recv``/``irecv`` (an object). Nothing else can receive it meanwhile."""

    __slots__ = ("_g", "_m", "_noproc")

    def __new__(cls, message: Any = None) -> Any:
        # (made as mpi4py makes its handles, by __new__: a subclass's __new__(cls, message)
        # that passes message on gets the copy; __init__ then does it again)
        self = object.__new__(cls)
        Message.__init__(self, message)
        return self

    def __init__(self, message: "Message | None" = None) -> None:
        self._g = None if message is None else message._g
        self._m = None if message is None else message._m
        self._noproc = False if message is None else message._noproc

    @classmethod
    def _claimed(cls, g: Any, m: Any, status: Status | None) -> "Message":
        msg = cls()
        msg._g, msg._m = g, m
        if status is not None:
            status._set(m.source, m.tag & TAG_BITS, m.nbytes)
        return msg

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Message) and self._m is other._m and self._noproc == other._noproc

    __hash__ = None  # type: ignore[assignment]

    def __bool__(self) -> bool:
        return self._m is not None or self._noproc

    def _take(self, call: str) -> Any:
        if self._noproc:
            self._noproc = False
            return None
        if self._m is None:
            raise MPIException(7, f"Message.{call}: the message is MPI.MESSAGE_NULL (already received?)")
        g, m, self._m = self._g, self._m, None
        return g, m

    # -- integer handles (as _handles.py's: this process's own numbers) -------------------
    def py2f(self) -> int:
        if self._m is None:
            return 1 if self._noproc else 0         # (MESSAGE_NULL, MESSAGE_NO_PROC)
        n = _NUMBERS.get(id(self._m))
        if n is None:
            n = _NUMBERS[id(self._m)] = 2 + len(_MESSAGES)
            _MESSAGES[n] = Message(self)
        return n

    toint = py2f
    handle = property(py2f)

    @classmethod
    def f2py(cls, arg: int) -> "Message":
        n = int(arg)
        if n in (0, 1):
            m = cls()
            m._noproc = n == 1
            return m
        if n not in _MESSAGES:
            raise MPIException(ERR_ARG, f"Message.f2py: {n} is no handle of this process")
        return cls(_MESSAGES[n])

    fromint = fromhandle = f2py

    def free(self) -> None:
        """Does nothing (as mpi4py's: a message is freed by the receive that takes it)."""
        return None

    def Irecv(self, buf: Any) -> Request:  # noqa: N802
        st = Receiving()
        if self._m is not None:   # (checked first: a bad buffer leaves the message claimable)
            arr, _ = simple(buf, "Message.Irecv", "buf", writable=True, staged=st)
        taken = self._take("Irecv")
        if taken is None:
            return _done_request()
        g, m = taken
        try:
            r = _Recv(g, p2p.mrecv(g, m, arr))
        except CollcommError as exc:
            raise translate(exc) from exc
        return _request(r if not st else Unpacked(r, st))

    def Recv(self, buf: Any, status: Status | None = None) -> None:  # noqa: N802
        self.Irecv(buf).Wait(status)

    def irecv(self) -> Request:
        taken = self._take("irecv")
        if taken is None:
            return _done_request()
        g, m = taken
        buf = np.empty(max(m.nbytes, 8), dtype=np.uint8)
        try:
            op = _ObjRecv(g, p2p.mrecv(g, m, buf), buf)
        except CollcommError as exc:
            raise translate(exc) from exc
        if op.first_arrived():          # (a taken message: its body, if any, asked for now)
            op.post_body()
        return _request(op)

    def recv(self, status: Status | None = None) -> Any:
        return self.irecv().wait(status)

    @classmethod
    def Probe(cls, comm: Any, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Status | None = None) -> "Message":  # noqa: N802
        return comm.Mprobe(source, tag, status)

    @classmethod
    def Iprobe(cls, comm: Any, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Status | None = None) -> "Message | None":  # noqa: N802
        return comm.Improbe(source, tag, status)

    probe = Probe
    iprobe = Iprobe


#: the messages numbered by py2f (number -> a copy; id of its claimed message -> number)
_MESSAGES: dict[int, Message] = {}
_NUMBERS: dict[int, int] = {}
MESSAGE_NULL = Message()
MESSAGE_NO_PROC = Message()
MESSAGE_NO_PROC._noproc = True
