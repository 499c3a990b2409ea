"""``collcomm run``: start the ranks of a job on this node, watch them, clean up after them.

What one call of :func:`launch` does, in order:

1. On node 0 it hosts the job's :class:`~collcomm.rendezvous.TCPStoreServer` on its own
   port (``--store-port``; else ``--master-port`` + 1 when a master port is given; else a
   free port picked race-free by binding port 0). Every rank reaches it through
   ``COLLCOMM_STORE``; ``COLLCOMM_TOKEN`` (random per job, or the user's on several nodes)
   proves membership on every connection. ``MASTER_ADDR``/``MASTER_PORT`` are left to the
   program (``--master-port``, or a free port): torch's own ``env://`` store can take it.
2. It starts ``nproc`` children, each in its own session (and so its own process group),
   with the environment of :func:`rank_env`: a script through ``sys.executable -u`` (a
   leading ``python`` typed by the user is that interpreter), a module with ``-m``, any
   other executable (or everything with ``--no-python``) as it is. A reader thread per pipe
   forwards whole lines of stdout/stderr, prefixed ``[rank] `` unless ``prefix`` is off (an
   unterminated last line still ends with a newline), and keeps the last lines of every
   rank's stderr.
3. It waits, watching every rank's process state: a rank stopped (SIGSTOP, state ``T``) is
   named at once on stderr. When a rank fails (non-zero exit or a signal), the others get up
   to ``SETTLE_S`` to fail on their own and say why (see
   :mod:`collcomm.tools.rootcause`), then SIGTERM (and SIGCONT, for a stopped rank) on their
   process groups, SIGKILL after ``grace`` seconds. The summary names the root cause, not
   the first rank the launcher happened to poll: the first genuine failure, else a stopped
   rank, else the odd one out of a mismatch, else the rank the others' errors name. The launcher exits with that rank's code
   (128 + signal number for a signal), or with the first failing rank's when the root cause
   exited 0, is stuck, or runs on another node. SIGINT/SIGTERM to the launcher are forwarded
   to every rank, escalated the same way, and the launcher exits 128 + that signal.
4. Whatever happened, it kills what is left of every rank's process group and removes the
   job's shared-memory segments ``/dev/shm/collcomm-<job_id>-*`` and its report directory.

Multi-node: run it once per node with the same ``--nnodes``, ``--master-addr``,
``--master-port`` and ``COLLCOMM_TOKEN``; node 0 hosts the store. A failure on another
node is seen here through the errors of this node's ranks, which name the lost rank.
"""
from __future__ import annotations

import collections
import glob
import hashlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any, BinaryIO, TextIO

from ..core.bootstrap import FAULT_KEY, REPORT_ENV
from ..errors import InvalidArgumentError
from ..rendezvous import TCPStoreServer
from ..rendezvous.auth import job_token
from .rootcause import RankState, Verdict, describe_exit, exit_code, root_cause, settled

__all__ = ["LaunchConfig", "launch", "rank_env", "shm_segments", "program_argv"]

STDERR_TAIL_LINES = 15
#: After the first failure, seconds the other ranks get to fail on their own (and report);
#: the wait ends as soon as every rank still running is stopped or named by a report.
SETTLE_S = 5.0
#: A rank seen stopped this long is named on stderr.
STOPPED_REPORT_S = 0.2
_POLL_S = 0.05


@dataclass
class LaunchConfig:
    """Everything ``collcomm run`` needs. ``program`` is a script path, a module name
    (``module=True``) or, with ``python=False``, an executable run as it is."""

    nproc: int
    program: str
    args: list[str] = field(default_factory=list)
    module: bool = False
    python: bool = True
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 0
    store_port: int = 0
    prefix: bool = True
    grace: float = 3.0
    trace: str | None = None      # COLLCOMM_TRACE for every rank (merged at the end)


