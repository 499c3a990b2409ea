"""Watching the ranks of a job while it joins: who died, and the store barrier.

Every rank joining publishes itself in the store (:class:`JoinWatch`); the store waits of
the join then notice a same-host rank whose process is gone and end the join at once with
:class:`~collcomm.errors.PeerLostError` naming it. :func:`store_barrier` is the join's
barrier through the store.
"""
from __future__ import annotations

import os
import time
from typing import Any

from ..errors import CollcommError, CommTimeoutError, PeerLostError
from .identity import host_id


class JoinWatch:
    """Who died while the job was joining.

    Every rank publishes ``alive/<rank>`` = its host id and pid first thing. The store
    waits of the join (:meth:`get`) then run in slices of :attr:`SLICE` seconds and, between
    slices, look at the ranks of this host that published: one whose process is gone ends
    the join at once with :class:`PeerLostError` naming it, instead of every other rank
    waiting for the job's timeout (300 s by default) for a key it will never write. A rank
    that died before publishing, or on another host, is still found by the timeout."""

    SLICE = 0.25

    def __init__(self, kv: Any, rank: int, size: int) -> None:
        self.kv, self.rank, self.size = kv, rank, size
        self.host = host_id()
        self.pids: dict[int, int] = {}      # same-host ranks that published
        self.known: set[int] = {rank}
        kv.set(f"alive/{rank}", f"{self.host} {os.getpid()}".encode())

    def check(self) -> None:
        """Raise PeerLostError if a same-host rank that published has died."""
        from ..transport.peer_process import pid_alive

        for r in range(self.size):
            if r in self.known:
                continue
            key = f"alive/{r}"
            try:
                if not self.kv.check([key]):
                    continue
                host, _, pid = self.kv.get(key, timeout=1.0).decode().rpartition(" ")
            except CollcommError:
                continue
            self.known.add(r)
            if host == self.host:
                self.pids[r] = int(pid)
        dead = [r for r, pid in self.pids.items() if not pid_alive(pid)]
        if not dead:
            return
        # a rank that gave up because of another one marked itself: name the root cause
        culprit = dead[0]
        for r in dead:
            try:
                reacted = self.kv.check([f"left/{r}"])
            except CollcommError:
                reacted = False
            if not reacted:
                culprit = r
                break
        raise PeerLostError(
            f"init_process_group: rank {culprit} (pid {self.pids[culprit]}, same host) died while "
            f"the job was joining; rank {self.rank} stops waiting for it", peer=culprit)

    def linger(self, patience: float = 10.0) -> None:
        """The store's host failing the join stays (``patience`` s at most) until every rank
        has left or is known dead, so that a rank arriving late still reaches the store and
        learns who died instead of retrying a vanished store until its timeout."""
        from ..transport.peer_process import pid_alive

        deadline = time.monotonic() + patience
        while time.monotonic() < deadline:
            try:
                self.check()
            except PeerLostError:
                pass
            pending = []
            for r in range(self.size):
                if r == self.rank or (r in self.pids and not pid_alive(self.pids[r])):
                    continue
                try:
                    if not self.kv.check([f"left/{r}"]):
                        pending.append(r)
                except CollcommError:
                    return
            if not pending:
                return
            time.sleep(0.05)

    def leave(self, exc: BaseException) -> None:
        """Mark this rank as gone because of ``exc`` (best effort), so that others do not
        take its exit for the root cause."""
        if isinstance(exc, CollcommError):
            try:
                self.kv.set(f"left/{self.rank}", str(getattr(exc, "peer", "") or "").encode())
            except Exception:  # noqa: BLE001 - the store may be gone too
                pass

    def get(self, key: str, timeout: float) -> bytes:
        """``kv.get(key)``, checking for dead ranks every :attr:`SLICE` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                return self.kv.get(key, timeout=max(0.001, min(self.SLICE, left)))
            except CommTimeoutError:
                if left <= self.SLICE:
                    raise
                self.check()


def store_barrier(store: Any, name: str, size: int, rank: int, timeout: float,
                  watch: JoinWatch | None = None) -> None:
    """Every rank adds itself to a counter; the last one opens the gate everyone waits on."""
    if store.add(f"{name}/count", 1) == size:
        store.set(f"{name}/open", b"1")
    try:
        if watch is not None:
            watch.get(f"{name}/open", timeout)
        else:
            store.get(f"{name}/open", timeout=timeout)
    except CommTimeoutError as exc:
        arrived = store.add(f"{name}/count", 0)
        raise CommTimeoutError(
            f"init_process_group: rank {rank} waited {timeout:g} s at the rendezvous step "
            f"{name!r}: only {arrived} of {size} ranks arrived") from exc
