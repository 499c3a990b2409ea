"""Linear (root-based) algorithms: the reference every other family is checked against.

The root does everything, one peer at a time (seed 000's pseudo-code):

* broadcast: the root sends the whole buffer to each of the n-1 other ranks.
* reduce: every rank sends its buffer to the root, which receives them one by one into a
  scratch buffer and combines each into ``recv``.
* gather / scatter: the root receives / sends chunk j from / to rank j.
* all_reduce = reduce to rank 0 + broadcast from rank 0; all_gather = gather to 0 +
  broadcast; reduce_scatter = reduce to 0 + scatter from 0.
* all_to_all: every rank posts all its receives, then all its sends (MPI's "basic linear").
* barrier: every rank sends an empty message to rank 0, which then answers each.

Rounds: n-1 at the root (2(n-1) for the composites); bytes moved by the root: (n-1)·k for
broadcast/reduce/gather/scatter, the other ranks k. Good for tiny groups and as the
obviously-correct reference; the root's link is the bottleneck beyond that.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..errors import MismatchError
from .base import Comm, ReduceFn, wait_all

_EMPTY = np.empty(0, dtype=np.uint8)


def broadcast(comm: Comm, buf: np.ndarray, root: int) -> None:
    if comm.rank == root:
        wait_all([comm.isend(buf, peer) for peer in range(comm.size) if peer != root])
    else:
        comm.irecv(buf, root).wait()


def reduce(comm: Comm, send: np.ndarray, recv: np.ndarray | None, fn: ReduceFn, root: int) -> None:
    if comm.rank != root:
        comm.isend(send, root).wait()
        return
    assert recv is not None
    np.copyto(recv, send)  # no-op copy when recv aliases send
    scratch = np.empty_like(send)
    for peer in range(comm.size):
        if peer != root:
            comm.irecv(scratch, peer).wait()
            fn(recv, scratch)


def all_reduce(comm: Comm, buf: np.ndarray, fn: ReduceFn) -> None:
    reduce(comm, buf, buf if comm.rank == 0 else None, fn, 0)
    broadcast(comm, buf, 0)


def gather(comm: Comm, send: np.ndarray, recv: np.ndarray | None, root: int) -> None:
    if comm.rank != root:
        comm.isend(send, root).wait()
        return
    assert recv is not None
    k = send.size
    np.copyto(recv[root * k:(root + 1) * k], send)
    wait_all([comm.irecv(recv[peer * k:(peer + 1) * k], peer)
              for peer in range(comm.size) if peer != root])


def scatter(comm: Comm, send: np.ndarray | None, recv: np.ndarray, root: int) -> None:
    if comm.rank != root:
        comm.irecv(recv, root).wait()
        return
    assert send is not None
    k = recv.size
    handles = [comm.isend(send[peer * k:(peer + 1) * k], peer)
               for peer in range(comm.size) if peer != root]
    np.copyto(recv, send[root * k:(root + 1) * k])
    wait_all(handles)


def all_gather(comm: Comm, send: np.ndarray, recv: np.ndarray) -> None:
    gather(comm, send, recv if comm.rank == 0 else None, 0)
    broadcast(comm, recv, 0)


def reduce_scatter(comm: Comm, send: np.ndarray, recv: np.ndarray, fn: ReduceFn) -> None:
    total = np.empty_like(send) if comm.rank == 0 else None
    reduce(comm, send, total, fn, 0)
    scatter(comm, total, recv, 0)


def displacements(counts: Sequence[int]) -> list[int]:
    """Prefix sums: displs[j] is where block j starts; displs[n] is the total."""
    displs = [0]
    for c in counts:
        displs.append(displs[-1] + int(c))
    return displs


def all_to_all(comm: Comm, send: np.ndarray, send_counts: Sequence[int],
               recv: np.ndarray, recv_counts: Sequence[int]) -> None:
    rank, n = comm.rank, comm.size
    sdispl, rdispl = displacements(send_counts), displacements(recv_counts)
    if np.may_share_memory(send, recv):
        send = send.copy()
    recvs = [(peer, comm.irecv(recv[rdispl[peer]:rdispl[peer + 1]], peer))
             for peer in range(n) if peer != rank]
    sends = [comm.isend(send[sdispl[peer]:sdispl[peer + 1]], peer)
             for peer in range(n) if peer != rank]
    np.copyto(recv[rdispl[rank]:rdispl[rank + 1]], send[sdispl[rank]:sdispl[rank + 1]])
    for peer, h in recvs:
        check_count(h.wait().nbytes, recv_counts[peer] * recv.itemsize, rank, peer)
    wait_all(sends)


def check_count(got: int, expected: int, rank: int, peer: int) -> None:
    if got != expected:
        raise MismatchError(
            f"all_to_all: rank {rank} expected {expected} bytes from rank {peer}, got {got}"
        )


def barrier(comm: Comm) -> None:
    if comm.size == 1:
        return
    if comm.rank == 0:
        wait_all([comm.irecv(np.empty(0, dtype=np.uint8), peer) for peer in range(1, comm.size)])
        wait_all([comm.isend(_EMPTY, peer) for peer in range(1, comm.size)])
    else:
        comm.isend(_EMPTY, 0).wait()
        comm.irecv(np.empty(0, dtype=np.uint8), 0).wait()