@dataclass
class _Rank:
    rank: int
    local_rank: int
    proc: subprocess.Popen[bytes]
    readers: list[threading.Thread] = field(default_factory=list)
    stderr_tail: collections.deque[str] = field(
        default_factory=lambda: collections.deque(maxlen=STDERR_TAIL_LINES))
    returncode: int | None = None
    exit_t: float | None = None
    signalled: bool = False
    stopped_since: float | None = None   # first seen stopped (still stopped, or when it died)
    stop_seen: float | None = None       # the current stop's first sighting
    stop_named: bool = False


# --------------------------------------------------------------------------- the program

def _is_python(token: str) -> bool:
    """``python``, ``python3``, ``sys.executable`` or a path/name resolving to it."""
    if token in ("python", "python3") or token == sys.executable:
        return True
    found = shutil.which(token)
    return found is not None and os.path.realpath(found) == os.path.realpath(sys.executable)


def program_argv(tokens: list[str], module: bool = False, python: bool = True) -> list[str]:
    """The argv each rank runs for what the user typed after ``collcomm run [options]``.

    ``prog.py args`` and ``python prog.py args`` (any interpreter option too, e.g. ``python
    -m pkg``) run under ``sys.executable -u``; ``-m`` makes the first token a module;
    ``./binary args`` (an executable file, or a command on PATH) and everything with
    ``python=False`` (``--no-python``) run as they are.
    """
    if not tokens:
        raise InvalidArgumentError("missing the program to run")
    first, rest = tokens[0], list(tokens[1:])
    if module:
        return [sys.executable, "-u", "-m", first, *rest]
    if not python:
        return [first, *rest]
    if _is_python(first):
        if not rest:
            raise InvalidArgumentError(f"{first!r} needs a script or -m module to run")
        return [sys.executable, "-u", *rest]
    if first.endswith(".py") or (os.path.isfile(first) and not os.access(first, os.X_OK)):
        if not os.path.isfile(first):
            raise InvalidArgumentError(f"cannot open the script {first!r}: no such file")
        return [sys.executable, "-u", first, *rest]
    if os.sep not in first and shutil.which(first):
        return [first, *rest]
    if os.path.isfile(first):
        return [first if os.sep in first else os.path.join(os.curdir, first), *rest]
    raise InvalidArgumentError(
        f"cannot find the program {first!r}: not a file here and not a command on PATH "
        "(a module needs -m)")


def _argv(cfg: LaunchConfig) -> list[str]:
    return program_argv([cfg.program, *cfg.args], module=cfg.module, python=cfg.python)


# --------------------------------------------------------------------------- setup

def _validate(cfg: LaunchConfig) -> None:
    if cfg.nproc < 1:
        raise InvalidArgumentError(f"-n must be at least 1, got {cfg.nproc}")
    if cfg.nnodes < 1 or not 0 <= cfg.node_rank < cfg.nnodes:
        raise InvalidArgumentError(f"--node-rank must be in [0, {cfg.nnodes}), "
                                   f"got {cfg.node_rank} with --nnodes {cfg.nnodes}")
    if cfg.grace < 0:
        raise InvalidArgumentError(f"--grace must be >= 0, got {cfg.grace}")
    for name in ("master_port", "store_port"):
        if not 0 <= getattr(cfg, name) < 65536:
            raise InvalidArgumentError(f"--{name.replace('_', '-')} must be in [0, 65535]")
    if cfg.nnodes > 1 and not os.environ.get("COLLCOMM_TOKEN"):
        raise InvalidArgumentError(
            "with --nnodes > 1, set COLLCOMM_TOKEN to the same secret on every node, "
            "e.g. export COLLCOMM_TOKEN=$(python -c 'import secrets; print(secrets.token_hex(16))')")
    if cfg.nnodes > 1 and cfg.master_port == 0:
        raise InvalidArgumentError("--master-port is required with --nnodes > 1")
    if cfg.master_port and cfg.master_port == cfg.store_port:
        raise InvalidArgumentError("--store-port must differ from --master-port "
                                   "(MASTER_PORT is left free for the program)")


