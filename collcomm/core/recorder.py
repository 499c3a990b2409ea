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
"""
from __future__ import annotations

import collections
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
import weakref
from typing import Any, Callable

from ..algorithms import signature
from ..errors import CollcommError, CommTimeoutError, MismatchError, PeerLostError, with_context

log = logging.getLogger("collcomm")

DEFAULT_SIZE = 2000
DEFAULT_STALL_WARN = 60.0
#: how long a rank that timed out waits for the others' answers through the store
GATHER_SECONDS = 1.5

# A collective's record is a tuple (the cheapest thing to build per call) of the fields
# R_GROUP … R_T0, all plain numbers, strings and the caller's code object (the observer's
# index, the id of the family function; code objects are not tracked by the garbage
# collector): the collector untracks such a tuple at
# its first look, so 2000 of them in the ring cost no collection time (holding objects, the
# ring made the collections walk it: +3 us per call measured). Its state is derived:
# completed when its group's last completed call is this one or a later one, failed when
# listed in the group's failures. A point-to-point record is a list with three more fields
# (peer, state, end time).
R_GROUP, R_SEQ, R_OP, R_SIG, R_ALGO, R_CODE, R_LASTI, R_T0, R_PEER, R_PSTATE, R_PT1 = range(11)
ENTERED, COMPLETED, FAILED = "entered", "completed", "failed"
_SEQ_MASK = (1 << 35) - 1     # group.py: the low 35 bits of a collective's tag are its seq

_PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
PACKAGE_PREFIX = _PKG             # frames of files under it are collcomm's own
_internal: dict[int, bool] = {}   # id(code object) -> it lies inside the collcomm package
_codes: dict[int, Any] = {}       # id -> those code objects, kept alive so their ids stay theirs
_perf = time.perf_counter
_getframe = sys._getframe


def caller(depth: int = 2) -> tuple[Any, int]:
    """(code object, instruction offset) of the first frame outside collcomm, starting
    ``depth`` frames above the caller of this function.

    At most 8 frames are walked; whether a code object is collcomm's is cached per code
    object (keyed by id: hashing a code object costs ~0.3 us), and the line is computed
    from the offset only when a record is read (:func:`where`)."""
    try:
        f: Any = _getframe(depth + 1)
    except ValueError:
        return None, 0
    internal = _internal
    for _ in range(8):
        code = f.f_code
        inside = internal.get(id(code))
        if inside is None:
            inside = internal[id(code)] = code.co_filename.startswith(_PKG)
            _codes[id(code)] = code
        if not inside:
            return code, f.f_lasti
        back = f.f_back
        if back is None:
            break
        f = back
    return f.f_code, f.f_lasti


def line_of(code: Any, lasti: int) -> int:
    """The source line of instruction offset ``lasti`` in ``code``."""
    for start, end, line in code.co_lines():
        if start <= lasti < end and line is not None:
            return line
    return code.co_firstlineno


def where(code: Any, lasti: int) -> str:
    """``file:line`` of a recorded caller (a code object or its id; relative to the working
    directory when inside it)."""
    if isinstance(code, int):
        code = _codes.get(code)
    if code is None:
        return "?"
    path = code.co_filename
    try:
        rel = os.path.relpath(path)
        if not rel.startswith(".."):
            path = rel
    except ValueError:
        pass
    return f"{path}:{line_of(code, lasti)}"


_ALGO_NAMES: dict[int, str] = {}   # id(family function) -> its name in the registry


def algorithm_name(fn: Any) -> str:
    """The family name of an algorithm function (``ring``, ``shm_direct`` …), or ``""``."""
    if not fn:
        return ""
    if not _ALGO_NAMES:
        from ..algorithms.registry import ALGORITHMS

        for table in ALGORITHMS.values():
            for name, f in table.items():
                _ALGO_NAMES.setdefault(id(f), name)
    if isinstance(fn, int):
        return _ALGO_NAMES.get(fn, "?")
    return _ALGO_NAMES.get(id(fn), getattr(fn, "__name__", str(fn)))


_family_index: dict[int, int] = {}


def family_of(body: Any) -> Any:
    """The ``family`` a core collective's closure calls (None if it has none)."""
    code = getattr(body, "__code__", None)
    if code is None:
        return None
    if body.__closure__ is None:     # the family itself (barrier runs it directly)
        return body if algorithm_name(body) != getattr(body, "__name__", None) else None
    i = _family_index.get(id(code))
    if i is None:
        i = _family_index[id(code)] = code.co_freevars.index("family") if "family" in code.co_freevars else -1
        _codes[id(code)] = code
    return body.__closure__[i].cell_contents if i >= 0 else None


