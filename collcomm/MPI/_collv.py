"""Vector collectives (``Gatherv``, ``Scatterv``, ``Allgatherv``, ``Alltoallv``,
``Alltoallw``), with ``I…`` and ``…_init`` (the prefix reductions ``Scan``/``Exscan``:
:mod:`._coll_scan`).

Every vector collective is one :func:`collcomm.core.collectives.all_to_all` call with
per-rank counts (the core's v-variant): Gatherv sends one block to the root only,
Scatterv receives one block from the root only, Allgatherv sends the same block to every
rank. The core packs blocks back to back; when the displacements say otherwise the
blocks are packed into (or unpacked from, after the call) a temporary, so any ``displs``
work. ``Alltoallw`` moves bytes: its displacements are in bytes and each rank's block may
have its own datatype. All five, blocking, ``I…`` and ``…_init``, on numpy arrays first
offer the same call to the group's fast call (:mod:`._collv_fast`).

"""
from __future__ import annotations

from itertools import accumulate
from typing import Any, Callable, Sequence

import numpy as np

from ..core import collectives as core
from ..errors import CollcommError
from ._coll import _builtin, _not_root_in_place, _request, _run
from . import _collv_fast as _fast
from ._coll_persistent import _start, private_comm
from ._errors import ERR_ROOT, Exception as MPIException, translate
from ._msg import IN_PLACE, packed, pinned, simple, vector
from ._staging import Staged, finisher, packed_blocks
from ._prequest import persistent
from ._request import Request
from ._request_makers import started as _started   # (the Request of a two-part start, or None)
from ._types import Datatype, as_datatype


def _a2a(g: Any, send: np.ndarray, *args: Any, **kwargs: Any) -> Any:
    """core.all_to_all; a read-only send buffer (bytes, a frozen array) is copied first,
    as some families of the core write to their input's pages (reported to the core)."""
    if not send.flags.writeable:
        send = send.copy()
    return _run(core.all_to_all, g, send, *args, **kwargs)


def _check_root(g: Any, root: int, call: str) -> None:
    if not 0 <= root < g.size:
        raise MPIException(ERR_ROOT, f"{call} on {g.describe()}: root must be in [0, {g.size}), got {root}")


def _pack(whole: np.ndarray, m: int, counts: Sequence[int], displs: Sequence[int]) -> np.ndarray:
    """The blocks of a vector buffer, back to back (a view when they already are)."""
    if packed(whole, None, counts, displs):  # type: ignore[arg-type]
        return whole[:sum(counts) * m]
    if not counts:
        return whole[:0]
    return np.concatenate([whole[d * m:(d + c) * m] for c, d in zip(counts, displs)])


def _unpacker(whole: np.ndarray, m: int, counts: Sequence[int], displs: Sequence[int]
              ) -> tuple[np.ndarray, Callable[[], None] | None]:
    """(where the core should write the packed blocks, what copies them into place after)."""
    if packed(whole, None, counts, displs):  # type: ignore[arg-type]
        return whole[:sum(counts) * m], None
    tmp = np.empty(sum(counts) * m, dtype=whole.dtype)

    def after() -> None:
        pos = 0
        for c, d in zip(counts, displs):
            whole[d * m:(d + c) * m] = tmp[pos:pos + c * m]
            pos += c * m

    return tmp, after