def _job_credentials(cfg: LaunchConfig) -> tuple[str, str]:
    """(token hex/text, job id): random on one node; shared by every node otherwise."""
    if cfg.nnodes == 1:
        return secrets.token_hex(16), secrets.token_hex(6)
    token = os.environ["COLLCOMM_TOKEN"]
    job_id = os.environ.get("COLLCOMM_JOB_ID") or \
        hashlib.sha256(b"collcomm-job-id\0" + token.encode()).hexdigest()[:12]
    return token, job_id


def _store_port(cfg: LaunchConfig) -> int:
    if cfg.store_port:
        return cfg.store_port
    return cfg.master_port + 1 if cfg.master_port else 0


def _free_port(avoid: int) -> int:
    """A port free right now on every interface (for MASTER_PORT; the program binds it)."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", 0))
            port = int(s.getsockname()[1])
        if port != avoid:
            return port


def _serve_store(cfg: LaunchConfig, token: str) -> TCPStoreServer:
    """Node 0's store: loopback for a one-node job; else bound to ``--master-addr`` where it
    is an address of this host (every node reaches us there), else to every interface."""
    secret = job_token({"COLLCOMM_TOKEN": token})
    port = _store_port(cfg)
    if cfg.nnodes == 1 and cfg.master_addr in ("127.0.0.1", "localhost"):
        return TCPStoreServer("127.0.0.1", port, token=secret)
    try:
        addr = socket.getaddrinfo(cfg.master_addr, None, type=socket.SOCK_STREAM)[0][4][0]
        return TCPStoreServer(addr, port, token=secret)
    except Exception:  # noqa: BLE001 - not an address of this host (NAT, a name elsewhere)
        return TCPStoreServer("::" if ":" in cfg.master_addr else "0.0.0.0", port, token=secret)


def rank_env(cfg: LaunchConfig, local_rank: int, port: int, token: str, job_id: str,
             base: dict[str, str] | None = None, master_port: int | None = None,
             report_dir: str | None = None) -> dict[str, str]:
    """The environment of local rank ``local_rank`` on this node; ``port`` is the store's."""
    env = dict(os.environ if base is None else base)
    env.update({
        "RANK": str(cfg.node_rank * cfg.nproc + local_rank),
        "WORLD_SIZE": str(cfg.nproc * cfg.nnodes),
        "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(cfg.nproc),
        "GROUP_RANK": str(cfg.node_rank),
        "NODE_RANK": str(cfg.node_rank),
        "MASTER_ADDR": cfg.master_addr,
        "MASTER_PORT": str(master_port if master_port is not None else cfg.master_port),
        "COLLCOMM_STORE": f"{cfg.master_addr}:{port}",
        "COLLCOMM_TOKEN": token,
        "COLLCOMM_JOB_ID": job_id,
        "PYTHONUNBUFFERED": "1",
    })
    env.pop("TORCHELASTIC_USE_AGENT_STORE", None)  # no agent store on MASTER_PORT here
    if report_dir is not None:
        env[REPORT_ENV] = report_dir
    else:
        env.pop(REPORT_ENV, None)
    return env


# --------------------------------------------------------------------------- output

class _Output:
    """Writes whole lines to our stdout/stderr under one lock so ranks never interleave."""

    def __init__(self) -> None:
        self.lock = threading.Lock()

    def write(self, stream: TextIO, data: bytes) -> None:
        with self.lock:
            try:
                buffer = getattr(stream, "buffer", None)
                if buffer is not None:
                    buffer.write(data)
                    buffer.flush()
                else:  # a text-only stream (e.g. replaced by a test harness)
                    stream.write(data.decode("utf-8", "replace"))
                    stream.flush()
            except (OSError, ValueError):
                pass


