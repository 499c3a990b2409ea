"""collcomm.MPI programs as users start them: a plain ``python prog.py`` (a world of one),
``collcomm run``, ``mpiexec`` (Open MPI), and ranks started with only RANK/WORLD_SIZE/
MASTER_ADDR/MASTER_PORT (no launcher that stops the job). In every case an uncaught
exception on one rank ends the whole job promptly with that rank's traceback, and
``comm.Abort(code)`` ends it with ``code``, while the other ranks wait in collectives.
"""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import time

import pytest

from tests.harness import ROOT, free_port, shm_files

PROG = """
import os, sys, time
import numpy as np
from collcomm import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
mode = sys.argv[1]
total = comm.allreduce(rank + 1)
x = np.full(3, rank, dtype="i"); y = np.empty_like(x)
comm.Allreduce(x, y, op=MPI.MAX)
req = comm.isend({"me": rank}, rank, tag=7)           # a message to oneself works everywhere
mine = comm.recv(source=rank, tag=7); req.wait()
print(f"RESULT {rank} {size} {total} {y.tolist()} {mine}", flush=True)
if rank == 0:
    from collcomm.rendezvous.auth import job_id
    print(f"JOB {job_id()}", flush=True)
if mode == "raise":
    comm.Barrier()
    if rank == 1:
        raise ValueError("rank 1 gives up")
    comm.Barrier()          # the others wait here for rank 1, which is gone
    comm.Barrier()
elif mode == "raise-any":
    # rank 0 waits for anyone, rank 2 for rank 0: only stopping the job ends these waits
    comm.Barrier()
    if rank == 1:
        raise ValueError("rank 1 gives up")
    comm.recv(source=MPI.ANY_SOURCE if rank == 0 else 0)
elif mode == "abort":
    comm.Barrier()
    if rank == 1:
        comm.Abort(3)
    comm.bcast(None, root=1)
print(f"DONE {rank}", flush=True)
"""


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("COLLCOMM_", "OMPI_", "PMI_", "PMIX_", "SLURM_", "TORCHELASTIC_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


@pytest.fixture
def prog(tmp_path):
    path = tmp_path / "prog.py"
    path.write_text(PROG)
    return str(path)


def _results(out: str, n: int) -> list[str]:
    return sorted(line for line in out.splitlines() if "RESULT" in line)


@pytest.mark.timeout(60)
def test_plain_python_is_a_world_of_one(prog):
    res = subprocess.run([sys.executable, prog, "ok"], capture_output=True, text=True, timeout=50, env=_clean_env())
    assert res.returncode == 0, res.stderr
    assert "RESULT 0 1 1 [0, 0, 0] {'me': 0}" in res.stdout and "DONE 0" in res.stdout


@pytest.mark.timeout(90)
def test_collcomm_run_uncaught_exception_ends_the_job(prog):
    start = time.monotonic()
    fr = os.path.join(os.path.dirname(prog), "fr")   # the dumps: not in /tmp/collcomm-fr-<job>
    res = subprocess.run([sys.executable, "-m", "collcomm", "run", "-n", "3", prog, "raise"], capture_output=True,
                         text=True, timeout=80, env=_clean_env(COLLCOMM_FR_DIR=fr))
    elapsed = time.monotonic() - start
    out = res.stdout + res.stderr
    assert res.returncode != 0 and "rank 1 gives up" in out, out[-3000:]
    assert len([ln for ln in out.splitlines() if "RESULT" in ln]) == 3, out[-3000:]
    assert "DONE" not in out and elapsed < 40, (elapsed, out[-3000:])


def _spawn_env_ranks(prog: str, mode: str, n: int) -> tuple[list[subprocess.CompletedProcess], float]:
    """Ranks started with torchrun-style variables only: nobody stops the job for them."""
    port = str(free_port())
    procs = [subprocess.Popen([sys.executable, prog, mode], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=_clean_env(RANK=str(r), WORLD_SIZE=str(n), LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1",
                                             MASTER_PORT=port, COLLCOMM_JOB_ID=f"mpilaunch{port}"),
                              start_new_session=True) for r in range(n)]
    start = time.monotonic()
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=60)
            outs.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.wait()
    leaked = shm_files(f"mpilaunch{port}")
    for path in leaked:
        os.unlink(path)
    assert not leaked, f"shared memory left behind: {leaked}"
    return outs, time.monotonic() - start


