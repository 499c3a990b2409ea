"""Dissemination barrier.

In round i (distance ``dist`` = 1, 2, 4 … < n) rank r sends an empty message to rank
``r + dist`` and waits for one from rank ``r - dist`` (mod n). After ceil(log2 n) rounds
every rank has heard, directly or through others, from every rank, so nobody leaves before
everybody has arrived. Rounds: ceil(log2 n), no root and no payload: the barrier of choice
at any n (linear.barrier is the 2(n-1)-message reference).
"""
from __future__ import annotations

import numpy as np

from .base import Comm, sendrecv


def barrier(comm: Comm) -> None:
    rank, n = comm.rank, comm.size
    token, inbox = np.empty(0, dtype=np.uint8), np.empty(0, dtype=np.uint8)
    dist = 1
    while dist < n:
        sendrecv(comm, token, (rank + dist) % n, inbox, (rank - dist) % n)
        dist <<= 1
