"""Blocking collectives with derived datatypes with gaps, the short way: the message is
packed into an array (a receive buffer into a packed temporary filled from the memory),
the same method runs on the arrays, which takes the group's fast call, and the
temporary is unpacked into place. Each function returns False when it does not apply
(no spec with gaps, ``IN_PLACE``, a user op, bfloat16's bits; for a reduction, pairs
and structs of mixed types), checked before anything is parsed; the method then goes the general way,
which handles all of those. A rank on either way works with ranks on the other.
"""
from __future__ import annotations

from typing import Any

from ._msg import IN_PLACE, blocks, gapped, simple
from ._staging import unpack_staged


def _fits(*specs: Any, reduction: bool = False) -> bool:
    """Some spec has a type with gaps, and every such type's packed array carries what the
    core would be told (not bfloat16's bits; for a reduction, one basic type, no pairs)."""
    found = False
    for spec in specs:
        if gapped(spec):
            t = spec[-1]._t
            if t.core is not t.base or (reduction and (t.mixed or t.pair)):
                return False
            found = True
    return found


def _done(staged: list[Any]) -> bool:
    unpack_staged(staged)
    return True


def bcast(comm: Any, buf: Any, root: int) -> bool:
    if not _fits(buf):
        return False
    g, st = comm._grp("Bcast"), []
    arr, _ = simple(buf, "Bcast", "buf", writable=g.rank != root, staged=st)
    comm.Bcast(arr, root)
    return _done(st)


def allreduce(comm: Any, sendbuf: Any, recvbuf: Any, op: Any) -> bool:
    if sendbuf is IN_PLACE or not _fits(sendbuf, recvbuf, reduction=True):
        return False
    st: list[Any] = []
    recv, _ = simple(recvbuf, "Allreduce", "recvbuf", writable=True, staged=st)
    send, _ = simple(sendbuf, "Allreduce", "sendbuf")
    comm.Allreduce(send, recv, op)
    return _done(st)


def reduce(comm: Any, sendbuf: Any, recvbuf: Any, op: Any, root: int) -> bool:
    g = comm._grp("Reduce")
    mine = recvbuf if g.rank == root else None
    if sendbuf is IN_PLACE or not _fits(sendbuf, mine, reduction=True):
        return False
    st: list[Any] = []
    recv = None if mine is None else simple(mine, "Reduce", "recvbuf", writable=True, staged=st)[0]
    send, _ = simple(sendbuf, "Reduce", "sendbuf")
    comm.Reduce(send, recv, op, root)
    return _done(st)


def gather(comm: Any, sendbuf: Any, recvbuf: Any, root: int) -> bool:
    g = comm._grp("Gather")
    mine = recvbuf if g.rank == root else None
    if sendbuf is IN_PLACE or not _fits(sendbuf, mine):
        return False
    st: list[Any] = []
    recv = None if mine is None else blocks(mine, g.size, "Gather", "recvbuf", writable=True, staged=st)[0]
    send, _ = simple(sendbuf, "Gather", "sendbuf")
    comm.Gather(send, recv, root)
    return _done(st)


def scatter(comm: Any, sendbuf: Any, recvbuf: Any, root: int) -> bool:
    g = comm._grp("Scatter")
    mine = sendbuf if g.rank == root else None
    if recvbuf is IN_PLACE or not _fits(mine, recvbuf):
        return False
    st: list[Any] = []
    send = None if mine is None else blocks(mine, g.size, "Scatter", "sendbuf")[0]
    recv, _ = simple(recvbuf, "Scatter", "recvbuf", writable=True, staged=st)
    comm.Scatter(send, recv, root)
    return _done(st)


def allgather(comm: Any, sendbuf: Any, recvbuf: Any) -> bool:
    if sendbuf is IN_PLACE or not _fits(sendbuf, recvbuf):
        return False
    g, st = comm._grp("Allgather"), []
    recv = blocks(recvbuf, g.size, "Allgather", "recvbuf", writable=True, staged=st)[0]
    send, _ = simple(sendbuf, "Allgather", "sendbuf")
    comm.Allgather(send, recv)
    return _done(st)


def alltoall(comm: Any, sendbuf: Any, recvbuf: Any) -> bool:
    if sendbuf is IN_PLACE or not _fits(sendbuf, recvbuf):
        return False
    g, st = comm._grp("Alltoall"), []
    recv = blocks(recvbuf, g.size, "Alltoall", "recvbuf", writable=True, staged=st)[0]
    send = blocks(sendbuf, g.size, "Alltoall", "sendbuf")[0]
    comm.Alltoall(send, recv)
    return _done(st)