class VectorCollectives:
    """The vector collectives of a communicator."""

    __slots__ = ()

    _grp: Callable[..., Any]      # the communicator's group, from Comm

    def _gatherv(self, sendbuf: Any, recvbuf: Any, root: int, aop: bool, call: str) -> Any:
        g = self._grp(call)
        _check_root(g, root, call)
        n = g.size
        recv_counts, after, recv, st = [0] * n, None, None, []
        if g.rank == root:
            whole, counts, displs, dt = vector(recvbuf, n, call, "recvbuf", writable=True, staged=st)
            m = dt._t.mult
            recv_counts = [c * m for c in counts]
            recv, after = _unpacker(whole, m, counts, displs)
        if sendbuf is IN_PLACE:
            if recv is None:
                raise _not_root_in_place(call, "sendbuf")
            send = whole[displs[root] * m:(displs[root] + counts[root]) * m]
        else:
            send, dt = simple(sendbuf, call, "sendbuf")
        send_counts = [0] * n
        send_counts[root] = send.size
        if recv is None:
            recv = np.empty(0, dtype=send.dtype)
        return _a2a(g, send, send_counts, recv, recv_counts, dtype=dt._t.core,
                    async_op=aop, name=call, after=finisher(st, after))

    def _scatterv(self, sendbuf: Any, recvbuf: Any, root: int, aop: bool, call: str) -> Any:
        g = self._grp(call)
        _check_root(g, root, call)
        n = g.size
        send, send_counts, st = None, [0] * n, []
        if g.rank == root:
            whole, counts, displs, dt = vector(sendbuf, n, call, "sendbuf")
            m = dt._t.mult
            send, send_counts = _pack(whole, m, counts, displs), [c * m for c in counts]
        if recvbuf is IN_PLACE:
            if send is None:
                raise _not_root_in_place(call, "recvbuf")
            recv = np.empty(send_counts[root], dtype=send.dtype)    # the root keeps its block
        else:
            recv, dt = simple(recvbuf, call, "recvbuf", writable=True, staged=st)
        recv_counts = [0] * n
        recv_counts[root] = send_counts[root] if g.rank == root else recv.size
        if send is None:
            send = recv[:0]
        return _a2a(g, send, send_counts, recv, recv_counts, dtype=dt._t.core,
                    async_op=aop, name=call, after=finisher(st))

    def _allgatherv(self, sendbuf: Any, recvbuf: Any, aop: bool, call: str) -> Any:
        g = self._grp(call)
        st: Staged = []
        whole, counts, displs, dt = vector(recvbuf, g.size, call, "recvbuf", writable=True, staged=st)
        m = dt._t.mult
        if sendbuf is IN_PLACE:
            send = whole[displs[g.rank] * m:(displs[g.rank] + counts[g.rank]) * m].copy()
        else:
            send, dt = simple(sendbuf, call, "sendbuf")
        recv, after = _unpacker(whole, m, counts, displs)
        after = finisher(st, after)
        if len(set(counts)) == 1 and send.size == counts[0] * m:   # every rank knows: all equal
            return _run(core.all_gather, g, send, recv, dtype=dt._t.core, async_op=aop, name=call,
                        after=after)
        # the same block to every rank: all_to_all sends distinct blocks, so n copies
        return _a2a(g, np.tile(send, g.size), [send.size] * g.size, recv,
                    [c * m for c in counts], dtype=dt._t.core, async_op=aop, name=call, after=after)

    def _alltoallv(self, sendbuf: Any, recvbuf: Any, aop: bool, call: str) -> Any:
        g = self._grp(call)
        st: Staged = []
        whole, rcounts, rdispls, dt = vector(recvbuf, g.size, call, "recvbuf", writable=True, staged=st)
        m = dt._t.mult
        if sendbuf is IN_PLACE:
            send, scounts = _pack(whole, m, rcounts, rdispls).copy(), rcounts
        else:
            swhole, scounts, sdispls, sdt = vector(sendbuf, g.size, call, "sendbuf")
            send = _pack(swhole, sdt._t.mult, scounts, sdispls)
            scounts = [c * sdt._t.mult // m for c in scounts]
        recv, after = _unpacker(whole, m, rcounts, rdispls)
        return _a2a(g, send, [c * m for c in scounts], recv, [c * m for c in rcounts],
                    dtype=dt._t.core, async_op=aop, name=call, after=finisher(st, after))

    def _alltoallw(self, sendbuf: Any, recvbuf: Any, aop: bool, call: str) -> Any:
        g = self._grp(call)
        st: Staged = []
        rbytes, rcounts, rdispls = _wspec(recvbuf, g.size, call, "recvbuf", st)
        if sendbuf is IN_PLACE:
            sbytes, scounts, sdispls = rbytes.copy(), rcounts, rdispls
        else:
            sbytes, scounts, sdispls = _wspec(sendbuf, g.size, call, "sendbuf", None)
        send = _pack(sbytes, 1, scounts, sdispls)
        recv, after = _unpacker(rbytes, 1, rcounts, rdispls)
        return _a2a(g, send, scounts, recv, rcounts, async_op=aop, name=call, after=finisher(st, after))

    def _fast_call(self) -> tuple[Any, Any]:
        """(the group's fast call or None, the group)."""
        g = self._h.g
        return (g.fast, g) if g is not None and g.fast is not None else (None, g)

    # (the public forms call the fast call's entry themselves, without the helpers' frames:
    # its C reads the specs, an error of it is translated, None: the regular path)
    def Gatherv(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> None:  # noqa: N802
        if sendbuf is None:            # (mpi4py: None is IN_PLACE)
            sendbuf = IN_PLACE
        g = self._h.g
        if g is not None and (fast := g.fast) is not None:
            try:
                if fast.gatherv(sendbuf, recvbuf, root, "Gatherv", Datatype, False) is not None:
                    return
            except CollcommError as exc:
                raise translate(exc) from exc
        self._gatherv(sendbuf, recvbuf, root, False, "Gatherv")

    def Igatherv(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> Request:  # noqa: N802
        if sendbuf is None:            # (mpi4py: None is IN_PLACE)
            sendbuf = IN_PLACE
        g = self._h.g
        if g is not None and (fast := g.fast) is not None \
                and (r := _started(fast.gatherv, sendbuf, recvbuf, root, "Igatherv", Datatype, True)) is not None:
            return r
        return _request(self._gatherv(sendbuf, recvbuf, root, True, "Igatherv"))

    def _igatherv(self, sendbuf: Any, recvbuf: Any, root: int, call: str) -> Request:
        fast, _ = self._fast_call()
        work = None if fast is None else _fast.rooted_v(fast.gatherv, sendbuf, recvbuf, root, call, True)
        return _request(self._gatherv(sendbuf, recvbuf, root, True, call) if work is None else work)

    def Scatterv(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> None:  # noqa: N802
        if recvbuf is None:            # (mpi4py: None is IN_PLACE)
            recvbuf = IN_PLACE
        g = self._h.g
        if g is not None and (fast := g.fast) is not None:
            try:
                if fast.scatterv(sendbuf, recvbuf, root, "Scatterv", Datatype, False) is not None:
                    return
            except CollcommError as exc:
                raise translate(exc) from exc
        self._scatterv(sendbuf, recvbuf, root, False, "Scatterv")

    def Iscatterv(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> Request:  # noqa: N802
        if recvbuf is None:            # (mpi4py: None is IN_PLACE)
            recvbuf = IN_PLACE
        g = self._h.g
        if g is not None and (fast := g.fast) is not None \
                and (r := _started(fast.scatterv, sendbuf, recvbuf, root, "Iscatterv", Datatype, True)) is not None:
            return r
        return _request(self._scatterv(sendbuf, recvbuf, root, True, "Iscatterv"))

    def _iscatterv(self, sendbuf: Any, recvbuf: Any, root: int, call: str) -> Request:
        fast, _ = self._fast_call()
        work = None if fast is None else _fast.rooted_v(fast.scatterv, sendbuf, recvbuf, root, call, True)
        return _request(self._scatterv(sendbuf, recvbuf, root, True, call) if work is None else work)

    def Allgatherv(self, sendbuf: Any, recvbuf: Any) -> None:  # noqa: N802
        if sendbuf is None:            # (mpi4py: None is IN_PLACE)
            sendbuf = IN_PLACE
        fast, g = self._fast_call()
        if fast is None or _fast.allgatherv(fast, g, sendbuf, recvbuf, "Allgatherv") is None:
            self._allgatherv(sendbuf, recvbuf, False, "Allgatherv")

    def Iallgatherv(self, sendbuf: Any, recvbuf: Any) -> Request:  # noqa: N802
        if sendbuf is None:            # (mpi4py: None is IN_PLACE)
            sendbuf = IN_PLACE
        return self._iallgatherv(sendbuf, recvbuf, "Iallgatherv")

    def _iallgatherv(self, sendbuf: Any, recvbuf: Any, call: str) -> Request:
        fast, g = self._fast_call()
        work = None if fast is None else _fast.allgatherv(fast, g, sendbuf, recvbuf, call, True)
        return _request(self._allgatherv(sendbuf, recvbuf, True, call) if work is None else work)

    def Alltoallv(self, sendbuf: Any, recvbuf: Any) -> None:  # noqa: N802
        if sendbuf is None:            # (mpi4py: None is IN_PLACE)
            sendbuf = IN_PLACE
        g = self._h.g
        if g is not None and (fast := g.fast) is not None:
            try:
                if fast.alltoallv(sendbuf, recvbuf, "Alltoallv", Datatype, False) is not None:
                    return
            except CollcommError as exc:
                raise translate(exc) from exc
        self._alltoallv(sendbuf, recvbuf, False, "Alltoallv")

    def Ialltoallv(self, sendbuf: Any, recvbuf: Any) -> Request:  # noqa: N802
        if sendbuf is None:            # (mpi4py: None is IN_PLACE)
            sendbuf = IN_PLACE
        g = self._h.g
        if g is not None and (fast := g.fast) is not None \
                and (r := _started(fast.alltoallv, sendbuf, recvbuf, "Ialltoallv", Datatype, True)) is not None:
            return r
        return _request(self._alltoallv(sendbuf, recvbuf, True, "Ialltoallv"))

    def _ialltoallv(self, sendbuf: Any, recvbuf: Any, call: str) -> Request:
        fast, _ = self._fast_call()
        work = None if fast is None else _fast.alltoallv(fast, sendbuf, recvbuf, call, True)
        return _request(self._alltoallv(sendbuf, recvbuf, True, call) if work is None else work)

    def Alltoallw(self, sendbuf: Any, recvbuf: Any) -> None:  # noqa: N802
        if sendbuf is None:            # (mpi4py: None is IN_PLACE)
            sendbuf = IN_PLACE
        g = self._h.g
        if g is not None and (fast := g.fast) is not None:
            try:
                if fast.alltoallw(sendbuf, recvbuf, "Alltoallw", Datatype, False, _fast.UINT8) is not None:
                    return
            except CollcommError as exc:
                raise translate(exc) from exc
        self._alltoallw(sendbuf, recvbuf, False, "Alltoallw")

    def Ialltoallw(self, sendbuf: Any, recvbuf: Any) -> Request:  # noqa: N802
        if sendbuf is None:            # (mpi4py: None is IN_PLACE)
            sendbuf = IN_PLACE
        g = self._h.g
        if g is not None and (fast := g.fast) is not None and (r := _started(
                fast.alltoallw, sendbuf, recvbuf, "Ialltoallw", Datatype, True, _fast.UINT8)) is not None:
            return r
        return _request(self._alltoallw(sendbuf, recvbuf, True, "Ialltoallw"))

    def _ialltoallw(self, sendbuf: Any, recvbuf: Any, call: str) -> Request:
        fast, g = self._fast_call()
        work = None if fast is None else _fast.alltoallw(fast, g, sendbuf, recvbuf, call, True)
        return _request(self._alltoallw(sendbuf, recvbuf, True, call) if work is None else work)

    def Gatherv_init(self, sendbuf: Any, recvbuf: Any, root: int = 0, info: Any = None) -> Any:  # noqa: N802
        if sendbuf is None:            # (mpi4py: None is IN_PLACE)
            sendbuf = IN_PLACE
        sendbuf, recvbuf = pinned(sendbuf), pinned(recvbuf)
        c = private_comm(self, "Gatherv_init", sendbuf, recvbuf)
        general = lambda: c._igatherv(sendbuf, recvbuf, root, "Gatherv_init")._op  # noqa: E731
        return persistent(_start(c, "gatherv", (sendbuf, recvbuf, root, "Gatherv_init", Datatype, True), general), c)

    def Scatterv_init(self, sendbuf: Any, recvbuf: Any, root: int = 0, info: Any = None) -> Any:  # noqa: N802
        if recvbuf is None:            # (mpi4py: None is IN_PLACE)
            recvbuf = IN_PLACE
        sendbuf, recvbuf = pinned(sendbuf), pinned(recvbuf)
        c = private_comm(self, "Scatterv_init", sendbuf, recvbuf)
        general = lambda: c._iscatterv(sendbuf, recvbuf, root, "Scatterv_init")._op  # noqa: E731
        return persistent(_start(c, "scatterv", (sendbuf, recvbuf, root, "Scatterv_init", Datatype, True), general),
                          c)

    def Allgatherv_init(self, sendbuf: Any, recvbuf: Any, info: Any = None) -> Any:  # noqa: N802
        if sendbuf is None:            # (mpi4py: None is IN_PLACE)
            sendbuf = IN_PLACE
        sendbuf, recvbuf = pinned(sendbuf), pinned(recvbuf)
        c = private_comm(self, "Allgatherv_init", sendbuf, recvbuf)
        general = lambda: c._iallgatherv(sendbuf, recvbuf, "Allgatherv_init")._op  # noqa: E731
        return persistent(_start(c, "allgatherv", (sendbuf, recvbuf, "Allgatherv_init", Datatype, True, np.tile),
                                 general), c)

    def Alltoallv_init(self, sendbuf: Any, recvbuf: Any, info: Any = None) -> Any:  # noqa: N802
        if sendbuf is None:            # (mpi4py: None is IN_PLACE)
            sendbuf = IN_PLACE
        sendbuf, recvbuf = pinned(sendbuf), pinned(recvbuf)
        c = private_comm(self, "Alltoallv_init", sendbuf, recvbuf)
        general = lambda: c._ialltoallv(sendbuf, recvbuf, "Alltoallv_init")._op  # noqa: E731
        return persistent(_start(c, "alltoallv", (sendbuf, recvbuf, "Alltoallv_init", Datatype, True), general), c)

    def Alltoallw_init(self, sendbuf: Any, recvbuf: Any, info: Any = None) -> Any:  # noqa: N802
        if sendbuf is None:            # (mpi4py: None is IN_PLACE)
            sendbuf = IN_PLACE
        sendbuf, recvbuf = pinned(sendbuf), pinned(recvbuf)
        c = private_comm(self, "Alltoallw_init", sendbuf, recvbuf)
        general = lambda: c._ialltoallw(sendbuf, recvbuf, "Alltoallw_init")._op  # noqa: E731
        return persistent(_start(c, "alltoallw", (sendbuf, recvbuf, "Alltoallw_init", Datatype, True, _fast.UINT8),
                                 general), c)


def _wspec(spec: Any, n: int, call: str, role: str, staged: Staged | None
           ) -> tuple[np.ndarray, list[int], list[int]]:
    """A BufSpecW ``[buf, (counts, byte displs), types]`` / ``[buf, counts, displs, types]`` as
    (the buffer's bytes, byte counts, byte displacements); ``staged`` is given for the
    receive buffer. Blocks of derived types with gaps are packed (into a temporary, their
    unpacking staged for a receive)."""
    if not isinstance(spec, (list, tuple)) or len(spec) not in (3, 4):
        raise ValueError(f"{call}: {role} must be [buf, (counts, displs), datatypes] or "
                         "[buf, counts, displs, datatypes]")
    if len(spec) == 3:
        obj, (counts, displs), types = spec
    else:
        obj, counts, displs, types = spec
    raw = simple([obj, "B"], call, role, staged is not None)[0]
    dts = [as_datatype(t, call) for t in types] if isinstance(types, (list, tuple)) \
        else [as_datatype(types, call)] * n
    if not len(counts) == len(displs) == len(dts) == n:
        raise ValueError(f"{call}: {role}: expecting {n} counts, displacements and datatypes")
    if any(dt._t.gaps for dt in dts):  # type: ignore[union-attr]
        whole, bcounts = packed_blocks(raw, dts, counts, displs, call, role, staged)
        return whole, bcounts, list(accumulate(bcounts, initial=0))[:n]
    bcounts = [int(c) * dt.Get_extent()[1] for c, dt in zip(counts, dts)]
    bdispls = [int(d) for d in displs]
    for c, d in zip(bcounts, bdispls):
        if d < 0 or d + c > raw.size:
            raise ValueError(f"{call}: {role}: a block of {c} bytes at byte {d} does not fit in {raw.size} bytes")
    return raw, bcounts, bdispls
