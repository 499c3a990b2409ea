"""Persistent buffer collectives (MPI 4): ``Barrier_init``, ``Bcast_init``, ``Gather_init``,
``Scatter_init``, ``Allgather_init``, ``Alltoall_init``, ``Reduce_init``, ``Allreduce_init``,
``Reduce_scatter_block_init``, ``Reduce_scatter_init``.

Each returns a persistent request (:func:`._prequest.persistent`) whose ``Start()`` runs the
call again as its ``I…`` form would, through the same implementation of
:class:`._coll.BufferCollectives` (the buffers and arguments given here, read anew at each
start); ``info`` is accepted and ignored.
"""
from __future__ import annotations

from typing import Any

from ._coll import BufferCollectives
from ._msg import pinned
from ._ops import SUM, pinned_op
from ._prequest import persistent
from ._request import WorkOp


class PersistentCollectives(BufferCollectives):
    """The ``…_init`` forms of the equal-block buffer collectives."""

    __slots__ = ()

    def Barrier_init(self, info: Any = None) -> Any:  # noqa: N802
        return persistent(lambda: WorkOp(self._barrier(True, "Barrier_init")))

    def Bcast_init(self, buf: Any, root: int = 0, info: Any = None) -> Any:  # noqa: N802
        buf = pinned(buf)
        return persistent(lambda: WorkOp(self._bcast(buf, root, True, "Bcast_init")))

    def Gather_init(self, sendbuf: Any, recvbuf: Any, root: int = 0, info: Any = None) -> Any:  # noqa: N802
        sendbuf, recvbuf = pinned(sendbuf), pinned(recvbuf)
        return persistent(lambda: WorkOp(self._gather(sendbuf, recvbuf, root, True, "Gather_init")))

    def Scatter_init(self, sendbuf: Any, recvbuf: Any, root: int = 0, info: Any = None) -> Any:  # noqa: N802
        sendbuf, recvbuf = pinned(sendbuf), pinned(recvbuf)
        return persistent(lambda: WorkOp(self._scatter(sendbuf, recvbuf, root, True, "Scatter_init")))

    def Allgather_init(self, sendbuf: Any, recvbuf: Any, info: Any = None) -> Any:  # noqa: N802
        sendbuf, recvbuf = pinned(sendbuf), pinned(recvbuf)
        return persistent(lambda: WorkOp(self._allgather(sendbuf, recvbuf, True, "Allgather_init")))

    def Alltoall_init(self, sendbuf: Any, recvbuf: Any, info: Any = None) -> Any:  # noqa: N802
        sendbuf, recvbuf = pinned(sendbuf), pinned(recvbuf)
        return persistent(lambda: WorkOp(self._alltoall(sendbuf, recvbuf, True, "Alltoall_init")))

    def Reduce_init(self, sendbuf: Any, recvbuf: Any, op: Any = SUM, root: int = 0, info: Any = None) -> Any:  # noqa: N802
        sendbuf, recvbuf = pinned(sendbuf), pinned(recvbuf)
        op = pinned_op(op)
        return persistent(lambda: WorkOp(self._reduce(sendbuf, recvbuf, op, root, True, "Reduce_init")))

    def Allreduce_init(self, sendbuf: Any, recvbuf: Any, op: Any = SUM, info: Any = None) -> Any:  # noqa: N802
        sendbuf, recvbuf = pinned(sendbuf), pinned(recvbuf)
        op = pinned_op(op)
        return persistent(lambda: WorkOp(self._allreduce(sendbuf, recvbuf, op, True, "Allreduce_init")))

    def Reduce_scatter_block_init(self, sendbuf: Any, recvbuf: Any, op: Any = SUM, info: Any = None) -> Any:  # noqa: N802
        sendbuf, recvbuf = pinned(sendbuf), pinned(recvbuf)
        op = pinned_op(op)
        return persistent(lambda: WorkOp(self._reduce_scatter_block(sendbuf, recvbuf, op, True,
                                                                    "Reduce_scatter_block_init")))

    def Reduce_scatter_init(self, sendbuf: Any, recvbuf: Any, recvcounts: Any = None, op: Any = SUM,  # noqa: N802
                            info: Any = None) -> Any:
        sendbuf, recvbuf = pinned(sendbuf), pinned(recvbuf)
        op = pinned_op(op)
        return persistent(lambda: WorkOp(self._reduce_scatter(sendbuf, recvbuf, recvcounts, op, True,
                                                              "Reduce_scatter_init")))
