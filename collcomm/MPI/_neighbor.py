"""Neighbourhood collectives of a topology communicator: ``Neighbor_allgather(v)``,
``Neighbor_alltoall(v/w)``, their ``I…`` and ``…_init`` forms, and the object forms
``neighbor_allgather`` / ``neighbor_alltoall``.

Every rank of the communicator calls them (they are collective over it), each exchanging
blocks with its own neighbours only: ``outedges`` receive this rank's send blocks in order,
``inedges`` fill its receive blocks in order (a ``PROC_NULL`` neighbour, off a grid's
non-periodic edge, gets nothing and leaves its receive block untouched). A call is one
:func:`collcomm.core.collectives.all_to_all` with per-rank counts (the core's v-variant, as
``Alltoallv`` uses): the blocks for one peer packed back to back, zero for a rank that is
no neighbour. Where a peer is a neighbour several times (a multigraph edge, a grid's
periodic dimension of size 1 or 2) the blocks are paired by the topology's *keys*: the
n-th edge to a peer with the n-th from it on a graph, direction of travel on a grid
(:mod:`._topo`). ``IN_PLACE`` is not allowed (MPI forbids it here).

The datatypes, buffer kinds and specs are those of the other collectives (:mod:`._msg`):
derived types with gaps are packed and unpacked around the call, ``Neighbor_alltoallw``
moves bytes with a datatype per block.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple, Sequence

import numpy as np

from ._coll import _request
from ._collv import _a2a, _wspec
from ._consts import PROC_NULL
from ._errors import ERR_ARG, Exception as MPIException
from ._msg import IN_PLACE, blocks, pinned, simple, vector
from ._prequest import persistent
from ._request import Request, WorkOp
from ._staging import Staged, finisher


class Neighbors(NamedTuple):
    """A rank's neighbours: ranks (or PROC_NULL) in slot order; keys pair the n-th send to
    a peer with the receive it fills there (None: by order of appearance)."""

    sources: list[int]
    destinations: list[int]
    source_keys: Sequence[Any] | None = None
    destination_keys: Sequence[Any] | None = None


def _by_peer(ranks: Sequence[int], keys: Sequence[Any] | None) -> dict[int, list[int]]:
    """Slot indexes per peer (PROC_NULL left out), each peer's in key order."""
    seen: dict[int, list[tuple[Any, int]]] = {}
    for i, r in enumerate(ranks):
        if r != PROC_NULL:
            mine = seen.setdefault(r, [])
            mine.append((len(mine) if keys is None else keys[i], i))
    return {r: [i for _, i in sorted(slots, key=lambda t: t[0])] for r, slots in seen.items()}


def _check_not_in_place(sendbuf: Any, call: str) -> None:
    if sendbuf is IN_PLACE:     # (Open MPI: ERR_ARG too)
        raise MPIException(ERR_ARG, f"{call}: MPI.IN_PLACE is not allowed in a neighbourhood collective")


def _exchange(g: Any, nb: Neighbors, send: np.ndarray, s_at: Sequence[tuple[int, int]], recv: np.ndarray,
              r_at: Sequence[tuple[int, int]], dtype: Any, aop: bool, call: str, staged: Staged) -> Any:
    """One all_to_all: send block i (``send[off:off+len]``, ``s_at[i]``) to destination i, the
    block from source j into ``recv`` at ``r_at[j]`` (after the call; then ``staged``)."""
    n = g.size
    out, inn = _by_peer(nb.destinations, nb.destination_keys), _by_peer(nb.sources, nb.source_keys)
    send_counts, parts = [0] * n, []
    for q in sorted(out):
        for i in out[q]:
            off, length = s_at[i]
            parts.append(send[off:off + length])
            send_counts[q] += length
    packed = np.concatenate(parts) if len(parts) > 1 else parts[0] if parts else send[:0]
    recv_counts, order = [0] * n, []
    for p in sorted(inn):
        for j in inn[p]:
            order.append(r_at[j])
            recv_counts[p] += r_at[j][1]
    tmp = np.empty(sum(recv_counts), dtype=recv.dtype)

    def unpack() -> None:
        pos = 0
        for off, length in order:
            recv[off:off + length] = tmp[pos:pos + length]
            pos += length

    kwargs = {} if dtype is None else {"dtype": dtype}
    return _a2a(g, packed, send_counts, tmp, recv_counts, async_op=aop, name=call,
                after=finisher(staged, unpack), **kwargs)


def _even(k: int, count: int) -> list[tuple[int, int]]:
    return [(i * k, k) for i in range(count)]


