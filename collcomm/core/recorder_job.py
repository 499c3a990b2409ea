"""The flight recorder's job-wide parts: the store watcher, the stall monitor, SIGUSR1.

The first group of a job (its WORLD group) starts them once (:func:`start_job`, from
:func:`.recorder.observer_for`): logging, the watcher thread that answers the other ranks
through the store (:class:`.recorder_exchange.Exchange`), the stall monitor, the SIGUSR1
dump (chaining whatever handled the signal before) and the trace clock. The stall monitor
thread logs (logger ``collcomm``, WARNING) once per call that waited more than
``COLLCOMM_STALL_WARN`` seconds which ranks have arrived and which have not, with their
last calls (:func:`.recorder_report.missing_report` over the gathered states).
"""
from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Callable

from .recorder_exchange import Exchange, gather_from
from .recorder_records import ENTERED, R_GROUP, R_OP, R_PEER, R_SEQ, R_T0, _SEQ_MASK, state_of
from .recorder_report import missing_report
from ..helper_thread import HelperThread

if TYPE_CHECKING:
    from .recorder import Recorder
    from .recorder_settings import Settings

log = logging.getLogger("collcomm")

_job_seen: Any = None


def start_job(group: Any, rec: Recorder, settings: Settings, dump: Callable[[str], str | None]) -> None:
    """The job-wide parts, once per job when its WORLD group is made: logging, the store
    watcher (:class:`.recorder_exchange.Exchange`), the stall monitor, the SIGUSR1 dump
    (``dump(reason)``) and the trace clock, as ``settings`` ask."""
    global _job_seen
    from . import runtime

    job = runtime._job
    if job is None or job is _job_seen or group.name != "WORLD":
        return
    _job_seen = job
    rec.rank, rec.world_size = job.rank, job.size
    from ..rendezvous.auth import job_id

    rec.job = job_id()
    from . import log as log_setup

    log_setup.setup(job.rank)
    if log.isEnabledFor(logging.INFO) and group.transport is not None and hasattr(group.transport, "kinds"):
        kinds = group.transport.kinds()
        log.info("rank %d: transport per peer: %s", job.rank,
                 ", ".join(f"{r}:{k}" for r, k in sorted(kinds.items())))
    install_sigusr1(dump, settings.fr_size)
    if job.size > 1 and settings.fr_size:
        rec.exchange = Exchange(job, rec)
        job.on_close.append(rec.exchange.stop)
        if settings.stall_warn > 0:
            start_stall_monitor(rec, settings.stall_warn)
    if settings.trace_dir:
        from . import tracing

        tracing.tracer().start(job)


_sigusr1_installed = False


def install_sigusr1(dump: Callable[[str], str | None], fr_size: int) -> None:
    """Dump (``dump(reason)``) on SIGUSR1, chaining whatever handled it before (a Python
    handler, or faulthandler's stack dump: re-registered on top, chaining to ours).
    Nothing when the recorder is off (``fr_size`` 0) or off the main thread."""
    global _sigusr1_installed
    if _sigusr1_installed or not fr_size or threading.current_thread() is not threading.main_thread():
        return
    import faulthandler

    try:
        previous = signal.getsignal(signal.SIGUSR1)
        had_faulthandler = faulthandler.unregister(signal.SIGUSR1)

        def on_sigusr1(signum: int, frame: Any) -> None:
            path = dump("SIGUSR1")
            if path:
                print(f"collcomm: flight recorder dumped to {path}", file=sys.stderr, flush=True)
            if callable(previous):
                previous(signum, frame)

        signal.signal(signal.SIGUSR1, on_sigusr1)
        if had_faulthandler:
            faulthandler.register(signal.SIGUSR1, all_threads=True, chain=True)
        _sigusr1_installed = True
    except (ValueError, OSError, RuntimeError):
        pass


def start_stall_monitor(rec: Recorder, warn: float) -> None:
    """The thread that warns about calls of ``rec``'s groups waiting over ``warn`` seconds."""
    interval = min(1.0, max(warn / 4, 0.02))

    def loop() -> None:
        while True:
            time.sleep(interval)
            now = time.perf_counter()
            latest: dict[int, Any] = {}        # each group's newest collective record
            for r in rec.records()[-512:]:
                if len(r) <= R_PEER:
                    latest[r[R_GROUP]] = r
            for obs in list(rec.observers):
                cur = latest.get(obs.index)
                if cur is None or state_of(cur) != ENTERED or obs.warned is cur:
                    continue
                if now - cur[R_T0] > warn:
                    obs.warned = cur
                    try:
                        report = missing_report(obs, cur, gather_from(rec))
                        log.warning("rank %d: %s #%d on group %s has waited %.0f s (COLLCOMM_STALL_WARN): %s",
                                    rec.rank, cur[R_OP], cur[R_SEQ] & _SEQ_MASK, obs.name, now - cur[R_T0],
                                    report["text"])
                    except Exception as exc:  # noqa: BLE001 - a warning must not kill anything
                        log.warning("rank %d: %s #%d on group %s has waited %.0f s (could not ask "
                                    "the others: %s)", rec.rank, cur[R_OP], cur[R_SEQ] & _SEQ_MASK, obs.name,
                                    now - cur[R_T0], exc)

    HelperThread(loop, "collcomm-stall-monitor").start()
