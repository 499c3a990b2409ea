"""Run a function on N real ranks (separate processes) with a hard timeout.

``run_ranks(fn, n, *args)`` starts n Python processes with torchrun-style environment
(RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT, COLLCOMM_TOKEN, COLLCOMM_JOB_ID), each
calls ``collcomm.init_process_group()``, then ``fn(*args)`` and returns its result here.
``fn`` must be a module-level function of an importable module (e.g. ``tests.test_x``).
Every process runs in its own process group and is killed when the call ends, pass or fail;
the job's shared-memory segments must be gone afterwards. The ranks are forked by this
worker's zygote (tests/rank_zygote.py: numpy already imported) where it can, else started
as fresh interpreters.

Two small helpers the tests share: :func:`line_of` (where a marked line is, for the
flight recorder's file:line) and :func:`wait_errors` (what waiting twice raises).
"""
from __future__ import annotations

import glob
import os
import pickle
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Callable

from tests.rank_zygote import Zygote

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: Job ids started by this test session (conftest checks none of them left anything).
JOBS: list[str] = []


@dataclass
class Outcome:
    rank: int
    ok: bool
    value: Any = None          # fn's result when ok
    error_type: str = ""       # the exception's class name when not ok
    error: str = ""            # str(exception)
    traceback: str = ""
    elapsed: float = 0.0       # seconds from the start of fn to its return/raise
    exitcode: int | None = None
    output: str = ""
    killed_at: float | None = None   # time.monotonic() of the harness's SIGKILL (``kill=``)


class RankFailure(AssertionError):
    pass


def line_of(path: str, marker: str) -> int:
    """The number of the first line of ``path`` holding ``marker`` (not a ``line_of`` call)."""
    with open(path) as f:
        for i, line in enumerate(f, 1):
            if marker in line and "line_of" not in line:
                return i
    raise AssertionError(marker)


def wait_errors(work: Any, error: type[BaseException], times: int = 2) -> list[BaseException]:
    """The ``error``s each of ``times`` waits of ``work`` raised (a kept error: the same one)."""
    errors = []
    for _ in range(times):
        try:
            work.wait()
        except error as exc:
            errors.append(exc)
    return errors


# Ports for MASTER_PORT are drawn below the kernel's ephemeral range (32768-60999 by default),
# a block per pytest-xdist worker: a port the kernel hands out for bind(0) or for an outgoing
# connection can be taken by another worker's job (or its client sockets) between our check and
# rank 0's bind, which failed a CI run ("Address already in use", the other job's store then
# refusing our token). Inside a block the draw is random and checked by a bind.
_PORT_BLOCK = 2000
_PORT_BASE = 12000


def _port_block() -> range:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    start = _PORT_BASE + (index % 10) * _PORT_BLOCK
    return range(start, start + _PORT_BLOCK)


def free_port() -> int:
    """A loopback port free now, from this test worker's own block (see _port_block)."""
    block = _port_block()
    for _ in range(200):
        port = secrets.choice(block)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {block}")


def shm_files(job_id: str) -> list[str]:
    return glob.glob(f"/dev/shm/collcomm-{job_id}-*")


#: This worker's zygotes of rank processes by what they import besides numpy (conftest
#: stops them after the suite). ``run_ranks(..., preload=TORCH)``: ranks that import torch.
ZYGOTES: dict[tuple[str, ...], Zygote] = {}
TORCH = ("torch",)


def stop_zygotes() -> None:
    for zygote in ZYGOTES.values():
        zygote.stop()


def zygote_pids() -> set[int]:
    return {pid for z in ZYGOTES.values() if (pid := z.pid()) is not None}


