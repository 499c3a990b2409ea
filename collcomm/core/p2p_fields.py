"""The fields a deferred receive (core/p2p.py ``Deferred``) is made of: the native core's
C type (native/_p2p_deferred.c: the fields and the wait's common case in C), or, where the
core is not built, a Python stand-in with the same slots whose ``wait`` is the Python
``_wait``."""
from __future__ import annotations

from typing import Any

from ..errors import CollcommError
from ..transport.base import Status
from .timeouts import _local as _timeouts_local

__all__ = ["deferred_fields"]


class _DeferredFields:
    """A Deferred's fields and its wait where the native core is missing (where no
    Deferred is ever made: the native entry makes them): the C type
    (native/_p2p_deferred.c) has the same fields and does the wait's common case itself."""

    __slots__ = ("f", "g", "eng", "arr", "local", "utag", "umask", "sig", "tag", "limit", "rec",
                 "h", "req", "status", "exc", "waiting", "_exc", "_ok")

    def wait(self, timeout: float | None = None) -> Any:
        return self._wait(timeout)  # type: ignore[attr-defined]


def deferred_fields() -> Any:
    """The base of core/p2p.py's Deferred: the C type where the native core is built
    (handed, once, what its wait needs from Python), else the stand-in."""
    from .. import native as nat
    if nat.core is None or not hasattr(nat.core, "Deferred"):
        return _DeferredFields
    nat.core.Deferred._setup(_timeouts_local, CollcommError, Status)
    return nat.core.Deferred
