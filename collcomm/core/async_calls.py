"""A group's asynchronous calls: queued in program order, run by whoever needs them first.

An ``async_op=True`` call is queued here, not handed to a thread at once. It runs, in
the order the calls were made and one at a time, on the first of:

* the caller's own thread, when it waits for it (``Work.wait()`` without a timeout) or
  makes a synchronous call on the same group (which must come after it): running it
  there costs what the synchronous call costs, where handing it to another thread and
  back costs 20-60 µs of thread wake-ups on this project's machines;
* the group's worker thread, which looks at the queue while the group has made
  asynchronous calls in the last :data:`IDLE` seconds (else it sleeps until the next one
  wakes it): :data:`POLL` seconds after it last found a call there, then less often, at
  least every :data:`POLL_MAX` seconds; and at once when the call is large (more than
  :data:`LAZY_MAX` bytes: there the hand-off is small beside the call and the overlap
  with the caller's work is what async is for), or when someone asks whether it is done
  (``is_completed()``), adds a callback (``then``, torch's ``get_future()``) or waits
  with a timeout.

So an asynchronous call always makes progress while its caller does something else
(computes, blocks in a receive its peer answers only after the collective, waits on
another group's call): at most :data:`POLL_MAX` seconds after it was made, the worker
takes it. What a caller sees is unchanged: results, errors (raised by ``wait()``), callbacks
(run by the thread that finished the call), ordering against the group's synchronous
calls. When a run leaves the queue empty the group lifts its fast call's pause
(``on_empty``).

A small call the fast call started in two parts (native/_fastcall_parts.c) is queued as
its second part: its caller normally finishes it (``wait()``, ``Test``); the worker takes
it only once it has waited :data:`PART_GRACE` (``part_age``), as the safety net for a
second part that needs more than the others' arrival (a peer published in place).

``_exec`` (re-entrant: a callback may make a synchronous call on the group) is held by
the thread running calls; calls leave the queue only under it, so they run in order and
never two at once.

A group made by the hundred (a persistent collective request's) is *watched* instead
(``watcher``, :mod:`.async_watch`): no worker of its own polls its queue; one thread per
parent group looks at all such queues the same way and hands a call that waits to the
group's runner thread, made on first need and asleep until woken.
"""
from __future__ import annotations

import collections
import threading
import time
from threading import get_ident
from typing import TYPE_CHECKING, Any, Callable

from .async_watch import Watcher
from .call_comm import GroupComm
from .recorder_records import family_of
from .timeouts import current_timeout
from .work import Work
from ..helper_thread import HelperThread

if TYPE_CHECKING:
    from .group import ProcessGroup

#: the worker's look at the queue while calls come (seconds): every POLL after it found a
#: call there, doubling while it finds none, up to POLL_MAX (each look costs 40-100 µs of
#: CPU on this project's VM: looking every 0.5 ms took 6% of a core)
POLL = 0.0005
POLL_MAX = 0.004
#: how long without calls before the worker stops looking and sleeps until woken
IDLE = 1.0
#: calls of more bytes are handed to the worker at once
LAZY_MAX = 64 * 1024
#: a call started in two parts (native/_fastcall_parts.c) is left to its caller this long
#: before the worker finishes it (its caller normally does, in wait() or Test, within µs;
#: the worker is the safety net: e.g. a peer that published its buffer in place needs
#: more syncs from this rank before it can finish)
PART_GRACE = 0.002

Item = tuple[Work, Callable[[], Any]]


