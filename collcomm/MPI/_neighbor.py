"""Neighbourhood collectives of a topology communicator: ``Neighbor_allgather(v)``,
``Neighbor_alltoall(v/w)``, their ``I…`` and ``…_init`` forms, and the object forms
``neighbor_allgather`` / ``neighbor_alltoall``.

Every rank of the communicator calls them (they are collective over it), each exchanging
blocks with its own neighbours only: ``outedges`` receive this rank's send blocks in order,
``inedges`` fill its receive blocks in order (a ``PROC_NULL`` neighbour, off a grid's
non-periodic edge, gets nothing and leaves its receive block untouched). How the blocks
travel: :mod:`._neighbor_exchange`. Each call parses and checks its buffers before it takes
its number on the communicator (the tags of its messages), so a call refused on one rank
leaves the numbering in step; a persistent request takes its number at ``…_init`` and
keeps it, so requests may be started in any order. ``IN_PLACE`` is not allowed (MPI
forbids it here; ``ERR_ARG``, as Open MPI).

The datatypes, buffer kinds and specs are those of the other collectives (:mod:`._msg`):
derived types with gaps are packed and unpacked around the call, ``Neighbor_alltoallw``
moves bytes with a datatype per block.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import numpy as np

from ._collv import _wspec
from ._errors import ERR_ARG, Exception as MPIException
from ._msg import IN_PLACE, blocks, pinned, simple, vector
from ._neighbor_exchange import Neighborhood, exchange, plain_key, vector_key
from ._p2p_ops import _request, complete
from ._pickle import pickle
from ._prequest import persistent
from ._request import Request
from ._staging import Staged
from ._types import _BY_NUMPY

__all__ = ["NeighborCollectives"]


#: the kinds of call the quick path knows (Neighborhood.quick_run)
_ALLTOALL, _ALLGATHER, _ALLTOALLV, _ALLGATHERV = 0, 1, 2, 3


def _v_key(sendbuf: Any, recvbuf: Any) -> tuple[Any, ...] | None:
    """The quick path's key of a Neighbor_alltoallv (None: not spec lists of its form)."""
    skey, rkey = vector_key(sendbuf), vector_key(recvbuf)
    return None if skey is None or rkey is None else (_ALLTOALLV, *skey, *rkey)


def _gv_key(sendbuf: Any, recvbuf: Any) -> tuple[Any, ...] | None:
    """The quick path's key of a Neighbor_allgatherv: a plain array, a receive spec list."""
    rkey = vector_key(recvbuf) if type(sendbuf) is np.ndarray else None
    return None if rkey is None else (_ALLGATHERV, sendbuf.dtype, sendbuf.shape, *rkey)


def _quick_args(kind: int, sendbuf: Any, recvbuf: Any) -> tuple[tuple[Any, ...], Any, Any] | None:
    """(key, send array, receive array) of a call of ``kind`` the quick path may take (its
    plain arrays, or the arrays of its spec lists), or None."""
    if kind == _ALLTOALLV:
        key = _v_key(sendbuf, recvbuf)
        return None if key is None else (key, sendbuf[0], recvbuf[0])
    if kind == _ALLGATHERV:
        key = _gv_key(sendbuf, recvbuf)
        return None if key is None else (key, sendbuf, recvbuf[0])
    if type(sendbuf) is np.ndarray and type(recvbuf) is np.ndarray:
        return plain_key(kind, sendbuf, recvbuf), sendbuf, recvbuf
    return None


def _check_not_in_place(sendbuf: Any, call: str) -> None:
    if sendbuf is IN_PLACE:     # (Open MPI: ERR_ARG too)
        raise MPIException(ERR_ARG, f"{call}: MPI.IN_PLACE is not allowed in a neighbourhood collective")


def _plain(sendbuf: Any, recvbuf: Any) -> bool:
    """Both buffers plain C-contiguous numpy arrays of one dtype MPI names, the receive one
    writable: their elements are the blocks, no spec to parse."""
    return (type(sendbuf) is np.ndarray and type(recvbuf) is np.ndarray and sendbuf.dtype == recvbuf.dtype
            and sendbuf.dtype in _BY_NUMPY and sendbuf.flags.c_contiguous and recvbuf.flags.c_contiguous
            and recvbuf.flags.writeable)


def _even(k: int, count: int) -> list[tuple[int, int]]:
    return [(i * k, k) for i in range(count)]