def _pump(pipe: BinaryIO, out: TextIO, prefix: bytes, output: _Output,
          tail: collections.deque[str] | None) -> None:
    """Forward ``pipe`` line by line to ``out`` until EOF. Every line written ends with a
    newline (an unterminated last line gets one), so no rank's line runs into another's."""
    try:
        for line in iter(pipe.readline, b""):
            if not line.endswith(b"\n"):
                line += b"\n"
            output.write(out, prefix + line)
            if tail is not None:
                tail.append(line.decode("utf-8", "replace").rstrip("\n"))
    except (OSError, ValueError):
        pass
    finally:
        pipe.close()


def _start_rank(argv: list[str], local_rank: int, env: dict[str, str], prefix: bool,
                output: _Output, wake: threading.Event) -> _Rank:
    try:
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
    except OSError as exc:
        raise InvalidArgumentError(f"cannot start {argv[0]!r}: {exc}") from exc
    r = _Rank(rank=int(env["RANK"]), local_rank=local_rank, proc=proc)
    tag = f"[{r.rank}] ".encode() if prefix else b""
    assert proc.stdout is not None and proc.stderr is not None
    for pipe, out, tail in ((proc.stdout, sys.stdout, None),
                            (proc.stderr, sys.stderr, r.stderr_tail)):
        t = threading.Thread(target=_pump, args=(pipe, out, tag, output, tail),
                             daemon=True, name=f"collcomm-run-pipe-{r.rank}")
        t.start()
        r.readers.append(t)

    def wait_exit() -> None:  # records the exit time exactly, whatever the polling does
        code = proc.wait()
        r.exit_t = time.monotonic()
        r.returncode = code
        wake.set()

    threading.Thread(target=wait_exit, daemon=True, name=f"collcomm-run-wait-{r.rank}").start()
    return r


# --------------------------------------------------------------------------- watching

def process_state(pid: int) -> str:
    """The state letter of ``/proc/<pid>/stat`` ('R', 'S', 'T' stopped, 'Z'...), '' if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            text = fh.read().decode("ascii", "replace")
    except OSError:
        return ""
    return text[text.rfind(")") + 2:].split(" ", 1)[0]


def _check_stopped(r: _Rank, now: float, output: _Output) -> None:
    if r.returncode is not None:
        return
    if process_state(r.proc.pid) == "T":
        if r.stop_seen is None:
            r.stop_seen = now
        if r.stopped_since is None:
            r.stopped_since = now
        if not r.stop_named and now - r.stop_seen >= STOPPED_REPORT_S:
            r.stop_named = True
            output.write(sys.stderr, (
                f"collcomm run: rank {r.rank} (pid {r.proc.pid}) is stopped (state T, e.g. "
                f"SIGSTOP): ranks waiting on it will time out; 'kill -CONT {r.proc.pid}' "
                "resumes it\n").encode())
    elif r.stop_seen is not None:
        if r.stop_named:
            output.write(sys.stderr, f"collcomm run: rank {r.rank} (pid {r.proc.pid}) "
                                     "resumed\n".encode())
        r.stop_seen, r.stopped_since, r.stop_named = None, None, False


# --------------------------------------------------------------------------- stopping

def _signal_group(r: _Rank, sig: int) -> None:
    try:
        os.killpg(r.proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _live_group_members(pgids: set[int]) -> set[int]:
    """Pids (not zombies) whose process group is one of ``pgids``; Linux /proc scan."""
    alive = set()
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat, "rb") as fh:
                text = fh.read().decode("ascii", "replace")
        except OSError:
            continue
        fields = text[text.rfind(")") + 2:].split()
        if len(fields) > 2 and fields[0] != "Z" and int(fields[2]) in pgids:
            alive.add(int(text.split(" ", 1)[0]))
    return alive


def _stop(ranks: list[_Rank], first_signal: int, grace: float) -> None:
    """Signal every rank's group (and wake stopped ones), SIGKILL what is left after ``grace``."""
    for r in ranks:
        if r.returncode is None:
            r.signalled = True
        _signal_group(r, first_signal)
        _signal_group(r, signal.SIGCONT)  # a stopped process acts on SIGTERM only when resumed
    deadline = time.monotonic() + grace
    pgids = {r.proc.pid for r in ranks}
    while time.monotonic() < deadline:
        if all(r.returncode is not None for r in ranks) and not _live_group_members(pgids):
            break
        time.sleep(_POLL_S)
    for r in ranks:
        if r.returncode is None:
            r.signalled = True
        _signal_group(r, signal.SIGKILL)
    for r in ranks:
        try:
            r.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
    deadline = time.monotonic() + 1.0  # the exit threads record what wait() saw
    while any(r.returncode is None and r.proc.returncode is not None for r in ranks) and \
            time.monotonic() < deadline:
        time.sleep(0.005)