class AsyncCalls:
    """The queue and worker of one group's asynchronous calls (see the module docstring)."""

    # (slots: the C two-part entries read _worker and _sleeping at their offsets)
    __slots__ = ("_name", "_items", "_exec", "_wake", "_worker", "_sleeping", "_closed",
                 "on_empty", "part_age", "_watcher", "_runner")

    def __init__(self, name: str, watcher: Watcher | None = None) -> None:
        self._name = name
        self._items: collections.deque[Item] = collections.deque()
        self._exec = threading.RLock()
        self._wake = threading.Event()
        self._worker: threading.Thread | None = None
        self._sleeping = True      # the worker waits for _wake without looking (see _loop)
        self._closed = False
        #: called (holding ``_exec``) when a run leaves the queue empty: the group lets its
        #: fast call take blocking calls again (ProcessGroup._settled)
        self.on_empty: Callable[[], None] | None = None
        #: seconds since the call in two parts at the head started, or < 0 (ProcessGroup)
        self.part_age: Callable[[], float] | None = None
        #: watched (see the module docstring): the Watcher stands where the worker would
        #: (``_worker``, for the fast call's C entries: see native/_fastcall_parts.c
        #: worker_looking) and ``_runner`` runs what it hands over
        self._watcher = watcher
        self._runner: threading.Thread | None = None
        if watcher is not None:
            self._worker = watcher  # type: ignore[assignment]

    def submit(self, work: Work, fn: Callable[[], Any], nbytes: int = -1) -> None:
        """Queue ``work`` (running ``fn``); the worker is woken for a large call or when asleep."""
        self._items.append((work, fn))
        if self._watcher is not None:
            if not 0 <= nbytes <= LAZY_MAX:
                self.hand_off()
            elif self._sleeping:
                self._watcher.watch(self)
            return
        self._start_worker()
        if self._sleeping or not 0 <= nbytes <= LAZY_MAX:
            self._wake.set()

    def _start_worker(self) -> None:
        if self._watcher is not None:
            if self._runner is None and not self._closed:
                # started before it is published: close() (another thread) joins only a
                # started runner (two made at once by two threads both run the queue under
                # _exec, and the unpublished one is gone IDLE seconds later)
                runner = HelperThread(self._run_when_woken, f"collcomm-{self._name}")
                runner.start()
                self._runner = runner
            return
        if self._worker is None:
            self._worker = HelperThread(self._loop, f"collcomm-{self._name}")
            self._worker.start()

    def run_through(self, work: Work | None = None) -> None:
        """Run the queued calls in order on this thread until ``work`` is done (every
        queued call if None); a call another thread is running is waited for."""
        with self._exec:
            items = self._items
            ran = False
            while items and (work is None or not work.done):
                w, fn = items.popleft()
                ran = True
                w._run(fn)
            if ran and not items and self.on_empty is not None:
                self.on_empty()

    @property
    def exec_lock(self) -> threading.RLock:
        """Held by the thread running the queued calls."""
        return self._exec

    @property
    def items(self) -> collections.deque[Item]:
        """The queue itself: the fast call's entries of calls in two parts
        (native/_fastcall_parts.c) append their second part to it."""
        return self._items

    def queued(self) -> bool:
        """Whether calls wait in the queue (not counting one running)."""
        return bool(self._items)

    def watch_part(self) -> None:
        """A call in two parts was queued (native/_fastcall_parts.c): make sure the worker
        is looking (it takes such a call only after PART_GRACE)."""
        if self._watcher is not None:
            if self._sleeping:
                self._watcher.watch(self)
            return
        self._start_worker()
        if self._sleeping:
            self._wake.set()

    def hand_off(self) -> None:
        """Let the worker run what is queued now (someone polls or waits with a timeout)."""
        if self._items:
            self._start_worker()
            self._wake.set()

    def close(self) -> None:
        """Run what is queued, then stop the worker (or the runner, and stop being watched)."""
        self.run_through()
        self._closed = True
        thread = self._worker if self._watcher is None else self._runner
        if self._watcher is not None:
            self._watcher.forget(self)
        if thread is not None:
            self._wake.set()
            if thread is not threading.current_thread():
                thread.end(timeout=5)

    def _run_when_woken(self) -> None:
        """A watched group's runner: run what is queued each time it is handed over; gone
        after IDLE seconds without (the next hand-off makes another; a call queued as it
        leaves is still watched, so the watcher hands it over again)."""
        while not self._closed:
            if not self._wake.wait(IDLE):
                self._runner = None
                if self._items and not self._closed:
                    self.hand_off()
                return
            self._wake.clear()
            if self._items:
                try:
                    self.run_through()
                except BaseException:  # noqa: BLE001 - recorded in its Work; the runner goes on
                    pass
        self.run_through()

    def _loop(self) -> None:
        items, wake = self._items, self._wake
        last = time.monotonic()
        poll = POLL
        while not self._closed:
            if self._sleeping:
                wake.wait()
                self._sleeping = False    # woken by a call: look again from now
                last, poll = time.monotonic(), POLL
            else:
                wake.wait(poll)
            wake.clear()
            if items and self.part_age is not None and 0 <= self.part_age() < PART_GRACE:
                poll = POLL           # its caller will most likely finish it: look again soon
                continue
            if items:
                try:
                    self.run_through()
                except BaseException:  # noqa: BLE001 - recorded in its Work; the worker goes on
                    pass
                last, poll = time.monotonic(), POLL
                continue
            poll = min(2 * poll, POLL_MAX)
            if time.monotonic() - last > IDLE:
                self._sleeping = True
                if items:            # submitted while we decided: it saw _sleeping False
                    self._sleeping = False
        self.run_through()


def queued_call(g: "ProcessGroup", collective: str, body: Callable[[GroupComm], Any],
                timeout: float | None, sig: int,
                fast_call: Callable[[Any], Any] | None) -> tuple[Work, Callable[[], Any]]:
    """The Work of an asynchronous call on ``g``, its tag taken and its record made now
    (the caller holds the group's lock), and what runs it: ``fast_call(fast)`` first, the
    group's fast call given that tag and record (it declines what it does not take; not
    under a ``call_timeout`` or an explicit timeout, which it cannot honour), else ``body``
    on the call's comm."""
    tag = g._next_tag()
    scoped = current_timeout(g.timeout)
    limit = scoped if timeout is None else timeout
    if scoped != g.timeout or timeout is not None:
        fast_call = None
    obs, fast = g.observer, g.fast
    rec = None
    if obs is not None:       # the record: made by the fast call's C code where there is one
        rec = (fast.record(tag, collective, sig, id(family_of(body))) if fast is not None
               else obs.enter(tag, sig, collective, body, 3))
    work = Work(collective, g, tag)

    def call() -> Any:
        fast = g.fast
        if fast_call is not None and fast is not None:
            # this call's tag and record (honoured on this thread only, while paused)
            fast.exec_thread, fast.exec_tag, fast.exec_rec = get_ident(), tag, rec
            try:
                if fast_call(fast):
                    return None
            finally:
                fast.exec_thread = 0
        return g._bound(collective, body, tag, limit, sig, rec)()

    return work, call
