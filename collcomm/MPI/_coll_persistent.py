"""Persistent buffer collectives (MPI 4): ``Barrier_init``, ``Bcast_init``, ``Gather_init``,
``Scatter_init``, ``Allgather_init``, ``Alltoall_init``, ``Reduce_init``, ``Allreduce_init``,
``Reduce_scatter_block_init``, ``Reduce_scatter_init`` (the v forms and the scans use
:func:`private_comm` too, in :mod:`._collv`; the v forms start through :func:`_start` with
the fast call's own v entries).

Each returns a persistent request (:func:`._prequest.persistent`) whose ``Start()`` runs the
call as its ``I…`` form would, through the same implementation of
:class:`._coll.BufferCollectives` (the buffers and arguments given here, read anew at each
start), or, for the calls the fast call starts in two parts, its entry with the arguments
worked out at ``…_init`` (:class:`_Prepared`; the ``I…`` form where it declines); ``info``
is accepted and ignored.

MPI lets ranks start persistent collectives in different orders (only MPI 4.1's
``mpi_assert_strict_persistent_collective_ordering`` promises the same order), so each
request runs on a communicator of its own, made by ``…_init`` (:func:`private_comm`): its
context derives from the parent's (every rank makes the same one, in the order of the
``…_init`` calls, which MPI requires to be the same), its calls are numbered on it alone,
and it moves on while the caller waits for another request: one thread per parent group
watches all its requests' queues and hands a call left waiting to that request's runner
thread (:mod:`collcomm.core.async_watch`; no thread polls per request). Its
shared-memory arena (built at the first ``Start``) has slots the size of the largest
buffer rank 0 passed (rank 0 makes the arena: a rooted request whose root is another rank
may get smaller slots than the root's buffer), at most :data:`SLOT_MAX` (not ``COLLCOMM_SHM_SLOT``'s 4 MiB), so a request
costs /dev/shm twice that (plus a page) per rank: 8 MiB at most for 16 ranks. Larger
calls take more steps through it (at 2 ranks, 256 KiB slots measured as fast as 4 MiB ones
from 256 KiB to 16 MiB: those calls mostly read peers' memory directly). ``Free()``
closes it, and so does dropping the last reference to an inactive request
(:class:`._prequest._Persistent`).
"""
from __future__ import annotations

from typing import Any, Callable

from ._coll import BufferCollectives, _builtin
from ._msg import IN_PLACE, pinned
from ._msg_plain import as_array, bound_at_init
from ._ops import SUM, pinned_op
from ._prequest import persistent
from ._request_makers import workop_started


#: the largest slot of a persistent collective's arena (bytes)
SLOT_MAX = 256 << 10


def _nbytes(spec: Any) -> int:
    """The bytes of a buffer spec's buffer (its first item for a list spec), SLOT_MAX if
    it cannot tell."""
    if isinstance(spec, (list, tuple)) and spec:
        spec = spec[0]
    if spec is None or spec is IN_PLACE:
        return 0
    nbytes = getattr(spec, "nbytes", None)       # numpy arrays, torch tensors
    if isinstance(nbytes, int):
        return nbytes
    try:
        return memoryview(spec).nbytes
    except TypeError:
        return SLOT_MAX


def private_comm(comm: Any, call: str, *bufs: Any) -> Any:
    """The communicator a persistent collective of ``comm`` made by ``call`` runs on (see
    the module docstring): same ranks, a context of its own, an arena with slots of the
    largest of ``bufs`` (up to SLOT_MAX)."""
    g = comm._grp(call)
    h = comm._h
    ctx = h.next_ctx("persistent")
    slot = min(max([_nbytes(b) for b in bufs] + [1]), SLOT_MAX)
    sub = g.watched_subgroup(ctx, f"{g.name}.{call}", slot)
    return comm._wrap(type(h)(sub, "derived"))


