"""The scripts in benchmarks/ still run: each at its smallest setting, as its header says
to run it (a world of one, ``collcomm run -n 2``, or Open MPI's ``mpiexec`` where
installed), must exit 0 and print a row of figures. They are how BENCHMARKS.md's
figures are made; nothing else runs them, and one (call_overhead.py) had stopped working
unnoticed: the fast call's ``record`` switch had become a method's name."""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = sys.executable
RUN = [PY, "-m", "collcomm", "run", "-n", "2"]

#: (script and arguments, how to launch it, a line its output must have)
CASES = {
    "call_overhead": ([PY, "benchmarks/call_overhead.py", "--rounds", "2", "--calls", "50"],
                      r"recorder on the fast call: [+-]?\d+ ns per call"),
    "front_calls one": ([PY, "benchmarks/front_calls.py", "--blocks", "1", "--iters", "20"],
                        r"barrier\s.*\d+\.\d+\s+\[\s*\d+\.\d+\]"),
    "front_calls": (RUN + ["--no-prefix", PY, "benchmarks/front_calls.py", "--blocks", "1",
                           "--iters", "20"], r"all_reduce\s.*\d+\.\d+\s+\[\s*\d+\.\d+\]"),
    "p2p_latency": (RUN + [PY, "benchmarks/p2p_latency.py", "--blocks", "1", "--iters", "20"],
                    r"engine isend/irecv\s+\d+\.\d+"),
    "allreduce_memory_limit": (RUN + [PY, "benchmarks/allreduce_memory_limit.py", "--mib", "1",
                                      "--reps", "1"], r"memory-traffic limit [\d.]+ ms; reached \d+%"),
    "bucketed_allreduce": (RUN + ["benchmarks/bucketed_allreduce.py", "--scale", "0.02", "--iters",
                                  "1", "--backward-ms", "1", "--bucket-mb", "1"],
                           r"bucketed-1\s+[\d.]+\s+-?[\d.]+\s+[\d.]+x"),
    "poll_loop": (RUN + ["--no-prefix", PY, "benchmarks/poll_loop.py", "cc", "8", "4096"],
                  r"cc\s+4096 B\s+Iallreduce\+Test loop\s+[\d.]+ us"),
    "p2p_poll_loop": (RUN + ["--no-prefix", PY, "benchmarks/p2p_poll_loop.py", "cc", "8", "4096"],
                      r"cc\s+4096 B\s+ping-pong, Irecv \+ Test loop\s+[\d.]+ us"),
    "mpi_halo_datatypes": (RUN + ["--no-prefix", PY, "benchmarks/mpi_halo_datatypes.py", "--sizes", "8",
                                  "--iters", "20", "--records", "100"],
                           r'"column 8 \(subarray both sides\)": [\d.]+'),
    "mpi_neighbor": (RUN + ["--no-prefix", PY, "benchmarks/mpi_neighbor.py", "--sizes", "8", "--iters", "20"],
                     r'"ring Neighbor_alltoall 8 B": [\d.]+'),
    "mpi_calls": (RUN + ["--no-prefix", PY, "benchmarks/mpi_calls.py", "--blocks", "1", "--iters", "20"],
                  r"Alltoallv\s+[\d.]+\s+\[[\d.]+\]"),
    "torch_calls": (RUN + ["--no-prefix", PY, "benchmarks/torch_calls.py", "--blocks", "1",
                           "--iters", "20", "--no-gloo"], r"\d+\.\d+\s+\[\s*\d+\.\d+\]"),
    "torch_p2p": (RUN + ["--no-prefix", PY, "benchmarks/torch_p2p.py", "--blocks", "1", "--iters",
                         "20"], r"batch_isend_irecv\s+[\d.]+"),
}
MPI_CASES = {
    "mpi_small_calls": (["benchmarks/mpi_small_calls.py", "--blocks", "1", "--iters", "20"],
                        r"Ibarrier\+Wait\s+[\d.]+"),
    "p2p_latency --mpi4py": (["benchmarks/p2p_latency.py", "--mpi4py", "--blocks", "1", "--iters",
                              "20"], r"\d+\.\d+\s+\[\s*\d+\.\d+\]"),
}


def _run(cmd: list[str], timeout: float = 90) -> subprocess.CompletedProcess[str]:
    """``cmd`` from the repository in its own session, killed whole past ``timeout``."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "COLLCOMM_STORE")}
    p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        pytest.fail(f"{' '.join(cmd)} ran past {timeout} s\n{out[-2000:]}\n{err[-2000:]}")
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


def _check(cmd: list[str], row: str) -> None:
    res = _run(cmd)
    assert res.returncode == 0, f"{' '.join(cmd)}: exit {res.returncode}\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}"
    assert re.search(row, res.stdout), f"no line like {row!r} in:\n{res.stdout[-3000:]}"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", sorted(CASES))
def test_script_runs(name: str) -> None:
    if name.startswith("torch"):
        pytest.importorskip("torch")
    cmd, row = CASES[name]
    _check(cmd, row)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", sorted(MPI_CASES))
def test_mpi_script_runs(name: str) -> None:
    pytest.importorskip("mpi4py")
    mpiexec = shutil.which("mpiexec")
    if mpiexec is None:
        pytest.skip("no mpiexec (pip install '.[bench]')")
    args, row = MPI_CASES[name]
    _check([mpiexec, "--allow-run-as-root", "--oversubscribe", "-n", "2", PY, *args], row)
