"""What the equal-block buffer collectives do: the implementations behind
:class:`._coll.BufferCollectives` (and its ``I…``/``…_init`` forms).

Each ``_name`` method of :class:`BufferCollectivesImpl` turns its buffer specs into views
(:mod:`._msg`), maps MPI's conventions onto one call of :mod:`collcomm.core.collectives`
and lets the core check the rest (root range, sizes that fit, dtypes, op against dtype);
core errors come back as ``MPI.Exception`` (:func:`_run`). With ``aop`` it returns the
core's Work, which :func:`_request` makes a :class:`Request`.

* ``IN_PLACE``: Gather/Scatter at the root (its block stays where it is), Allgather (the
  rank's block already in ``recvbuf``), Alltoall, Reduce at the root, Allreduce,
  Reduce_scatter(_block) (the input is ``recvbuf``; the result goes to its start).
* Block specs (``recvbuf`` of Gather/Allgather/Alltoall, ``sendbuf`` of Scatter): an
  explicit count is one rank's block; otherwise the buffer splits evenly.
* ``Allreduce(sendbuf, recvbuf)`` copies ``sendbuf`` into ``recvbuf`` and reduces in place.
* ``Reduce_scatter`` with unequal ``recvcounts`` pads every block to the largest count;
  ``recvcounts=None`` gathers each rank's receive count first.
* A user op made with ``commute=False`` is combined in rank order here: the blocks are
  gathered (or exchanged, for the reduce-scatters) through the core and folded locally.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..core import collectives as core
from ..errors import CollcommError
from ._errors import ERR_BUFFER, Exception as MPIException, translate
from ._msg import IN_PLACE, blocks, simple
from ._staging import Staged, finisher
from ._ops import core_op, fold
from ._types import Datatype


def _run(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    except CollcommError as exc:
        raise translate(exc) from exc


def _not_root_in_place(call: str, what: str) -> MPIException:
    return MPIException(ERR_BUFFER, f"{call}: MPI.IN_PLACE as {what} is only for the root")



class BufferCollectivesImpl:
    """The implementations of the equal-block buffer collectives (``self._grp(call)`` gives
    the communicator's group; ``aop``: return the core's Work)."""

    __slots__ = ()

    _grp: Callable[..., Any]      # the communicator's group, from Comm

    def _barrier(self, aop: bool, call: str) -> Any:
        return _run(core.barrier, self._grp(call), async_op=aop, name=call)

    def _bcast(self, buf: Any, root: int, aop: bool, call: str) -> Any:
        g = self._grp(call)
        st: Staged = []
        arr, dt = simple(buf, call, "buf", writable=g.rank != root, staged=st)
        if not arr.flags.writeable:      # a read-only buffer at the root (bytes): MPI only reads it
            arr = arr.copy()
        return _run(core.broadcast, g, arr, root, dtype=dt._t.core, async_op=aop, name=call,
                    after=finisher(st))

    def _gather(self, sendbuf: Any, recvbuf: Any, root: int, aop: bool, call: str) -> Any:
        g = self._grp(call)
        recv, st = None, []
        if g.rank == root:
            recv, k, dt = blocks(recvbuf, g.size, call, "recvbuf", writable=True, staged=st)
        if sendbuf is IN_PLACE:
            if recv is None:
                raise _not_root_in_place(call, "sendbuf")
            m = dt._t.mult
            send = recv[g.rank * k * m:(g.rank + 1) * k * m]
        else:
            send, dt = simple(sendbuf, call, "sendbuf")
        return _run(core.gather, g, send, recv, root, dtype=dt._t.core, async_op=aop, name=call,
                    after=finisher(st))

    def _scatter(self, sendbuf: Any, recvbuf: Any, root: int, aop: bool, call: str) -> Any:
        g = self._grp(call)
        send, st = None, []
        if g.rank == root:
            send, k, dt = blocks(sendbuf, g.size, call, "sendbuf")
        if recvbuf is IN_PLACE:
            if send is None:
                raise _not_root_in_place(call, "recvbuf")
            recv = np.empty(k * dt._t.mult, dtype=send.dtype)     # the root keeps its block
        else:
            recv, dt = simple(recvbuf, call, "recvbuf", writable=True, staged=st)
        return _run(core.scatter, g, send, recv, root, dtype=dt._t.core, async_op=aop, name=call,
                    after=finisher(st))

    def _allgather(self, sendbuf: Any, recvbuf: Any, aop: bool, call: str) -> Any:
        g = self._grp(call)
        st: Staged = []
        recv, k, dt = blocks(recvbuf, g.size, call, "recvbuf", writable=True, staged=st)
        if sendbuf is IN_PLACE:
            m = dt._t.mult
            send = recv[g.rank * k * m:(g.rank + 1) * k * m]
        else:
            send, dt = simple(sendbuf, call, "sendbuf")
        return _run(core.all_gather, g, send, recv, dtype=dt._t.core, async_op=aop, name=call,
                    after=finisher(st))

    def _alltoall(self, sendbuf: Any, recvbuf: Any, aop: bool, call: str) -> Any:
        g = self._grp(call)
        n = g.size
        st: Staged = []
        recv, k, dt = blocks(recvbuf, n, call, "recvbuf", writable=True, staged=st)
        ks, rm = k, dt._t.mult
        send = recv                       # IN_PLACE: the core copies an overlapping input
        if sendbuf is not IN_PLACE:      # (its datatype may differ: the same basic elements)
            send, ks, dt = blocks(sendbuf, n, call, "sendbuf")
        if not send.flags.writeable:    # see _collv._a2a
            send = send.copy()
        return _run(core.all_to_all, g, send, [ks * dt._t.mult] * n, recv, [k * rm] * n, dtype=dt._t.core,
                    async_op=aop, name=call, after=finisher(st))

    def _reduce(self, sendbuf: Any, recvbuf: Any, op: Any, root: int, aop: bool, call: str) -> Any:
        g = self._grp(call)
        recv, st = None, []
        if g.rank == root:
            recv, dt = simple(recvbuf, call, "recvbuf", writable=True, staged=st)
        if sendbuf is IN_PLACE:
            if recv is None:
                raise _not_root_in_place(call, "sendbuf")
            send = recv
        else:
            send, dt = simple(sendbuf, call, "sendbuf")
        rop, ordered = core_op(op, dt, call)
        if ordered:
            parts = np.empty(g.size * send.size, dtype=send.dtype) if recv is not None else None
            after = (lambda: fold(op, dt, parts, g.size, recv)) if recv is not None else None
            return _run(core.gather, g, send.copy(), parts, root, dtype=dt._t.core, async_op=aop,
                        name=call, after=finisher(st, after))
        return _run(core.reduce, g, send, recv, rop, root, dtype=dt._t.core, async_op=aop, name=call,
                    after=finisher(st))

    def _allreduce(self, sendbuf: Any, recvbuf: Any, op: Any, aop: bool, call: str) -> Any:
        g = self._grp(call)
        st: Staged = []
        recv, dt = simple(recvbuf, call, "recvbuf", writable=True, staged=st)
        if sendbuf is not IN_PLACE:
            send, sdt = simple(sendbuf, call, "sendbuf")
            if sdt._t.key() != dt._t.key() or send.size != recv.size:   # (same basic type and count)
                raise ValueError(f"{call}: sendbuf holds {send.size // sdt._t.mult} {sdt.Get_name()} "
                                 f"elements and recvbuf {recv.size // dt._t.mult} {dt.Get_name()}; "
                                 "they must be the same")
            np.copyto(recv, send)
        rop, ordered = core_op(op, dt, call)
        if ordered:
            parts = np.empty(g.size * recv.size, dtype=recv.dtype)
            return _run(core.all_gather, g, recv.copy(), parts, dtype=dt._t.core, async_op=aop, name=call,
                        after=finisher(st, lambda: fold(op, dt, parts, g.size, recv)))
        return _run(core.all_reduce, g, recv, rop, dtype=dt._t.core, async_op=aop, name=call,
                    after=finisher(st))

    def _reduce_scatter_block(self, sendbuf: Any, recvbuf: Any, op: Any, aop: bool, call: str) -> Any:
        g = self._grp(call)
        n, st = g.size, []
        if sendbuf is IN_PLACE:
            send, k, dt = blocks(recvbuf, n, call, "recvbuf", writable=True, staged=st)
            recv = send[:k * dt._t.mult]
        else:
            recv, dt = simple(recvbuf, call, "recvbuf", writable=True, staged=st)
            send, _, sdt = blocks(sendbuf, n, call, "sendbuf")
            send = send[:n * recv.size] if send.size >= n * recv.size else send
        return self._reduce_blocks(g, send, recv, [recv.size] * n, op, dt, aop, call, st)

    def _reduce_blocks(self, g: Any, send: np.ndarray, recv: np.ndarray, counts: list[int], op: Any,
                       dt: Datatype, aop: bool, call: str, st: Staged) -> Any:
        """Reduce ``send`` (blocks of ``counts`` base elements, packed) and give rank r block r;
        ``st``: what unpacks ``recv`` after (a derived type with gaps)."""
        n, r = g.size, g.rank
        rop, ordered = core_op(op, dt, call)
        if ordered:       # exchange the blocks, then fold the n pieces of ours in rank order
            parts = np.empty(n * counts[r], dtype=send.dtype)
            return _run(core.all_to_all, g, send.copy(), counts, parts, [counts[r]] * n,
                        dtype=dt._t.core, async_op=aop, name=call,
                        after=finisher(st, lambda: fold(op, dt, parts, n, recv[:counts[r]])))
        if len(set(counts)) <= 1:
            c = counts[0] if counts else 0
            return _run(core.reduce_scatter, g, send[:n * c], recv[:c], rop, dtype=dt._t.core,
                        async_op=aop, name=call, after=finisher(st))
        width = max(counts)                            # unequal blocks: pad each to the widest
        padded = np.zeros(n * width, dtype=send.dtype)
        pos = 0
        for j, c in enumerate(counts):
            padded[j * width:j * width + c] = send[pos:pos + c]
            pos += c
        out = np.empty(width, dtype=send.dtype)
        return _run(core.reduce_scatter, g, padded, out, rop, dtype=dt._t.core, async_op=aop, name=call,
                    after=finisher(st, lambda: np.copyto(recv[:counts[r]], out[:counts[r]])))

    def _reduce_scatter(self, sendbuf: Any, recvbuf: Any, recvcounts: Any, op: Any, aop: bool,
                        call: str) -> Any:
        g = self._grp(call)
        st: Staged = []
        recv, dt = simple(recvbuf, call, "recvbuf", writable=True, staged=st)
        m = dt._t.mult
        if recvcounts is None:             # every rank's receive count, gathered first
            mine = np.array([recv.size // m if sendbuf is not IN_PLACE else -1], dtype=np.int64)
            if sendbuf is IN_PLACE:
                raise ValueError(f"{call}: with MPI.IN_PLACE give recvcounts")
            all_counts = np.empty(g.size, dtype=np.int64)
            _run(core.all_gather, g, mine, all_counts, name=call)
            recvcounts = all_counts.tolist()
        counts = [int(c) * m for c in recvcounts]
        if len(counts) != g.size:
            raise ValueError(f"{call}: expecting {g.size} recvcounts (one per rank), got {len(counts)}")
        if sendbuf is IN_PLACE:
            send = recv[:sum(counts)].copy()
        else:
            send, _ = simple(sendbuf, call, "sendbuf")
        if send.size != sum(counts) or recv.size < counts[g.rank]:
            raise ValueError(f"{call}: sendbuf must hold sum(recvcounts) = {sum(counts) // m} elements "
                             f"(has {send.size // m}) and recvbuf at least {counts[g.rank] // m} "
                             f"(has {recv.size // m})")
        return self._reduce_blocks(g, send, recv, counts, op, dt, aop, call, st)
