"""An in-process implementation of the algorithms' ``Comm`` protocol, for unit tests.

``run_threads(n, fn)`` runs ``fn(comm)`` in ``n`` threads, one per rank, and returns the
results in rank order. Each ordered pair (src, dst) has a FIFO queue: ``isend`` copies the
array eagerly and completes at once; ``irecv`` is matched to messages in the order the
receives were posted (as the real transports do), when some handle from that peer is
waited on. Every wait has a timeout, a message larger than the posted buffer fails with
MismatchError, and when any rank raises, the other ranks' waits fail fast instead of
hanging. After all ranks return, an undelivered message is an error too.
"""
from __future__ import annotations

import collections
import queue
import threading
import time
from typing import Any, Callable

import numpy as np

from collcomm.errors import ClosedError, CommTimeoutError, InvalidArgumentError, MismatchError
from collcomm.transport.base import Handle, Status

_POLL = 0.02


class _World:
    def __init__(self, n: int, timeout: float) -> None:
        self.n = n
        self.timeout = timeout
        self.queues = {(s, d): queue.Queue() for s in range(n) for d in range(n)}
        self.failed = threading.Event()
        self.failure = ""


class _SendHandle(Handle):
    def __init__(self, status: Status) -> None:
        self.status = status

    def wait(self, timeout: float | None = None) -> Status:
        return self.status

    def test(self) -> bool:
        return True


class _RecvHandle(Handle):
    def __init__(self, comm: ThreadComm, arr: np.ndarray, src: int) -> None:
        self.comm = comm
        self.arr = arr
        self.src = src
        self.status: Status | None = None
        self.error: BaseException | None = None

    def _deliver(self, msg: bytes) -> None:
        dst = self.arr.view(np.uint8)
        if len(msg) > dst.nbytes:
            self.error = MismatchError(
                f"rank {self.comm.rank}: message of {len(msg)} bytes from rank {self.src} "
                f"is larger than the posted receive of {dst.nbytes} bytes"
            )
        else:
            dst[: len(msg)] = np.frombuffer(msg, dtype=np.uint8)
            self.status = Status(self.src, len(msg))

    def wait(self, timeout: float | None = None) -> Status:
        self.comm._progress(self, self.comm.world.timeout if timeout is None else timeout)
        if self.error is not None:
            raise self.error
        assert self.status is not None
        return self.status

    def test(self) -> bool:
        if self.status is None and self.error is None:
            self.comm._progress(self, 0.0, block=False)
        if self.error is not None:
            raise self.error
        return self.status is not None


class ThreadComm:
    """One rank's view: ``rank``, ``size``, ``isend``, ``irecv`` (plus message counters)."""

    def __init__(self, world: _World, rank: int) -> None:
        self.world = world
        self.rank = rank
        self.size = world.n
        self.pending: dict[int, collections.deque[_RecvHandle]] = {
            s: collections.deque() for s in range(world.n)
        }
        self.sent_messages = 0
        self.sent_bytes = 0

    def _check(self, arr: np.ndarray, peer: int, what: str) -> None:
        if not isinstance(arr, np.ndarray) or arr.ndim != 1 or not arr.flags.c_contiguous:
            raise InvalidArgumentError(f"rank {self.rank}: {what} needs a 1-D C-contiguous array")
        if not 0 <= peer < self.size or peer == self.rank:
            raise InvalidArgumentError(f"rank {self.rank}: {what} to/from bad peer {peer}")

    def isend(self, arr: np.ndarray, peer: int) -> Handle:
        self._check(arr, peer, "isend")
        msg = arr.tobytes()
        self.world.queues[(self.rank, peer)].put(msg)
        self.sent_messages += 1
        self.sent_bytes += len(msg)
        return _SendHandle(Status(peer, len(msg)))

    def irecv(self, arr: np.ndarray, peer: int) -> Handle:
        self._check(arr, peer, "irecv")
        if not arr.flags.writeable:
            raise InvalidArgumentError(f"rank {self.rank}: irecv into a read-only array")
        h = _RecvHandle(self, arr, peer)
        self.pending[peer].append(h)
        return h

    def _progress(self, target: _RecvHandle, timeout: float, block: bool = True) -> None:
        """Match queued messages from target.src to posted receives, in posting order."""
        q = self.world.queues[(target.src, self.rank)]
        pend = self.pending[target.src]
        deadline = time.monotonic() + timeout
        while target.status is None and target.error is None:
            if self.world.failed.is_set():
                raise ClosedError(f"rank {self.rank}: aborted, {self.world.failure}")
            try:
                if block:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise CommTimeoutError(
                            f"rank {self.rank}: receive from rank {target.src} timed out "
                            f"after {timeout}s", peer=target.src)
                    msg = q.get(timeout=min(_POLL, remaining))
                else:
                    msg = q.get_nowait()
            except queue.Empty:
                if not block:
                    return
                continue
            pend.popleft()._deliver(msg)


def run_threads(n: int, fn: Callable[[ThreadComm], Any], timeout: float = 20) -> list[Any]:
    """Run ``fn(comm)`` on ``n`` thread-ranks; return the results in rank order.

    Re-raises the first rank's exception (by rank order of the root cause); raises
    MismatchError if a message was sent but never received.
    """
    world = _World(n, timeout)
    comms = [ThreadComm(world, r) for r in range(n)]
    results: list[Any] = [None] * n
    errors: list[BaseException | None] = [None] * n

    def body(r: int) -> None:
        try:
            results[r] = fn(comms[r])
        except BaseException as exc:  # noqa: BLE001 - reported to the caller
            errors[r] = exc
            if not world.failed.is_set():
                world.failure = f"rank {r} raised {type(exc).__name__}: {exc}"
                world.failed.set()

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    end = time.monotonic() + timeout + 5
    for t in threads:
        t.join(max(0.0, end - time.monotonic()))
    if any(t.is_alive() for t in threads):
        world.failure = "run_threads gave up"
        world.failed.set()
        raise CommTimeoutError(f"run_threads: ranks still running after {timeout + 5}s")
    real = [e for e in errors if e is not None and not isinstance(e, ClosedError)]
    first = real[0] if real else next((e for e in errors if e is not None), None)
    if first is not None:
        raise first
    left = {k: q.qsize() for k, q in world.queues.items() if q.qsize()}
    if left:
        raise MismatchError(f"run_threads: undelivered messages (src, dst) -> count: {left}")
    return results
