"""Recursive doubling and recursive halving (all_reduce, all_gather, reduce_scatter).

Both work on a power of two ``p2`` (the largest one <= n) of participants. The other
``rem = n - p2`` ranks are folded in first: among the ranks below ``2·rem`` each even rank
hands its data to the odd rank above it and sits out; the odd rank takes ``newrank =
rank // 2``, a rank at or above ``2·rem`` takes ``newrank = rank - rem``. Participant
``newrank`` i then stands for the contiguous original ranks ``[first(i), first(i+1))``
(two ranks for i < rem, one otherwise). At the end each odd rank hands the result to the
even rank it stood for (the unfold).

* recursive doubling: for ``mask`` = 1, 2, 4 … p2/2, exchange with ``newrank ^ mask``.
  all_reduce exchanges the whole vector and combines (log2 p2 rounds, k·log2 p2 bytes:
  latency-optimal, for small messages). all_gather exchanges the aligned range of blocks
  gathered so far, which doubles each round ((n-1)·k bytes).
* recursive halving: for ``mask`` = p2/2 … 1, keep the half of the current range of
  blocks that contains mine, send the other half to ``newrank ^ mask`` and combine the
  half it sends me. reduce_scatter uses it directly (≈ (n-1)·k bytes, log2 p2 rounds);
  the Rabenseifner all_reduce is halving over ``k`` split into p2 segments followed by
  doubling all_gather of the segments (≈ 2k bytes, 2·log2 p2 rounds: large messages).

The fold and unfold add one round each and k (n·k for reduce_scatter) bytes for the
ranks below 2·rem.
"""
from __future__ import annotations

import numpy as np

from .base import Comm, ReduceFn, sendrecv
from .base import scratch as temporary
from .ring import chunk_bounds


class _Fold:
    """The power-of-two fold-in for ``n`` ranks, from ``rank``'s point of view."""

    def __init__(self, rank: int, n: int) -> None:
        p2 = 1
        while p2 * 2 <= n:
            p2 *= 2
        self.p2, self.rem = p2, n - p2
        if rank < 2 * self.rem:
            self.newrank = -1 if rank % 2 == 0 else rank // 2
            self.partner = rank + 1 if rank % 2 == 0 else rank - 1
        else:
            self.newrank = rank - self.rem
            self.partner = -1  # no folding partner

    def rank_of(self, newrank: int) -> int:
        """The rank that takes part as ``newrank``."""
        return newrank * 2 + 1 if newrank < self.rem else newrank + self.rem

    def first(self, newrank: int) -> int:
        """First original rank that ``newrank`` stands for (``first(p2) == n``)."""
        return 2 * newrank if newrank < self.rem else newrank + self.rem


def _halving(comm: Comm, acc: np.ndarray, bounds: list[int], fold: _Fold, fn: ReduceFn) -> None:
    """Recursive halving over segments ``acc[bounds[i]:bounds[i+1]]``, i = newrank.

    Leaves the full reduction of segment ``newrank`` in place in ``acc``.
    """
    me = fold.newrank
    lo, hi = 0, fold.p2
    mask = fold.p2 // 2
    scratch: np.ndarray | None = None  # sized by the first (largest) half kept; later halves are inside it
    while mask >= 1:
        mid = lo + mask
        if me < mid:
            (keep_lo, keep_hi), (give_lo, give_hi) = (lo, mid), (mid, hi)
        else:
            (keep_lo, keep_hi), (give_lo, give_hi) = (mid, hi), (lo, mid)
        keep = acc[bounds[keep_lo]:bounds[keep_hi]]
        if scratch is None:
            scratch = temporary(comm, keep.size, acc.dtype)
        inbox = scratch[:keep.size]
        sendrecv(comm, acc[bounds[give_lo]:bounds[give_hi]], fold.rank_of(me ^ mask),
                 inbox, fold.rank_of(me ^ mask))
        fn(keep, inbox)
        lo, hi = keep_lo, keep_hi
        mask //= 2