class _Prepared:
    """A persistent collective's ``Start`` through the fast call's two-part entry named
    ``entry``, its arguments worked out once at ``…_init`` (the buffers, root and op are
    fixed there): one C call and the op, without the ``I…`` form's frames; where the entry
    declines (or the group has no fast call), ``general()``, the ``I…`` form itself. Once
    the group has its fast call (built by the first call on it), ``quick[0]`` is that C
    call bound to its arguments, ``(entry, *args)`` for ``workop_started(entry, *args)``
    (a tuple: the C ``Start`` makes that call without a ``partial``; :func:`._prequest.
    quick_call` where Python starts it), which ``Prequest.Start`` makes first (no Python
    frame: ~1-1.5 µs a Start on the project's VM, BENCHMARKS.md session 38); a closed
    group's entry declines, and this runs."""

    __slots__ = ("g", "entry", "args", "general", "quick", "unprepared")

    #: entries that work out their own call once (native/_fastcall_vroot.c vr_aop): the
    #: index of their ``aop`` argument, given Ellipsis for ``(entry, args)`` of the call
    #: they would make (their specs read and count lists built once, not at every start)
    PREPARES = {"gatherv": 5, "scatterv": 5, "allgatherv": 4, "alltoallv": 4}

    def __init__(self, c: Any, entry: str, args: tuple, general: Callable[[], Any]) -> None:
        self.g, self.entry, self.args, self.general = c._h.g, entry, args, general
        self.quick: list[Any] = [None]
        self.unprepared = entry in self.PREPARES

    def _prepare(self, fast: Any) -> None:
        """Once the group has its fast call: the call the entry would make at every start,
        worked out now (None from the entry, or an error: it stays as it is, and the start
        itself declines or raises)."""
        self.unprepared = False
        at = self.PREPARES[self.entry]
        try:
            made = getattr(fast, self.entry)(*self.args[:at], ..., *self.args[at + 1:])
        except Exception:  # noqa: BLE001 - the start itself says what is wrong
            return
        if made is not None:
            self.entry, self.args = made

    def __call__(self) -> Any:
        fast = self.g.fast
        if fast is not None:
            if self.unprepared:
                self._prepare(fast)
            start = (getattr(fast, self.entry),) + self.args
            op = workop_started(*start)
            if op is not None:
                self.quick[0] = start      # (only where it starts: declined, it is not tried again)
                return op
        self.quick[0] = None
        return self.general()


def _fast(spec: Any, call: str, role: str, writable: bool = False, per: int = 0, reduction: bool = False) -> Any:
    """What the fast call's entry is given for a buffer spec: the array the spec stands
    for (``[x, MPI.DOUBLE]``: x; :func:`._msg.as_array`), else the spec (which it declines:
    the ``I…`` form then runs). ``reduction``: only a spec whose datatype reduces as its
    array's dtype (:func:`._msg_plain.reducible_type`)."""
    if not bound_at_init(spec):
        return spec
    a = as_array(spec, call, role, writable, per, reduction)
    return spec if a is None else a


def _start(c: Any, entry: str, args: tuple | None, general: Callable[[], Any]) -> Callable[[], Any]:
    """What ``Start`` calls: the prepared fast start when ``args`` are given, else ``general``."""
    return general if args is None else _Prepared(c, entry, args, general)


