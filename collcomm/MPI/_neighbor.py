"""Neighbourhood collectives of a topology communicator: ``Neighbor_allgather(v)``,
``Neighbor_alltoall(v/w)``, their ``I…`` and ``…_init`` forms, and the object forms
``neighbor_allgather`` / ``neighbor_alltoall``.

Every rank of the communicator calls them (they are collective over it), each exchanging
blocks with its own neighbours only: ``outedges`` receive this rank's send blocks in order,
``inedges`` fill its receive blocks in order (a ``PROC_NULL`` neighbour, off a grid's
non-periodic edge, gets nothing and leaves its receive block untouched). A call is one
``Isend`` a send block and one ``Irecv`` a receive block, straight from and into the
caller's buffers, on a hidden twin of the communicator (its own context, made without a
message on first use: a user's ``ANY_TAG`` receive never sees them), then a wait for all
of them: what Open MPI's basic component does. Its cost follows the degree, not the size
of the communicator, and a small exchange takes the native point-to-point path. The tag
is the call's number on the communicator (every rank makes the same calls in the same
order) and the edge's *key* code: where a peer is a neighbour several times (a multigraph
edge, a grid's periodic dimension of size 1 or 2) the n-th edge to a peer meets the n-th
from it on a graph (same tag, messages in order), and on a grid a block sent one step up
lands in the receiver's slot for its neighbour one step down (the direction in the tag, as
Open MPI's blocking calls do; :mod:`._topo`). ``IN_PLACE`` is not allowed (MPI forbids it
here).

The datatypes, buffer kinds and specs are those of the other collectives (:mod:`._msg`):
derived types with gaps are packed and unpacked around the call, ``Neighbor_alltoallw``
moves bytes with a datatype per block.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple, Sequence

import numpy as np

from ._collv import _wspec
from ._consts import ANY_SOURCE, ANY_TAG, PROC_NULL
from ._errors import ERR_ARG, ERR_TOPOLOGY, ERR_TRUNCATE, Exception as MPIException
from ._msg import IN_PLACE, blocks, pinned, simple, vector
from ._p2p_ops import _request
from ._pickle import pickle
from ._prequest import persistent
from ._request import Request
from ._staging import Staged, finisher
from ._types import _BY_NUMPY


class Neighbors(NamedTuple):
    """A rank's neighbours: ranks (or PROC_NULL) in slot order; keys pair the n-th send to
    a peer with the receive it fills there (None: by order of appearance)."""

    sources: list[int]
    destinations: list[int]
    source_keys: Sequence[Any] | None = None
    destination_keys: Sequence[Any] | None = None


def _check_not_in_place(sendbuf: Any, call: str) -> None:
    if sendbuf is IN_PLACE:     # (Open MPI: ERR_ARG too)
        raise MPIException(ERR_ARG, f"{call}: MPI.IN_PLACE is not allowed in a neighbourhood collective")


def _code(key: Any) -> int:
    """A key's part of the tag: a grid's (dimension, direction) as 2 d + direction; 0 on a
    graph (its edges to one peer meet in order)."""
    return 0 if key is None else 2 * key[0] + key[1]


class Plan:
    """What a rank's calls on one topology communicator do, worked out once: the sends
    ``(block, peer, code)`` in slot order, the receives ``(slot, peer, code)`` in the order
    each peer sends (a receive waited for out of its peer's order leaves the native path:
    38 µs against 11 for a ring of 2 in one test), and the edges to itself as ``(block,
    slot)`` copies (the n-th block sent to itself with a code fills the n-th slot expecting
    it)."""

    __slots__ = ("nb", "sends", "recvs", "local")

    def __init__(self, nb: Neighbors, me: int, call: str) -> None:
        skeys = nb.source_keys or [None] * len(nb.sources)
        dkeys = nb.destination_keys or [None] * len(nb.destinations)
        self.nb = nb
        self.sends = [(i, q, _code(dkeys[i])) for i, q in enumerate(nb.destinations) if q not in (PROC_NULL, me)]
        self.recvs = sorted(((j, p, _code(skeys[j])) for j, p in enumerate(nb.sources) if p not in (PROC_NULL, me)),
                            key=lambda t: t[2])
        to_me: dict[int, list[int]] = {}
        for i, q in enumerate(nb.destinations):
            if q == me:
                to_me.setdefault(_code(dkeys[i]), []).append(i)
        self.local = []
        for j, p in enumerate(nb.sources):
            if p == me:
                mine = to_me.get(_code(skeys[j]))
                if not mine:
                    raise MPIException(ERR_TOPOLOGY, f"{call}: rank {me} lists itself as a source more often "
                                                     "than as a destination")
                self.local.append((mine.pop(0), j))
        if any(to_me.values()):
            raise MPIException(ERR_TOPOLOGY, f"{call}: rank {me} lists itself as a destination more often "
                                             "than as a source")


class _Exchange:
    """A neighbourhood exchange in flight: its receives and sends, then ``after`` (the
    staged unpacks of a receive type with gaps)."""

    __slots__ = ("_reqs", "_after", "_done", "value")
    source, tag, nbytes, cancelled = ANY_SOURCE, ANY_TAG, 0, False   # (a collective's status)

    def __init__(self, reqs: list[Request], after: Callable[[], Any] | None) -> None:
        self._reqs, self._after, self._done, self.value = reqs, after, False, None

    def test(self) -> bool:
        if not self._done and Request.Testall(self._reqs):
            self.wait()
        return self._done

    def wait(self) -> None:
        if self._done:
            return
        try:
            for r in self._reqs:
                r.Wait()
        except BaseException:
            for r in self._reqs:      # the others: no receive left posted to catch a later message
                try:
                    if r and not r.Test():
                        r.Cancel()
                except Exception:  # noqa: BLE001 - the first error is the one to raise
                    pass
            self._done = True
            raise
        self._done = True
        if self._after is not None:
            self._after()

    def cancel(self) -> None:
        return None     # a collective cannot be cancelled (MPI: erroneous); it completes


def _exchange(on: tuple[Any, int, Plan], s_at: Sequence[tuple[int, int]], send: np.ndarray,
              r_at: Sequence[tuple[int, int]], recv: np.ndarray, aop: bool, call: str, staged: Staged) -> Any:
    """Send block i (``send[off:off+len]``, ``s_at[i]``) to destination i and receive the block
    from source j into ``recv`` at ``r_at[j]`` (then ``staged``), ``on`` (twin, tag base,
    plan): an :class:`_Exchange`, waited for here unless ``aop``."""
    twin, base, plan = on
    sends = []
    for i, q, code in plan.sends:
        off, length = s_at[i]
        sends.append(twin.Isend(send[off:off + length], q, base | code))
    reqs = []               # the receives waited for first: a large send is lent, and its
    for j, p, code in plan.recvs:      # wait lasts until the peer's receive reads it
        off, length = r_at[j]
        reqs.append(twin.Irecv(recv[off:off + length], p, base | code))
    reqs += sends
    for i, j in plan.local:
        (so, sl), (ro, rl) = s_at[i], r_at[j]
        if sl > rl:
            raise MPIException(ERR_TRUNCATE, f"{call}: a block of {sl} elements to itself does not fit "
                                             f"its receive block of {rl}")
        recv[ro:ro + sl] = send[so:so + sl]
    op = _Exchange(reqs, finisher(staged))
    if aop:
        return op
    op.wait()
    return None


def _plain(sendbuf: Any, recvbuf: Any) -> bool:
    """Both buffers plain C-contiguous numpy arrays of one dtype MPI names, the receive one
    writable: their elements are the blocks, no spec to parse."""
    return (type(sendbuf) is np.ndarray and type(recvbuf) is np.ndarray and sendbuf.dtype == recvbuf.dtype
            and sendbuf.dtype in _BY_NUMPY and sendbuf.flags.c_contiguous and recvbuf.flags.c_contiguous
            and recvbuf.flags.writeable)


def _even(k: int, count: int) -> list[tuple[int, int]]:
    return [(i * k, k) for i in range(count)]


class NeighborCollectives:
    """The neighbourhood collectives of a topology communicator (``_neighbor_plan`` from Topocomm)."""

    __slots__ = ()

    _grp: Callable[..., Any]
    _neighbor_plan: Callable[[str], tuple[Any, int, Plan]]

    # -- buffers -----------------------------------------------------------------------------
    def _n_allgather(self, sendbuf: Any, recvbuf: Any, aop: bool, call: str) -> Any:
        _check_not_in_place(sendbuf, call)
        on = self._neighbor_plan(call)
        nb = on[2].nb
        send, _ = simple(sendbuf, call, "sendbuf")
        st: Staged = []
        recv, k, dt = blocks(recvbuf, len(nb.sources), call, "recvbuf", writable=True, staged=st)
        return _exchange(on, [(0, send.size)] * len(nb.destinations), send,
                         _even(k * dt._t.mult, len(nb.sources)), recv, aop, call, st)

    def _n_allgatherv(self, sendbuf: Any, recvbuf: Any, aop: bool, call: str) -> Any:
        _check_not_in_place(sendbuf, call)
        on = self._neighbor_plan(call)
        nb = on[2].nb
        send, _ = simple(sendbuf, call, "sendbuf")
        st: Staged = []
        recv, counts, displs, dt = vector(recvbuf, len(nb.sources), call, "recvbuf", writable=True, staged=st)
        m = dt._t.mult
        return _exchange(on, [(0, send.size)] * len(nb.destinations), send,
                         [(d * m, c * m) for c, d in zip(counts, displs)], recv, aop, call, st)

    def _n_alltoall(self, sendbuf: Any, recvbuf: Any, aop: bool, call: str) -> Any:
        on = self._neighbor_plan(call)
        nb = on[2].nb
        outdeg, indeg = len(nb.destinations), len(nb.sources)
        if _plain(sendbuf, recvbuf):     # (what blocks() gives them, without the spec's parse)
            ks, k = sendbuf.size // outdeg if outdeg else 0, recvbuf.size // indeg if indeg else 0
            return _exchange(on, _even(ks, outdeg), sendbuf.reshape(-1), _even(k, indeg), recvbuf.reshape(-1),
                             aop, call, [])
        _check_not_in_place(sendbuf, call)
        send, ks, sdt = blocks(sendbuf, outdeg, call, "sendbuf")
        st: Staged = []
        recv, k, dt = blocks(recvbuf, indeg, call, "recvbuf", writable=True, staged=st)
        return _exchange(on, _even(ks * sdt._t.mult, outdeg), send, _even(k * dt._t.mult, indeg), recv,
                         aop, call, st)

    def _n_alltoallv(self, sendbuf: Any, recvbuf: Any, aop: bool, call: str) -> Any:
        _check_not_in_place(sendbuf, call)
        on = self._neighbor_plan(call)
        nb = on[2].nb
        send, scounts, sdispls, sdt = vector(sendbuf, len(nb.destinations), call, "sendbuf")
        st: Staged = []
        recv, rcounts, rdispls, dt = vector(recvbuf, len(nb.sources), call, "recvbuf", writable=True, staged=st)
        sm, m = sdt._t.mult, dt._t.mult
        return _exchange(on, [(d * sm, c * sm) for c, d in zip(scounts, sdispls)], send,
                         [(d * m, c * m) for c, d in zip(rcounts, rdispls)], recv, aop, call, st)

    def _n_alltoallw(self, sendbuf: Any, recvbuf: Any, aop: bool, call: str) -> Any:
        _check_not_in_place(sendbuf, call)
        on = self._neighbor_plan(call)
        nb = on[2].nb
        st: Staged = []
        rbytes, rcounts, rdispls = _wspec(recvbuf, len(nb.sources), call, "recvbuf", st)
        sbytes, scounts, sdispls = _wspec(sendbuf, len(nb.destinations), call, "sendbuf", None)
        return _exchange(on, list(zip(sdispls, scounts)), sbytes, list(zip(rdispls, rcounts)), rbytes,
                         aop, call, st)

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
        return persistent(lambda: fn(sendbuf, recvbuf, True, call))

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
        """sendobjs[i] to destination i (pickled, on the twin); the list of what each source
        sent (None from PROC_NULL)."""
        twin, base, plan = self._neighbor_plan(call)   # type: ignore[attr-defined]
        sends = [twin.isend(sendobjs[i], q, base | code) for i, q, code in plan.sends]
        recvs = [(j, twin.irecv(source=p, tag=base | code)) for j, p, code in plan.recvs]
        result: list[Any] = [None] * len(plan.nb.sources)
        for i, j in plan.local:           # (a copy, as every object received is)
            result[j] = pickle.loads(pickle.dumps(sendobjs[i]))
        for j, r in recvs:
            result[j] = r.wait()
        Request.Waitall(sends)
        return result

    def neighbor_allgather(self, sendobj: Any) -> list[Any]:
        """The object of each in-neighbour, in ``inedges`` order (None from PROC_NULL)."""
        return self._n_objects([sendobj] * len(self._neighbor_plan("neighbor_allgather")[2].nb.destinations),
                               "neighbor_allgather")

    def neighbor_alltoall(self, sendobj: Sequence[Any]) -> list[Any]:
        """``sendobj[i]`` to out-neighbour i; what each in-neighbour sent, in order."""
        nb = self._neighbor_plan("neighbor_alltoall")[2].nb
        objs = list(sendobj)
        if len(objs) != len(nb.destinations):
            raise ValueError(f"neighbor_alltoall: expecting {len(nb.destinations)} objects (one per "
                             f"out-neighbour), got {len(objs)}")
        return self._n_objects(objs, "neighbor_alltoall")
