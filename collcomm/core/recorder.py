"""The flight recorder: every rank's last N calls, and who is missing when a call hangs.

Each process keeps one ring buffer of its last ``COLLCOMM_FR_SIZE`` (default 2000; 0 turns
the recorder off) collective and point-to-point calls. A record is a short list (see the
``R_*`` indices): the group, the call's sequence number in the group, the op, its 64-bit
signature (dtype, count, root, reduce op: :mod:`collcomm.algorithms.signature`), the
algorithm's function, the caller's code object and line, the enter and end times and the
state (entered / completed / failed). Everything else (names, file:line text, the
algorithm's name) is computed when a record is read, never per call.

Every :class:`~collcomm.core.group.ProcessGroup` gets an :class:`Observer` (None when the
recorder and every other observation is off); ``ProcessGroup.call``/``run`` hand each call
to it. The observer records the call, optionally traces it (:mod:`.tracing`), counts it
(:mod:`.stats`) or checks it against the other ranks first (``COLLCOMM_DEBUG=DETAIL``).

When a call fails by timeout, a lost peer or a mismatch, the rank dumps its ring as JSON to
``COLLCOMM_FR_DIR`` (default ``/tmp/collcomm-fr-<job id>``; also on ``SIGUSR1``), and for a
timeout asks every rank of the job, through the rendezvous store, where it is: each rank
runs a watcher thread blocked on its own store connection that answers such requests with
its per-group state, even while its main thread is stuck in a collective. Nothing goes
through the store per call. The error then names the ranks that never entered the call,
the last call each of them entered (op, seq, file:line) and whether it completed, and
"unknown" for ranks that did not answer (dead, or gone).

A stall monitor thread logs (logger ``collcomm``, WARNING) once per call that waited more
than ``COLLCOMM_STALL_WARN`` seconds (default 60) which ranks have arrived and which have
not, with their last calls.

This module keeps the ring (:class:`Recorder`), the :class:`Observer` and the process's
:data:`settings`, and re-exports the names of its parts: :mod:`.recorder_records` (the
record layout, callers' file:line, algorithm names), :mod:`.recorder_settings`,
:mod:`.recorder_exchange` (asking the other ranks through the store),
:mod:`.recorder_report` (who is missing, the DETAIL check) and :mod:`.recorder_job` (the
job-wide parts: store watcher, stall monitor, SIGUSR1 dump).
"""
from __future__ import annotations

import collections
import json
import logging
import os
import socket
import sys
import tempfile
import threading
import time
import weakref
from typing import Any, Callable

from ..algorithms import signature
from ..errors import CollcommError, CommTimeoutError, MismatchError, PeerLostError, with_context
from .recorder_exchange import GATHER_SECONDS, gather_from
from .recorder_job import start_job
from .recorder_records import (_OBSERVERS, _PKG, _SEQ_MASK, COMPLETED, ENTERED, FAILED, R_ALGO, R_CODE,
                               R_GROUP, R_LASTI, R_OP, R_PSTATE, R_PT1, R_SEQ, R_SIG, R_T0, _codes,
                               _internal, algorithm_name, caller, family_of, record_entry, where)
from .recorder_report import detail_check, missing_report
from .recorder_settings import Settings

# read by other modules as collcomm.core.recorder.<name>
from .recorder_exchange import Exchange  # noqa: F401
from .recorder_records import PACKAGE_PREFIX, R_PEER, line_of, state_of  # noqa: F401
from .recorder_settings import DEFAULT_SIZE, DEFAULT_STALL_WARN  # noqa: F401

log = logging.getLogger("collcomm")

_perf = time.perf_counter
_getframe = sys._getframe


# ------------------------------------------------------------------------------- settings
settings = Settings()


def reload_settings() -> None:
    """Re-read the environment (tests and ``collcomm.stats(enable=True)``)."""
    global settings
    settings = Settings()


# ------------------------------------------------------------------------------ the ring
class Recorder:
    """The process's ring buffer of records (see the module docstring)."""

    def __init__(self, size: int) -> None:
        self.size = max(1, size)
        self.ring: "collections.deque[Any]" = collections.deque(maxlen=self.size)
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
            except RuntimeError:   # appended to while copied (another thread): again
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


