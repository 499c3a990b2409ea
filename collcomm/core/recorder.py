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

This module keeps the :class:`Observer` (what a group's calls go through) and
:func:`observer_for`, and re-exports the names of its parts: :mod:`.recorder_ring` (the
ring, :class:`Recorder`, its dumps, the process's ring and its :data:`settings`, read
here as ``recorder.settings``), :mod:`.recorder_records` (the record layout, callers'
file:line, algorithm names), :mod:`.recorder_settings` (the switches),
:mod:`.recorder_exchange` (asking the other ranks through the store),
:mod:`.recorder_report` (who is missing, the DETAIL check) and :mod:`.recorder_job` (the
job-wide parts: store watcher, stall monitor, SIGUSR1 dump).
"""
from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any, Callable

from ..algorithms import signature
from ..errors import CollcommError, CommTimeoutError, MismatchError, PeerLostError, with_context
from . import recorder_ring
from .recorder_job import start_job
from .recorder_records import (_OBSERVERS, _PKG, _SEQ_MASK, COMPLETED, ENTERED, FAILED, R_ALGO, R_CODE,
                               R_LASTI, R_OP, R_PSTATE, R_PT1, R_SEQ, R_SIG, R_T0, _codes, _internal,
                               algorithm_name, caller, family_of, where)
from .recorder_report import detail_check, missing_report
from .recorder_ring import Recorder, dump, gather_states, recorder

# read by other modules as collcomm.core.recorder.<name>
from .recorder_exchange import Exchange  # noqa: F401
from .recorder_records import PACKAGE_PREFIX, R_GROUP, R_PEER, line_of, record_entry, state_of  # noqa: F401
from .recorder_ring import Settings, fr_dir, reload_settings  # noqa: F401
from .recorder_settings import DEFAULT_SIZE, DEFAULT_STALL_WARN  # noqa: F401

log = logging.getLogger("collcomm")

_perf = time.perf_counter
_getframe = sys._getframe


def __getattr__(name: str) -> Any:
    """``settings``: the process's switches now (:data:`.recorder_ring.settings`, which
    :func:`reload_settings` replaces)."""
    if name == "settings":
        return recorder_ring.settings
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
        s = recorder_ring.settings
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
            if t1 - rec[R_T0] > recorder_ring.settings.slow_log:
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
    s = recorder_ring.settings
    if not s.fr_size and not s.extra:
        return None
    rec = recorder()
    obs = Observer(group, rec)
    rec.observers.add(obs)
    start_job(group, rec, recorder_ring.settings, dump)
    return obs
