"""The ``Work`` objects the collcomm backend hands to torch.

torch expects every backend call to return a ``torch.distributed.Work``; C++ callers
(DDP's reducer, ``_broadcast_coalesced``) reach only its ``wait`` and ``get_future``,
Python callers everything. Three kinds:

* :class:`DoneWork` — the call already ran in the caller's thread (torch's Python API
  passes ``opts.asyncOp = async_op``; a blocking call runs inline, with no thread hop).
* :class:`CollWork` — the call runs on the group's worker thread (``async_op=True``, and
  every call from C++, whose options default to asynchronous). ``wait(timeout)`` raises a
  timeout error if it is not done in time (the call itself goes on); ``get_future()``
  completes when the worker finishes it, with the list of output tensors (what DDP's comm
  hooks read with ``fut.value()[0]``) or with the call's error.
* :class:`P2PWork` — a send or a receive in flight on the transport; ``_source_rank()``
  tells the sender of a receive from any rank. ``get_future()`` starts a helper thread
  that waits for it.

Errors surface translated (:func:`collcomm.torch.errors.translate`).
"""
from __future__ import annotations

import datetime
import threading
import time
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist

from ..core.work import Work as CoreWork
from ..errors import CollcommError, CommTimeoutError
from ..transport.base import Handle
from .errors import translate
from ..helper_thread import HelperThread

__all__ = ["CollWork", "DoneWork", "P2PWork", "done", "gathered", "seconds"]


#: one core call of a torch call: started inline (False) or on the worker (True)
Start = Callable[[bool], "CoreWork | None"]


def seconds(timeout: Any) -> float | None:
    """torch's timeouts (``timedelta``, 0 = none given) as seconds or None."""
    if timeout is None:
        return None
    value = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else float(timeout)
    return value if value > 0 else None


class _Work(dist.Work):
    # slots: a blocking call's DoneWork sets two fields, 0.1 µs less than through a __dict__
    __slots__ = ("_name", "_value", "_future", "_future_lock", "__dict__")

    def __init__(self, name: str, result: Any) -> None:
        dist.Work.__init__(self)
        self._name = name
        self._value = result
        self._future: torch.futures.Future | None = None
        self._future_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<collcomm {type(self).__name__} {self._name}{' done' if self.is_completed() else ''}>"

    def result(self) -> Any:
        """The call's output tensors (after waiting), as torch's ``Work.result()``."""
        self.wait()
        return self._value

    def synchronize(self) -> None:
        """Nothing to do on the CPU (there is no stream to join)."""

    def source_rank(self) -> int:
        return self._source_rank()

    def _source_rank(self) -> int:
        raise RuntimeError(f"{self._name}: only a receive from any rank has a source rank")

    def get_future(self) -> torch.futures.Future:
        with self._future_lock:
            if self._future is None:
                self._future = torch.futures.Future()
                self._arm(self._future)
            return self._future

    def _arm(self, fut: torch.futures.Future) -> None:
        raise NotImplementedError

    def _settle(self, fut: torch.futures.Future, exc: BaseException | None) -> None:
        if fut.done():
            return
        if exc is None:
            fut.set_result(self._value)
        else:
            fut.set_exception(translate(exc))


class DoneWork(_Work):
    """A call that already completed (successfully) before it was returned: made by
    :func:`done`, at a blocking call's cost (0.4 µs; through ``_Work.__init__``, 0.8 µs)."""

    __slots__ = ()
    __init__ = dist.Work.__init__   # no Python frame: done() sets the fields

    def wait(self, timeout: Any = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def exception(self) -> BaseException | None:
        return None

    def get_future(self) -> torch.futures.Future:
        with _DONE_LOCK:     # shared: arming a done future runs no callback
            try:
                return self._future
            except AttributeError:    # the slot is unset until the first call
                fut = self._future = torch.futures.Future()
                fut.set_result(self._value)
                return fut

    def _arm(self, fut: torch.futures.Future) -> None:
        fut.set_result(self._value)


_DONE_LOCK = threading.Lock()


def gathered(output_lists: Any) -> Any:
    """The value of a call whose outputs are lists of tensors (all_gather, gather), as
    gloo gives it (``result()``, the future's value): the one list itself (so
    ``torch.cat(fut.value())`` works), ``[]`` for none (gather's other ranks), the lists
    when there are several (all_gather_coalesced)."""
    if isinstance(output_lists, (list, tuple)) and len(output_lists) <= 1:
        return list(output_lists[0]) if output_lists else []
    return output_lists


def done(name: str, result: Any) -> DoneWork:
    """The completed ``Work`` of call ``name`` whose outputs are ``result``."""
    w = DoneWork()
    w._name = name
    w._value = result
    return w


class CollWork(_Work):
    """Collective calls running on the group's worker (in order: the last one ends last)."""

    def __init__(self, name: str, works: Sequence[CoreWork], result: Any) -> None:
        super().__init__(name, result)
        self._works = list(works)

    def wait(self, timeout: Any = None) -> bool:
        limit = seconds(timeout)
        deadline = None if limit is None else time.monotonic() + limit
        try:
            for w in self._works:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                w.wait(left)
        except CollcommError as exc:
            raise translate(exc) from None
        return True

    def is_completed(self) -> bool:
        return all(w.is_completed() for w in self._works)

    def is_success(self) -> bool:
        return all(w.is_success() for w in self._works)

    def exception(self) -> BaseException | None:
        for w in self._works:
            exc = w.exception()
            if exc is not None:
                return translate(exc)
        return None

    def _arm(self, fut: torch.futures.Future) -> None:
        if not self._works:
            fut.set_result(self._value)
            return
        fired = threading.Lock()

        def fire(_: Any = None) -> None:
            if not fired.acquire(blocking=False):
                return
            exc = next((w.exception() for w in self._works if w.exception() is not None), None)
            self._settle(fut, exc)

        last = self._works[-1]
        last.then(fire)
        if last.is_completed():   # then() may miss a finish that races with it
            fire()


class P2PWork(_Work):
    """A point-to-point send or receive; ``finish`` runs once after it completed."""

    def __init__(self, name: str, handle: Handle, to_local: Callable[[int], int], result: Any,
                 finish: Callable[[], None] | None = None) -> None:
        super().__init__(name, result)
        self._handle = handle
        self._to_local = to_local
        self._finish = finish
        self._source: int | None = None
        self._exc: BaseException | None = None
        self._lock = threading.Lock()

    def wait(self, timeout: Any = None) -> bool:
        limit = seconds(timeout)
        try:
            status = self._handle.wait(limit)
        except CollcommError as exc:
            err = translate(exc)
            if limit is None or not isinstance(exc, CommTimeoutError):
                self._exc = err   # (a timed-out look leaves it pending: it may still complete)
            raise err from None
        with self._lock:
            if self._source is None:
                self._source = self._to_local(status.source)
                if self._finish is not None:
                    self._finish()
        return True

    def is_completed(self) -> bool:
        try:
            return self._handle.test()
        except CollcommError as exc:
            self._exc = translate(exc)
            return True

    def is_success(self) -> bool:
        return self.is_completed() and self._exc is None

    def exception(self) -> BaseException | None:
        self.is_completed()
        return self._exc

    def _source_rank(self) -> int:
        self.wait()
        assert self._source is not None
        return self._source

    def _arm(self, fut: torch.futures.Future) -> None:
        def waiter() -> None:
            try:
                self.wait()
            except BaseException as exc:  # noqa: BLE001 - handed to the future
                self._settle(fut, exc)
            else:
                self._settle(fut, None)

        HelperThread(waiter, f"collcomm-{self._name}").start()
