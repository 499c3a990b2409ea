"""Sends that find the peer's ring full (:class:`SendBacklog`, a base of
:class:`collcomm.transport.shm.ShmChannel`, and the engine's :class:`BacklogWriter`).

A send never waits for its receiver. One whose record does not fit in the peer's ring
joins the channel's backlog, and every later send to that peer joins behind it (MPI's
non-overtaking order; the native sends decline while the backlog holds anything, through
the ``Pipe``'s ``backlog`` flag). The record is made first as it would be at once (a
large body staged, or lent), so a queued send keeps its way and its errors: a body that
was staged or copied into private memory, or one of a blocking send (copied here), no
longer needs the caller's buffer, and its request completes at once (the message is
buffered, as MPI allows a standard-mode send); a non-blocking send's own buffer, lent or
inline, completes when its record is written (or, lent, read).

The backlog is written, in order, as the receiver makes room: by the channel's next
send, by every :meth:`Engine.progress` (every wait), and by the engine's writer thread
(:class:`BacklogWriter`), which runs while any channel has a backlog, so a rank busy in
a collective, a computation or a wait on another peer still delivers what it sent. A
job whose request failed meanwhile (a lent send's wait timed out) is dropped unwritten.
Copies are bounded: a send that would buffer more than ``BACKLOG_BYTES`` behind one
peer waits for room first (progressing, with the timeout and the old error text). A
backlog whose peer died or left is dropped (requests not yet complete fail); a closing
channel waits for it as for its staged bodies, then drops it and says how many buffered
messages were never delivered. Why:
a receiver that posted its receives and went into a collective (a halo exchange
overlapped with an all_reduce), while its sender's send waited for ring room, waited
for that sender in the collective forever; MPI's progress rule makes that program
correct (tests/random_overlap.py found it; tests/test_shm_backlog.py).

Lock order: ``send_lock`` (a leaf) guards the backlog with the ring; a flush, which may
run inside a poll (holding ``poll_lock``), only tries it; the writer's own lock is never
taken under it; requests complete with no lock held.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from ..errors import CommTimeoutError
from .peer_process import pid_alive
from .shm_ring import INLINE, LEFT, LENT, PRIVATE, PRIVATE_ID
from .shm_segments import warn_once
from ..helper_thread import HelperThread

if TYPE_CHECKING:
    from .engine import Engine
    from .request import Request

__all__ = ["BACKLOG_BYTES", "BacklogWriter", "SendBacklog", "SendJob"]

#: how long the writer thread sleeps between tries: from the first, doubling to the last
WRITER_SLEEP = (50e-6, 1e-3)
#: the bodies a channel's backlog holds copies of (blocking sends' and staged ones): a send
#: that would copy more into it waits for room first (:meth:`SendBacklog.wait_for_room`)
BACKLOG_BYTES = 64 << 20
#: how often a channel with a backlog checks that its peer lives
LIVENESS_PERIOD = 0.1


class SendJob:
    """One send's record, made (and its body staged) before it went into the ring."""

    __slots__ = ("req", "kind", "aux", "body", "staged", "copy", "completed")

    def __init__(self, req: "Request", kind: int, aux: int, body: Any, staged: str, copy: Any) -> None:
        self.req, self.kind, self.aux, self.body, self.staged, self.copy = req, kind, aux, body, staged, copy
        self.completed = False     # its request completed when it was queued (buffered)


