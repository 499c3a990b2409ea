"""``collcomm run``: start the ranks of a job on this node, watch them, clean up after them.

What one call of :func:`launch` does, in order:

1. On node 0 it hosts a :class:`~collcomm.rendezvous.TCPStoreServer` (``--master-port``, or a
   free port picked race-free by binding port 0). Every rank reaches it through
   ``COLLCOMM_STORE``; ``COLLCOMM_TOKEN`` (random per job, or the user's on several nodes)
   proves membership on every connection.
2. It starts ``nproc`` children with ``sys.executable -u``, each in its own session (and so
   its own process group), with the environment of :func:`rank_env`. A reader thread per
   pipe forwards whole lines of stdout/stderr, prefixed ``[rank] `` unless ``prefix`` is off,
   and keeps the last lines of every rank's stderr.
3. It waits. The first rank to exit non-zero or by a signal is the *root cause*: the others
   get SIGTERM on their process groups, SIGKILL after ``grace`` seconds, a summary naming
   that rank with its stderr tail goes to stderr, and the launcher exits with the rank's
   code (128 + signal number for a signal). SIGINT/SIGTERM to the launcher are forwarded to
   every rank, escalated the same way, and the launcher exits 128 + that signal (130 for
   Ctrl-C).
4. Whatever happened, it kills what is left of every rank's process group and removes the
   job's shared-memory segments ``/dev/shm/collcomm-<job_id>-*``.

Multi-node: run it once per node with the same ``--nnodes``, ``--master-addr``,
``--master-port`` and ``COLLCOMM_TOKEN``; node 0 hosts the store. A failure on another
node is not seen by this launcher; its ranks then fail through their own peer errors.
"""
from __future__ import annotations

import collections
import glob
import hashlib
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import BinaryIO, TextIO

from ..rendezvous.auth import job_token
from ..errors import InvalidArgumentError
from ..rendezvous import TCPStoreServer

__all__ = ["LaunchConfig", "launch", "rank_env", "shm_segments"]

STDERR_TAIL_LINES = 15
_POLL_S = 0.05


@dataclass
class LaunchConfig:
    """Everything ``collcomm run`` needs; ``program`` is a script path or, with
    ``module=True``, a module name."""

    nproc: int
    program: str
    args: list[str] = field(default_factory=list)
    module: bool = False
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 0
    prefix: bool = True
    grace: float = 3.0


@dataclass
class _Rank:
    rank: int
    local_rank: int
    proc: subprocess.Popen[bytes]
    readers: list[threading.Thread] = field(default_factory=list)
    stderr_tail: collections.deque[str] = field(
        default_factory=lambda: collections.deque(maxlen=STDERR_TAIL_LINES))
    returncode: int | None = None


# --------------------------------------------------------------------------- setup

def _validate(cfg: LaunchConfig) -> None:
    if cfg.nproc < 1:
        raise InvalidArgumentError(f"-n must be at least 1, got {cfg.nproc}")
    if cfg.nnodes < 1 or not 0 <= cfg.node_rank < cfg.nnodes:
        raise InvalidArgumentError(f"--node-rank must be in [0, {cfg.nnodes}), "
                                   f"got {cfg.node_rank} with --nnodes {cfg.nnodes}")
    if cfg.grace < 0:
        raise InvalidArgumentError(f"--grace must be >= 0, got {cfg.grace}")
    if cfg.nnodes > 1 and not os.environ.get("COLLCOMM_TOKEN"):
        raise InvalidArgumentError(
            "with --nnodes > 1, set COLLCOMM_TOKEN to the same secret on every node, "
            "e.g. export COLLCOMM_TOKEN=$(python -c 'import secrets; print(secrets.token_hex(16))')")
    if cfg.node_rank > 0 and cfg.master_port == 0:
        raise InvalidArgumentError("--master-port is required on nodes other than node 0")


def _job_credentials(cfg: LaunchConfig) -> tuple[str, str]:
    """(token hex/text, job id): random on one node; shared by every node otherwise."""
    if cfg.nnodes == 1:
        return secrets.token_hex(16), secrets.token_hex(6)
    token = os.environ["COLLCOMM_TOKEN"]
    job_id = os.environ.get("COLLCOMM_JOB_ID") or \
        hashlib.sha256(b"collcomm-job-id\0" + token.encode()).hexdigest()[:12]
    return token, job_id