def _kill_group(p: Any) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_ranks(fn: Callable[..., Any], n: int, *args: Any, env: dict[str, str] | None = None,
              timeout: float = 60.0, transport: str | None = None, init: bool = True,
              expect_failure: bool = False, kill: dict[int, float] | None = None,
              rank_env: dict[int, dict[str, str]] | None = None,
              preload: tuple[str, ...] = ()) -> list[Any]:
    """Run ``fn(*args)`` on ``n`` ranks; return the per-rank results (or Outcomes).

    ``transport``: force COLLCOMM_TRANSPORT ("tcp" or "shm"). ``expect_failure``: return
    the list of :class:`Outcome` instead of raising when a rank fails. ``kill``: {rank: t}
    SIGKILLs that rank t seconds after every rank has joined the job (with ``init``; else
    after the start), so a slow start on a loaded machine never moves the kill into
    ``init_process_group``; earlier once every other rank has exited; the victim's ``Outcome.killed_at`` says when it happened. ``rank_env``: extra variables per rank
    (e.g. ``COLLCOMM_HOST_ID`` to make ranks of one machine look like several hosts).
    ``preload``: modules every rank imports anyway (:data:`TORCH`), imported once in the
    zygote the ranks are forked from (tests/rank_zygote.py).
    """
    job_id = secrets.token_hex(6)
    JOBS.append(job_id)
    tmp = tempfile.mkdtemp(prefix="collcomm-test-")
    with open(os.path.join(tmp, "job.pkl"), "wb") as f:
        pickle.dump((fn, args, init), f)
    base = dict(os.environ)
    base.update({
        "WORLD_SIZE": str(n), "LOCAL_WORLD_SIZE": str(n), "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()), "COLLCOMM_TOKEN": secrets.token_hex(16),
        "COLLCOMM_JOB_ID": job_id, "PYTHONPATH": ROOT + os.pathsep + base.get("PYTHONPATH", ""),
    })
    base.pop("COLLCOMM_STORE", None)
    if transport:
        base["COLLCOMM_TRANSPORT"] = transport
    plain = dict(base)        # (what a zygote starts with: no job's own variables)
    base.update(env or {})
    procs: list[Any] = []     # subprocess.Popen or rank_zygote.Forked
    zygote = ZYGOTES.get(preload) or ZYGOTES.setdefault(preload, Zygote(preload))
    logs = []
    start = time.monotonic()
    try:
        for r in range(n):
            e = dict(base, RANK=str(r), LOCAL_RANK=str(r), **(rank_env or {}).get(r, {}))
            log = open(os.path.join(tmp, f"out-{r}.txt"), "wb")
            logs.append(log)
            procs.append(zygote.fork(tmp, r, e, log.name, plain) or subprocess.Popen(
                [sys.executable, "-m", "tests.rank_main", tmp], env=e, stdout=log,
                stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True))
        pending_kills = dict(kill or {})
        killed_at: dict[int, float] = {}
        joined_at: float | None = None if init else start
        deadline = start + timeout
        while any(p.poll() is None for p in procs):
            now = time.monotonic()
            if joined_at is None and pending_kills and all(
                    os.path.exists(os.path.join(tmp, f"joined-{r}")) for r in range(n)):
                joined_at = now
            for r, t in list(pending_kills.items()):
                alone = all(p.poll() is not None for q, p in enumerate(procs) if q != r)
                if joined_at is not None and (now - joined_at >= t or alone):
                    procs[r].send_signal(signal.SIGKILL)
                    killed_at[r] = time.monotonic()
                    del pending_kills[r]
            if now > deadline:
                for p in procs:          # every rank's stacks, into its output
                    if p.poll() is None:
                        p.send_signal(signal.SIGUSR1)
                time.sleep(0.5)
                raise RankFailure(f"ranks did not finish within {timeout} s; output:\n"
                                  + _outputs(tmp, n))
            time.sleep(0.01)
    finally:
        for p in procs:
            _kill_group(p)
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        for log in logs:
            log.close()
        if sys.exc_info()[0] is not None:   # failing here: the error text has the outputs
            shutil.rmtree(tmp, ignore_errors=True)
    try:
        return _collect(tmp, n, procs, killed_at, job_id, expect_failure)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)   # every output is in the results or the error


def _collect(tmp: str, n: int, procs: list[Any], killed_at: dict[int, float],
             job_id: str, expect_failure: bool) -> list[Any]:
    """The ranks' outcomes from ``tmp``; RankFailure for leaked segments or failed ranks."""
    outcomes = []
    for r in range(n):
        path = os.path.join(tmp, f"result-{r}.pkl")
        out = _read(os.path.join(tmp, f"out-{r}.txt"))
        if os.path.exists(path):
            with open(path, "rb") as f:
                o: Outcome = pickle.load(f)
        else:
            o = Outcome(r, False, error_type="NoResult", error="rank produced no result")
        o.exitcode, o.output = procs[r].returncode, out
        o.killed_at = killed_at.get(r)
        outcomes.append(o)
    leaked = shm_files(job_id)
    for path in leaked:
        os.unlink(path)
    if leaked:
        raise RankFailure(f"shared-memory segments leaked: {leaked}")
    if expect_failure:
        return outcomes
    bad = [o for o in outcomes if not o.ok]
    if bad:
        raise RankFailure("\n".join(f"rank {o.rank} failed: {o.error_type}: {o.error}\n{o.traceback}"
                                    f"--- output ---\n{o.output[-3000:]}" for o in bad))
    return [o.value for o in outcomes]


def _read(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _outputs(tmp: str, n: int) -> str:
    return "\n".join(f"--- rank {r} ---\n{_read(os.path.join(tmp, f'out-{r}.txt'))[-6000:]}"
                     for r in range(n))
