"""``Work``: the handle an ``async_op=True`` collective returns (torch.distributed style)."""
from __future__ import annotations

import threading
from typing import Any, Callable

from ..errors import CollcommError, CommTimeoutError


class Work:
    """A collective started in the background. ``wait()`` re-raises its error, if any."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._done = threading.Event()
        self._result: Any = None
        self._exc: BaseException | None = None
        self._callbacks: list[Callable[["Work"], None]] = []

    # -- producer side -------------------------------------------------------------
    def _finish(self, result: Any = None, exc: BaseException | None = None) -> None:
        self._result, self._exc = result, exc
        self._done.set()
        for cb in self._callbacks:
            cb(self)

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
        """Call ``callback(work)`` when done (at once if already done)."""
        if self._done.is_set():
            callback(self)
        else:
            self._callbacks.append(callback)


def completed_work(name: str, result: Any = None) -> Work:
    work = Work(name)
    work._finish(result=result)
    return work