class PersistentCollectives(BufferCollectives):
    """The ``…_init`` forms of the equal-block buffer collectives."""

    __slots__ = ()

    def Barrier_init(self, info: Any = None) -> Any:  # noqa: N802
        c = private_comm(self, "Barrier_init")
        general = lambda: c._ibarrier("Barrier_init")._op  # noqa: E731
        return persistent(_start(c, "barrier_async", ("Barrier_init",), general), c)

    def Bcast_init(self, buf: Any, root: int = 0, info: Any = None) -> Any:  # noqa: N802
        buf = pinned(buf)
        c = private_comm(self, "Bcast_init", buf)
        general = lambda: c._ibcast(buf, root, "Bcast_init")._op  # noqa: E731
        fast = _fast(buf, "Bcast_init", "buf", c.rank != root)
        return persistent(_start(c, "broadcast_async", (fast, root, "Bcast_init"), general), c)

    def Gather_init(self, sendbuf: Any, recvbuf: Any, root: int = 0, info: Any = None) -> Any:  # noqa: N802
        if sendbuf is None:            # (mpi4py: None is IN_PLACE)
            sendbuf = IN_PLACE
        sendbuf, recvbuf = pinned(sendbuf), pinned(recvbuf)
        c = private_comm(self, "Gather_init", sendbuf, recvbuf)
        general = lambda: c._igather(sendbuf, recvbuf, root, "Gather_init")._op  # noqa: E731
        recv = _fast(recvbuf, "Gather_init", "recvbuf", True, c.size) if c.rank == root else None
        send = _fast(sendbuf, "Gather_init", "sendbuf")
        return persistent(_start(c, "gather_async", (send, recv, root, "Gather_init"), general), c)

    def Scatter_init(self, sendbuf: Any, recvbuf: Any, root: int = 0, info: Any = None) -> Any:  # noqa: N802
        if recvbuf is None:            # (mpi4py: None is IN_PLACE)
            recvbuf = IN_PLACE
        sendbuf, recvbuf = pinned(sendbuf), pinned(recvbuf)
        c = private_comm(self, "Scatter_init", sendbuf, recvbuf)
        general = lambda: c._iscatter(sendbuf, recvbuf, root, "Scatter_init")._op  # noqa: E731
        send = _fast(sendbuf, "Scatter_init", "sendbuf", False, c.size) if c.rank == root else None
        recv = _fast(recvbuf, "Scatter_init", "recvbuf", True)
        return persistent(_start(c, "scatter_async", (send, recv, root, "Scatter_init"), general), c)

    def Allgather_init(self, sendbuf: Any, recvbuf: Any, info: Any = None) -> Any:  # noqa: N802
        if sendbuf is None:            # (mpi4py: None is IN_PLACE)
            sendbuf = IN_PLACE
        sendbuf, recvbuf = pinned(sendbuf), pinned(recvbuf)
        c = private_comm(self, "Allgather_init", sendbuf, recvbuf)
        general = lambda: c._iallgather(sendbuf, recvbuf, "Allgather_init")._op  # noqa: E731
        args = (_fast(sendbuf, "Allgather_init", "sendbuf"), _fast(recvbuf, "Allgather_init", "recvbuf", True, c.size),
                "Allgather_init")
        return persistent(_start(c, "all_gather_async", args, general), c)

    def Alltoall_init(self, sendbuf: Any, recvbuf: Any, info: Any = None) -> Any:  # noqa: N802
        if sendbuf is None:            # (mpi4py: None is IN_PLACE)
            sendbuf = IN_PLACE
        sendbuf, recvbuf = pinned(sendbuf), pinned(recvbuf)
        c = private_comm(self, "Alltoall_init", sendbuf, recvbuf)
        general = lambda: c._ialltoall(sendbuf, recvbuf, "Alltoall_init")._op  # noqa: E731
        args = (_fast(sendbuf, "Alltoall_init", "sendbuf", False, c.size),
                _fast(recvbuf, "Alltoall_init", "recvbuf", True, c.size), "Alltoall_init")
        return persistent(_start(c, "all_to_all_async", args, general), c)

    def Reduce_init(self, sendbuf: Any, recvbuf: Any, op: Any = SUM, root: int = 0, info: Any = None) -> Any:  # noqa: N802
        if sendbuf is None:            # (mpi4py: None is IN_PLACE)
            sendbuf = IN_PLACE
        sendbuf, recvbuf = pinned(sendbuf), pinned(recvbuf)
        op = pinned_op(op)
        c = private_comm(self, "Reduce_init", sendbuf, recvbuf)
        general = lambda: c._ireduce(sendbuf, recvbuf, op, root, "Reduce_init")._op  # noqa: E731
        builtin = _builtin(op)
        recv = _fast(recvbuf, "Reduce_init", "recvbuf", True, 0, True) if c.rank == root else None
        send = recv if sendbuf is IN_PLACE else _fast(sendbuf, "Reduce_init", "sendbuf", False, 0, True)
        args = (send, recv, builtin, root, "Reduce_init")
        return persistent(_start(c, "reduce_async", args if builtin is not None else None, general), c)

    def Allreduce_init(self, sendbuf: Any, recvbuf: Any, op: Any = SUM, info: Any = None) -> Any:  # noqa: N802
        if sendbuf is None:            # (mpi4py: None is IN_PLACE)
            sendbuf = IN_PLACE
        sendbuf, recvbuf = pinned(sendbuf), pinned(recvbuf)
        op = pinned_op(op)
        c = private_comm(self, "Allreduce_init", sendbuf, recvbuf)
        general = lambda: c._iallreduce(sendbuf, recvbuf, op, "Allreduce_init")._op  # noqa: E731
        builtin = _builtin(op)
        recv = _fast(recvbuf, "Allreduce_init", "recvbuf", True, 0, True)
        send = recv if sendbuf is IN_PLACE else _fast(sendbuf, "Allreduce_init", "sendbuf", False, 0, True)
        args = (send, recv, builtin, "Allreduce_init")
        return persistent(_start(c, "all_reduce_async", args if builtin is not None else None, general), c)

    def Reduce_scatter_block_init(self, sendbuf: Any, recvbuf: Any, op: Any = SUM, info: Any = None) -> Any:  # noqa: N802
        if sendbuf is None:            # (mpi4py: None is IN_PLACE)
            sendbuf = IN_PLACE
        sendbuf, recvbuf = pinned(sendbuf), pinned(recvbuf)
        op = pinned_op(op)
        c = private_comm(self, "Reduce_scatter_block_init", sendbuf, recvbuf)
        call = "Reduce_scatter_block_init"
        general = lambda: c._ireduce_scatter_block(sendbuf, recvbuf, op, call)._op  # noqa: E731
        builtin = _builtin(op)
        send, recv = _fast(sendbuf, call, "sendbuf", False, c.size, True), _fast(recvbuf, call, "recvbuf", True, 0, True)
        args = (send, recv, builtin, call) if builtin is not None else None
        return persistent(_start(c, "reduce_scatter_async", args, general), c)

    def Reduce_scatter_init(self, sendbuf: Any, recvbuf: Any, recvcounts: Any = None, op: Any = SUM,  # noqa: N802
                            info: Any = None) -> Any:
        if sendbuf is None:            # (mpi4py: None is IN_PLACE)
            sendbuf = IN_PLACE
        sendbuf, recvbuf = pinned(sendbuf), pinned(recvbuf)
        op = pinned_op(op)
        c = private_comm(self, "Reduce_scatter_init", sendbuf, recvbuf)
        return persistent(lambda: c._ireduce_scatter(sendbuf, recvbuf, recvcounts, op,
                                                     "Reduce_scatter_init")._op, c)
