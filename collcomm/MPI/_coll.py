"""Buffer collectives with equal blocks: ``Bcast``, ``Gather``, ``Scatter``, ``Allgather``,
``Alltoall``, ``Reduce``, ``Allreduce``, ``Reduce_scatter_block``, ``Reduce_scatter``,
``Barrier``; each also as ``I…`` (a :class:`Request`); the ``…_init`` (persistent) forms
are in :mod:`._coll_persistent`.

The public methods are here (the reducing ones in :mod:`._coll_reduce`); what each does
(buffer specs, ``IN_PLACE``, block specs,
unequal ``recvcounts``, non-commutative user ops) is in :mod:`._coll_impl`, whose
:class:`~._coll_impl.BufferCollectivesImpl` :class:`BufferCollectives` extends.

``Barrier``, ``Bcast``, ``Gather``, ``Scatter``, ``Allgather``, ``Alltoall``, ``Reduce``,
``Allreduce`` and ``Reduce_scatter_block`` on numpy arrays (and built-in ops) first offer
the call to the group's fast call (:mod:`collcomm.core.fastpath`): one C call that either
does all of it or nothing, in which case the method goes on as :mod:`._coll_impl` says;
so do their ``I…`` forms (and the persistent forms, which start as their ``I…`` form:
:mod:`._coll_persistent`), through the fast call's entries in two parts; so does
``Reduce_scatter`` (and ``Ireduce_scatter``) with equal ``recvcounts``.
With a derived datatype with gaps the blocking forms pack and call themselves on the
arrays (:mod:`._coll_packed`). A buffer spec that stands for an array (``[x, MPI.DOUBLE]``,
``[x, count, dt]``...) is given to the fast call as that array (:mod:`._msg_plain`).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import CollcommError
from . import _coll_packed as _packed
from ._coll_impl import BufferCollectivesImpl
from ._coll_reduce import ReducingCollectives, _builtin, _plain, _plain2  # noqa: F401 - (_builtin: read by _collv)
from ._coll_impl import _not_root_in_place, _run  # (_not_root_in_place: read by _collv)
from ._errors import translate
from ._msg import IN_PLACE
from ._msg_plain import plain_pair
from ._types import PLAIN
from ._request import Request
from ._request_makers import request_of as _request   # Request(WorkOp(work, finish))
from ._request_makers import started as _started   # (the Request of a two-part start, or None)


class BufferCollectives(ReducingCollectives, BufferCollectivesImpl):
    """The equal-block buffer collectives of a communicator (``self._grp(call)`` gives its group)."""

    __slots__ = ()

    # -- the public methods ------------------------------------------------------------------------
    def Barrier(self) -> None:  # noqa: N802
        g = self._h.g
        fast = g.fast if g is not None else None
        if fast is not None:
            try:
                if fast.barrier("Barrier"):
                    return
            except CollcommError as exc:
                raise translate(exc) from exc
        self._barrier(False, "Barrier")

    def Ibarrier(self) -> Request:  # noqa: N802
        return self._ibarrier("Ibarrier")

    def _ibarrier(self, call: str) -> Request:
        g = self._h.g
        fast = g.fast if g is not None else None
        if fast is not None:
            started = _started(fast.barrier_async, call)
            if started is not None:
                return started
        return _request(self._barrier(True, call))

    def Bcast(self, buf: Any, root: int = 0) -> None:  # noqa: N802
        g = self._h.g
        fast = g.fast if g is not None else None
        if fast is not None and type(buf) is not np.ndarray:   # (a spec of an array: the array)
            buf = _plain(buf, 1, g.rank != root)
        if fast is not None and type(buf) is np.ndarray:
            try:
                if fast.broadcast(buf, root, "Bcast"):
                    return
            except CollcommError as exc:
                raise translate(exc) from exc
        elif fast is not None and (arrays := plain_pair(buf, None, "Bcast", 0, 0, g.rank != root)) is not None:
            return self.Bcast(arrays[0], root)     # (a spec of an array: the call on the array)
        if not _packed.bcast(self, buf, root):
            self._bcast(buf, root, False, "Bcast")

    def Ibcast(self, buf: Any, root: int = 0) -> Request:  # noqa: N802
        return self._ibcast(buf, root, "Ibcast")

    def _ibcast(self, buf: Any, root: int, call: str) -> Request:
        g = self._h.g
        fast = g.fast if g is not None else None
        if fast is not None and type(buf) is not np.ndarray:   # (a spec of an array: the array)
            buf = _plain(buf, 1, g.rank != root)
        if fast is not None and type(buf) is np.ndarray:
            started = _started(fast.broadcast_async, buf, root, call)
            if started is not None:
                return started
        elif fast is not None and (arrays := plain_pair(buf, None, call, 0, 0, g.rank != root)) is not None:
            return self._ibcast(arrays[0], root, call)
        return _request(self._bcast(buf, root, True, call))

    def Gather(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> None:  # noqa: N802
        if sendbuf is None:            # (mpi4py: None is IN_PLACE)
            sendbuf = IN_PLACE
        g = self._h.g
        fast = g.fast if g is not None else None
        if fast is not None and (type(sendbuf) is not np.ndarray and sendbuf is not None
                                 or type(recvbuf) is not np.ndarray and recvbuf is not None):
            sendbuf, recvbuf = _plain2(sendbuf, recvbuf, 1, g.size)   # (specs' arrays)
        if fast is not None and type(sendbuf) is np.ndarray:
            recv = recvbuf if g.rank == root else None
            if recv is None or type(recv) is np.ndarray:
                try:
                    if fast.gather(sendbuf, recv, root, "Gather"):
                        return
                except CollcommError as exc:
                    raise translate(exc) from exc
        if fast is not None and (arrays := plain_pair(sendbuf, recvbuf if g.rank == root else None, "Gather",
                                                       0, g.size)) is not None:
            return self.Gather(arrays[0], arrays[1], root)   # (specs of arrays: the call on the arrays)
        if not _packed.gather(self, sendbuf, recvbuf, root):
            self._gather(sendbuf, recvbuf, root, False, "Gather")

    def Igather(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> Request:  # noqa: N802
        if sendbuf is None:            # (mpi4py: None is IN_PLACE)
            sendbuf = IN_PLACE
        return self._igather(sendbuf, recvbuf, root, "Igather")

    def _igather(self, sendbuf: Any, recvbuf: Any, root: int, call: str) -> Request:
        g = self._h.g
        fast = g.fast if g is not None else None
        if fast is not None and (type(sendbuf) is not np.ndarray and sendbuf is not None
                                 or type(recvbuf) is not np.ndarray and recvbuf is not None):
            sendbuf, recvbuf = _plain2(sendbuf, recvbuf, 1, g.size)   # (specs' arrays)
        if fast is not None and type(sendbuf) is np.ndarray:
            recv = recvbuf if g.rank == root else None
            if recv is None or type(recv) is np.ndarray:
                started = _started(fast.gather_async, sendbuf, recv, root, call)
                if started is not None:
                    return started
        if fast is not None and (arrays := plain_pair(sendbuf, recvbuf if g.rank == root else None, call,
                                                       0, g.size)) is not None:
            return self._igather(arrays[0], arrays[1], root, call)
        return _request(self._gather(sendbuf, recvbuf, root, True, call))

    def Scatter(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> None:  # noqa: N802
        if recvbuf is None:            # (mpi4py: None is IN_PLACE)
            recvbuf = IN_PLACE
        g = self._h.g
        fast = g.fast if g is not None else None
        if fast is not None and (type(sendbuf) is not np.ndarray and sendbuf is not None
                                 or type(recvbuf) is not np.ndarray and recvbuf is not None):
            sendbuf, recvbuf = _plain2(sendbuf, recvbuf, g.size, 1)   # (specs' arrays)
        if fast is not None and type(recvbuf) is np.ndarray:
            send = sendbuf if g.rank == root else None
            if send is None or type(send) is np.ndarray:
                try:
                    if fast.scatter(send, recvbuf, root, "Scatter"):
                        return
                except CollcommError as exc:
                    raise translate(exc) from exc
        if fast is not None and (arrays := plain_pair(sendbuf if g.rank == root else None, recvbuf, "Scatter",
                                                       g.size, 0)) is not None:
            return self.Scatter(arrays[0], arrays[1], root)
        if not _packed.scatter(self, sendbuf, recvbuf, root):
            self._scatter(sendbuf, recvbuf, root, False, "Scatter")

    def Iscatter(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> Request:  # noqa: N802
        if recvbuf is None:            # (mpi4py: None is IN_PLACE)
            recvbuf = IN_PLACE
        return self._iscatter(sendbuf, recvbuf, root, "Iscatter")

    def _iscatter(self, sendbuf: Any, recvbuf: Any, root: int, call: str) -> Request:
        g = self._h.g
        fast = g.fast if g is not None else None
        if fast is not None and (type(sendbuf) is not np.ndarray and sendbuf is not None
                                 or type(recvbuf) is not np.ndarray and recvbuf is not None):
            sendbuf, recvbuf = _plain2(sendbuf, recvbuf, g.size, 1)   # (specs' arrays)
        if fast is not None and type(recvbuf) is np.ndarray:
            send = sendbuf if g.rank == root else None
            if send is None or type(send) is np.ndarray:
                started = _started(fast.scatter_async, send, recvbuf, root, call)
                if started is not None:
                    return started
        if fast is not None and (arrays := plain_pair(sendbuf if g.rank == root else None, recvbuf, call,
                                                       g.size, 0)) is not None:
            return self._iscatter(arrays[0], arrays[1], root, call)
        return _request(self._scatter(sendbuf, recvbuf, root, True, call))

    def Allgather(self, sendbuf: Any, recvbuf: Any) -> None:  # noqa: N802
        if sendbuf is None:            # (mpi4py: None is IN_PLACE)
            sendbuf = IN_PLACE
        g = self._h.g
        fast = g.fast if g is not None else None
        if fast is not None and (type(sendbuf) is not np.ndarray and sendbuf is not None
                                 or type(recvbuf) is not np.ndarray and recvbuf is not None):
            sendbuf, recvbuf = _plain2(sendbuf, recvbuf, 1, g.size)   # (specs' arrays)
        if fast is not None and type(sendbuf) is np.ndarray and type(recvbuf) is np.ndarray:
            try:
                if fast.all_gather(sendbuf, recvbuf, "Allgather"):
                    return
            except CollcommError as exc:
                raise translate(exc) from exc
        elif fast is not None and sendbuf is not IN_PLACE and \
                (arrays := plain_pair(sendbuf, recvbuf, "Allgather", 0, g.size)) is not None:
            return self.Allgather(arrays[0], arrays[1])
        if not _packed.allgather(self, sendbuf, recvbuf):
            self._allgather(sendbuf, recvbuf, False, "Allgather")

    def Iallgather(self, sendbuf: Any, recvbuf: Any) -> Request:  # noqa: N802
        if sendbuf is None:            # (mpi4py: None is IN_PLACE)
            sendbuf = IN_PLACE
        return self._iallgather(sendbuf, recvbuf, "Iallgather")

    def _iallgather(self, sendbuf: Any, recvbuf: Any, call: str) -> Request:
        g = self._h.g
        fast = g.fast if g is not None else None
        if fast is not None and (type(sendbuf) is not np.ndarray and sendbuf is not None
                                 or type(recvbuf) is not np.ndarray and recvbuf is not None):
            sendbuf, recvbuf = _plain2(sendbuf, recvbuf, 1, g.size)   # (specs' arrays)
        if fast is not None and type(sendbuf) is np.ndarray and type(recvbuf) is np.ndarray:
            started = _started(fast.all_gather_async, sendbuf, recvbuf, call)
            if started is not None:
                return started
        elif fast is not None and sendbuf is not IN_PLACE and \
                (arrays := plain_pair(sendbuf, recvbuf, call, 0, g.size)) is not None:
            return self._iallgather(arrays[0], arrays[1], call)
        return _request(self._allgather(sendbuf, recvbuf, True, call))

    def Alltoall(self, sendbuf: Any, recvbuf: Any) -> None:  # noqa: N802
        if sendbuf is None:            # (mpi4py: None is IN_PLACE)
            sendbuf = IN_PLACE
        g = self._h.g
        fast = g.fast if g is not None else None
        if fast is not None and (type(sendbuf) is not np.ndarray and sendbuf is not None
                                 or type(recvbuf) is not np.ndarray and recvbuf is not None):
            sendbuf, recvbuf = _plain2(sendbuf, recvbuf, g.size, g.size)   # (specs' arrays)
        if fast is not None and type(sendbuf) is np.ndarray and type(recvbuf) is np.ndarray:
            try:
                if fast.all_to_all(sendbuf, recvbuf, "Alltoall"):
                    return
            except CollcommError as exc:
                raise translate(exc) from exc
        elif fast is not None and sendbuf is not IN_PLACE and \
                (arrays := plain_pair(sendbuf, recvbuf, "Alltoall", g.size, g.size)) is not None:
            return self.Alltoall(arrays[0], arrays[1])
        if not _packed.alltoall(self, sendbuf, recvbuf):
            self._alltoall(sendbuf, recvbuf, False, "Alltoall")

    def Ialltoall(self, sendbuf: Any, recvbuf: Any) -> Request:  # noqa: N802
        if sendbuf is None:            # (mpi4py: None is IN_PLACE)
            sendbuf = IN_PLACE
        return self._ialltoall(sendbuf, recvbuf, "Ialltoall")

    def _ialltoall(self, sendbuf: Any, recvbuf: Any, call: str) -> Request:
        g = self._h.g
        fast = g.fast if g is not None else None
        if fast is not None and (type(sendbuf) is not np.ndarray and sendbuf is not None
                                 or type(recvbuf) is not np.ndarray and recvbuf is not None):
            sendbuf, recvbuf = _plain2(sendbuf, recvbuf, g.size, g.size)   # (specs' arrays)
        if fast is not None and type(sendbuf) is np.ndarray and type(recvbuf) is np.ndarray:
            started = _started(fast.all_to_all_async, sendbuf, recvbuf, call)
            if started is not None:
                return started
        elif fast is not None and sendbuf is not IN_PLACE and \
                (arrays := plain_pair(sendbuf, recvbuf, call, g.size, g.size)) is not None:
            return self._ialltoall(arrays[0], arrays[1], call)
        return _request(self._alltoall(sendbuf, recvbuf, True, call))
