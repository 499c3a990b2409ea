"""``Scan`` and ``Exscan`` with their ``I…`` and persistent forms (an Intracomm's).

They call :mod:`collcomm.core.scan` (recursive doubling in rank order, so a
non-commutative user op is fine). Exscan leaves rank 0's ``recvbuf`` as it was.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..core import collectives as core
from ..core import scan as core_scan
from ..errors import CollcommError
from ._coll import _request, _run
from ._coll_persistent import private_comm
from ._errors import translate
from ._msg import IN_PLACE, pinned, simple
from ._ops import SUM, Op, core_op, pinned_op
from ._prequest import persistent
from ._request import Request, WorkOp
from ._staging import Staged, finisher


class ScanCollectives:
    """Scan and Exscan (an Intracomm's)."""

    __slots__ = ()

    _grp: Callable[..., Any]      # the communicator's group, from Comm

    def _scan(self, sendbuf: Any, recvbuf: Any, op: Any, exclusive: bool, aop: bool, call: str) -> Any:
        g = self._grp(call)
        st: Staged = []
        recv, dt = simple(recvbuf, call, "recvbuf", writable=True, staged=st)
        send = recv if sendbuf is IN_PLACE else simple(sendbuf, call, "sendbuf")[0]
        rop, _ = core_op(op, dt, call, keeps_order=True)
        fn = core_scan.exscan if exclusive else core_scan.scan
        return _run(fn, g, send, recv, rop, dtype=dt._t.core, async_op=aop, name=call,
                    after=finisher(st))

    Scan: Callable[..., None]
    Exscan: Callable[..., None]

    def Iscan(self, sendbuf: Any, recvbuf: Any, op: Any = SUM) -> Request:  # noqa: N802
        if sendbuf is None:            # (mpi4py: None is IN_PLACE)
            sendbuf = IN_PLACE
        return _request(self._scan(sendbuf, recvbuf, op, False, True, "Iscan"))

    def Iexscan(self, sendbuf: Any, recvbuf: Any, op: Any = SUM) -> Request:  # noqa: N802
        if sendbuf is None:            # (mpi4py: None is IN_PLACE)
            sendbuf = IN_PLACE
        return _request(self._scan(sendbuf, recvbuf, op, True, True, "Iexscan"))

    def Scan_init(self, sendbuf: Any, recvbuf: Any, op: Any = SUM, info: Any = None) -> Any:  # noqa: N802
        return self._scan_init(sendbuf, recvbuf, op, False, "Scan_init")

    def Exscan_init(self, sendbuf: Any, recvbuf: Any, op: Any = SUM, info: Any = None) -> Any:  # noqa: N802
        return self._scan_init(sendbuf, recvbuf, op, True, "Exscan_init")

    def _scan_init(self, sendbuf: Any, recvbuf: Any, op: Any, exclusive: bool, call: str) -> Any:
        if sendbuf is None:            # (mpi4py: None is IN_PLACE)
            sendbuf = IN_PLACE
        sendbuf, recvbuf = pinned(sendbuf), pinned(recvbuf)
        op = pinned_op(op)
        c = private_comm(self, call, sendbuf, recvbuf)
        return persistent(lambda: WorkOp(c._scan(sendbuf, recvbuf, op, exclusive, True, call)), c)


def _blocking(exclusive: bool, call: str) -> Callable[..., None]:
    """``Scan`` or ``Exscan``: a small one of numpy arrays with a built-in op in one C call
    (the fast call's ``scan``: the all_gather and fold of collcomm/core/scan.py), in the
    method's own frame (no helper's: ~0.1 µs each); anything it does not take (it answers
    None, nothing done) the general way."""

    def method(self: Any, sendbuf: Any, recvbuf: Any, op: Any = SUM) -> None:
        if sendbuf is None:            # (mpi4py: None is IN_PLACE)
            sendbuf = IN_PLACE
        g = self._h.g
        fast = g.fast if g is not None else None
        o = op._o if type(op) is Op else None
        builtin = o.builtin if o is not None else None
        send = recvbuf if sendbuf is IN_PLACE else sendbuf
        if (fast is not None and builtin is not None and type(recvbuf) is np.ndarray
                and type(send) is np.ndarray):
            try:
                if fast.scan(send, recvbuf, builtin, exclusive, call) is True:
                    return
            except CollcommError as exc:
                raise translate(exc) from exc
        self._scan(sendbuf, recvbuf, op, exclusive, False, call)

    method.__name__, method.__qualname__ = call, f"ScanCollectives.{call}"
    return method


ScanCollectives.Scan = _blocking(False, "Scan")       # type: ignore[method-assign]
ScanCollectives.Exscan = _blocking(True, "Exscan")    # type: ignore[method-assign]
