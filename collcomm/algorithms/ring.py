"""Ring algorithms: bandwidth-optimal all_gather, reduce_scatter and all_reduce.

The ranks form a ring; rank r sends to ``right = r+1`` and receives from ``left = r-1``
(mod n). The data is cut into n chunks (for all_reduce, ``k`` elements are partitioned like
``np.array_split``: the first ``k % n`` chunks have one element more).

* all_gather: rank r starts with its own chunk. In step s (0..n-2) it sends chunk
  ``r-s`` to the right and receives chunk ``r-s-1`` from the left, straight into place.
* reduce_scatter: in step s rank r sends its partial sum of chunk ``r-s-1`` to the right
  and receives the left's partial of chunk ``r-s-2``, adding its own contribution; after
  n-1 steps it holds the full reduction of chunk r.
* all_reduce = a reduce-scatter phase (rank r ends owning chunk ``r+1``) followed by an
  all_gather phase that circulates the owned chunks, both in place in ``buf``.

Rounds: n-1 (2(n-1) for all_reduce). Bytes sent per rank: (n-1)/n of the data per phase,
≈ 2·k for all_reduce, independent of n. Good for large messages; latency grows with n.
"""
from __future__ import annotations

import numpy as np

from .base import Comm, ReduceFn, scratch, sendrecv


def chunk_bounds(count: int, parts: int) -> list[int]:
    """``parts + 1`` offsets splitting ``count`` like np.array_split (larger chunks first)."""
    base, extra = divmod(count, parts)
    bounds = [0]
    for i in range(parts):
        bounds.append(bounds[-1] + base + (1 if i < extra else 0))
    return bounds


def all_gather(comm: Comm, send: np.ndarray, recv: np.ndarray) -> None:
    rank, n = comm.rank, comm.size
    k = send.size
    np.copyto(recv[rank * k:(rank + 1) * k], send)
    right, left = (rank + 1) % n, (rank - 1) % n
    for step in range(n - 1):
        out_chunk, in_chunk = (rank - step) % n, (rank - step - 1) % n
        sendrecv(comm, recv[out_chunk * k:(out_chunk + 1) * k], right,
                 recv[in_chunk * k:(in_chunk + 1) * k], left)


def reduce_scatter(comm: Comm, send: np.ndarray, recv: np.ndarray, fn: ReduceFn) -> None:
    rank, n = comm.rank, comm.size
    k = recv.size
    if np.may_share_memory(send, recv):
        send = send.copy()
    if n == 1:
        np.copyto(recv, send)
        return
    right, left = (rank + 1) % n, (rank - 1) % n
    outbox = send[((rank - 1) % n) * k:((rank - 1) % n + 1) * k]  # step 0: own data
    partials = [scratch(comm, k, send.dtype, i) for i in range(min(2, n - 2))]
    for step in range(n - 1):
        in_chunk = (rank - step - 2) % n
        inbox = recv if step == n - 2 else partials[step % 2]
        sendrecv(comm, outbox, right, inbox, left)
        fn(inbox, send[in_chunk * k:(in_chunk + 1) * k])
        outbox = inbox


def all_reduce(comm: Comm, buf: np.ndarray, fn: ReduceFn) -> None:
    rank, n = comm.rank, comm.size
    if n == 1:
        return
    bounds = chunk_bounds(buf.size, n)
    right, left = (rank + 1) % n, (rank - 1) % n

    def chunk(i: int) -> np.ndarray:
        return buf[bounds[i]:bounds[i + 1]]

    space = scratch(comm, bounds[1] - bounds[0], buf.dtype)
    for step in range(n - 1):  # reduce-scatter phase
        out_chunk, in_chunk = (rank - step) % n, (rank - step - 1) % n
        inbox = space[:bounds[in_chunk + 1] - bounds[in_chunk]]
        sendrecv(comm, chunk(out_chunk), right, inbox, left)
        fn(chunk(in_chunk), inbox)
    for step in range(n - 1):  # all_gather phase: rank r owns chunk r+1
        out_chunk, in_chunk = (rank + 1 - step) % n, (rank - step) % n
        sendrecv(comm, chunk(out_chunk), right, chunk(in_chunk), left)