# ----------------------------------------------------------------------------- observer
class Observer:
    """What a process group hands each call to (see the module docstring)."""

    __slots__ = ("index", "rec", "append", "name", "ctx", "ranks", "rank", "size", "describe", "extra",
                 "done", "failures", "warned", "tracer", "stats", "detail", "seen",
                 "__weakref__")

    def __init__(self, group: Any, rec: Recorder) -> None:
        self.index = len(_OBSERVERS)      # records name their observer by this index
        _OBSERVERS.append(self)
        self.rec = rec
        self.append = rec.ring.append     # the ring's append, bound once
        self.done: Any = None             # the last completed call's record
        self.failures: dict[int, tuple[Any, float, str]] = {}   # id(record) -> (record, end, error)
        self.name, self.ctx, self.ranks = group.name, group.ctx, list(group.ranks)
        self.rank, self.size = group.rank, group.size
        self.describe = group.describe()
        self.warned: Any = None
        s = settings
        self.extra = s.extra
        self.tracer: Any = None
        self.stats: Any = None
        self.detail = s.detail and group.size > 1
        self.seen: set[Any] = set()
        if s.trace_dir:
            from . import tracing

            self.tracer = tracing.tracer()
        if s.stats:
            from . import stats

            self.stats = stats.collector()

    # -- the hot path -----------------------------------------------------------------------
    def call(self, comm: Any, collective: str, family: Callable[..., Any], args: tuple) -> Any:
        """``family(comm, *args)`` recorded (ProcessGroup.call's observed path).

        Frames: 0 this, 1 ProcessGroup.call, 2 the core collective, 3 the front end, 4 its
        caller: the walk for the caller's file:line starts at 4 (each frame looked at costs
        ~70 ns) and goes up while the code is collcomm's. (A program calling the core
        collectives directly is attributed to its caller's line.)"""
        try:
            f = _getframe(4)
        except ValueError:
            f = _getframe(0)
        code = f.f_code
        inside = _internal.get(id(code))
        while inside is not False:
            if inside is None:
                inside = _internal[id(code)] = code.co_filename.startswith(_PKG)
                _codes[id(code)] = code
                continue
            if f.f_back is None:
                break
            f = f.f_back
            code = f.f_code
            inside = _internal.get(id(code))
        rec = (self.index, comm._tag, collective, comm.sig, id(family), code, f.f_lasti, _perf())
        self.append(rec)
        if self.extra:
            return self._observed(rec, comm, collective, lambda c: family(c, *args), True)
        try:
            out = family(comm, *args)
        except CollcommError as exc:
            raise self.failed(rec, exc, comm, f"{collective} on {self.describe}") from exc
        self.done = rec
        return out

    def enter(self, tag: int, sig: int, collective: str, body: Callable[[Any], Any],
              depth: int = 2) -> tuple:
        """The record of a call entered now (appended), whose family ``body`` runs; its
        caller is looked for from ``depth`` frames above ours."""
        code, lasti = caller(depth + 1)
        rec = (self.index, tag, collective, sig, id(family_of(body)), code, lasti, _perf())
        self.append(rec)
        return rec

    def wrap(self, comm: Any, collective: str, body: Callable[[Any], Any],
             rec: tuple | None = None) -> Callable[[Any], Any]:
        """``body`` recorded (ProcessGroup.run's path: entered now, or at ``rec``, and
        completed when it runs)."""
        if rec is None:
            rec = self.enter(comm._tag, comm.sig, collective, body, 3)

        def observed(c: Any) -> Any:
            if self.extra:
                return self._observed(rec, c, collective, body, False)
            try:
                out = body(c)
            except CollcommError as exc:
                raise self.failed(rec, exc, c, None) from exc
            self.done = rec
            return out

        return observed

    def p2p(self, op: str, peer: int | None, handle: Any, nbytes: int) -> Any:
        """Record a user point-to-point call (``op`` isend/irecv to/from local ``peer``)."""
        code, lasti = caller(2)
        rec = [self.index, 0, op, 0, 0, code, lasti, _perf(),
               -1 if peer is None else self.ranks[peer], ENTERED, 0.0]
        self.append(rec)
        return _P2PHandle(handle, rec)

    # -- the slower path (tracing, stats, DETAIL checks, logging) -------------------------------
    def _observed(self, rec: list[Any], comm: Any, collective: str, body: Callable[[Any], Any],
                  context: bool) -> Any:
        where_ = f"{collective} on {self.describe}" if context else None
        tracer, c = self.tracer, comm
        try:
            if self.detail:
                detail_check(comm, rec, self)
            if tracer is not None:
                c = tracer.wrap(comm, rec, self)
            out = body(c)
        except CollcommError as exc:
            if tracer is not None:
                tracer.end(c, rec, self, failed=True)
            raise self.failed(rec, exc, comm, where_) from exc
        t1 = _perf()
        self.done = rec
        if tracer is not None:
            tracer.end(c, rec, self, failed=False)
        if self.stats is not None:
            self.stats.add(collective, rec[R_SIG], self.size, t1 - rec[R_T0])
        if log.isEnabledFor(logging.INFO):
            key = (collective, rec[R_ALGO])
            if key not in self.seen:
                self.seen.add(key)
                log.info("%s on group %s: algorithm %s (%s)", collective, self.name,
                         algorithm_name(rec[R_ALGO]) or "?", signature.describe(rec[R_SIG]))
            if t1 - rec[R_T0] > settings.slow_log:
                log.info("slow call: %s #%d on group %s took %.3f s (%s)", collective, rec[R_SEQ] & _SEQ_MASK,
                         self.name, t1 - rec[R_T0], where(rec[R_CODE], rec[R_LASTI]))
        return out

    # -- failures ---------------------------------------------------------------------------
    def failed(self, rec: list[Any], exc: CollcommError, comm: Any, context: str | None) -> CollcommError:
        """Mark ``rec`` failed; for a timeout, lost peer or mismatch dump the ring, and for a
        timeout add who is missing (asked through the store). Returns the error to raise."""
        self.failures[id(rec)] = (rec, _perf(), type(exc).__name__)
        if len(self.failures) > 64:
            self.failures.pop(next(iter(self.failures)))
        err = with_context(exc, context) if context else exc
        if not isinstance(exc, (CommTimeoutError, PeerLostError, MismatchError)):
            return err
        lines: list[str] = []
        report: dict[str, Any] = {}
        states: dict[int, Any] | None = None
        # who is missing matters for a timeout; a lost peer is named already, and asking the
        # others would hold its survivors up (the detection bound is ~0.1 s)
        if isinstance(exc, CommTimeoutError):
            try:
                states = gather_states()
                report = missing_report(self, rec, states)
                lines.append(report["text"])
            except Exception as why:  # noqa: BLE001 - the report must never hide the error
                lines.append(f"(could not ask the other ranks where they are: {why})")
        path = self.rec.dump(f"{type(exc).__name__} in {rec[R_OP]} #{rec[R_SEQ] & _SEQ_MASK} on group {self.name}",
                             states)
        if path:
            lines.append(f"flight recorder dump: {path} (collcomm trace analyze {os.path.dirname(path)})")
        if not lines:
            return err
        msg = f"{err}\n" + "\n".join(lines)
        new = (type(err)(msg, peer=getattr(err, "peer", None))
               if isinstance(err, (CommTimeoutError, PeerLostError)) else type(err)(msg))
        new.report = report   # type: ignore[attr-defined]
        return new