class NeighborCollectives:
    """The neighbourhood collectives of a topology communicator (``_neighbors`` from Topocomm)."""

    __slots__ = ()

    _grp: Callable[..., Any]
    _neighbors: Callable[[str], Neighbors]

    # -- buffers -----------------------------------------------------------------------------
    def _n_allgather(self, sendbuf: Any, recvbuf: Any, aop: bool, call: str) -> Any:
        _check_not_in_place(sendbuf, call)
        g, nb = self._grp(call), self._neighbors(call)
        send, _ = simple(sendbuf, call, "sendbuf")
        st: Staged = []
        recv, k, dt = blocks(recvbuf, len(nb.sources), call, "recvbuf", writable=True, staged=st)
        return _exchange(g, nb, send, [(0, send.size)] * len(nb.destinations), recv,
                         _even(k * dt._t.mult, len(nb.sources)), dt._t.core, aop, call, st)

    def _n_allgatherv(self, sendbuf: Any, recvbuf: Any, aop: bool, call: str) -> Any:
        _check_not_in_place(sendbuf, call)
        g, nb = self._grp(call), self._neighbors(call)
        send, _ = simple(sendbuf, call, "sendbuf")
        st: Staged = []
        recv, counts, displs, dt = vector(recvbuf, len(nb.sources), call, "recvbuf", writable=True, staged=st)
        m = dt._t.mult
        return _exchange(g, nb, send, [(0, send.size)] * len(nb.destinations), recv,
                         [(d * m, c * m) for c, d in zip(counts, displs)], dt._t.core, aop, call, st)

    def _n_alltoall(self, sendbuf: Any, recvbuf: Any, aop: bool, call: str) -> Any:
        _check_not_in_place(sendbuf, call)
        g, nb = self._grp(call), self._neighbors(call)
        send, ks, sdt = blocks(sendbuf, len(nb.destinations), call, "sendbuf")
        st: Staged = []
        recv, k, dt = blocks(recvbuf, len(nb.sources), call, "recvbuf", writable=True, staged=st)
        return _exchange(g, nb, send, _even(ks * sdt._t.mult, len(nb.destinations)), recv,
                         _even(k * dt._t.mult, len(nb.sources)), dt._t.core, aop, call, st)

    def _n_alltoallv(self, sendbuf: Any, recvbuf: Any, aop: bool, call: str) -> Any:
        _check_not_in_place(sendbuf, call)
        g, nb = self._grp(call), self._neighbors(call)
        send, scounts, sdispls, sdt = vector(sendbuf, len(nb.destinations), call, "sendbuf")
        st: Staged = []
        recv, rcounts, rdispls, dt = vector(recvbuf, len(nb.sources), call, "recvbuf", writable=True, staged=st)
        sm, m = sdt._t.mult, dt._t.mult
        return _exchange(g, nb, send, [(d * sm, c * sm) for c, d in zip(scounts, sdispls)], recv,
                         [(d * m, c * m) for c, d in zip(rcounts, rdispls)], dt._t.core, aop, call, st)

    def _n_alltoallw(self, sendbuf: Any, recvbuf: Any, aop: bool, call: str) -> Any:
        _check_not_in_place(sendbuf, call)
        g, nb = self._grp(call), self._neighbors(call)
        st: Staged = []
        rbytes, rcounts, rdispls = _wspec(recvbuf, len(nb.sources), call, "recvbuf", st)
        sbytes, scounts, sdispls = _wspec(sendbuf, len(nb.destinations), call, "sendbuf", None)
        return _exchange(g, nb, sbytes, list(zip(sdispls, scounts)), rbytes, list(zip(rdispls, rcounts)),
                         None, aop, call, st)

    def Neighbor_allgather(self, sendbuf: Any, recvbuf: Any) -> None:  # noqa: N802
        self._n_allgather(sendbuf, recvbuf, False, "Neighbor_allgather")

    def Neighbor_allgatherv(self, sendbuf: Any, recvbuf: Any) -> None:  # noqa: N802
        self._n_allgatherv(sendbuf, recvbuf, False, "Neighbor_allgatherv")

    def Neighbor_alltoall(self, sendbuf: Any, recvbuf: Any) -> None:  # noqa: N802
        self._n_alltoall(sendbuf, recvbuf, False, "Neighbor_alltoall")

    def Neighbor_alltoallv(self, sendbuf: Any, recvbuf: Any) -> None:  # noqa: N802
        self._n_alltoallv(sendbuf, recvbuf, False, "Neighbor_alltoallv")

    def Neighbor_alltoallw(self, sendbuf: Any, recvbuf: Any) -> None:  # noqa: N802
        self._n_alltoallw(sendbuf, recvbuf, False, "Neighbor_alltoallw")

    def Ineighbor_allgather(self, sendbuf: Any, recvbuf: Any) -> Request:  # noqa: N802
        return _request(self._n_allgather(sendbuf, recvbuf, True, "Ineighbor_allgather"))

    def Ineighbor_allgatherv(self, sendbuf: Any, recvbuf: Any) -> Request:  # noqa: N802
        return _request(self._n_allgatherv(sendbuf, recvbuf, True, "Ineighbor_allgatherv"))

    def Ineighbor_alltoall(self, sendbuf: Any, recvbuf: Any) -> Request:  # noqa: N802
        return _request(self._n_alltoall(sendbuf, recvbuf, True, "Ineighbor_alltoall"))

    def Ineighbor_alltoallv(self, sendbuf: Any, recvbuf: Any) -> Request:  # noqa: N802
        return _request(self._n_alltoallv(sendbuf, recvbuf, True, "Ineighbor_alltoallv"))

    def Ineighbor_alltoallw(self, sendbuf: Any, recvbuf: Any) -> Request:  # noqa: N802
        return _request(self._n_alltoallw(sendbuf, recvbuf, True, "Ineighbor_alltoallw"))

    def _n_init(self, fn: Callable[..., Any], sendbuf: Any, recvbuf: Any, call: str) -> Any:
        sendbuf, recvbuf = pinned(sendbuf), pinned(recvbuf)
        return persistent(lambda: WorkOp(fn(sendbuf, recvbuf, True, call)))

    def Neighbor_allgather_init(self, sendbuf: Any, recvbuf: Any, info: Any = None) -> Any:  # noqa: N802
        return self._n_init(self._n_allgather, sendbuf, recvbuf, "Neighbor_allgather_init")

    def Neighbor_allgatherv_init(self, sendbuf: Any, recvbuf: Any, info: Any = None) -> Any:  # noqa: N802
        return self._n_init(self._n_allgatherv, sendbuf, recvbuf, "Neighbor_allgatherv_init")

    def Neighbor_alltoall_init(self, sendbuf: Any, recvbuf: Any, info: Any = None) -> Any:  # noqa: N802
        return self._n_init(self._n_alltoall, sendbuf, recvbuf, "Neighbor_alltoall_init")

    def Neighbor_alltoallv_init(self, sendbuf: Any, recvbuf: Any, info: Any = None) -> Any:  # noqa: N802
        return self._n_init(self._n_alltoallv, sendbuf, recvbuf, "Neighbor_alltoallv_init")

    def Neighbor_alltoallw_init(self, sendbuf: Any, recvbuf: Any, info: Any = None) -> Any:  # noqa: N802
        return self._n_init(self._n_alltoallw, sendbuf, recvbuf, "Neighbor_alltoallw_init")

    # -- objects -----------------------------------------------------------------------------
    def _n_objects(self, sendobjs: Sequence[Any], call: str) -> list[Any]:
        """One object alltoall: sendobjs[i] to destination i; the list of what each source
        sent (None from PROC_NULL)."""
        nb, n = self._neighbors(call), self._grp(call).size
        out, inn = _by_peer(nb.destinations, nb.destination_keys), _by_peer(nb.sources, nb.source_keys)
        got = self.alltoall([[sendobjs[i] for i in out.get(q, ())] for q in range(n)])  # type: ignore[attr-defined]
        result: list[Any] = [None] * len(nb.sources)
        for p, slots in inn.items():
            for j, obj in zip(slots, got[p]):
                result[j] = obj
        return result

    def neighbor_allgather(self, sendobj: Any) -> list[Any]:
        """The object of each in-neighbour, in ``inedges`` order (None from PROC_NULL)."""
        return self._n_objects([sendobj] * len(self._neighbors("neighbor_allgather").destinations),
                               "neighbor_allgather")

    def neighbor_alltoall(self, sendobj: Sequence[Any]) -> list[Any]:
        """``sendobj[i]`` to out-neighbour i; what each in-neighbour sent, in order."""
        nb = self._neighbors("neighbor_alltoall")
        objs = list(sendobj)
        if len(objs) != len(nb.destinations):
            raise ValueError(f"neighbor_alltoall: expecting {len(nb.destinations)} objects (one per "
                             f"out-neighbour), got {len(objs)}")
        return self._n_objects(objs, "neighbor_alltoall")