class NeighborCollectives:
    """The neighbourhood collectives of a topology communicator (``_neighbor_plan`` and
    ``_neighbor_call`` from Topocomm)."""

    __slots__ = ()

    _h: Any
    _neighbor_plan: Callable[[str], Neighborhood]
    _neighbor_call: Callable[[], int]

    def _go(self, on: Neighborhood, base: int | None, s_at: Sequence[tuple[int, int]], send: np.ndarray,
            r_at: Sequence[tuple[int, int]], recv: np.ndarray, aop: bool, call: str, staged: Staged,
            key: tuple[Any, ...] | None = None) -> Any:
        """The exchange, numbered now (the buffers checked) unless a persistent request's
        ``base``; ``key``: a call on plain arrays, for the quick path (Neighborhood)."""
        return exchange(on, self._neighbor_call() if base is None else base, s_at, send, r_at, recv,
                        aop, call, staged, key)

    # -- buffers -----------------------------------------------------------------------------
    def _n_allgather(self, sendbuf: Any, recvbuf: Any, aop: bool, call: str, base: int | None = None) -> Any:
        on = self._neighbor_plan(call)
        nb = on.plan.nb
        indeg = len(nb.sources)
        if (_plain(sendbuf, recvbuf) and indeg and recvbuf.size == sendbuf.size * indeg
                and sendbuf.ndim == 1):    # (what simple() and blocks() give them, unparsed)
            k = sendbuf.size
            return self._go(on, base, [(0, k)] * len(nb.destinations), sendbuf, _even(k, indeg),
                            recvbuf.reshape(-1), aop, call, [], plain_key(_ALLGATHER, sendbuf, recvbuf))
        _check_not_in_place(sendbuf, call)
        send, _ = simple(sendbuf, call, "sendbuf")
        st: Staged = []
        recv, k, dt = blocks(recvbuf, len(nb.sources), call, "recvbuf", writable=True, staged=st)
        return self._go(on, base, [(0, send.size)] * len(nb.destinations), send,
                        _even(k * dt._t.mult, len(nb.sources)), recv, aop, call, st)

    def _n_allgatherv(self, sendbuf: Any, recvbuf: Any, aop: bool, call: str, base: int | None = None) -> Any:
        _check_not_in_place(sendbuf, call)
        on = self._neighbor_plan(call)
        nb = on.plan.nb
        send, _ = simple(sendbuf, call, "sendbuf")
        st: Staged = []
        recv, counts, displs, dt = vector(recvbuf, len(nb.sources), call, "recvbuf", writable=True, staged=st)
        m = dt._t.mult
        return self._go(on, base, [(0, send.size)] * len(nb.destinations), send,
                        [(d * m, c * m) for c, d in zip(counts, displs)], recv, aop, call, st,
                        None if dt._t.gaps else _gv_key(sendbuf, recvbuf))

    def _n_alltoall(self, sendbuf: Any, recvbuf: Any, aop: bool, call: str, base: int | None = None) -> Any:
        on = self._neighbor_plan(call)
        nb = on.plan.nb
        outdeg, indeg = len(nb.destinations), len(nb.sources)
        if (_plain(sendbuf, recvbuf) and outdeg and indeg and not sendbuf.size % outdeg
                and not recvbuf.size % indeg):     # (what blocks() gives them, without the spec's parse)
            ks, k = sendbuf.size // outdeg, recvbuf.size // indeg
            return self._go(on, base, _even(ks, outdeg), sendbuf.reshape(-1), _even(k, indeg), recvbuf.reshape(-1),
                            aop, call, [], plain_key(_ALLTOALL, sendbuf, recvbuf))
        _check_not_in_place(sendbuf, call)
        send, ks, sdt = blocks(sendbuf, outdeg, call, "sendbuf")
        st: Staged = []
        recv, k, dt = blocks(recvbuf, indeg, call, "recvbuf", writable=True, staged=st)
        return self._go(on, base, _even(ks * sdt._t.mult, outdeg), send, _even(k * dt._t.mult, indeg), recv,
                        aop, call, st)

    def _n_alltoallv(self, sendbuf: Any, recvbuf: Any, aop: bool, call: str, base: int | None = None) -> Any:
        _check_not_in_place(sendbuf, call)
        on = self._neighbor_plan(call)
        nb = on.plan.nb
        send, scounts, sdispls, sdt = vector(sendbuf, len(nb.destinations), call, "sendbuf")
        st: Staged = []
        recv, rcounts, rdispls, dt = vector(recvbuf, len(nb.sources), call, "recvbuf", writable=True, staged=st)
        sm, m = sdt._t.mult, dt._t.mult
        # (blocks packed from a type with gaps: not the quick path's bytes)
        key = None if sdt._t.gaps or dt._t.gaps else _v_key(sendbuf, recvbuf)
        return self._go(on, base, [(d * sm, c * sm) for c, d in zip(scounts, sdispls)], send,
                        [(d * m, c * m) for c, d in zip(rcounts, rdispls)], recv, aop, call, st, key)

    def _n_alltoallw(self, sendbuf: Any, recvbuf: Any, aop: bool, call: str, base: int | None = None) -> Any:
        _check_not_in_place(sendbuf, call)
        on = self._neighbor_plan(call)
        nb = on.plan.nb
        st: Staged = []
        rbytes, rcounts, rdispls = _wspec(recvbuf, len(nb.sources), call, "recvbuf", st)
        sbytes, scounts, sdispls = _wspec(sendbuf, len(nb.destinations), call, "sendbuf", None)
        return self._go(on, base, list(zip(sdispls, scounts)), sbytes, list(zip(rdispls, rcounts)), rbytes,
                        aop, call, st)
    def Neighbor_allgather(self, sendbuf: Any, recvbuf: Any) -> None:  # noqa: N802
        nbh = self._h.neighbor
        if nbh is None or not nbh.quick_run(_ALLGATHER, sendbuf, recvbuf):
            self._n_allgather(sendbuf, recvbuf, False, "Neighbor_allgather")

    def Neighbor_allgatherv(self, sendbuf: Any, recvbuf: Any) -> None:  # noqa: N802
        nbh = self._h.neighbor
        key = None if nbh is None or not nbh.quick else _gv_key(sendbuf, recvbuf)
        if key is None or not nbh.quick_run(_ALLGATHERV, sendbuf, recvbuf[0], key):
            self._n_allgatherv(sendbuf, recvbuf, False, "Neighbor_allgatherv")

    def Neighbor_alltoall(self, sendbuf: Any, recvbuf: Any) -> None:  # noqa: N802
        nbh = self._h.neighbor
        if nbh is None or not nbh.quick_run(_ALLTOALL, sendbuf, recvbuf):
            self._n_alltoall(sendbuf, recvbuf, False, "Neighbor_alltoall")

    def Neighbor_alltoallv(self, sendbuf: Any, recvbuf: Any) -> None:  # noqa: N802
        nbh = self._h.neighbor
        key = None if nbh is None or not nbh.quick else _v_key(sendbuf, recvbuf)
        if key is None or not nbh.quick_run(_ALLTOALLV, sendbuf[0], recvbuf[0], key):
            self._n_alltoallv(sendbuf, recvbuf, False, "Neighbor_alltoallv")

    def Neighbor_alltoallw(self, sendbuf: Any, recvbuf: Any) -> None:  # noqa: N802
        self._n_alltoallw(sendbuf, recvbuf, False, "Neighbor_alltoallw")

    def Ineighbor_allgather(self, sendbuf: Any, recvbuf: Any) -> Request:  # noqa: N802
        nbh = self._h.neighbor
        op = None if nbh is None else nbh.quick_start(_ALLGATHER, sendbuf, recvbuf)
        return _request(op if op is not None else self._n_allgather(sendbuf, recvbuf, True, "Ineighbor_allgather"))

    def Ineighbor_allgatherv(self, sendbuf: Any, recvbuf: Any) -> Request:  # noqa: N802
        nbh = self._h.neighbor
        key = None if nbh is None or not nbh.quick else _gv_key(sendbuf, recvbuf)
        op = None if key is None else nbh.quick_start(_ALLGATHERV, sendbuf, recvbuf[0], key)
        return _request(op if op is not None else self._n_allgatherv(sendbuf, recvbuf, True, "Ineighbor_allgatherv"))

    def Ineighbor_alltoall(self, sendbuf: Any, recvbuf: Any) -> Request:  # noqa: N802
        nbh = self._h.neighbor
        op = None if nbh is None else nbh.quick_start(_ALLTOALL, sendbuf, recvbuf)
        return _request(op if op is not None else self._n_alltoall(sendbuf, recvbuf, True, "Ineighbor_alltoall"))

    def Ineighbor_alltoallv(self, sendbuf: Any, recvbuf: Any) -> Request:  # noqa: N802
        nbh = self._h.neighbor
        key = None if nbh is None or not nbh.quick else _v_key(sendbuf, recvbuf)
        op = None if key is None else nbh.quick_start(_ALLTOALLV, sendbuf[0], recvbuf[0], key)
        return _request(op if op is not None else self._n_alltoallv(sendbuf, recvbuf, True, "Ineighbor_alltoallv"))

    def Ineighbor_alltoallw(self, sendbuf: Any, recvbuf: Any) -> Request:  # noqa: N802
        return _request(self._n_alltoallw(sendbuf, recvbuf, True, "Ineighbor_alltoallw"))

    def _n_init(self, fn: Callable[..., Any], sendbuf: Any, recvbuf: Any, call: str, kind: int | None = None) -> Any:
        """A persistent request: its buffers checked and its number taken now, kept for
        every Start (one Start completes before the next: its messages arrive in order).
        A ``kind`` the quick path knows starts the quick way (``Prequest.Start`` calls the
        ``quick`` item first: Neighborhood.quick_start, None until a Start ran natively)."""
        _check_not_in_place(sendbuf, call)
        sendbuf, recvbuf = pinned(sendbuf), pinned(recvbuf)
        nbh = self._neighbor_plan(call)
        base = self._neighbor_call()

        def start() -> Any:
            nbh.starting = request      # (interrupted once its sends were written: made active)
            try:
                return fn(sendbuf, recvbuf, True, call, base)
            finally:
                nbh.starting = None
        request = persistent(start)
        quick = None if kind is None else _quick_args(kind, sendbuf, recvbuf)
        if quick is not None and request._persist is not None:    # (the request: made active if interrupted)
            key, send, recv = quick
            request._persist.quick = [functools.partial(nbh.quick_start, kind, send, recv, key, base, request)]
        return request

    def Neighbor_allgather_init(self, sendbuf: Any, recvbuf: Any, info: Any = None) -> Any:  # noqa: N802
        return self._n_init(self._n_allgather, sendbuf, recvbuf, "Neighbor_allgather_init", _ALLGATHER)

    def Neighbor_allgatherv_init(self, sendbuf: Any, recvbuf: Any, info: Any = None) -> Any:  # noqa: N802
        return self._n_init(self._n_allgatherv, sendbuf, recvbuf, "Neighbor_allgatherv_init", _ALLGATHERV)

    def Neighbor_alltoall_init(self, sendbuf: Any, recvbuf: Any, info: Any = None) -> Any:  # noqa: N802
        return self._n_init(self._n_alltoall, sendbuf, recvbuf, "Neighbor_alltoall_init", _ALLTOALL)

    def Neighbor_alltoallv_init(self, sendbuf: Any, recvbuf: Any, info: Any = None) -> Any:  # noqa: N802
        return self._n_init(self._n_alltoallv, sendbuf, recvbuf, "Neighbor_alltoallv_init", _ALLTOALLV)

    def Neighbor_alltoallw_init(self, sendbuf: Any, recvbuf: Any, info: Any = None) -> Any:  # noqa: N802
        return self._n_init(self._n_alltoallw, sendbuf, recvbuf, "Neighbor_alltoallw_init")

    # -- objects -----------------------------------------------------------------------------
    def _n_objects(self, on: Neighborhood, sendobjs: Sequence[Any], call: str) -> list[Any]:
        """sendobjs[i] to destination i (pickled, on the twin; each written at once where it
        fits the peer's ring), then each receive in turn; the list of what each source sent
        (None from PROC_NULL)."""
        twin, plan = on.twin, on.plan
        base = self._neighbor_call()
        result: list[Any] = [None] * len(plan.nb.sources)
        for i, j in plan.local:           # (a copy, as every object received is)
            result[j] = pickle.loads(pickle.dumps(sendobjs[i]))
        pending = []
        for i, q, code in plan.sends:     # (as isend: written at once in C, else that pickle the regular way)
            obj = sendobjs[i]
            pickled = twin._fast_send(obj, q, base + code)
            if pickled is not True:
                pending.append(twin._osend(obj, q, base + code, False, call, pickled))
        for j, p, code in plan.recvs:     # (in each peer's order: received and unpickled in C where it can)
            result[j] = twin.recv(None, p, base + code)
        for op in pending:
            complete(op)
        return result

    def neighbor_allgather(self, sendobj: Any) -> list[Any]:
        """The object of each in-neighbour, in ``inedges`` order (None from PROC_NULL)."""
        on = self._neighbor_plan("neighbor_allgather")
        return self._n_objects(on, [sendobj] * len(on.plan.nb.destinations), "neighbor_allgather")

    def neighbor_alltoall(self, sendobj: Sequence[Any]) -> list[Any]:
        """``sendobj[i]`` to out-neighbour i; what each in-neighbour sent, in order."""
        on = self._neighbor_plan("neighbor_alltoall")
        want = len(on.plan.nb.destinations)
        objs = [None] * want if sendobj is None else list(sendobj)     # (None: None to each, as mpi4py)
        if len(objs) != want:
            raise ValueError(f"neighbor_alltoall: expecting {want} objects (one per out-neighbour), got {len(objs)}")
        return self._n_objects(on, objs, "neighbor_alltoall")
