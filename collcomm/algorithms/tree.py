"""Binomial-tree algorithms: broadcast, reduce, gather, scatter (and reduce+broadcast).

Ranks are renumbered relative to the root, ``vrank = (rank - root) mod n``, so the root is
vrank 0. In the binomial tree the parent of vrank v is ``v - mask`` where ``mask`` is v's
lowest set bit, and v's children are ``v + mask`` for every power of two ``mask`` below
that bit (while ``v + mask < n``). The subtree of v covers the vranks
``[v, v + min(lowbit(v), n - v))``, a contiguous range.

* broadcast: receive from the parent, then send to the children, largest subtree first.
* reduce: receive each child's partial result (smallest subtree first), combine it into an
  accumulator, then send the accumulator to the parent.
* gather: each rank collects its subtree's blocks, in vrank order, into one contiguous
  segment and sends it to its parent; the root rotates vrank order into rank order.
* scatter: the reverse of gather: the root rotates, each rank receives its subtree's segment
  and forwards each child's part.

Rounds: ceil(log2 n). Bytes per rank: broadcast/reduce k per edge (the root sends or
receives log2(n)·k); gather/scatter move each block log2(n) times at most, the root
receives/sends (n-1)·k. Good for small and medium messages, and for rooted collectives.
"""
from __future__ import annotations

import numpy as np

from .base import Comm, ReduceFn, wait_all


def _lowbit_mask(vrank: int, n: int) -> int:
    """The lowest set bit of vrank (for vrank 0: the first power of two >= n)."""
    mask = 1
    while mask < n and not vrank & mask:
        mask <<= 1
    return mask


def _children(vrank: int, n: int) -> list[int]:
    """Masks of vrank's children, smallest first."""
    top = _lowbit_mask(vrank, n)
    masks, mask = [], 1
    while mask < top and vrank + mask < n:
        masks.append(mask)
        mask <<= 1
    return masks


def broadcast(comm: Comm, buf: np.ndarray, root: int) -> None:
    n = comm.size
    vrank = (comm.rank - root) % n
    if vrank:
        parent = (vrank - _lowbit_mask(vrank, n) + root) % n
        comm.irecv(buf, parent).wait()
    children = _children(vrank, n)
    wait_all([comm.isend(buf, (vrank + mask + root) % n) for mask in reversed(children)])


def reduce(comm: Comm, send: np.ndarray, recv: np.ndarray | None, fn: ReduceFn, root: int) -> None:
    n = comm.size
    vrank = (comm.rank - root) % n
    children = _children(vrank, n)
    if vrank == 0:
        assert recv is not None
        acc = recv
        np.copyto(acc, send)
    else:
        acc = send.copy() if children else send  # a leaf sends its input as is
    scratch = np.empty_like(send) if children else None
    for mask in children:
        assert scratch is not None
        comm.irecv(scratch, (vrank + mask + root) % n).wait()
        fn(acc, scratch)
    if vrank:
        parent = (vrank - _lowbit_mask(vrank, n) + root) % n
        comm.isend(acc, parent).wait()


def all_reduce(comm: Comm, buf: np.ndarray, fn: ReduceFn) -> None:
    """Binomial reduce to rank 0, then binomial broadcast from rank 0."""
    reduce(comm, buf, buf if comm.rank == 0 else None, fn, 0)
    broadcast(comm, buf, 0)


def _subtree(vrank: int, n: int) -> int:
    return n if vrank == 0 else min(_lowbit_mask(vrank, n), n - vrank)


def _to_rank_order(segment: np.ndarray, out: np.ndarray, root: int, n: int, k: int) -> None:
    """segment holds blocks in vrank order; block v belongs to rank (v + root) mod n."""
    head = (n - root) * k
    np.copyto(out[root * k:], segment[:head])
    np.copyto(out[:root * k], segment[head:])


def _to_vrank_order(buf: np.ndarray, segment: np.ndarray, root: int, n: int, k: int) -> None:
    head = (n - root) * k
    np.copyto(segment[:head], buf[root * k:])
    np.copyto(segment[head:], buf[:root * k])


def gather(comm: Comm, send: np.ndarray, recv: np.ndarray | None, root: int) -> None:
    n = comm.size
    k = send.size
    vrank = (comm.rank - root) % n
    children = _children(vrank, n)
    size = _subtree(vrank, n)
    if vrank == 0:
        assert recv is not None
        segment = recv if root == 0 else np.empty(n * k, dtype=send.dtype)
    else:
        segment = np.empty(size * k, dtype=send.dtype) if children else send
    if segment is not send:
        np.copyto(segment[:k], send)
    handles = []
    for mask in children:
        child = vrank + mask
        count = min(mask, n - child)
        handles.append(comm.irecv(segment[mask * k:(mask + count) * k], (child + root) % n))
    wait_all(handles)
    if vrank:
        parent = (vrank - _lowbit_mask(vrank, n) + root) % n
        comm.isend(segment[:size * k], parent).wait()
    elif root != 0:
        assert recv is not None
        _to_rank_order(segment, recv, root, n, k)


def scatter(comm: Comm, send: np.ndarray | None, recv: np.ndarray, root: int) -> None:
    n = comm.size
    k = recv.size
    vrank = (comm.rank - root) % n
    children = _children(vrank, n)
    size = _subtree(vrank, n)
    if vrank == 0:
        assert send is not None
        if root == 0:
            segment = send
        else:
            segment = np.empty(n * k, dtype=send.dtype)
            _to_vrank_order(send, segment, root, n, k)
    else:
        segment = np.empty(size * k, dtype=recv.dtype) if children else recv
        parent = (vrank - _lowbit_mask(vrank, n) + root) % n
        comm.irecv(segment, parent).wait()
    handles = []
    for mask in reversed(children):
        child = vrank + mask
        count = min(mask, n - child)
        handles.append(comm.isend(segment[mask * k:(mask + count) * k], (child + root) % n))
    if segment is not recv:
        np.copyto(recv, segment[:k])
    wait_all(handles)