class _P2PHandle:
    """A point-to-point handle that marks its flight-recorder record when waited."""

    __slots__ = ("_h", "_rec")

    def __init__(self, h: Any, rec: list[Any]) -> None:
        self._h, self._rec = h, rec

    def wait(self, timeout: float | None = None) -> Any:
        try:
            st = self._h.wait(timeout)
        except CollcommError:
            self._rec[R_PSTATE], self._rec[R_PT1] = FAILED, _perf()
            raise
        self._rec[R_PSTATE], self._rec[R_PT1] = COMPLETED, _perf()
        return st

    def test(self) -> bool:
        done = self._h.test()
        if done and self._rec[R_PSTATE] == ENTERED:
            self._rec[R_PSTATE], self._rec[R_PT1] = COMPLETED, _perf()
        return done

    def __getattr__(self, name: str) -> Any:
        return getattr(self._h, name)


def observer_for(group: Any) -> Observer | None:
    """The observer of a new process group (None when every observation is off: then the
    group's calls pay nothing). The first group of a job also starts the job-wide parts
    (store watcher, stall monitor, SIGUSR1 dump, logging, trace clock)."""
    s = settings
    if not s.fr_size and not s.extra:
        return None
    rec = recorder()
    obs = Observer(group, rec)
    rec.observers.add(obs)
    start_job(group, rec, settings, dump)
    return obs



def gather_states(patience: float = GATHER_SECONDS + 1.0) -> dict[int, Any]:
    """Every rank's state, asked through the store (:func:`.recorder_exchange.gather_from`
    for this process's recorder)."""
    return gather_from(recorder(), patience)
