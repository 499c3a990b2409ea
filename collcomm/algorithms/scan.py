"""Prefix reductions (MPI_Scan, MPI_Exscan) by recursive doubling.

Rank r ends with ``x0 ∘ x1 ∘ … ∘ xr`` (scan, *inclusive*) or ``x0 ∘ … ∘ x(r-1)``
(exscan, *exclusive*; rank 0's ``recv`` is left as it was, MPI leaves it undefined). The
op keeps rank order, so it need not be commutative: ``fn(acc, other)`` leaves
``acc ∘ other`` in ``acc`` with ``acc`` the left (lower ranks) operand.

Each rank keeps a *partial*: the reduction of the block of ranks it has heard from so far,
a contiguous range containing itself. In round k (``mask = 2**k``) it exchanges its partial
with ``partner = rank ^ mask`` (when the partner exists):

* the partner is lower: its partial covers ranks just below ours, so it goes on the left:
  ``result = theirs ∘ result`` (or ``result = theirs`` if we had nothing yet, exclusive)
  and ``partial = theirs ∘ partial``;
* the partner is higher: ``partial = partial ∘ theirs`` (the result is unchanged).

After ``ceil(log2 n)`` rounds every rank has its prefix. Cost: ``ceil(log2 n)`` rounds of
one send and one receive of k elements, and up to two combines and two copies of k
elements per round (the copies keep the operand order with an in-place ``fn``).
"""
from __future__ import annotations

import numpy as np

from .base import Comm, ReduceFn, scratch, sendrecv

__all__ = ["scan"]


def scan(comm: Comm, send: np.ndarray, recv: np.ndarray, fn: ReduceFn, exclusive: bool = False) -> None:
    """Prefix ``fn`` over ranks of ``send`` into ``recv`` (same size and dtype; ``send`` is
    not modified and must not overlap ``recv``)."""
    rank, n = comm.rank, comm.size
    if not exclusive:
        np.copyto(recv, send)
    have = not exclusive
    if n == 1:
        return
    partial = scratch(comm, send.size, send.dtype, 0)
    theirs = scratch(comm, send.size, send.dtype, 1)
    left = scratch(comm, send.size, send.dtype, 2)
    np.copyto(partial, send)
    mask = 1
    while mask < n:
        partner = rank ^ mask
        if partner < n:
            sendrecv(comm, partial, partner, theirs, partner)
            if partner < rank:
                if have:
                    np.copyto(left, theirs)
                    fn(left, recv)           # theirs ∘ result
                    np.copyto(recv, left)
                else:
                    np.copyto(recv, theirs)
                    have = True
                fn(theirs, partial)          # theirs ∘ partial
                np.copyto(partial, theirs)
            else:
                fn(partial, theirs)          # partial ∘ theirs
        mask <<= 1