def shm_segments(job_id: str) -> list[str]:
    """The job's shared-memory files on this host."""
    return glob.glob(f"/dev/shm/collcomm-{job_id}-*")


def _remove_shm(job_id: str) -> None:
    for path in shm_segments(job_id):
        try:
            os.unlink(path)
        except OSError:
            pass


# --------------------------------------------------------------------------- reporting

def _read_report(report_dir: str, rank: int) -> dict[str, Any] | None:
    try:
        with open(os.path.join(report_dir, f"rank-{rank}.json")) as fh:
            report = json.load(fh)
        return report if isinstance(report, dict) else None
    except (OSError, ValueError):
        return None


#: Seconds the launcher waits for the other nodes' fault reports from the store.
REMOTE_REPORTS_S = 1.0


def _remote_reports(cfg: LaunchConfig, port: int, token: str) -> dict[int, dict[str, Any]]:
    """The fault reports other nodes' ranks put in the store (several nodes only), fetched
    on a helper thread for ``REMOTE_REPORTS_S`` at most (the store may be unreachable)."""
    if cfg.nnodes == 1:
        return {}
    found: dict[int, dict[str, Any]] = {}
    lock = threading.Lock()
    mine = range(cfg.node_rank * cfg.nproc, (cfg.node_rank + 1) * cfg.nproc)

    def fetch() -> None:
        from ..rendezvous.tcp_client import TCPStore

        try:
            store = TCPStore(cfg.master_addr, port, timeout=REMOTE_REPORTS_S,
                             token=job_token({"COLLCOMM_TOKEN": token}))
        except Exception:  # noqa: BLE001 - unreachable: judge from this node alone
            return
        try:
            for r in range(cfg.nproc * cfg.nnodes):
                key = FAULT_KEY.format(rank=r)
                if r not in mine and store.check([key]):
                    report = json.loads(store.get(key, timeout=1.0))
                    if isinstance(report, dict):
                        with lock:
                            found[r] = report
        except Exception:  # noqa: BLE001 - what we have so far
            pass
        finally:
            store.close()

    fetcher = threading.Thread(target=fetch, daemon=True, name="collcomm-run-reports")
    fetcher.start()
    fetcher.join(REMOTE_REPORTS_S)
    with lock:
        return dict(found)


def _states(ranks: list[_Rank], report_dir: str,
            remote: dict[int, dict[str, Any]] | None = None) -> list[RankState]:
    states = [RankState(rank=r.rank, pid=r.proc.pid, returncode=r.returncode, exit_t=r.exit_t,
                        signalled=r.signalled, stopped_since=r.stopped_since,
                        report=_read_report(report_dir, r.rank)) for r in ranks]
    for rank, report in sorted((remote or {}).items()):
        states.append(RankState(rank=rank, pid=int(report.get("pid", 0)), report=report,
                                local=False))
    return states


def _ranks_text(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r) for r in sorted(ranks))


def _indent(text: str) -> list[str]:
    return [f"    {line}" for line in text.rstrip("\n").splitlines()]


