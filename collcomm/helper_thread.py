"""``HelperThread``: a thread collcomm runs for itself in a rank (the TCP engine's loop, a
group's worker, the flight recorder's watchers, the store's server...).

Such a thread is a daemon named ``collcomm-…`` and ends with the job. A program that waits
for "every other thread" (``for t in threading.enumerate(): t.join()``, as mpi4py's
demo/threads/issue784.py does; mpi4py starts no threads) would wait for it forever, so
``join()`` from outside collcomm returns at once, the thread still running (as a join whose
timeout passed: ``is_alive()`` says so); collcomm's own code ends its threads with
:meth:`HelperThread.end`, which waits as ``join`` does.
"""
from __future__ import annotations

import queue
import threading
from typing import Callable


class HelperThread(threading.Thread):
    """A daemon thread of collcomm's own (see the module docstring)."""

    def __init__(self, target: object, name: str, args: tuple = ()) -> None:
        super().__init__(target=target, args=args, name=name, daemon=True)  # type: ignore[arg-type]

    def join(self, timeout: float | None = None) -> None:
        """Returns at once: collcomm's threads end with the job, not when a program joins
        them (:meth:`end` is collcomm's own wait)."""
        return None

    def end(self, timeout: float | None = None) -> None:
        """Wait for the thread to end (``threading.Thread.join``), at most ``timeout`` s."""
        threading.Thread.join(self, timeout)


class _Standby:
    """One idle daemon thread, started while Python still starts threads (:func:`standby`,
    when a rank joins a job), that runs what :func:`run_with_patience` hands it where
    Python starts no new one: at interpreter exit 3.12 refuses new threads ("can't create
    new thread at interpreter shutdown") but runs the ones it has until the exit hooks are
    done, and a program's exit is where a rank that never called destroy_process_group
    leaves the job. (Run in the caller instead, a step whose store no longer answers, a
    cut link, held the exit for the store client's socket timeout.)"""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue | None = None
        self._thread: HelperThread | None = None

    def start(self) -> None:
        with self._lock:
            if self._thread is not None and self._thread.is_alive():   # (not after a fork)
                return
            q: queue.SimpleQueue = queue.SimpleQueue()
            t = HelperThread(self._loop, "collcomm-standby", (q,))
            t.start()
            self._queue, self._thread = q, t

    @staticmethod
    def _loop(q: queue.SimpleQueue) -> None:
        while True:
            target, done = q.get()
            try:
                target()
            except BaseException:  # noqa: BLE001 - (the steps handed over catch their own)
                pass
            finally:
                done.set()

    def run(self, target: Callable[[], None], patience: float) -> bool | None:
        """``target`` on the standby thread, waited for ``patience`` s at most: whether it
        finished; None without a live standby thread."""
        q, t = self._queue, self._thread
        if q is None or t is None or not t.is_alive():
            return None
        done = threading.Event()
        q.put((target, done))
        return done.wait(patience)


_standby = _Standby()


def standby() -> None:
    """Start this process's standby thread (see :class:`_Standby`) if it has none."""
    _standby.start()


def run_with_patience(target: Callable[[], None], name: str, patience: float) -> bool:
    """Run ``target`` on a daemon thread named ``name`` and wait for it ``patience`` seconds
    at most (a store that stops answering then costs that, not its client's socket
    timeout); True when it finished. Where Python starts no thread (at exit, 3.12+), the
    standby thread runs it (:class:`_Standby`), or, without one, the caller."""
    t = threading.Thread(target=target, daemon=True, name=name)
    try:
        t.start()
    except RuntimeError:
        finished = _standby.run(target, patience)
        if finished is None:
            target()
            return True
        return finished
    t.join(patience)
    return not t.is_alive()
