"""``Work``: the handle an ``async_op=True`` collective returns (torch.distributed style)."""
from __future__ import annotations

import sys
import threading
import traceback
from typing import Any, Callable

from ..errors import CollcommError, CommTimeoutError


class Work:
    """A collective started in the background. ``wait()`` re-raises its error, if any.

    ``_lock`` (a leaf) guards the result and the callback list; callbacks are user code and
    run after it is released: on the thread that finishes the work (the group's worker),
    or on the caller of ``then`` when the work is already done. One that raises on the
    worker is reported on stderr and stops neither the other callbacks nor the worker.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._result: Any = None
        self._exc: BaseException | None = None
        self._callbacks: list[Callable[["Work"], None]] = []

    # -- producer side -------------------------------------------------------------
    def _finish(self, result: Any = None, exc: BaseException | None = None) -> None:
        with self._lock:
            if self._done.is_set():
                return
            self._result, self._exc = result, exc
            callbacks, self._callbacks = self._callbacks, []
            self._done.set()
        for cb in callbacks:
            try:
                cb(self)
            except Exception:  # noqa: BLE001 - user code must not kill the worker thread
                print(f"collcomm: a callback of {self.name}'s Work raised:\n"
                      f"{traceback.format_exc()}", file=sys.stderr, end="")

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            result = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the waiter
            self._finish(exc=exc)
        else:
            self._finish(result=result)

    # -- consumer side -------------------------------------------------------------
    def wait(self, timeout: float | None = None) -> bool:
        """Block until the operation finished; raise its error. Returns True (torch)."""
        if not self._done.wait(timeout):
            raise CommTimeoutError(f"{self.name}: Work.wait timed out after {timeout} s")
        if self._exc is not None:
            if isinstance(self._exc, CollcommError):
                raise self._exc
            raise CollcommError(f"{self.name} failed: {self._exc!r}") from self._exc
        return True

    def is_completed(self) -> bool:
        return self._done.is_set()

    def is_success(self) -> bool:
        return self._done.is_set() and self._exc is None

    def exception(self) -> BaseException | None:
        return self._exc

    def result(self) -> Any:
        """The value the collective produced (after waiting)."""
        self.wait()
        return self._result

    def then(self, callback: Callable[["Work"], None]) -> None:
        """Call ``callback(work)`` when done (at once, on this thread, if already done)."""
        with self._lock:
            if not self._done.is_set():
                self._callbacks.append(callback)
                return
        callback(self)


def completed_work(name: str, result: Any = None) -> Work:
    work = Work(name)
    work._finish(result=result)
    return work