def _summary(verdict: Verdict, ranks: list[_Rank], states: list[RankState]) -> str:
    by_rank = {r.rank: r for r in ranks}
    state_of = {s.rank: s for s in states}
    root = by_rank.get(verdict.rank)
    where = f"(pid {root.proc.pid})" if root is not None else "(on another node)"
    lines = [f"collcomm run: rank {verdict.rank} {where} failed first: {verdict.how}"]
    # what the other ranks of this node did, grouped
    reactions: dict[tuple[str, tuple[int, ...]], list[int]] = collections.defaultdict(list)
    others: dict[str, list[int]] = collections.defaultdict(list)
    for s in states:
        if s.rank == verdict.rank or not s.local:
            continue
        if s.report:
            key = (str(s.report.get("type", "an error")), tuple(s.report.get("peers") or []))
            reactions[key].append(s.rank)
        elif s.signalled and s.returncode is not None:
            others["were stopped by the launcher"].append(s.rank)
        elif s.failed:
            others[f"failed too ({describe_exit(s.returncode or 1)})"].append(s.rank)
    for (etype, peers), who in sorted(reactions.items(), key=lambda kv: min(kv[1])):
        naming = f" naming {_ranks_text(list(peers))}" if peers else ""
        lines.append(f"collcomm run: {_ranks_text(who)} raised {etype}{naming}")
    for what, who in sorted(others.items(), key=lambda kv: min(kv[1])):
        lines.append(f"collcomm run: {_ranks_text(who)} {what}")
    # what the ranks of other nodes named here said, in their words
    named_here = {p for s in states if s.local and s.report for p in s.report.get("peers") or []}
    for s in states:
        if not s.local and s.report and (s.rank in named_here or s.rank == verdict.rank):
            first = str(s.report.get("message", "")).splitlines()[:1]
            lines.append(f"collcomm run: rank {s.rank} (on another node) raised "
                         f"{s.report.get('type', 'an error')}: {first[0] if first else ''}")
    # one traceback, once: the root cause's; else (it left none) its stderr; else the
    # first error reported on this node
    shown = state_of.get(verdict.rank)
    if shown is None or not shown.report:
        reported = sorted((s for s in states if s.local and s.report), key=lambda s: s.event_t)
        shown = None if (root is not None and root.stderr_tail) or not reported else reported[0]
    if shown is not None and shown.report and shown.report.get("traceback"):
        lines.append(f"collcomm run: rank {shown.rank}'s error "
                     "(your frames; COLLCOMM_DEBUG=1 for the full trace):")
        lines.extend(_indent(shown.report["traceback"]))
    elif root is not None and root.stderr_tail:
        lines.append(f"collcomm run: last {len(root.stderr_tail)} line(s) of rank {root.rank}'s "
                     "stderr:")
        lines.extend(f"    {line}" for line in root.stderr_tail)
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- main loop

class _Interrupts:
    """Records SIGINT/SIGTERM sent to the launcher while the job runs."""

    def __init__(self, wake: threading.Event) -> None:
        self.signum: int | None = None
        self.wake = wake
        self._saved: dict[int, object] = {}

    def __enter__(self) -> _Interrupts:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._saved[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: object) -> None:
        if self.signum is None:
            self.signum = signum
        self.wake.set()

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._saved.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]


def _explained(ranks: list[_Rank], report_dir: str) -> bool:
    """Waiting for the ranks still running is pointless (see :func:`rootcause.settled`)."""
    return settled(_states(ranks, report_dir))


def _watch(ranks: list[_Rank], interrupts: _Interrupts, wake: threading.Event,
           output: _Output, report_dir: str) -> bool:
    """Wait until every rank exited 0 (False), one failed (True) or we are interrupted;
    then, after a failure, give the others up to ``SETTLE_S`` to fail on their own and
    report (less when the ones left are stopped or named by the others' reports)."""
    settle_until: float | None = None
    while True:
        wake.clear()
        if interrupts.signum is not None:
            return settle_until is not None
        now = time.monotonic()
        for r in ranks:
            _check_stopped(r, now, output)
        if all(r.returncode is not None for r in ranks):
            return any(r.returncode != 0 for r in ranks)
        if settle_until is None and any(r.returncode not in (None, 0) for r in ranks):
            settle_until = now + SETTLE_S
        if settle_until is not None and (now >= settle_until or _explained(ranks, report_dir)):
            return True
        wake.wait(_POLL_S)


