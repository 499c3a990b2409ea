"""One library's ranks as a started job: collcomm's front ends under ``collcomm run``,
mpi4py under Open MPI's ``mpiexec``, torch Gloo as plain processes with torch's env://.

:func:`start` launches a library's sweep (``worker.py`` for collcomm, ``peers.py`` for the
rest) and returns a :class:`Job` at once, so the runner can either wait for each job in
turn (whole sweeps alternated) or keep every library's job up and hand out turns
(``turns.py``). A job's processes get their own session; :meth:`Job.kill` asks first
(SIGTERM: ``collcomm run`` then stops its ranks, which run in sessions of their own) and
kills the session after a grace period.
"""
from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from typing import IO, Any

from .options import Options, collcomm_env


#: seconds a job gets to stop after SIGTERM before its session is killed (collcomm run
#: itself gives its ranks 3 s, then SIGKILL)
KILL_GRACE_S = 8.0


class LaunchFailed(RuntimeError):
    pass


def mpiexec_path() -> str | None:
    for cand in (os.path.join(sys.prefix, "bin", "mpiexec"),
                 os.path.join(os.path.dirname(sys.executable), "mpiexec")):
        if os.path.exists(cand):
            return cand
    return shutil.which("mpiexec")


def peer_unavailable(lib: str) -> str | None:
    """None if ``lib`` can run here, else the one-line reason it is skipped."""
    if lib == "mpi":
        if importlib.util.find_spec("mpi4py") is None:
            return "mpi4py is not installed (pip install 'collcomm[bench]')"
        if mpiexec_path() is None:
            return "mpiexec not found (pip install 'collcomm[bench]' provides Open MPI)"
        return None
    if lib in ("gloo", "cc-torch"):
        if importlib.util.find_spec("torch") is None:
            return "torch is not installed (pip install 'collcomm[torch]')"
        return None
    if lib == "cc-mpi":
        return None if importlib.util.find_spec("collcomm.MPI") else "collcomm.MPI is missing"
    return f"unknown peer {lib!r}"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tail(text: str, lines: int = 6) -> str:
    return " | ".join(text.strip().splitlines()[-lines:])


class Job:
    """A library's started ranks. ``poll()``: None while any process runs, else the first
    non-zero exit code (0 when all succeeded); ``kill()`` ends them all; ``rows()`` reads
    what rank 0 wrote, or raises LaunchFailed saying why there is nothing."""

    def __init__(self, lib: str, procs: list[subprocess.Popen[bytes]], out_path: str,
                 errs: list[IO[bytes]]) -> None:
        self.lib, self.procs, self.out_path, self.errs = lib, procs, out_path, errs

    def poll(self) -> int | None:
        codes = [p.poll() for p in self.procs]
        bad = [c for c in codes if c]
        if bad:
            return bad[0]
        return None if any(c is None for c in codes) else 0

    def kill(self, grace: float = KILL_GRACE_S) -> None:
        """SIGTERM to each process (a launcher: collcomm run stops its ranks, mpiexec its),
        then SIGKILL to the sessions of what is left after ``grace`` s. (SIGKILL alone would
        orphan collcomm's ranks, each in a session of its own.)"""
        for p in self.procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(p.pid, signal.SIGTERM)
        self.settle(grace)
        for p in self.procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(p.pid, signal.SIGKILL)
        for p in self.procs:
            p.wait()

    def settle(self, grace: float) -> None:
        """Wait up to ``grace`` s for every process to exit by itself."""
        deadline = time.monotonic() + grace
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=max(0.0, deadline - time.monotonic()))

    def wait(self, timeout: float | None) -> int:
        """Wait for every process (None: for as long as it takes; else killing them all after
        ``timeout`` s); the exit code, or raise LaunchFailed when it timed out. Interrupted
        (Ctrl-C), it stops the job before the exception goes on."""
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            for p in self.procs:
                p.wait(timeout=None if deadline is None else max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.kill()
            raise LaunchFailed(f"{self.lib}: timed out") from None
        except BaseException:
            self.kill()
            raise
        code = self.poll()
        return 0 if code is None else code

    def failure(self, code: int) -> str:
        """What to say about a job that exited ``code``: its ranks' last stderr lines."""
        text = ""
        for fh in self.errs:
            fh.seek(0)
            text = fh.read().decode("utf-8", "replace")
            if text.strip():
                break
        return f"{self.lib}: exited {code}" + (f": {_tail(text)}" if text.strip() else "")

    def rows(self) -> list[dict[str, Any]]:
        try:
            with open(self.out_path) as fh:
                return list(json.load(fh))
        except (OSError, ValueError) as exc:
            raise LaunchFailed(f"{self.lib}: no results ({exc})") from None

    def close(self) -> None:
        for fh in self.errs:
            fh.close()


def _popen(cmd: list[str], env: dict[str, str], err: IO[bytes] | None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL,
                            env=env, start_new_session=True)


def start(lib: str, opts: Options, opts_path: str, out_path: str, tmp: str) -> Job:
    """Launch ``lib``'s sweep over ``opts_path``; rank 0 writes its rows to ``out_path``.
    collcomm's own ranks write their stderr through (a failure there is a bug the user must
    see whole); the peers' go to files in ``tmp``, quoted when they fail."""
    if lib in ("collcomm", "cc-mpi", "cc-torch"):
        program = (["-m", "collcomm.tools.bench.worker", opts_path, out_path] if lib == "collcomm"
                   else ["-m", "collcomm.tools.bench.peers", lib, opts_path, out_path])
        cmd = [sys.executable, "-m", "collcomm", "run", "-n", str(opts.nproc), "--no-prefix"]
        env = dict(os.environ, **collcomm_env(opts))
        return Job(lib, [_popen(cmd + program, env, None)], out_path, [])
    peer = [sys.executable, "-m", "collcomm.tools.bench.peers", lib, opts_path, out_path]
    if lib == "mpi":
        mpiexec = mpiexec_path()
        assert mpiexec is not None
        env = dict(os.environ)
        env.setdefault("OMPI_MCA_rmaps_base_oversubscribe", "1")
        err = open(os.path.join(tmp, f"{lib}.err"), "w+b")
        cmd = [mpiexec, "--allow-run-as-root", "--oversubscribe", "-n", str(opts.nproc)] + peer
        return Job(lib, [_popen(cmd, env, err)], out_path, [err])
    port = _free_port()                     # gloo: one process per rank, torch's env://
    procs, errs = [], []
    for rank in range(opts.nproc):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(opts.nproc), LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE=str(opts.nproc), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port))
        errs.append(open(os.path.join(tmp, f"{lib}.{rank}.err"), "w+b"))
        procs.append(_popen(peer, env, errs[-1]))
    return Job(lib, procs, out_path, errs)
