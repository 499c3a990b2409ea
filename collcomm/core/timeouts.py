"""Per-call timeouts: ``collcomm.call_timeout`` scopes and the timeout a wait uses.

A ``call_timeout(seconds)`` block bounds every wait of the collectives and point-to-point
calls its thread starts, overriding the group's and the job's timeout; scopes nest (the
innermost wins) and are per thread. While any scope is open anywhere, the fast call is
off (:func:`collcomm.core.fastpath.timeout_scope`): it cannot see a thread's scope.
"""
from __future__ import annotations

import threading

from ..errors import InvalidArgumentError
from . import fastpath

__all__ = ["call_timeout", "current_timeout", "scope", "started_under"]


class _Local(threading.local):
    timeout: float | None = None   # the innermost call_timeout of this thread (a class default:
                                   # reading it never raises, which getattr(..., None) pays for)


_local = _Local()


class started_under:
    """``with started_under(seconds):`` runs its block under the scope a call was started
    under (``scope()`` then), as if that call's thread: requests it makes there are bounded
    by that scope, or by the group's timeout for None, not by the scope of the thread that
    finishes the call (a wait handing a neighbourhood exchange's receives to regular
    requests, collcomm.MPI._neighbor_ops). :class:`call_timeout` is this with a scope the
    program chooses."""

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds

    def __enter__(self) -> "started_under":
        self._saved = _local.timeout
        _local.timeout = self.seconds
        if self.seconds is not None:
            fastpath.timeout_scope(1)
        return self

    def __exit__(self, *exc: object) -> None:
        _local.timeout = self._saved
        if self.seconds is not None:
            fastpath.timeout_scope(-1)


class call_timeout(started_under):
    """``with collcomm.call_timeout(5.0): ...`` bounds every wait of the collectives and
    point-to-point calls started in the block (this thread), overriding the group's and
    the job's timeout (fast calls, which cannot see this thread's timeout, are off
    meanwhile)."""

    def __init__(self, seconds: float) -> None:
        if not seconds > 0:
            raise InvalidArgumentError(f"call_timeout: seconds must be > 0, got {seconds!r}")
        super().__init__(float(seconds))


def current_timeout(default: float) -> float:
    """The innermost ``call_timeout`` of this thread, else ``default``."""
    value = _local.timeout
    return default if value is None else value


def scope() -> float | None:
    """This thread's innermost ``call_timeout`` (None: none open)."""
    return _local.timeout


