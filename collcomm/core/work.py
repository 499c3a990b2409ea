"""``Work``: the handle an ``async_op=True`` collective returns (torch.distributed style)."""
from __future__ import annotations

import sys
import threading
import time
import traceback
from typing import Any, Callable

from ..errors import CollcommError, CommTimeoutError


def wait_seconds(timeout: Any) -> float | None:
    """A ``wait(timeout)`` argument as seconds: a number as it is, a ``timedelta`` as its
    seconds (torch passes those; ``timedelta(0)`` is torch's "no timeout": None)."""
    if hasattr(timeout, "total_seconds"):
        seconds = float(timeout.total_seconds())
        return seconds if seconds > 0 else None
    return float(timeout)


class Work:
    """A collective started in the background. ``wait()`` re-raises its error, if any.

    ``_lock`` (a leaf) guards the result, the callback list and ``_event`` (made only
    when a thread must block for the call: most are waited for by the thread that ran
    them, see core/async_calls.py); callbacks are user code and run after it is released: on the thread that finishes the work (the group's worker),
    or on the caller of ``then`` when the work is already done. One that raises on the
    worker is reported on stderr and stops neither the other callbacks nor the worker.
    """

    __slots__ = ("name", "_group", "_tag", "_started", "_lock", "done", "_event", "_result",
                 "_exc", "_callbacks", "__weakref__")

    def __init__(self, name: str, group: Any = None, tag: int = 0) -> None:
        self.name = name
        self._group, self._tag = group, tag   # the call's group and tag (its sequence number)
        self._started = False
        self._lock = threading.Lock()
        self.done = False                       # finished (read without the lock)
        self._event: threading.Event | None = None
        self._result: Any = None
        self._exc: BaseException | None = None
        self._callbacks: list[Callable[["Work"], None]] | None = None

    # -- producer side -------------------------------------------------------------
    def _finish(self, result: Any = None, exc: BaseException | None = None) -> None:
        with self._lock:
            if self.done:
                return
            self._result, self._exc = result, exc
            callbacks, self._callbacks = self._callbacks, None
            self.done = True
            event = self._event
        if event is not None:
            event.set()
        for cb in callbacks or ():
            try:
                cb(self)
            except Exception:  # noqa: BLE001 - user code must not kill the worker thread
                print(f"collcomm: a callback of {self.name}'s Work raised:\n"
                      f"{traceback.format_exc()}", file=sys.stderr, end="")

    def _run(self, fn: Callable[[], Any]) -> None:
        self._started = True
        try:
            result = fn()
        except Exception as exc:  # noqa: BLE001 - handed to the waiter
            self._finish(exc=exc)
        except BaseException as exc:   # Ctrl-C in a call run by its waiter: recorded, and raised
            self._finish(exc=exc)
            raise
        else:
            self._finish(result=result)

    # -- consumer side -------------------------------------------------------------
    def wait(self, timeout: float | None = None) -> bool:
        """Block until the operation finished; raise its error. Returns True (torch).

        Without a timeout, a call still queued runs here, on this thread, with the group's
        calls queued before it (core/async_calls.py); with one, the group's worker runs it."""
        if timeout is not None:
            timeout = wait_seconds(timeout)
        g = self._group
        if not self.done and g is not None:
            if timeout is None:
                fast = g.fast     # a call started in two parts: finished here in C
                if fast is None or not fast.wait_part(self):
                    g.async_calls.run_through(self)
            else:
                self._group.async_calls.hand_off()
        if not self.done and not self._block(timeout):
            raise self._timeout_error(timeout)
        if self._exc is not None:
            if isinstance(self._exc, CollcommError):
                raise self._exc
            raise CollcommError(f"{self.name} failed: {self._exc!r}") from self._exc
        return True

    def _block(self, timeout: float | None = None) -> bool:
        """Wait for another thread to finish the call; whether it did within ``timeout``."""
        with self._lock:
            if self.done:
                return True
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        return event.wait(timeout)

    def _timeout_error(self, timeout: float | None) -> CommTimeoutError:
        """What a timed-out wait raises: the call, its group and this rank, whether it is
        running or still queued, and (from the flight recorder, asking the other ranks
        through the store) which ranks have not entered it. The call goes on: a later
        wait may still succeed."""
        g = self._group
        head = f"{self.name}" + (f" on {g.describe()}" if g is not None else "")
        state = ("it is still running" if self._started else
                 "it has not started: earlier async calls of the group are still running")
        msg = f"{head}: Work.wait timed out after {timeout:g} s; {state} (it goes on: wait again)"
        late: list[int] = []
        obs = getattr(g, "observer", None)
        if g is not None and obs is not None and self._tag:
            try:
                report = self._missing(obs, 1.5 if timeout is None else min(1.5, max(0.2, timeout)))
            except Exception as exc:  # noqa: BLE001 - the report must never hide the timeout
                report = {"text": f"(could not ask the other ranks where they are: {exc!r})"}
            if report:
                late = list(report.get("missing", [])) + list(report.get("unknown", []))
                msg += "\n" + report["text"]
        elif g is not None:
            msg += " (which ranks are late is known only with the flight recorder on: COLLCOMM_FR_SIZE)"
        return CommTimeoutError(msg, peer=late[0] if late else None)

    def _missing(self, obs: Any, gather: float) -> dict[str, Any]:
        """The flight recorder's account of who has not entered this call."""
        from . import recorder as fr

        rec = next((r for r in reversed(obs.rec.records())
                    if r[fr.R_GROUP] == obs.index and r[fr.R_SEQ] == self._tag), None)
        if rec is None:
            return {}
        ring = fr.recorder()
        states = ring.exchange.gather(gather) if ring.exchange is not None else fr.gather_states()
        return fr.missing_report(obs, rec, states)

    def is_completed(self) -> bool:
        """Whether it finished; if not, the group's worker runs it now (someone polls). A
        call started in two parts is finished here, in C, once every rank has arrived
        (its second part then waits for nothing; until then nothing needs to run)."""
        if self.done:
            return True
        g = self._group
        if g is not None:
            fast = g.fast
            tested = None if fast is None else fast.test_part(self)
            if tested is not None:
                return self.done
            g.async_calls.hand_off()
            # let the worker take the GIL: a caller polling in a loop holds it, and the
            # worker waited up to the switch interval (5 ms) per poll for it
            time.sleep(0)
            return self.done
        return False

    def is_success(self) -> bool:
        return self.done and self._exc is None

    def exception(self) -> BaseException | None:
        return self._exc

    def result(self) -> Any:
        """The value the collective produced (after waiting)."""
        self.wait()
        return self._result

    def then(self, callback: Callable[["Work"], None]) -> None:
        """Call ``callback(work)`` when done (at once, on this thread, if already done);
        a call still queued is handed to the group's worker now."""
        with self._lock:
            if not self.done:
                if self._callbacks is None:
                    self._callbacks = []
                self._callbacks.append(callback)
                queued = True
            else:
                queued = False
        if not queued:
            callback(self)
        elif self._group is not None:
            self._group.async_calls.hand_off()


def completed_work(name: str, result: Any = None) -> Work:
    work = Work(name)
    work._finish(result=result)
    return work
