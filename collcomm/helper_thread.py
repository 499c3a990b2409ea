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


def run_with_patience(target: Callable[[], None], name: str, patience: float) -> bool:
    """Run ``target`` on a daemon thread named ``name`` and wait for it ``patience`` seconds
    at most (a store that stops answering then costs that, not its client's socket
    timeout); True when it finished. Where Python starts no thread, ``target`` runs here
    instead: at interpreter exit Python 3.12 refuses new threads ("can't create new thread
    at interpreter shutdown"), and a program's exit is where a rank that never called
    destroy_process_group leaves the job (an atexit hook)."""
    t = threading.Thread(target=target, daemon=True, name=name)
    try:
        t.start()
    except RuntimeError:
        target()
        return True
    t.join(patience)
    return not t.is_alive()
