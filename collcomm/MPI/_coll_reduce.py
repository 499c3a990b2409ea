"""The reducing buffer collectives with equal blocks: ``Reduce``, ``Allreduce``,
``Reduce_scatter_block``, ``Reduce_scatter`` and their ``I…`` forms (a mixin of
:class:`._coll.BufferCollectives`, which says how each takes the fast call first; what
the general path does is in :mod:`._coll_impl`).
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .. import native as _native
from ..errors import CollcommError
from . import _coll_packed as _packed
from ._coll_impl import _run
from ._errors import translate
from ._msg import IN_PLACE
from ._msg_plain import plain_pair
from ._ops import SUM, Op
from ._request import Request
from ._request_makers import request_of as _request   # Request(WorkOp(work, finish))
from ._request_makers import started as _started   # (the Request of a two-part start, or None)
from ._types import PLAIN

#: spec -> the array it stands for as it is (``[x, MPI.DOUBLE]``: x), else the spec; run on
#: a method's buffers that are not arrays before its fast path (native/_mpi_plain.c)
_plain = PLAIN if PLAIN is not None else (lambda spec, per, writable: spec)


def _plain2_py(sendbuf: Any, recvbuf: Any, send_per: Any, recv_per: Any) -> tuple[Any, Any]:
    """Both buffers through ``_plain`` (the receive buffer as written): what a method runs
    on its buffers before its fast path when one is not an array."""
    return _plain(sendbuf, send_per, False), _plain(recvbuf, recv_per, True)


#: _plain2_py in one C call where the core has it (native/_mpi_plain.c: mpi_plain2)
_plain2: Callable[[Any, Any, Any, Any], tuple[Any, Any]] = (
    getattr(_native.core, "mpi_plain2", None) if PLAIN is not None and _native.core is not None
    else None) or _plain2_py


def _builtin(op: Any) -> Any:
    """The core's op for a built-in MPI op (the fast call's key), else None."""
    if type(op) is not Op:
        return None
    o = op._o
    return o.builtin if o is not None else None


class ReducingCollectives:
    """The reducing collectives (see the module docstring)."""

    __slots__ = ()
    _h: Any
    _reduce: Any
    _allreduce: Any
    _reduce_scatter_block: Any
    _reduce_scatter: Any

    def Reduce(self, sendbuf: Any, recvbuf: Any, op: Any = SUM, root: int = 0) -> None:  # noqa: N802
        if sendbuf is None:            # (mpi4py: None is IN_PLACE)
            sendbuf = IN_PLACE
        g = self._h.g
        fast = g.fast if g is not None else None
        if fast is not None and (type(sendbuf) is not np.ndarray and sendbuf is not None
                                 or type(recvbuf) is not np.ndarray and recvbuf is not None) \
                and _builtin(op) is not None:
            sendbuf, recvbuf = _plain2(sendbuf, recvbuf, 1, 1)   # (specs' arrays)
        builtin = _builtin(op) if fast is not None else None
        if builtin is not None:
            recv = recvbuf if g.rank == root else None
            send = recv if sendbuf is IN_PLACE else sendbuf
            if type(send) is np.ndarray and (recv is None or type(recv) is np.ndarray):
                try:
                    if fast.reduce(send, recv, builtin, root, "Reduce"):
                        return
                except CollcommError as exc:
                    raise translate(exc) from exc
            elif (arrays := plain_pair(sendbuf, recv, "Reduce", reduction=True)) is not None:
                return self.Reduce(arrays[0], arrays[1], op, root)   # (specs of arrays: on the arrays)
        if _builtin(op) is None or not _packed.reduce(self, sendbuf, recvbuf, op, root):
            self._reduce(sendbuf, recvbuf, op, root, False, "Reduce")

    def Ireduce(self, sendbuf: Any, recvbuf: Any, op: Any = SUM, root: int = 0) -> Request:  # noqa: N802
        if sendbuf is None:            # (mpi4py: None is IN_PLACE)
            sendbuf = IN_PLACE
        return self._ireduce(sendbuf, recvbuf, op, root, "Ireduce")

    def _ireduce(self, sendbuf: Any, recvbuf: Any, op: Any, root: int, call: str) -> Request:
        g = self._h.g
        fast = g.fast if g is not None else None
        if fast is not None and (type(sendbuf) is not np.ndarray and sendbuf is not None
                                 or type(recvbuf) is not np.ndarray and recvbuf is not None) \
                and _builtin(op) is not None:
            sendbuf, recvbuf = _plain2(sendbuf, recvbuf, 1, 1)   # (specs' arrays)
        builtin = _builtin(op) if fast is not None else None
        if builtin is not None:
            recv = recvbuf if g.rank == root else None
            send = recv if sendbuf is IN_PLACE else sendbuf
            if type(send) is np.ndarray and (recv is None or type(recv) is np.ndarray):
                started = _started(fast.reduce_async, send, recv, builtin, root, call)
                if started is not None:
                    return started
            elif (arrays := plain_pair(sendbuf, recv, call, reduction=True)) is not None:
                return self._ireduce(arrays[0], arrays[1], op, root, call)
        return _request(self._reduce(sendbuf, recvbuf, op, root, True, call))

    def Allreduce(self, sendbuf: Any, recvbuf: Any, op: Any = SUM) -> None:  # noqa: N802
        if sendbuf is None:            # (mpi4py: None is IN_PLACE)
            sendbuf = IN_PLACE
        g = self._h.g
        fast = g.fast if g is not None else None
        op_key = _builtin(op) if fast is not None else None
        if op_key is not None and (type(sendbuf) is not np.ndarray and sendbuf is not None
                                   or type(recvbuf) is not np.ndarray and recvbuf is not None):
            sendbuf, recvbuf = _plain2(sendbuf, recvbuf, 1, 1)   # (specs' arrays)
        if op_key is not None and type(recvbuf) is np.ndarray:
            send = recvbuf if sendbuf is IN_PLACE else sendbuf
            try:
                if fast.all_reduce(send, recvbuf, op_key, "Allreduce"):
                    return
            except CollcommError as exc:
                raise translate(exc) from exc
        elif op_key is not None and \
                (arrays := plain_pair(sendbuf, recvbuf, "Allreduce", reduction=True)) is not None:
            return self.Allreduce(arrays[0], arrays[1], op)     # (specs of arrays: on the arrays)
        if _builtin(op) is None or not _packed.allreduce(self, sendbuf, recvbuf, op):
            self._allreduce(sendbuf, recvbuf, op, False, "Allreduce")

    def Iallreduce(self, sendbuf: Any, recvbuf: Any, op: Any = SUM) -> Request:  # noqa: N802
        if sendbuf is None:            # (mpi4py: None is IN_PLACE)
            sendbuf = IN_PLACE
        return self._iallreduce(sendbuf, recvbuf, op, "Iallreduce")

    def _iallreduce(self, sendbuf: Any, recvbuf: Any, op: Any, call: str) -> Request:
        g = self._h.g
        fast = g.fast if g is not None else None
        if fast is not None and (type(sendbuf) is not np.ndarray and sendbuf is not None
                                 or type(recvbuf) is not np.ndarray and recvbuf is not None) \
                and _builtin(op) is not None:
            sendbuf, recvbuf = _plain2(sendbuf, recvbuf, 1, 1)   # (specs' arrays)
        builtin = _builtin(op) if fast is not None and type(recvbuf) is np.ndarray else None
        if builtin is not None:
            send = recvbuf if sendbuf is IN_PLACE else sendbuf
            started = _started(fast.all_reduce_async, send, recvbuf, builtin, call)
            if started is not None:
                return started
        elif fast is not None and _builtin(op) is not None and \
                (arrays := plain_pair(sendbuf, recvbuf, call, reduction=True)) is not None:
            return self._iallreduce(arrays[0], arrays[1], op, call)
        return _request(self._allreduce(sendbuf, recvbuf, op, True, call))

    def Reduce_scatter_block(self, sendbuf: Any, recvbuf: Any, op: Any = SUM) -> None:  # noqa: N802
        if sendbuf is None:            # (mpi4py: None is IN_PLACE)
            sendbuf = IN_PLACE
        g = self._h.g
        fast = g.fast if g is not None else None
        if fast is not None and (type(sendbuf) is not np.ndarray and sendbuf is not None
                                 or type(recvbuf) is not np.ndarray and recvbuf is not None) \
                and _builtin(op) is not None:
            # (specs' arrays; with IN_PLACE the receive buffer holds the n blocks)
            sendbuf, recvbuf = _plain2(sendbuf, recvbuf, g.size, g.size if sendbuf is IN_PLACE else 1)
        builtin = _builtin(op) if fast is not None else None
        if builtin is not None and type(sendbuf) is np.ndarray and type(recvbuf) is np.ndarray:
            try:
                if fast.reduce_scatter(sendbuf, recvbuf, builtin, "Reduce_scatter_block"):
                    return
            except CollcommError as exc:
                raise translate(exc) from exc
        elif builtin is not None and sendbuf is not IN_PLACE and \
                (arrays := plain_pair(sendbuf, recvbuf, "Reduce_scatter_block", g.size, 0, reduction=True)) is not None:
            return self.Reduce_scatter_block(arrays[0], arrays[1], op)
        self._reduce_scatter_block(sendbuf, recvbuf, op, False, "Reduce_scatter_block")

    def Ireduce_scatter_block(self, sendbuf: Any, recvbuf: Any, op: Any = SUM) -> Request:  # noqa: N802
        if sendbuf is None:            # (mpi4py: None is IN_PLACE)
            sendbuf = IN_PLACE
        return self._ireduce_scatter_block(sendbuf, recvbuf, op, "Ireduce_scatter_block")

    def _ireduce_scatter_block(self, sendbuf: Any, recvbuf: Any, op: Any, call: str) -> Request:
        g = self._h.g
        fast = g.fast if g is not None else None
        if fast is not None and (type(sendbuf) is not np.ndarray and sendbuf is not None
                                 or type(recvbuf) is not np.ndarray and recvbuf is not None) \
                and _builtin(op) is not None:
            # (specs' arrays; with IN_PLACE the receive buffer holds the n blocks)
            sendbuf, recvbuf = _plain2(sendbuf, recvbuf, g.size, g.size if sendbuf is IN_PLACE else 1)
        builtin = _builtin(op) if fast is not None else None
        if builtin is not None and type(sendbuf) is np.ndarray and type(recvbuf) is np.ndarray:
            started = _started(fast.reduce_scatter_async, sendbuf, recvbuf, builtin, call)
            if started is not None:
                return started
        elif builtin is not None and sendbuf is not IN_PLACE and \
                (arrays := plain_pair(sendbuf, recvbuf, call, g.size, 0, reduction=True)) is not None:
            return self._ireduce_scatter_block(arrays[0], arrays[1], op, call)
        return _request(self._reduce_scatter_block(sendbuf, recvbuf, op, True, call))

    def Reduce_scatter(self, sendbuf: Any, recvbuf: Any, recvcounts: Any = None, op: Any = SUM) -> None:  # noqa: N802
        if sendbuf is None:            # (mpi4py: None is IN_PLACE)
            sendbuf = IN_PLACE
        if self._equal_counts(sendbuf, recvbuf, recvcounts, op, False, "Reduce_scatter") is None:
            self._reduce_scatter(sendbuf, recvbuf, recvcounts, op, False, "Reduce_scatter")

    def Ireduce_scatter(self, sendbuf: Any, recvbuf: Any, recvcounts: Any = None, op: Any = SUM) -> Request:  # noqa: N802
        if sendbuf is None:            # (mpi4py: None is IN_PLACE)
            sendbuf = IN_PLACE
        return self._ireduce_scatter(sendbuf, recvbuf, recvcounts, op, "Ireduce_scatter")

    def _ireduce_scatter(self, sendbuf: Any, recvbuf: Any, recvcounts: Any, op: Any, call: str) -> Request:
        work = self._equal_counts(sendbuf, recvbuf, recvcounts, op, True, call)
        return _request(self._reduce_scatter(sendbuf, recvbuf, recvcounts, op, True, call) if work is None
                        else work)

    def _equal_counts(self, sendbuf: Any, recvbuf: Any, recvcounts: Any, op: Any, aop: bool,
                      call: str) -> Any:
        """Reduce_scatter with n equal ``recvcounts`` (ints, in a list or tuple) of numpy
        arrays and a built-in op through the fast call, as the regular path puts it (a
        reduce_scatter of sendbuf, exactly n x count elements, into the first count of
        recvbuf; other sizes go the regular way, which says what is wrong):
        True (done) or, with ``aop``, the started call's Work; None having done nothing."""
        g = self._h.g
        fast = g.fast if g is not None else None
        builtin = _builtin(op) if fast is not None else None
        kind = type(recvcounts)
        if builtin is None or (kind is not list and kind is not tuple) or len(recvcounts) != g.size \
                or type(sendbuf) is not np.ndarray or type(recvbuf) is not np.ndarray:
            return None
        c = recvcounts[0] if recvcounts else 0
        if type(c) is not int or recvcounts.count(c) != g.size or sendbuf.size != c * g.size \
                or recvbuf.size < c or not recvbuf.flags.c_contiguous:
            return None
        recv = recvbuf if recvbuf.size == c else recvbuf.reshape(-1)[:c]
        if aop:
            return _run(fast.reduce_scatter_async, sendbuf, recv, builtin, call)
        return _run(fast.reduce_scatter, sendbuf, recv, builtin, call)
