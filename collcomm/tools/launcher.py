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
   to ``SETTLE_S`` (``COLLCOMM_RUN_SETTLE``) to fail on their own and say why (see
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

import hashlib
import os
import secrets
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

from ..core.bootstrap import REPORT_ENV
from ..errors import InvalidArgumentError
from ..rendezvous import TCPStoreServer
from ..rendezvous.auth import job_token
from .launch_report import rank_states, remote_reports, summary
from .rank_procs import (POLL_S, Output, Rank, check_stopped, live_group_members, remove_shm,
                         shm_segments, start_rank, stop)
from .rootcause import root_cause, settled

__all__ = ["LaunchConfig", "launch", "rank_env", "shm_segments", "program_argv"]

#: After the first failure, seconds the other ranks get to fail on their own (and report);
#: the wait ends as soon as every rank still running is stopped or named by a report.
#: ``COLLCOMM_RUN_SETTLE`` (seconds, >= 0) replaces it, e.g. 0 for programs whose ranks
#: never say why they fail (no collcomm), where waiting only delays the summary.
SETTLE_S = 5.0
SETTLE_ENV = "COLLCOMM_RUN_SETTLE"


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
    settle: float | None = None   # None: COLLCOMM_RUN_SETTLE, else SETTLE_S


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

def settle_s(cfg: LaunchConfig) -> float:
    """Seconds the other ranks get after the first failure (see ``SETTLE_S``)."""
    if cfg.settle is not None:
        value, where = cfg.settle, "settle"
    else:
        text = os.environ.get(SETTLE_ENV, "").strip()
        if not text:
            return SETTLE_S
        where = f"{SETTLE_ENV}={text!r}"
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
    if not value >= 0 or value == float("inf"):
        raise InvalidArgumentError(f"{where}: expected seconds >= 0 (default {SETTLE_S:g})")
    return float(value)


def _validate(cfg: LaunchConfig) -> None:
    if cfg.nproc < 1:
        raise InvalidArgumentError(f"-n must be at least 1, got {cfg.nproc}")
    if cfg.nnodes < 1 or not 0 <= cfg.node_rank < cfg.nnodes:
        raise InvalidArgumentError(f"--node-rank must be in [0, {cfg.nnodes}), "
                                   f"got {cfg.node_rank} with --nnodes {cfg.nnodes}")
    if cfg.grace < 0:
        raise InvalidArgumentError(f"--grace must be >= 0, got {cfg.grace}")
    settle_s(cfg)
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


#: The thread-pool sizes a numeric library reads (OpenMP, OpenBLAS, MKL; torch's intra-op
#: pool reads OMP_NUM_THREADS): where the user set none, each of several local ranks gets
#: OMP_NUM_THREADS = its share of the cores (torchrun sets 1). Unset, every rank sizes its
#: pool to the whole machine: n ranks run n x cores threads, and numpy's OpenBLAS alone
#: spins its pool up at import (~0.12 s of CPU per rank on the 2-vCPU VM, measured).
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def threads_per_rank(local_ranks: int) -> int:
    """Each of ``local_ranks`` ranks' share of the CPUs this launcher may run on (>= 1)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):     # (no affinity call: not Linux)
        cpus = os.cpu_count() or 1
    return max(1, cpus // max(1, local_ranks))


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
    if cfg.nproc > 1 and not any(env.get(v) for v in THREAD_VARS):
        env["OMP_NUM_THREADS"] = str(threads_per_rank(cfg.nproc))
    if report_dir is not None:
        env[REPORT_ENV] = report_dir
    else:
        env.pop(REPORT_ENV, None)
    return env


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


def _explained(ranks: list[Rank], report_dir: str) -> bool:
    """Waiting for the ranks still running is pointless (see :func:`rootcause.settled`)."""
    return settled(rank_states(ranks, report_dir))


def _watch(ranks: list[Rank], interrupts: _Interrupts, wake: threading.Event,
           output: Output, report_dir: str, settle: float = SETTLE_S) -> bool:
    """Wait until every rank exited 0 (False), one failed (True) or we are interrupted;
    then, after a failure, give the others up to ``settle`` seconds to fail on their own and
    report (less when the ones left are stopped or named by the others' reports)."""
    settle_until: float | None = None
    while True:
        wake.clear()
        if interrupts.signum is not None:
            return settle_until is not None
        now = time.monotonic()
        for r in ranks:
            check_stopped(r, now, output)
        if all(r.returncode is not None for r in ranks):
            return any(r.returncode != 0 for r in ranks)
        if settle_until is None and any(r.returncode not in (None, 0) for r in ranks):
            settle_until = now + settle
        if settle_until is not None and (now >= settle_until or _explained(ranks, report_dir)):
            return True
        wake.wait(POLL_S)


def launch(cfg: LaunchConfig) -> int:
    """Run the job described by ``cfg``; return the launcher's exit code."""
    _validate(cfg)
    argv = _argv(cfg)
    token, job_id = _job_credentials(cfg)
    server: TCPStoreServer | None = _serve_store(cfg, token) if cfg.node_rank == 0 else None
    port = server.port if server is not None else _store_port(cfg)
    master_port = cfg.master_port or _free_port(avoid=port)
    report_dir = tempfile.mkdtemp(prefix=f"collcomm-{job_id}-report-")
    output = Output()
    wake = threading.Event()
    ranks: list[Rank] = []
    failed = False
    interrupted: int | None = None
    code = 0
    try:
        with _Interrupts(wake) as interrupts:
            for local in range(cfg.nproc):
                env = rank_env(cfg, local, port, token, job_id, master_port=master_port,
                               report_dir=report_dir)
                env.update(_observe_env(cfg, job_id))
                ranks.append(start_rank(argv, local, env, cfg.prefix, output, wake))
            failed = _watch(ranks, interrupts, wake, output, report_dir, settle_s(cfg))
            interrupted = interrupts.signum
            if interrupted is not None:
                stop(ranks, interrupted, cfg.grace)
                code = 128 + interrupted
            elif failed:
                stop([r for r in ranks if r.returncode is None], signal.SIGTERM, cfg.grace)
    finally:
        if live_group_members({r.proc.pid for r in ranks}):  # leftovers, e.g. grandchildren
            stop(ranks, signal.SIGTERM, cfg.grace)
        remove_shm(job_id)
        remote = remote_reports(cfg, port, token) if failed and interrupted is None else {}
        if server is not None:
            server.close()
        for r in ranks:
            for t in r.readers:
                t.join(timeout=2)
        states = rank_states(ranks, report_dir, remote)
        shutil.rmtree(report_dir, ignore_errors=True)
    if interrupted is not None:
        name = signal.Signals(interrupted).name
        output.write(sys.stderr,
                     f"collcomm run: received {name}, stopped all ranks\n".encode())
        return code
    verdict = root_cause(states) if failed else None
    _observe_report(cfg, job_id, output, failed)
    if verdict is not None:
        output.write(sys.stderr, summary(verdict, ranks, states).encode())
        return verdict.code
    return 0


def _observe_env(cfg: LaunchConfig, job_id: str) -> dict[str, str]:
    """Flight-recorder folder (per job unless set) and trace folder for every rank."""
    env = {"COLLCOMM_FR_DIR": os.environ.get("COLLCOMM_FR_DIR")
           or os.path.join(tempfile.gettempdir(), f"collcomm-fr-{job_id}")}
    if cfg.trace:
        env["COLLCOMM_TRACE"] = os.path.abspath(cfg.trace)
    return env


def _observe_report(cfg: LaunchConfig, job_id: str, output: Output, failed: bool) -> None:
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
