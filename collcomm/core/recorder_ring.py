"""The flight recorder's ring: the process's last calls, read back and dumped as JSON.

:class:`Recorder` is the process's ring buffer of records (:mod:`.recorder_records` has
their layout; :func:`new_ring` makes the ring itself, C's where the native core is built);
it reads them back per group (the state the other ranks ask for through the store) or as
a whole (a snapshot), and :meth:`Recorder.dump` writes that snapshot to
``COLLCOMM_FR_DIR`` (:func:`fr_dir`). :func:`recorder` is the process's one ring (made on
first use), :func:`dump` dumps it now and :func:`gather_states` asks every rank of the job
for its state. The process's switches, :data:`settings` (:class:`.recorder_settings.Settings`,
replaced by :func:`reload_settings`), are kept here, where the ring reads them.
:mod:`.recorder` re-exports these names (``recorder.settings``: always the current one).
"""
from __future__ import annotations

import collections
import json
import logging
import os
import socket
import tempfile
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any

from .recorder_exchange import GATHER_SECONDS, gather_from
from .recorder_records import COMPLETED, R_GROUP, record_entry
from .recorder_settings import Settings

if TYPE_CHECKING:
    from .recorder import Observer

log = logging.getLogger("collcomm")

_perf = time.perf_counter

settings = Settings()


def reload_settings() -> None:
    """Re-read the environment (tests and ``collcomm.stats(enable=True)``)."""
    global settings
    settings = Settings()


def new_ring(size: int) -> Any:
    """The ring of ``size`` records: the native core's ``Ring`` where it is built (the C
    writers refill its oldest record in place: native/_record_ring.c), else a bounded
    deque; both append, read oldest first and say their ``maxlen``."""
    from .. import native

    if native.core is not None and hasattr(native.core, "Ring"):
        return native.core.Ring(size)
    return collections.deque(maxlen=size)


class Recorder:
    """The process's ring buffer of records (see :mod:`.recorder`'s docstring)."""

    def __init__(self, size: int) -> None:
        self.size = max(1, size)
        self.ring: Any = new_ring(self.size)
        self.observers: "weakref.WeakSet[Observer]" = weakref.WeakSet()
        self.rank = 0
        self.world_size = 1
        self.job = ""
        self.dumped: str | None = None
        self.exchange: Any = None

    def add(self, rec: Any) -> None:
        self.ring.append(rec)

    def records(self) -> list[Any]:
        """The records still in the ring, oldest first."""
        while True:
            try:
                return list(self.ring)
            except RuntimeError:   # (the deque) appended to while copied (another thread): again
                continue

    # -- reading -------------------------------------------------------------------------
    entry = staticmethod(record_entry)

    def group_states(self, recent: int = 16) -> dict[str, Any]:
        """Per group (key: ctx in hex): name, ranks and its ``recent`` last records."""
        now, wall = _perf(), time.time()
        by_group: dict[Any, list[list[Any]]] = {}
        for rec in reversed(self.records()):
            lst = by_group.setdefault(rec[R_GROUP], [])
            if len(lst) < recent:
                lst.append(rec)
        out: dict[str, Any] = {}
        for obs in list(self.observers):
            recs = [self.entry(r, now, wall) for r in reversed(by_group.get(obs.index, []))]
            done = [r for r in recs if r["state"] == COMPLETED and "peer" not in r]
            out[f"{obs.ctx:x}"] = {"name": obs.name, "ranks": obs.ranks, "recent": recs,
                                   "last_completed": done[-1]["seq"] if done else 0}
        return out

    def snapshot(self, reason: str) -> dict[str, Any]:
        now, wall = _perf(), time.time()
        return {"version": 1, "rank": self.rank, "world_size": self.world_size, "job": self.job,
                "pid": os.getpid(), "host": socket.gethostname(), "reason": reason,
                "time": wall, "fr_size": self.size,
                "groups": {f"{o.ctx:x}": {"name": o.name, "ranks": o.ranks} for o in list(self.observers)},
                "entries": [self.entry(r, now, wall) for r in self.records()]}

    def dump(self, reason: str, peers: dict[int, Any] | None = None) -> str | None:
        """Write the ring as JSON to ``COLLCOMM_FR_DIR``; returns the path (None on failure).
        ``peers``: the other ranks' states gathered through the store, kept in the dump
        (``trace analyze`` uses them for ranks that left no dump)."""
        if not settings.fr_size:
            return None
        folder = fr_dir(self.job)
        try:
            os.makedirs(folder, exist_ok=True)
            path = os.path.join(folder, f"rank{self.rank}.json")
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "w") as f:
                snap = self.snapshot(reason)
                if peers:
                    snap["peer_states"] = {str(r): st for r, st in peers.items() if st is not None}
                json.dump(snap, f, indent=1)
            os.replace(tmp, path)
        except OSError as exc:
            log.warning("flight recorder: could not write its dump to %s: %s", folder, exc)
            return None
        self.dumped = path
        return path


def fr_dir(job: str = "") -> str:
    """Where dumps go: ``COLLCOMM_FR_DIR``, else ``/tmp/collcomm-fr-<job id>``."""
    folder = os.environ.get("COLLCOMM_FR_DIR")
    if folder:
        return folder
    if not job:
        from ..rendezvous.auth import job_id

        job = job_id()
    return os.path.join(tempfile.gettempdir(), f"collcomm-fr-{job}")


_recorder: Recorder | None = None
_lock = threading.Lock()


def recorder() -> Recorder:
    """The process's recorder (made on first use)."""
    global _recorder
    if _recorder is None:
        with _lock:
            if _recorder is None:
                _recorder = Recorder(settings.fr_size)
    return _recorder


def dump(reason: str = "requested") -> str | None:
    """Dump this process's flight recorder now (``collcomm.core.recorder.dump()``)."""
    return recorder().dump(reason)


def gather_states(patience: float = GATHER_SECONDS + 1.0) -> dict[int, Any]:
    """Every rank's state, asked through the store (:func:`.recorder_exchange.gather_from`
    for this process's recorder)."""
    return gather_from(recorder(), patience)