class SendBacklog:
    """A channel's queued sends (ShmChannel's; every attribute below but ``backlog``,
    ``backlog_bytes`` and ``_backlog_check`` is its own)."""

    engine: "Engine"
    peer: int
    peer_pid: int
    head: int
    next_private: int
    outside_until: int
    held: dict[int, Any]
    closed: bool
    send_lock: Any
    inp: Any
    _pipe: Any

    if TYPE_CHECKING:    # ShmChannel's, LentBodies', StagedBodies' and ChannelEnd's
        def _try_append(self, kind: int, tag: int, nbytes: int, aux: int, body: Any, sig: int = 0) -> bool: ...

        def lent_body(self, ident: int) -> bytes: ...

        def lent_out(self, req: "Request", ident: int) -> None: ...

        def unstage(self, name: str) -> None: ...

        def _send_error(self, problem: BaseException | str, req: "Request") -> BaseException: ...

        def _death_error(self) -> BaseException: ...

        def check_alive(self) -> None: ...

    def init_backlog(self) -> None:
        self.backlog: deque[SendJob] = deque()
        self.backlog_bytes = 0          # of the bodies buffered in it (its completed jobs')
        self._backlog_check = 0.0

    def write_job(self, job: SendJob) -> bool:
        """Write ``job``'s record if the ring has room (caller holds ``send_lock``; the
        backlog empty or ``job`` its first). A PRIVATE or LENT record's release id is
        taken here, with the append: ids must reach the ring in order (RELEASED is a
        watermark)."""
        kind = job.kind
        release = self.next_private if kind in (PRIVATE, LENT) else 0
        body = PRIVATE_ID.pack(release) if kind == PRIVATE else self.lent_body(release) if kind == LENT else job.body
        req = job.req
        if not self._try_append(kind, req.tag, len(req.buf), job.aux, body, req.sig):
            return False
        if kind != INLINE:
            self.outside_until = self.head
        if release:
            self.next_private = release + 1
            if kind == PRIVATE:
                self.held[release] = job.copy
            else:
                self.lent_out(req, release)
        return True

    def queue(self, job: SendJob, lend: bool) -> None:
        """Put ``job`` at the end of the backlog (caller holds ``send_lock``). A body the
        caller may reuse once its send returns (an inline one of a blocking send) is copied;
        one staged or copied already needs nothing more: either way the request is
        completed by the caller (``job.completed``), the message buffered."""
        if job.kind == INLINE and not lend:
            job.body = bytes(job.body)
        job.completed = job.kind != LENT and (job.kind != INLINE or not lend)
        if job.completed:
            self.backlog_bytes += len(job.req.buf)
        if not self.backlog and self._pipe is not None:
            self._pipe.backlog = 1
        self.backlog.append(job)

    def write_backlog(self) -> list[SendJob]:
        """Write what fits of the backlog, in order (caller holds ``send_lock``); the jobs
        written whose requests are still to complete (not lent, not completed when
        queued). A job whose request failed meanwhile (its wait timed out, its rank was
        interrupted) is dropped unwritten: its caller was told it was not sent."""
        done = []
        backlog = self.backlog
        while backlog:
            job = backlog[0]
            if not job.completed and job.req.done:
                backlog.popleft()       # (never staged: a lent or an inline non-blocking send)
                continue
            if not self.write_job(job):
                break
            backlog.popleft()
            if job.completed:
                self.backlog_bytes -= len(job.req.buf)
            elif job.kind != LENT:
                done.append(job)
        if not backlog and self._pipe is not None:
            self._pipe.backlog = 0
        return done

    def flush_backlog(self) -> bool:
        """Write what fits of the backlog now (any thread, maybe holding a channel's
        ``poll_lock``: ``send_lock`` is only tried). A backlog whose peer died or left is
        dropped. True once the backlog is empty."""
        if not self.backlog:
            return True
        now = time.monotonic()
        gone: BaseException | str | None = None
        if now >= self._backlog_check:
            self._backlog_check = now + LIVENESS_PERIOD
            if self.peer in self.engine.lost or not pid_alive(self.peer_pid):
                self.check_alive()
                gone = "gone"
            elif self.inp.ctl[LEFT]:
                gone = self._death_error()      # (it left the job: it reads no more)
        if not self.send_lock.acquire(blocking=False):
            return False
        try:
            if self.closed or gone is not None:
                dropped, done = self.take_backlog(), []
            else:
                dropped, done = [], self.write_backlog()
            empty = not self.backlog
        finally:
            self.send_lock.release()
        if dropped:
            self.fail_jobs(dropped, "closed" if gone is None else gone)
        for job in done:
            job.req.complete(self.peer, len(job.req.buf))
        return empty

    def take_backlog(self) -> list[SendJob]:
        """Empty the backlog, its staged segments given back (caller holds ``send_lock``;
        before the channel is marked closed): its jobs, for :meth:`fail_jobs`."""
        jobs = list(self.backlog)
        self.backlog.clear()
        self.backlog_bytes = 0
        if self._pipe is not None:
            self._pipe.backlog = 0
        for job in jobs:
            if job.staged:
                self.unstage(job.staged)
        return jobs

    def fail_jobs(self, jobs: list[SendJob], problem: BaseException | str) -> None:
        """After :meth:`take_backlog` (no lock held): a request not yet complete fails with
        ``problem`` as a send would; buffered messages the peer never got are said once."""
        lost = sum(1 for job in jobs if job.completed)
        if lost:
            warn_once(f"backlog-dropped-{self.peer}", (
                f"rank {self.engine.rank}: {lost} message(s) sent to rank {self.peer} were never "
                f"delivered (its ring stayed full until {problem if isinstance(problem, str) else problem})"))
        for job in jobs:
            if not job.completed and not job.req.done:
                job.req.fail(self._send_error(problem, job.req))

    def backlog_full(self, nbytes: int) -> bool:
        """Would ``nbytes`` more copied into the backlog pass ``BACKLOG_BYTES``?"""
        return bool(self.backlog) and self.backlog_bytes + nbytes > BACKLOG_BYTES

    def wait_for_room(self, req: "Request", nbytes: int) -> BaseException | str | None:
        """A send to copy ``nbytes`` into a backlog already holding ``BACKLOG_BYTES`` of
        copies waits (no lock held) until it shrinks enough (or empties), progressing
        meanwhile: memory is not spent without bound on a receiver that does not read.
        None to go on; or why the send fails (closed, the peer gone, the timeout)."""
        engine = self.engine
        start = time.monotonic()
        next_check, sleep = start + LIVENESS_PERIOD, WRITER_SLEEP[0]
        while True:
            if self.closed or engine._aborted is not None:
                return "closed"
            if self.peer in engine.lost:      # (the writer thread may have found it first,
                return "gone"                 # and dropped the backlog: no room to wait for)
            if self.inp.ctl[LEFT]:
                return self._death_error()
            if not self.backlog_full(nbytes):
                return None
            engine.progress()
            time.sleep(sleep)
            sleep = min(sleep * 2, WRITER_SLEEP[1])
            now = time.monotonic()
            if now >= next_check:
                next_check = now + LIVENESS_PERIOD
                if not pid_alive(self.peer_pid):    # (lost: checked above every round)
                    return "gone"
                if now - start > engine.timeout:
                    return CommTimeoutError(
                        f"rank {engine.rank} timed out after {engine.timeout:g} s: its ring to rank "
                        f"{self.peer} stayed full, {self.backlog_bytes} bytes queued behind it "
                        f"({req.describe()})", peer=self.peer)