def _doubling_gather(comm: Comm, buf: np.ndarray, bounds: list[int], fold: _Fold) -> None:
    """Recursive doubling all_gather of segments ``buf[bounds[i]:bounds[i+1]]``, in place."""
    me = fold.newrank
    mask = 1
    while mask < fold.p2:
        peer = me ^ mask
        mine, theirs = me & ~(mask - 1), peer & ~(mask - 1)
        sendrecv(comm, buf[bounds[mine]:bounds[mine + mask]], fold.rank_of(peer),
                 buf[bounds[theirs]:bounds[theirs + mask]], fold.rank_of(peer))
        mask <<= 1


def all_reduce(comm: Comm, buf: np.ndarray, fn: ReduceFn) -> None:
    """Recursive doubling: log2(p2) full-vector exchanges (+ fold/unfold)."""
    fold = _Fold(comm.rank, comm.size)
    if comm.size == 1:
        return
    scratch = temporary(comm, buf.size, buf.dtype)
    if fold.newrank < 0:  # even rank below 2·rem: hand over, wait for the result
        comm.isend(buf, fold.partner).wait()
        comm.irecv(buf, fold.partner).wait()
        return
    if fold.partner >= 0:
        comm.irecv(scratch, fold.partner).wait()
        fn(buf, scratch)
    mask = 1
    while mask < fold.p2:
        peer = fold.rank_of(fold.newrank ^ mask)
        sendrecv(comm, buf, peer, scratch, peer)
        fn(buf, scratch)
        mask <<= 1
    if fold.partner >= 0:
        comm.isend(buf, fold.partner).wait()


def all_reduce_rabenseifner(comm: Comm, buf: np.ndarray, fn: ReduceFn) -> None:
    """Recursive-halving reduce_scatter + recursive-doubling all_gather (+ fold/unfold)."""
    fold = _Fold(comm.rank, comm.size)
    if comm.size == 1:
        return
    if fold.newrank < 0:
        comm.isend(buf, fold.partner).wait()
        comm.irecv(buf, fold.partner).wait()
        return
    if fold.partner >= 0:
        scratch = temporary(comm, buf.size, buf.dtype)
        comm.irecv(scratch, fold.partner).wait()
        fn(buf, scratch)
        del scratch
    bounds = chunk_bounds(buf.size, fold.p2)
    _halving(comm, buf, bounds, fold, fn)
    _doubling_gather(comm, buf, bounds, fold)
    if fold.partner >= 0:
        comm.isend(buf, fold.partner).wait()


def all_gather(comm: Comm, send: np.ndarray, recv: np.ndarray) -> None:
    """Recursive doubling over contiguous ranges of blocks (+ fold/unfold)."""
    rank, n = comm.rank, comm.size
    k = send.size
    np.copyto(recv[rank * k:(rank + 1) * k], send)
    if n == 1:
        return
    fold = _Fold(rank, n)
    if fold.newrank < 0:
        comm.isend(send, fold.partner).wait()
        comm.irecv(recv, fold.partner).wait()
        return
    if fold.partner >= 0:
        p = fold.partner
        comm.irecv(recv[p * k:(p + 1) * k], p).wait()
    bounds = [fold.first(i) * k for i in range(fold.p2 + 1)]
    _doubling_gather(comm, recv, bounds, fold)
    if fold.partner >= 0:
        comm.isend(recv, fold.partner).wait()


def reduce_scatter(comm: Comm, send: np.ndarray, recv: np.ndarray, fn: ReduceFn) -> None:
    """Recursive halving over the ranks' blocks (+ fold/unfold)."""
    rank, n = comm.rank, comm.size
    k = recv.size
    if n == 1:
        np.copyto(recv, send)
        return
    fold = _Fold(rank, n)
    if fold.newrank < 0:
        comm.isend(send, fold.partner).wait()
        comm.irecv(recv, fold.partner).wait()
        return
    acc = temporary(comm, send.size, send.dtype, 1)   # slot 1: slot 0 is the inbox
    np.copyto(acc, send)
    if fold.partner >= 0:
        scratch = temporary(comm, send.size, send.dtype)
        comm.irecv(scratch, fold.partner).wait()
        fn(acc, scratch)
        del scratch
    bounds = [fold.first(i) * k for i in range(fold.p2 + 1)]
    _halving(comm, acc, bounds, fold, fn)
    if fold.partner >= 0:
        p = fold.partner
        comm.isend(acc[p * k:(p + 1) * k], p).wait()
    np.copyto(recv, acc[rank * k:(rank + 1) * k])