def rank_env(cfg: LaunchConfig, local_rank: int, port: int, token: str, job_id: str,
             base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of local rank ``local_rank`` on this node."""
    env = dict(os.environ if base is None else base)
    env.update({
        "RANK": str(cfg.node_rank * cfg.nproc + local_rank),
        "WORLD_SIZE": str(cfg.nproc * cfg.nnodes),
        "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(cfg.nproc),
        "GROUP_RANK": str(cfg.node_rank),
        "MASTER_ADDR": cfg.master_addr,
        "MASTER_PORT": str(port),
        "COLLCOMM_STORE": f"{cfg.master_addr}:{port}",
        "COLLCOMM_TOKEN": token,
        "COLLCOMM_JOB_ID": job_id,
        "PYTHONUNBUFFERED": "1",
    })
    return env


def _command(cfg: LaunchConfig) -> list[str]:
    head = ["-m", cfg.program] if cfg.module else [cfg.program]
    return [sys.executable, "-u", *head, *cfg.args]


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
    """Forward ``pipe`` line by line to ``out`` until EOF."""
    try:
        for line in iter(pipe.readline, b""):
            if prefix and not line.endswith(b"\n"):
                line += b"\n"  # a prefixed stream always shows whole lines
            output.write(out, prefix + line)
            if tail is not None:
                tail.append(line.decode("utf-8", "replace").rstrip("\n"))
    except (OSError, ValueError):
        pass
    finally:
        pipe.close()


def _start_rank(cfg: LaunchConfig, local_rank: int, env: dict[str, str],
                output: _Output) -> _Rank:
    proc = subprocess.Popen(_command(cfg), env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    r = _Rank(rank=int(env["RANK"]), local_rank=local_rank, proc=proc)
    prefix = f"[{r.rank}] ".encode() if cfg.prefix else b""
    assert proc.stdout is not None and proc.stderr is not None
    for pipe, out, tail in ((proc.stdout, sys.stdout, None),
                            (proc.stderr, sys.stderr, r.stderr_tail)):
        t = threading.Thread(target=_pump, args=(pipe, out, prefix, output, tail),
                             daemon=True, name=f"collcomm-run-pipe-{r.rank}")
        t.start()
        r.readers.append(t)
    return r


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


def _reap(ranks: list[_Rank]) -> None:
    for r in ranks:
        if r.returncode is None:
            r.returncode = r.proc.poll()


def _stop(ranks: list[_Rank], first_signal: int, grace: float) -> None:
    """Signal every rank's group, then SIGKILL what is still there after ``grace`` seconds."""
    for r in ranks:
        _signal_group(r, first_signal)
    deadline = time.monotonic() + grace
    pgids = {r.proc.pid for r in ranks}
    while time.monotonic() < deadline:
        _reap(ranks)
        if not _live_group_members(pgids) and all(r.returncode is not None for r in ranks):
            break
        time.sleep(_POLL_S)
    for r in ranks:
        _signal_group(r, signal.SIGKILL)
    for r in ranks:
        try:
            r.returncode = r.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


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

def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def _describe(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"killed by signal {name}"
    return f"exit code {returncode}"


def _summary(r: _Rank, returncode: int) -> str:
    lines = [f"collcomm run: rank {r.rank} (pid {r.proc.pid}) failed first: "
             f"{_describe(returncode)}"]
    if r.stderr_tail:
        lines.append(f"collcomm run: last {len(r.stderr_tail)} line(s) of rank {r.rank}'s stderr:")
        lines.extend(f"    {line}" for line in r.stderr_tail)
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- main loop

class _Interrupts:
    """Records SIGINT/SIGTERM sent to the launcher while the job runs."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._saved: dict[int, object] = {}

    def __enter__(self) -> _Interrupts:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._saved[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: object) -> None:
        if self.signum is None:
            self.signum = signum

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._saved.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]


def _watch(ranks: list[_Rank], interrupts: _Interrupts) -> _Rank | None:
    """Wait until all ranks exit 0 (None), one fails (it), or the launcher is interrupted."""
    while True:
        if interrupts.signum is not None:
            return None
        for r in ranks:
            if r.returncode is None:
                r.returncode = r.proc.poll()
                if r.returncode not in (None, 0):
                    return r
        if all(r.returncode is not None for r in ranks):
            return None
        time.sleep(_POLL_S)


def launch(cfg: LaunchConfig) -> int:
    """Run the job described by ``cfg``; return the launcher's exit code."""
    _validate(cfg)
    token, job_id = _job_credentials(cfg)
    server: TCPStoreServer | None = None
    if cfg.node_rank == 0:
        bind = "127.0.0.1" if cfg.nnodes == 1 and cfg.master_addr in ("127.0.0.1", "localhost") \
            else ("::" if ":" in cfg.master_addr else "0.0.0.0")
        server = TCPStoreServer(bind, cfg.master_port, token=job_token({"COLLCOMM_TOKEN": token}))
    port = server.port if server is not None else cfg.master_port
    output = _Output()
    ranks: list[_Rank] = []
    failed: _Rank | None = None
    interrupted: int | None = None
    try:
        with _Interrupts() as interrupts:
            for local in range(cfg.nproc):
                env = rank_env(cfg, local, port, token, job_id)
                ranks.append(_start_rank(cfg, local, env, output))
            failed = _watch(ranks, interrupts)
            interrupted = interrupts.signum
            if interrupted is not None:
                _stop(ranks, interrupted, cfg.grace)
                code = 128 + interrupted
            elif failed is not None:
                _stop([r for r in ranks if r is not failed], signal.SIGTERM, cfg.grace)
                code = _exit_code(failed.returncode or 1)
            else:
                code = 0
    finally:
        if _live_group_members({r.proc.pid for r in ranks}):  # leftovers, e.g. grandchildren
            _stop(ranks, signal.SIGTERM, cfg.grace)
        _remove_shm(job_id)
        if server is not None:
            server.close()
        for r in ranks:
            for t in r.readers:
                t.join(timeout=2)
    if interrupted is not None:
        name = signal.Signals(interrupted).name
        output.write(sys.stderr,
                     f"collcomm run: received {name}, stopped all ranks\n".encode())
    elif failed is not None:
        output.write(sys.stderr, _summary(failed, failed.returncode or 1).encode())
    return code