def launch(cfg: LaunchConfig) -> int:
    """Run the job described by ``cfg``; return the launcher's exit code."""
    _validate(cfg)
    argv = _argv(cfg)
    token, job_id = _job_credentials(cfg)
    server: TCPStoreServer | None = _serve_store(cfg, token) if cfg.node_rank == 0 else None
    port = server.port if server is not None else _store_port(cfg)
    master_port = cfg.master_port or _free_port(avoid=port)
    report_dir = tempfile.mkdtemp(prefix=f"collcomm-{job_id}-report-")
    output = _Output()
    wake = threading.Event()
    ranks: list[_Rank] = []
    failed = False
    interrupted: int | None = None
    code = 0
    try:
        with _Interrupts(wake) as interrupts:
            for local in range(cfg.nproc):
                env = rank_env(cfg, local, port, token, job_id, master_port=master_port,
                               report_dir=report_dir)
                env.update(_observe_env(cfg, job_id))
                ranks.append(_start_rank(argv, local, env, cfg.prefix, output, wake))
            failed = _watch(ranks, interrupts, wake, output, report_dir)
            interrupted = interrupts.signum
            if interrupted is not None:
                _stop(ranks, interrupted, cfg.grace)
                code = 128 + interrupted
            elif failed:
                _stop([r for r in ranks if r.returncode is None], signal.SIGTERM, cfg.grace)
    finally:
        if _live_group_members({r.proc.pid for r in ranks}):  # leftovers, e.g. grandchildren
            _stop(ranks, signal.SIGTERM, cfg.grace)
        _remove_shm(job_id)
        remote = _remote_reports(cfg, port, token) if failed and interrupted is None else {}
        if server is not None:
            server.close()
        for r in ranks:
            for t in r.readers:
                t.join(timeout=2)
        states = _states(ranks, report_dir, remote)
        shutil.rmtree(report_dir, ignore_errors=True)
    if interrupted is not None:
        name = signal.Signals(interrupted).name
        output.write(sys.stderr,
                     f"collcomm run: received {name}, stopped all ranks\n".encode())
        return code
    verdict = root_cause(states) if failed else None
    _observe_report(cfg, job_id, output, failed)
    if verdict is not None:
        output.write(sys.stderr, _summary(verdict, ranks, states).encode())
        return verdict.code
    return 0


def _observe_env(cfg: LaunchConfig, job_id: str) -> dict[str, str]:
    """Flight-recorder folder (per job unless set) and trace folder for every rank."""
    env = {"COLLCOMM_FR_DIR": os.environ.get("COLLCOMM_FR_DIR")
           or os.path.join(tempfile.gettempdir(), f"collcomm-fr-{job_id}")}
    if cfg.trace:
        env["COLLCOMM_TRACE"] = os.path.abspath(cfg.trace)
    return env


def _observe_report(cfg: LaunchConfig, job_id: str, output: _Output, failed: bool) -> None:
    """The flight recorder's cross-rank analysis, once (not each rank's copy), and the
    merged trace (see collcomm/tools/trace.py)."""
    from . import trace

    folder = _observe_env(cfg, job_id)["COLLCOMM_FR_DIR"]
    text = trace.launcher_summary(folder)
    if text:
        output.write(sys.stderr, f"collcomm run: {text}\ncollcomm run: (collcomm trace analyze "
                                 f"{folder})\n".encode())
    if cfg.trace and os.path.isdir(cfg.trace):
        output.write(sys.stderr, f"collcomm run: trace of every rank in {trace.merge(cfg.trace)}"
                                 "\n".encode())
