"""Pairwise exchange all_to_all(v).

In step s = 1 … n-1 rank r sends its block for rank ``r + s`` and receives the block from
rank ``r - s`` (mod n), one sendrecv per step; its own block is copied locally. Every pair
exchanges exactly once, each rank has one message in flight each way, and blocks go
straight from ``send`` to their place in ``recv``, so unequal counts (all_to_allv, zeros
included) cost nothing extra. Rounds: n-1; bytes sent per rank: its whole send buffer
minus its own block. Good for medium and large blocks; Bruck wins for tiny equal blocks.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .base import Comm
from .linear import check_count, displacements


def all_to_all(comm: Comm, send: np.ndarray, send_counts: Sequence[int],
               recv: np.ndarray, recv_counts: Sequence[int]) -> None:
    rank, n = comm.rank, comm.size
    sdispl, rdispl = displacements(send_counts), displacements(recv_counts)
    if np.may_share_memory(send, recv):
        send = send.copy()
    np.copyto(recv[rdispl[rank]:rdispl[rank + 1]], send[sdispl[rank]:sdispl[rank + 1]])
    for step in range(1, n):
        dst, src = (rank + step) % n, (rank - step) % n
        r = comm.irecv(recv[rdispl[src]:rdispl[src + 1]], src)
        s = comm.isend(send[sdispl[dst]:sdispl[dst + 1]], dst)
        check_count(r.wait().nbytes, int(recv_counts[src]) * recv.itemsize, rank, src)
        s.wait()
