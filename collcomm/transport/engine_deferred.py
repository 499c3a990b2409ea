"""The engine's deferred receives: non-blocking receives whose posting waits for their wait.

A ``Deferred`` (core/p2p.py: a non-blocking receive from a peer on this host) posts
nothing when it is made: its ``wait()`` receives natively. It still counts as posted in
the order it was made. :class:`~collcomm.transport.engine.Engine` keeps the held ones in
``_deferred`` (guarded by ``_defer_mutex``; ``_defer_lock`` is its Condition) and, before a
later receive, probe or native receive could match a message, posts them here in order
with the regular code (:meth:`DeferredReceives.post_deferred`). A deferred receive whose
own wait is receiving natively stays first in line: a thread that must post meanwhile
asks it to stop (``steal``) and waits for it to post or complete (:meth:`begin_native`,
:meth:`end_native`). The lock order is in engine.py's module docstring.
"""
from __future__ import annotations

import threading
from typing import Any

__all__ = ["DeferredReceives"]


class DeferredReceives:
    """A mixin of Engine, which sets ``_deferred``, ``_defer_mutex``, ``_defer_lock`` and
    ``_stealing`` in its ``__init__``."""

    _deferred: list[Any]
    _defer_mutex: Any
    _defer_lock: threading.Condition
    _stealing: int

    # -- deferred receives ---------------------------------------------
    def defer(self, d: Any) -> None:
        """Hold a receive whose posting waits for its wait (core/p2p.py ``Deferred``).
        Until then a receive posted here, a probe or a native receive (native/_p2p.c
        declines while any is held) posts it first (``d.post()``, in order)."""
        self._deferred.append(d)

    def _post_before(self, upto: Any) -> None:
        """Post the deferred receives before ``upto`` (all of them for None), holding
        ``_defer_lock``. One whose own wait is receiving natively in another thread
        (``d.waiting``) is asked to stop (``d.f.steal``: its C loop leaves at its next
        look at an empty ring, within about 1 ms) and waited for: its thread then posts it
        or completes it, and nothing later is posted before that."""
        held = self._deferred
        while held and held[0] is not upto:
            d = held[0]
            if d.waiting:
                d.f.steal = 1
                self._steal_wait()
                continue
            del held[0]
            d.post()

    def _steal_wait(self) -> None:
        """Wait (holding ``_defer_mutex``) for a native wait to end (:meth:`end_native`)."""
        self._stealing += 1
        try:
            self._defer_lock.wait(0.01)
        finally:
            self._stealing -= 1

    def post_deferred(self, upto: Any = None) -> bool:
        """Post the deferred receives in their order: all of them, or those up to and
        including ``upto``; True if ``upto`` was posted here (False: posted or withdrawn
        before)."""
        with self._defer_mutex:
            if upto is None:
                self._post_before(None)
                return False
            while upto.waiting:      # its own wait receives natively in another thread
                upto.f.steal = 1
                self._steal_wait()
            if upto not in self._deferred:
                return False
            self._post_before(upto)
            if not self._deferred or self._deferred[0] is not upto:
                return False     # posted meanwhile by another thread (see begin_native)
            del self._deferred[0]
            upto.post()
            return True

    def post_deferred_if_free(self) -> None:
        """Post every deferred receive now, unless another thread holds the line (the
        mutex taken, or one of them receiving natively): then leave them. Called by a
        channel about to read a large body (holding its ``poll_lock``, so the mutex is
        only tried), which then lands in place rather than aside and copied again."""
        if not self._defer_mutex.acquire(blocking=False):
            return
        try:
            if not any(d.waiting for d in self._deferred):
                self._post_before(None)
        finally:
            self._defer_mutex.release()

    def post_deferred_soon(self) -> None:
        """Post every deferred receive now, without waiting: unless the line's mutex is
        taken (then leave them), or a receive's own wait is receiving natively: then ask
        it to stop (``steal``, as :meth:`_post_before` does, but not waiting for it): its
        thread posts it and goes the regular way, and a later call posts the rest."""
        if not self._defer_mutex.acquire(blocking=False):
            return
        try:
            waiting = [d for d in self._deferred if d.waiting]
            for d in waiting:
                d.f.steal = 1
            if not waiting:
                self._post_before(None)
        finally:
            self._defer_mutex.release()

    def begin_native(self, d: Any) -> bool:
        """The wait of deferred receive ``d`` is about to receive natively: post those
        deferred before it and mark it ``waiting`` (it stays first in line, so nothing
        later is posted before :meth:`end_native`). False if it is no longer held."""
        with self._defer_mutex:
            if d.waiting or d not in self._deferred:   # (waited for in another thread too)
                return False
            # _post_before may wait for another thread's native wait to end, letting go of
            # the mutex: a third thread posting up to its own receive can post d meanwhile
            # (then d is no longer held: its wait takes the regular path, d.h)
            self._post_before(d)
            if not self._deferred or self._deferred[0] is not d:
                return False
            d.waiting = True
            return True

    def end_native(self, d: Any, post: bool) -> None:
        """The native wait of ``d`` is over: take it out (posting it here if ``post``:
        C left it to the regular path), in its turn, and wake the threads waiting to
        post after it."""
        with self._defer_mutex:
            try:
                self._deferred.remove(d)
                if post:
                    d.post()
            finally:
                d.waiting = False
                d.f.steal = 0
                if self._stealing:
                    self._defer_lock.notify_all()

    def withdraw_deferred(self, d: Any) -> bool:
        """Take a deferred receive out unposted (MPI_Cancel); False if it was posted."""
        with self._defer_mutex:
            if d in self._deferred and not d.waiting:
                self._deferred.remove(d)
                return True
        return False
