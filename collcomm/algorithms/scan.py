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

:func:`scan_gathered`, for small messages on any transport: every rank's ``send``
all-gathered (the group's all_gather family: in the shared-memory arena, one sync), then
each rank folds the blocks below it in rank order, ``((x0 ∘ x1) ∘ x2) ∘ …``: one sync
instead of ``ceil(log2 n)`` rounds of messages, up to ``n - 1`` combines of k elements,
and the same floating-point result over shared memory and TCP (recursive doubling
associates differently from rank 3 on).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from .base import Comm, ReduceFn, scratch, sendrecv

__all__ = ["fold", "scan", "scan_gathered"]


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


def scan_gathered(comm: Comm, send: np.ndarray, recv: np.ndarray, fn: ReduceFn, exclusive: bool,
                  all_gather: Callable[[Comm, np.ndarray, np.ndarray], None]) -> None:
    """What :func:`scan` computes, by an all_gather and a fold in rank order (see the module
    docstring); the same arguments, and the all_gather family to use."""
    parts = np.empty(comm.size * send.size, dtype=send.dtype)   # (not scratch: the family may use it)
    all_gather(comm, send, parts)
    fold(parts, recv, fn, comm.rank, exclusive)


def fold(parts: np.ndarray, recv: np.ndarray, fn: ReduceFn, rank: int, exclusive: bool) -> None:
    """``recv`` = the blocks of ``parts`` (every rank's, in rank order) up to ``rank``'s
    (``exclusive``: below it; none: ``recv`` unchanged) combined in rank order."""
    k = recv.size
    upto = rank if exclusive else rank + 1
    if upto == 0:
        return
    np.copyto(recv, parts[:k])
    for j in range(1, upto):
        fn(recv, parts[j * k:(j + 1) * k])     # recv ∘ x_j, lower ranks on the left
