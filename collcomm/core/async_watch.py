"""One thread that keeps many groups' asynchronous calls moving: the :class:`Watcher`.

A group's :class:`~.async_calls.AsyncCalls` normally has a worker thread of its own that
looks at the queue every :data:`~.async_calls.POLL`-:data:`~.async_calls.POLL_MAX`
seconds while calls come. That is right for a communicator, and wrong for something made
by the hundred: each persistent collective request (``MPI.Comm.Allreduce_init`` & co)
runs on a group of its own (collcomm/MPI/_coll_persistent.py), and a hundred workers
polling took 0.7 of a core (and slowed the caller's own Python 1.6-1.9x) where one took
0.08. Those groups' queues are watched instead: one Watcher (one per parent group) looks
at every queue that had calls in the last :data:`~.async_calls.IDLE` seconds, as one
worker would, and hands a call that was at a queue's head at two looks in a row to that
group's runner thread (made on the first such hand-off, asleep until woken; most calls
never need one: their caller runs them when it waits). A call handed over at once
(``hand_off``: someone tests, adds a callback, waits with a timeout; large calls) skips
the watcher. While it watches a queue the queue's ``_sleeping`` is False (the fast call's
C entries read it, as they read a worker's, and skip ``watch_part`` then). The watcher's
thread is gone after IDLE seconds with nothing to watch (the next queue to watch starts
another), so a Watcher needs no closing: the requests of a freed communicator keep theirs.
"""
from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any
from ..helper_thread import HelperThread

if TYPE_CHECKING:
    from .async_calls import AsyncCalls


class Watcher:
    """Looks at many groups' queues of asynchronous calls from one thread (see the module
    docstring)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._queues: dict["AsyncCalls", list[Any]] = {}   # queue -> [head seen, last busy]
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._idle = True

    def watch(self, calls: "AsyncCalls") -> None:
        """Look at ``calls`` from now on (until it has been empty IDLE seconds)."""
        with self._lock:
            calls._sleeping = False
            if calls not in self._queues:
                self._queues[calls] = [None, time.monotonic()]
            if self._thread is None:
                self._thread = HelperThread(self._loop, f"collcomm-watch-{self._name}")
                self._thread.start()
            if self._idle:
                self._idle = False
                self._wake.set()

    def forget(self, calls: "AsyncCalls") -> None:
        with self._lock:
            self._queues.pop(calls, None)

    def _look(self) -> bool:
        """One look at every watched queue; True if it handed a call over."""
        from .async_calls import IDLE, PART_GRACE

        now = time.monotonic()
        took = False
        with self._lock:
            watched = list(self._queues.items())
        for calls, seen in watched:
            items = calls._items
            head = items[0][0] if items else None
            if head is None:
                if now - seen[1] > IDLE:
                    with self._lock:          # (an item queued meanwhile keeps it watched)
                        calls._sleeping = True
                        if calls._items:
                            calls._sleeping = False
                        else:
                            self._queues.pop(calls, None)
                seen[0] = None
                continue
            seen[1] = now
            if head is not seen[0]:
                seen[0] = head            # its caller most likely takes it: look again
                continue
            if calls.part_age is not None and 0 <= calls.part_age() < PART_GRACE:
                continue
            calls.hand_off()
            took = True
        return took

    def _loop(self) -> None:
        from .async_calls import IDLE, POLL, POLL_MAX

        poll = POLL
        while True:
            if self._idle:
                woken = self._wake.wait(IDLE)
                with self._lock:
                    if not woken and self._idle:
                        self._thread = None      # (the next watch() starts another)
                        return
                self._wake.clear()
                poll = POLL
                continue
            self._wake.wait(poll)
            self._wake.clear()
            took = self._look()
            poll = POLL if took else min(2 * poll, POLL_MAX)
            with self._lock:
                if not self._queues:
                    self._idle = True
