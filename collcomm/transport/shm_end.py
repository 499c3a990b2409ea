"""How a shared-memory channel ends (:class:`ChannelEnd`, a base of
:class:`collcomm.transport.shm.ShmChannel`): its peer found dead (``check_alive``, the
error naming how it went) and its own close, which waits while the peer lives for it to
read what only this rank holds, then removes what is left.
"""
from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import PeerLostError
from .peer_process import pid_alive
from .shm_ring import LEFT, RELEASED, _Ring
from .shm_segments import unlink_quietly, warn_once

if TYPE_CHECKING:
    from .engine import Engine

__all__ = ["ChannelEnd"]

#: PRIVATE copies a closed channel's peer had not released: kept for the life of the
#: process, so a late reader gets the message, never freed memory (it gets an error only
#: once this process is gone)
_kept: list[np.ndarray] = []


class ChannelEnd:
    """The end of one peer's channel (ShmChannel's; every attribute below is its own)."""

    engine: "Engine"
    peer: int
    peer_pid: int
    out: _Ring
    inp: _Ring
    head: int
    outside_until: int
    closed: bool
    send_lock: threading.Lock
    created: list[str]
    pool: list[Any]
    mapped: dict[str, Any]
    held: dict[int, np.ndarray]
    backlog: Any

    if TYPE_CHECKING:   # ShmChannel's and LentBodies'
        def poll(self) -> None: ...

        def drop_lent(self) -> list[Any]: ...

        def take_backlog(self) -> list[Any]: ...

        def fail_jobs(self, jobs: list[Any], problem: BaseException | str) -> None: ...

    def check_alive(self) -> None:
        """Report the peer lost if its process is gone (called with no lock held)."""
        if self.closed or pid_alive(self.peer_pid):
            return
        self.poll()  # what it sent before dying is still ours
        self.engine.peer_lost(self.peer, self._death_error(), crashed=not self.inp.ctl[LEFT])

    def _death_error(self) -> PeerLostError:
        left = bool(self.inp.ctl[LEFT])
        what = "left the job" if left else "died"
        return PeerLostError(
            f"rank {self.peer} (pid {self.peer_pid}, same host) {what}; rank {self.engine.rank} "
            f"lost its shared-memory peer", peer=self.peer)

    def close(self, linger: float = 10.0) -> None:
        """Wait while the peer lives until it has read what we sent, then remove what is left.

        Records in the ring outlive us (the ring is the peer's inbox), so for those we wait at
        most ``linger`` s. A body staged in a segment or held in our memory (PRIVATE) is gone
        once we close, so while the peer has yet to read one we wait up to the job's timeout:
        a reader busy for longer than ``linger`` (a multi-GiB message) must not lose it. Not
        once the peer has left (it reads no more). Sends still in the backlog
        (shm_backlog.py: behind a full ring; only this rank holds them) are waited for as
        long, then dropped. Every channel is drained meanwhile
        (``engine.progress``), so ranks that each wait for the next one to read cannot wait
        in a circle. Copies the peer has not released are kept (:data:`_kept`), never freed
        under a reader that may still come."""
        if self.closed:
            return
        now = time.monotonic()
        deadline, outside_deadline = now + linger, now + max(linger, self.engine.timeout)
        while (self.peer not in self.engine.lost and pid_alive(self.peer_pid)
               and not self.inp.ctl[LEFT]):
            read = self.out.ctl[8]
            now = time.monotonic()
            if read < self.head and now < deadline:
                pass
            elif (read < self.outside_until or self.backlog) and now < outside_deadline and linger > 0:
                if now >= deadline:   # said once, when it outlasts the linger
                    warn_once(f"close-wait-{self.peer}", (
                        f"rank {self.engine.rank} is leaving but waits (up to "
                        f"{self.engine.timeout:g} s, while rank {self.peer} lives) for rank "
                        f"{self.peer} to read the large message it sent it: only this rank "
                        "holds it"))
            else:
                break
            try:
                self.engine.progress()
            except Exception:   # noqa: BLE001 - leaving anyway: what a peer sent is lost with it
                break
            time.sleep(0.001)
        with self.send_lock:   # a sender is never mid-write when the pool goes
            dropped = self.take_backlog()   # (never read: the peer left, or outlasted the wait)
            self.closed = True
            _kept.extend(self.drop_lent())
        if dropped:
            self.fail_jobs(dropped, "closed")
        self.out.ctl[LEFT] = 1   # tell the peer we left cleanly (not a crash)
        for name in self.created:
            unlink_quietly(name)
        self.created.clear()
        for mm in [p[0] for p in self.pool] + list(self.mapped.values()):
            try:
                mm.close()
            except BufferError:
                pass  # a message still being read holds it; it goes with the process
        self.pool.clear()
        self.mapped.clear()
        released = int(self.out.ctl[RELEASED])
        _kept.extend(copy for ident, copy in self.held.items() if ident >= released)
        self.held.clear()