@pytest.mark.timeout(90)
def test_uncaught_exception_without_a_launcher_ends_every_rank(prog):
    outs, elapsed = _spawn_env_ranks(prog, "raise", 3)
    assert "rank 1 gives up" in outs[1].stderr, outs[1].stderr[-2000:]
    assert all(o.returncode != 0 for o in outs), [(o.returncode, o.stderr[-500:]) for o in outs]
    assert all("RESULT" in o.stdout and "DONE" not in o.stdout for o in outs)
    assert elapsed < 30, elapsed          # the others end within seconds, not at the 300 s timeout


@pytest.mark.timeout(90)
def test_uncaught_exception_stops_ranks_waiting_on_others(prog):
    outs, elapsed = _spawn_env_ranks(prog, "raise-any", 3)
    assert "rank 1 gives up" in outs[1].stderr, outs[1].stderr[-2000:]
    assert all(o.returncode != 0 and "DONE" not in o.stdout for o in outs), [o.returncode for o in outs]
    assert elapsed < 30, elapsed


@pytest.mark.timeout(90)
def test_abort_ends_every_rank_with_its_code(prog):
    outs, elapsed = _spawn_env_ranks(prog, "abort", 3)
    assert outs[1].returncode == 3, outs[1].stderr[-2000:]
    assert all(o.returncode != 0 and "DONE" not in o.stdout for o in outs), [o.returncode for o in outs]
    assert elapsed < 30, elapsed


def _mpiexec() -> str | None:
    exe = shutil.which("mpiexec")
    if exe is None:
        return None
    version = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30)
    return exe if "Open MPI" in version.stdout + version.stderr else None


@pytest.mark.timeout(120)
@pytest.mark.skipif(_mpiexec() is None, reason="Open MPI's mpiexec is not installed (pip install '.[bench]')")
def test_mpiexec(prog):
    base = [_mpiexec(), "--allow-run-as-root", "--oversubscribe", "-n", "3", sys.executable, prog]
    res = subprocess.run(base + ["ok"], capture_output=True, text=True, timeout=60, env=_clean_env())
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert _results(res.stdout, 3) == [f"RESULT {r} 3 6 [2, 2, 2] {{'me': {r}}}" for r in range(3)]
    _no_rendezvous_file_left(res.stdout)
    start = time.monotonic()
    fr = os.path.join(os.path.dirname(prog), "fr")   # the dumps: not in /tmp/collcomm-fr-<job>
    res = subprocess.run(base + ["raise"], capture_output=True, text=True, timeout=60,
                         env=_clean_env(COLLCOMM_FR_DIR=fr))
    assert res.returncode != 0 and "rank 1 gives up" in res.stdout + res.stderr
    assert "DONE" not in res.stdout and time.monotonic() - start < 40
    # the job met in a file (/tmp/collcomm-rdzv-<job>): the aborting rank removes it, as
    # the others are stopped without closing it
    _no_rendezvous_file_left(res.stdout)


def _no_rendezvous_file_left(stdout: str) -> None:
    jobs = [line.split()[1] for line in stdout.splitlines() if line.startswith("JOB ")]
    assert len(jobs) == 1, stdout[-2000:]
    left = glob.glob(f"/tmp/collcomm-rdzv-{jobs[0]}*")
    for path in left:
        os.unlink(path)
    assert not left, f"rendezvous file left behind: {left}"
