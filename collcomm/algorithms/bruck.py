"""Bruck algorithms: all_gather and (equal-count) all_to_all in ceil(log2 n) rounds.

all_gather: rank r keeps a scratch buffer of n blocks in which block j will hold the data
of rank ``r + j`` (mod n); it starts with its own block at position 0. In the round with
distance ``dist`` = 1, 2, 4 … it sends its first ``min(dist, n - dist)`` blocks to rank
``r - dist`` and receives as many from rank ``r + dist`` into positions ``dist…``. A final
local rotation puts block j at rank slot ``r + j``. Rounds: ceil(log2 n); bytes sent per
rank: (n-1)·k, as ring, but with log rounds instead of n-1: good for small messages at
any n.

all_to_all: rank r first rotates its send blocks so that block j is the one for rank
``r + j``. In the round for bit ``pof2`` = 1, 2, 4 … every block j whose index has that
bit set is packed into one segment, sent to ``r + pof2`` and the segment received from
``r - pof2`` is unpacked into the same positions. A block thus travels the binary digits of
j and lands at rank ``r + j``, where it is block j of the source ``(dest - j)``. Rounds:
ceil(log2 n); bytes sent per rank ≈ k·(n/2)·log2 n: fewer rounds than pairwise, more
bytes: good for small blocks. Needs the same count for every pair (no v-version).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..errors import InvalidArgumentError
from .base import Comm, sendrecv


def all_gather(comm: Comm, send: np.ndarray, recv: np.ndarray) -> None:
    rank, n = comm.rank, comm.size
    k = send.size
    if n == 1:
        np.copyto(recv, send)
        return
    blocks = np.empty(n * k, dtype=send.dtype)
    blocks[:k] = send
    dist = 1
    while dist < n:
        count = min(dist, n - dist)
        sendrecv(comm, blocks[:count * k], (rank - dist) % n,
                 blocks[dist * k:(dist + count) * k], (rank + dist) % n)
        dist <<= 1
    head = (n - rank) * k  # blocks[j] belongs to rank (rank + j) mod n
    recv[rank * k:] = blocks[:head]
    recv[:rank * k] = blocks[head:]


def all_to_all(comm: Comm, send: np.ndarray, send_counts: Sequence[int],
               recv: np.ndarray, recv_counts: Sequence[int]) -> None:
    rank, n = comm.rank, comm.size
    k = int(send_counts[0]) if n else 0
    if any(int(c) != k for c in send_counts) or any(int(c) != k for c in recv_counts):
        raise InvalidArgumentError(
            f"all_to_all (bruck) on rank {rank}: needs equal counts for every rank, got "
            f"send_counts={list(send_counts)}, recv_counts={list(recv_counts)}; "
            "use the pairwise or linear algorithm for all_to_allv"
        )
    # blocks[j] is the block for rank (rank + j) mod n.
    blocks = np.concatenate([send[rank * k:], send[:rank * k]]) if n > 1 else send.copy()
    pof2 = 1
    while pof2 < n:
        chosen = [j for j in range(n) if j & pof2]
        outbox = np.concatenate([blocks[j * k:(j + 1) * k] for j in chosen])
        inbox = np.empty_like(outbox)
        sendrecv(comm, outbox, (rank + pof2) % n, inbox, (rank - pof2) % n)
        for i, j in enumerate(chosen):
            blocks[j * k:(j + 1) * k] = inbox[i * k:(i + 1) * k]
        pof2 <<= 1
    # blocks[j] came from rank (rank - j) mod n.
    for j in range(n):
        src = (rank - j) % n
        recv[src * k:(src + 1) * k] = blocks[j * k:(j + 1) * k]