# ------------------------------------------------------------------------------- settings
def _float_env(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


class Settings:
    """The observation switches, read from the environment once per process."""

    def __init__(self) -> None:
        env = os.environ
        try:
            self.fr_size = max(0, int(env.get("COLLCOMM_FR_SIZE", DEFAULT_SIZE)))
        except ValueError:
            self.fr_size = DEFAULT_SIZE
        self.trace_dir = env.get("COLLCOMM_TRACE", "") or ""
        self.stats = env.get("COLLCOMM_STATS", "") not in ("", "0")
        self.detail = env.get("COLLCOMM_DEBUG", "").upper() == "DETAIL"
        self.stall_warn = _float_env("COLLCOMM_STALL_WARN", DEFAULT_STALL_WARN)
        self.slow_log = _float_env("COLLCOMM_LOG_SLOW", 1.0)
        self.log = env.get("COLLCOMM_LOG", "").upper()

    @property
    def extra(self) -> bool:
        """Anything beyond the flight recorder (the slower observed path)."""
        return bool(self.trace_dir or self.stats or self.detail
                    or self.log in ("INFO", "DEBUG"))


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
    def entry(self, rec: list[Any], t_ref: float, wall_ref: float) -> dict[str, Any]:
        obs = _OBSERVERS[rec[R_GROUP]]
        sig = rec[R_SIG]
        d: dict[str, Any] = {
            "group": obs.name, "ctx": obs.ctx, "seq": rec[R_SEQ] & _SEQ_MASK, "op": rec[R_OP],
            "call": signature.describe(sig) if sig else rec[R_OP], "sig": sig,
            "algorithm": algorithm_name(rec[R_ALGO]), "where": where(rec[R_CODE], rec[R_LASTI]),
            "state": state_of(rec), "t_enter": round(wall_ref - (t_ref - rec[R_T0]), 6),
        }
        if len(rec) > R_PEER:
            d["peer"] = rec[R_PEER]
            if rec[R_PT1]:
                d["duration_s"] = round(rec[R_PT1] - rec[R_T0], 9)
        else:
            fail = obs.failures.get(id(rec))
            if fail is not None:
                d["duration_s"] = round(fail[1] - rec[R_T0], 9)
                d["error"] = fail[2]
            elif d["state"] == ENTERED:
                d["waiting_s"] = round(t_ref - rec[R_T0], 6)
        return d

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


def state_of(rec: Any) -> str:
    """entered / completed / failed (see the record layout above)."""
    if len(rec) > R_PEER:
        return rec[R_PSTATE]
    obs = _OBSERVERS[rec[R_GROUP]]
    if id(rec) in obs.failures:
        return FAILED
    done = obs.done
    return COMPLETED if done is not None and (rec[R_SEQ] & _SEQ_MASK) <= (done[R_SEQ] & _SEQ_MASK) else ENTERED


def fr_dir(job: str = "") -> str:
    """Where dumps go: ``COLLCOMM_FR_DIR``, else ``/tmp/collcomm-fr-<job id>``."""
    folder = os.environ.get("COLLCOMM_FR_DIR")
    if folder:
        return folder
    if not job:
        from ..rendezvous.auth import job_id

        job = job_id()
    return os.path.join("/tmp", f"collcomm-fr-{job}")


_recorder: Recorder | None = None
_lock = threading.Lock()
_OBSERVERS: list["Observer"] = []   # every observer made, by index (records hold the index)


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

    def wrap(self, comm: Any, collective: str, body: Callable[[Any], Any]) -> Callable[[Any], Any]:
        """``body`` recorded (ProcessGroup.run's path: entered now, completed when it runs)."""
        code, lasti = caller(2)
        rec = (self.index, comm._tag, collective, comm.sig, id(family_of(body)), code, lasti,
               _perf())
        self.append(rec)

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
    _start_job(group, rec)
    return obs


_job_seen: Any = None


def _start_job(group: Any, rec: Recorder) -> None:
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
    _install_sigusr1()
    if job.size > 1 and settings.fr_size:
        rec.exchange = Exchange(job, rec)
        job.on_close.append(rec.exchange.stop)
        if settings.stall_warn > 0:
            _start_stall_monitor(rec)
    if settings.trace_dir:
        from . import tracing

        tracing.tracer().start(job)


# ------------------------------------------------------------------------------- SIGUSR1
_sigusr1_installed = False


def _install_sigusr1() -> None:
    """Dump on SIGUSR1, chaining whatever handled it before (a Python handler, or
    faulthandler's stack dump: re-registered on top, chaining to ours)."""
    global _sigusr1_installed
    if _sigusr1_installed or not settings.fr_size or threading.current_thread() is not threading.main_thread():
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


# ------------------------------------------------------------------ asking the other ranks
class Exchange:
    """Per-rank states on request, through the rendezvous store (see the module docstring).

    Keys (under ``collcomm/fr/<job>``): ``req`` (a counter), ``req/<g>`` (request g was
    made), ``state/<g>/<rank>`` (rank's answer to request g, JSON)."""

    def __init__(self, job: Any, rec: Recorder) -> None:
        from .bootstrap import _generation

        self.rec, self.rank, self.size = rec, job.rank, job.size
        self.store = job.store
        self.prefix = f"collcomm/fr/{rec.job}/{_generation}"
        self._stop = False
        self._conn: Any = None
        self._thread: threading.Thread | None = None
        if self.store is not None:
            self._thread = threading.Thread(target=self._watch, daemon=True,
                                            name="collcomm-fr-watcher")
            self._thread.start()

    def _connect(self) -> Any:
        from ..rendezvous.file_store import FileStore
        from ..rendezvous.tcp_client import TCPStore

        s = self.store
        if isinstance(s, TCPStore):
            return TCPStore(s.host, s.port, token=s._token, timeout=30.0)
        if isinstance(s, FileStore):
            return FileStore(s.path, timeout=30.0, create=False)
        return None

    def _watch(self) -> None:
        try:
            self._conn = conn = self._connect()
            if conn is None:
                return
            g = 1
            while not self._stop:
                try:
                    conn.get(f"{self.prefix}/req/{g}", timeout=5.0)
                except CommTimeoutError:
                    continue
                if self._stop:
                    return
                conn.set(f"{self.prefix}/state/{g}/{self.rank}", json.dumps(self.state()))
                g += 1
        except Exception:  # noqa: BLE001 - the store went away: nobody can ask any more
            return

    def state(self) -> dict[str, Any]:
        return {"rank": self.rank, "pid": os.getpid(), "host": socket.gethostname(),
                "groups": self.rec.group_states()}

    def _final(self, r: int) -> Any:
        """Rank ``r``'s state as it left the job (published by :meth:`stop`), or None."""
        key = f"{self.prefix}/final/{r}"
        if not self.store.check([key]):
            return None
        st = json.loads(self.store.get(key, timeout=1.0))
        st["left"] = True
        return st

    def gather(self, timeout: float = GATHER_SECONDS) -> dict[int, Any]:
        """Every rank's state (None for ranks that did not answer within ``timeout``)."""
        out: dict[int, Any] = {r: None for r in range(self.size)}
        if self.store is None:
            out[self.rank] = self.state()
            return out
        store = self.store
        g = store.add(f"{self.prefix}/req", 1)
        self.store.set(f"{self.prefix}/req/{g}", str(self.rank))
        deadline = time.monotonic() + timeout
        for r in range(self.size):
            left = deadline - time.monotonic()
            try:
                if r == self.rank:
                    raise CommTimeoutError("self")
                out[r] = json.loads(self.store.get(f"{self.prefix}/state/{g}/{r}",
                                                   timeout=max(left, 0.01)))
            except CommTimeoutError:
                if r == self.rank:
                    out[r] = self.state()
                else:
                    out[r] = self._final(r)
            except Exception as exc:  # noqa: BLE001 - the store is gone: the rest stay unknown
                log.info("flight recorder: asking rank %d through the store failed: %r", r, exc)
                break
        return out

    def stop(self) -> None:
        """At the rank's clean exit: leave its final state in the store (one write, on a
        helper thread given 0.5 s: a store that no longer answers cannot hold the exit
        up), then stop the watcher."""
        if self.store is not None:
            def publish() -> None:
                try:
                    self.store.set(f"{self.prefix}/final/{self.rank}", json.dumps(self.state()))
                except Exception:  # noqa: BLE001 - the store may be gone already
                    pass

            t = threading.Thread(target=publish, daemon=True, name="collcomm-fr-final")
            t.start()
            t.join(0.5)
        self._stop = True
        conn = self._conn
        sock = getattr(conn, "_sock", None)
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def gather_states(patience: float = GATHER_SECONDS + 1.0) -> dict[int, Any]:
    """Every rank's state, asked through the store on a helper thread joined for
    ``patience`` seconds at most: a store that no longer answers (a cut link, a dead host)
    costs that, not the store client's socket timeout."""
    rec = recorder()
    if rec.exchange is None:
        return {rec.rank: {"rank": rec.rank, "groups": rec.group_states()}}
    box: list[Any] = []

    def ask() -> None:
        try:
            box.append(rec.exchange.gather())
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            box.append(exc)

    t = threading.Thread(target=ask, daemon=True, name="collcomm-fr-gather")
    t.start()
    t.join(patience)
    if not box:
        raise RuntimeError(f"the rendezvous store did not answer within {patience:g} s")
    if isinstance(box[0], BaseException):
        raise box[0]
    return box[0]


def _describe_entry(e: dict[str, Any]) -> str:
    return f"{e['op']} #{e['seq']} at {e['where']} ({e['state']})"


def missing_report(obs: Observer, rec: list[Any], states: dict[int, Any]) -> dict[str, Any]:
    """Who never entered call #seq of ``obs``'s group, and where everyone is."""
    seq, key = rec[R_SEQ] & _SEQ_MASK, f"{obs.ctx:x}"
    arrived, missing, unknown, elsewhere = [], [], [], []
    lines = []
    for local, g in enumerate(obs.ranks):
        st = states.get(g)
        if st is None:
            unknown.append(g)
            continue
        grp = st["groups"].get(key)
        recent = [e for e in (grp or {}).get("recent", []) if "peer" not in e]
        at_seq = [e for e in recent if e["seq"] == seq]
        last = recent[-1] if recent else None
        if at_seq:
            e = at_seq[0]
            if e["op"] != rec[R_OP] or (e["sig"] and rec[R_SIG] and e["sig"] != rec[R_SIG]):
                elsewhere.append(g)
                lines.append(f"  rank {g} entered #{seq} as {e['call']} at {e['where']} ({e['state']})")
            elif st.get("left"):
                arrived.append(g)
            else:
                arrived.append(g)
        elif last is not None and last["seq"] > seq:
            elsewhere.append(g)
            lines.append(f"  rank {g} is past #{seq}: last entered {_describe_entry(last)}")
        elif st.get("left"):
            missing.append(g)
            lines.append(f"  rank {g} left the job without entering #{seq}; its last call on "
                         "this group: " + (_describe_entry(last) if last else "none"))
        else:
            missing.append(g)
            lines.append(f"  rank {g} never entered #{seq}; its last call on this group: "
                         + (_describe_entry(last) if last else "none"))
    # an earlier divergence (a rank skipped a call and went on with the next one) explains more
    calls: dict[int, dict[int, dict[str, Any]]] = {}
    for g in obs.ranks:
        st = states.get(g)
        grp = (st or {}).get("groups", {}).get(key) if st else None
        if grp:
            calls[g] = {e["seq"]: e for e in grp.get("recent", []) if "peer" not in e}
    diverged = None
    for q in sorted({q for c in calls.values() for q in c if q <= seq}):
        at = {g: c[q] for g, c in calls.items() if q in c}
        if len({(e["op"], e["sig"]) for e in at.values()}) > 1:
            diverged = q
            lines.insert(0, f"  the ranks diverged at #{q}: " + "; ".join(
                f"rank {g} called {e['call']} at {e['where']}" for g, e in sorted(at.items())))
            break
    head = (f"call #{seq} ({rec[R_OP]}) of group {obs.name}: "
            + (f"ranks {missing} never entered it" if missing else "no rank is missing it")
            + (f"; in it: ranks {arrived}" if arrived else "")
            + (f"; unknown (no answer through the store: dead or gone): ranks {unknown}" if unknown else ""))
    text = "\n".join([head] + lines)
    return {"seq": seq, "op": rec[R_OP], "group": obs.name, "missing": missing, "diverged": diverged,
            "arrived": arrived, "unknown": unknown, "elsewhere": elsewhere, "text": text}


# ------------------------------------------------------------------- COLLCOMM_DEBUG=DETAIL
_DESC = 256


def detail_check(comm: Any, rec: Any, obs: Observer) -> None:
    """Before the call, every rank sends every other a small descriptor (op, signature,
    file:line); all ranks then hold the same table and all raise the same MismatchError
    when any two calls differ, naming both sides."""
    import numpy as np

    n, me = comm.size, comm.rank
    seq = rec[R_SEQ] & _SEQ_MASK
    text = json.dumps([rec[R_OP], rec[R_SIG], where(rec[R_CODE], rec[R_LASTI])[-200:]]).encode()
    mine = np.zeros(_DESC, dtype=np.uint8)
    mine[:len(text)] = np.frombuffer(text[:_DESC], dtype=np.uint8)
    table = np.zeros((n, _DESC), dtype=np.uint8)
    table[me] = mine
    saved = comm.sig
    comm.sig = 0          # the descriptors are not the call's data: no signature check on them
    try:
        recvs = [comm.irecv(table[p], p) for p in range(n) if p != me]
        sends = [comm.isend(mine, p) for p in range(n) if p != me]
        for h in recvs + sends:
            h.wait()
    finally:
        comm.sig = saved
    calls = [json.loads(bytes(row).rstrip(b"\0").decode()) for row in table]

    kinds: dict[tuple, list[int]] = {}
    for r in range(n):
        kinds.setdefault((calls[r][0], calls[r][1]), []).append(r)
    if len(kinds) > 1:           # the same text on every rank: distinct calls by lowest rank
        parts = []
        for i, ((op, sig), rs) in enumerate(kinds.items()):
            who = f"rank {obs.ranks[rs[0]]}" if len(rs) == 1 else f"ranks {[obs.ranks[r] for r in rs]}"
            what = signature.describe(sig) if sig else op
            at = calls[rs[0]][2]
            parts.append(f"{who} called {what} as #{seq} on group {obs.name} at {at}" if i == 0
                         else f"{who} called {what} at {at}")
        raise MismatchError("; ".join(parts) + " (COLLCOMM_DEBUG=DETAIL: every rank must make "
                            "the same collective calls in the same order, with the same dtype, "
                            "count, root and op)")


# ------------------------------------------------------------------------- stall monitor
def _start_stall_monitor(rec: Recorder) -> None:
    warn = settings.stall_warn
    interval = min(1.0, max(warn / 4, 0.02))

    def loop() -> None:
        while True:
            time.sleep(interval)
            now = _perf()
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
                        report = missing_report(obs, cur, gather_states())
                        log.warning("rank %d: %s #%d on group %s has waited %.0f s (COLLCOMM_STALL_WARN): %s",
                                    rec.rank, cur[R_OP], cur[R_SEQ] & _SEQ_MASK, obs.name, now - cur[R_T0],
                                    report["text"])
                    except Exception as exc:  # noqa: BLE001 - a warning must not kill anything
                        log.warning("rank %d: %s #%d on group %s has waited %.0f s (could not ask "
                                    "the others: %s)", rec.rank, cur[R_OP], cur[R_SEQ] & _SEQ_MASK, obs.name,
                                    now - cur[R_T0], exc)

    threading.Thread(target=loop, daemon=True, name="collcomm-stall-monitor").start()