class BacklogWriter:
    """The engine's writer of backlogs: a daemon thread, started when a channel's backlog
    first holds a send, that writes them as room appears (sleeping ``WRITER_SLEEP``
    between tries) and ends when none is left. :meth:`flush` is also the engine's
    progress step (any thread)."""

    def __init__(self, engine: "Engine") -> None:
        self.engine = engine
        self.channels: list[SendBacklog] = []    # those with a backlog (the engine reads it)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def add(self, channel: SendBacklog) -> None:
        """``channel`` has just queued a send (no channel lock held)."""
        with self._lock:
            if channel not in self.channels:
                self.channels.append(channel)
            if self._thread is None:
                self._thread = HelperThread(self._run, f"collcomm-backlog-{self.engine.rank}")
                self._thread.start()

    def flush(self) -> bool:
        """Write what fits of every backlog; True if one got shorter or empty."""
        moved = False
        for ch in list(self.channels):
            before = len(ch.backlog)
            if ch.flush_backlog():
                with self._lock:
                    if not ch.backlog and ch in self.channels:
                        self.channels.remove(ch)
            moved = moved or len(ch.backlog) < before
        return moved

    def _run(self) -> None:
        first, last = WRITER_SLEEP
        sleep = first
        while True:
            with self._lock:
                if not self.channels:
                    self._thread = None
                    return
            try:
                moved = self.flush()
            except Exception:   # noqa: BLE001 - (a closing engine): its channels drop what is left
                moved = False
            sleep = first if moved else min(sleep * 2, last)
            time.sleep(sleep)
