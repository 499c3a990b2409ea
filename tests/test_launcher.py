"""``collcomm run`` end to end: env contract, output prefixing, failures, signals, cleanup."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from collcomm.tools.launcher import THREAD_VARS, LaunchConfig, rank_env, threads_per_rank

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _env(extra_path: str | None = None) -> dict[str, str]:
    env = dict(os.environ)
    for name in ("COLLCOMM_STORE", "COLLCOMM_TOKEN", "COLLCOMM_JOB_ID", "RANK", "WORLD_SIZE"):
        env.pop(name, None)
    paths = [ROOT] + ([extra_path] if extra_path else []) + [env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    return env


def write_prog(tmp_path: Path, body: str, name: str = "prog.py") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


def run(args: list[str], timeout: float = 60, extra_path: str | None = None,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``collcomm run ARGS``; its ranks' flight-recorder dumps (of a failed job) go to a
    folder removed afterwards (else /tmp/collcomm-fr-<job> stays, for the user to read)."""
    with tempfile.TemporaryDirectory(prefix="collcomm-fr-test-") as fr:
        return subprocess.run([sys.executable, "-m", "collcomm", "run", *args],
                              env={**_env(extra_path), "COLLCOMM_FR_DIR": fr, **(env or {})},
                              capture_output=True, text=True, timeout=timeout)


#: Ranks that never join collcomm leave no report: waiting for them to say why they fail
#: (the launcher's settle, 5 s by default) only delays the summary.
NO_SETTLE = {"COLLCOMM_RUN_SETTLE": "0"}

#: Program lines: this rank says it started (after its PID lines), then waits until every
#: rank of the job (3) did, so that a rank failing next never beats a slow start.
_ALL_STARTED = """
        import pathlib
        _folder = pathlib.Path(r"{folder}")
        (_folder / ("started-" + os.environ["RANK"])).touch()
        _deadline = time.monotonic() + 40
        while len(list(_folder.glob("started-*"))) < 3 and time.monotonic() < _deadline:
            time.sleep(0.01)
"""


def alive(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def pids_in(text: str) -> list[int]:
    return [int(p) for p in re.findall(r"PID (\d+)", text)]


@pytest.mark.timeout(60)
def test_env_contract_and_store(tmp_path):
    prog = write_prog(tmp_path, """
        import json, os
        from collcomm.rendezvous import store_from_url
        from collcomm.rendezvous.auth import job_token
        names = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                 "MASTER_ADDR", "MASTER_PORT", "COLLCOMM_STORE", "COLLCOMM_TOKEN", "COLLCOMM_JOB_ID",
                 "OMP_NUM_THREADS"]
        env = {n: os.environ.get(n) for n in names}
        store = store_from_url("env://", int(env["RANK"]), 3, 20, job_token())
        store.add("joined", 1)
        store.set(f"r{env['RANK']}", env["RANK"])
        store.wait(["r0", "r1", "r2"])
        env["joined"] = int(store.get("joined"))
        store.close()
        print("ENV " + json.dumps(env))
    """)
    # no thread-pool size set (empty counts as unset): each rank gets its share of the cores
    res = run(["-n", "3", prog], env={v: "" for v in THREAD_VARS})
    assert res.returncode == 0, res.stderr
    envs = [json.loads(line.split("ENV ", 1)[1]) for line in res.stdout.splitlines()]
    share = str(max(1, len(os.sched_getaffinity(0)) // 3))
    assert sorted(e["RANK"] for e in envs) == ["0", "1", "2"]
    for e in envs:
        assert e["LOCAL_RANK"] == e["RANK"] and e["WORLD_SIZE"] == "3"
        assert e["LOCAL_WORLD_SIZE"] == "3" and e["GROUP_RANK"] == "0"
        # collcomm's store has its own port: MASTER_PORT stays free for the program (torch)
        host, port = e["COLLCOMM_STORE"].rsplit(":", 1)
        assert host == e["MASTER_ADDR"] and port != e["MASTER_PORT"]
        assert re.fullmatch(r"[0-9a-f]{32}", e["COLLCOMM_TOKEN"])
        assert re.fullmatch(r"[0-9a-f]{12}", e["COLLCOMM_JOB_ID"])
        assert e["joined"] == 3
        assert e["OMP_NUM_THREADS"] == share
    for name in ("COLLCOMM_TOKEN", "COLLCOMM_JOB_ID", "MASTER_PORT"):
        assert len({e[name] for e in envs}) == 1


def test_thread_pool_share_only_where_the_user_set_none():
    """OMP_NUM_THREADS = the cores // local ranks (at least 1), for several local ranks
    only, and never over a size the user gave in any of the variables."""
    cpus = len(os.sched_getaffinity(0))
    for nproc in (2, 3, cpus, 4 * cpus):
        env = rank_env(LaunchConfig(nproc=nproc, program="p.py"), 0, 1, "t", "j", base={})
        assert env["OMP_NUM_THREADS"] == str(max(1, cpus // nproc)) == str(threads_per_rank(nproc))
    assert "OMP_NUM_THREADS" not in rank_env(LaunchConfig(nproc=1, program="p.py"), 0, 1, "t",
                                             "j", base={})
    for var in THREAD_VARS:
        env = rank_env(LaunchConfig(nproc=2, program="p.py"), 1, 1, "t", "j", base={var: "5"})
        assert env[var] == "5" and env.get("OMP_NUM_THREADS", "5") == "5"


_CHATTY = """
    import os, sys
    r = os.environ["RANK"]
    for i in range(200):
        print(r * 3000)
        print("e" + r, file=sys.stderr)
    sys.stdout.write("partial" + r)
"""


@pytest.mark.timeout(60)
def test_output_prefixed_whole_lines(tmp_path):
    res = run(["-n", "2", write_prog(tmp_path, _CHATTY)])
    assert res.returncode == 0, res.stderr
    for line in res.stdout.splitlines():
        m = re.fullmatch(r"\[(\d)\] (\d{3000}|partial\d)", line)
        assert m, line[:80]
        assert set(m.group(2).replace("partial", "")) == {m.group(1)}  # never mixed
    assert res.stdout.count("[0] partial0") == 1 and res.stdout.count("[1] partial1") == 1
    assert res.stderr.count("[1] e1\n") == 200 and res.stderr.count("[0] e0\n") == 200


@pytest.mark.timeout(60)
def test_no_prefix(tmp_path):
    res = run(["-n", "2", "--no-prefix", "--", write_prog(tmp_path, _CHATTY)])
    assert res.returncode == 0, res.stderr
    assert "[" not in res.stdout and "[" not in res.stderr
    assert res.stdout.count("0" * 3000 + "\n") == 200 and res.stderr.count("e1\n") == 200
    # an unterminated last line is flushed as its own line: never merged with another rank's
    lines = res.stdout.splitlines()
    assert "partial0" in lines and "partial1" in lines
    assert all(line in ("partial0", "partial1") or len(set(line)) == 1 for line in lines)


@pytest.mark.timeout(60)
def test_module_form_and_arguments(tmp_path):
    (tmp_path / "ccmod_hello.py").write_text(
        "import os, sys\nprint('hello', os.environ['RANK'], sys.argv[1:])\n")
    res = run(["-n", "2", "-m", "ccmod_hello", "--flag", "x"], extra_path=str(tmp_path))
    assert res.returncode == 0, res.stderr
    assert "[0] hello 0 ['--flag', 'x']" in res.stdout
    assert "[1] hello 1 ['--flag', 'x']" in res.stdout


@pytest.mark.timeout(60)
def test_exit_code_propagates_and_others_stopped(tmp_path):
    prog = write_prog(tmp_path, """
        import os, sys, time
        print("PID", os.getpid(), flush=True)
    """ + _ALL_STARTED.format(folder=tmp_path) + """
        if os.environ["RANK"] == "1":
            sys.exit(3)
        time.sleep(60)
    """)
    t0 = time.monotonic()
    res = run(["-n", "3", "--grace", "1", prog], env=NO_SETTLE)
    assert res.returncode == 3
    assert time.monotonic() - t0 < 20
    assert re.search(r"collcomm run: rank 1 \(pid \d+\) failed first: exit code 3", res.stderr)
    assert not alive(pids_in(res.stdout))


@pytest.mark.timeout(60)
def test_exception_summary_shows_traceback_tail(tmp_path):
    prog = write_prog(tmp_path, """
        import os, time
        def deep():
            raise ValueError("boom-xyz")
        if os.environ["RANK"] == "2":
            deep()
        time.sleep(60)
    """)
    res = run(["-n", "3", "--grace", "1", prog], env=NO_SETTLE)
    assert res.returncode == 1
    summary = res.stderr.split("collcomm run: rank 2", 1)[1]
    assert "failed first: exit code 1" in summary
    assert "Traceback" in summary and "ValueError: boom-xyz" in summary and "deep()" in summary


@pytest.mark.timeout(60)
def test_rank_sigkilled_stops_everything(tmp_path):
    prog = write_prog(tmp_path, """
        import os, signal, subprocess, sys, time
        # a grandchild in the rank's process group must not survive either
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        print("PID", os.getpid(), "PID", child.pid, flush=True)
    """ + _ALL_STARTED.format(folder=tmp_path) + """
        if os.environ["RANK"] == "1":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)
    """)
    t0 = time.monotonic()
    res = run(["-n", "3", "--grace", "1", prog], env=NO_SETTLE)
    assert res.returncode == 137
    assert time.monotonic() - t0 < 20
    assert re.search(r"rank 1 \(pid \d+\) failed first: killed by signal SIGKILL", res.stderr)
    pids = pids_in(res.stdout)
    assert len(pids) == 6 and not alive(pids)


@pytest.mark.timeout(90)
def test_settle_from_the_environment(tmp_path, monkeypatch):
    """COLLCOMM_RUN_SETTLE: how long the others get, after a rank failed, to fail on their
    own. Rank 1 exits 3; ranks 0 and 2 would exit 4 and 5 on their own ``argv[1]`` s later
    (and say when SIGTERM came instead)."""
    prog = write_prog(tmp_path, """
        import os, signal, sys, time
        def stopped(signum, frame):
            print("TERM", time.monotonic(), flush=True)
            os._exit(143)
        signal.signal(signal.SIGTERM, stopped)
        print("PID", os.getpid(), flush=True)
    """ + _ALL_STARTED.format(folder=tmp_path) + """
        if os.environ["RANK"] == "1":
            print("EXIT", time.monotonic(), flush=True)
            sys.exit(3)
        time.sleep(float(sys.argv[1]))
        sys.exit(4 if os.environ["RANK"] == "0" else 5)
    """)
    # a long settle: both get to fail on their own and the summary says so
    res = run(["-n", "3", "--grace", "1", prog, "0.5"], env={"COLLCOMM_RUN_SETTLE": "40"})
    assert res.returncode == 3, res.stderr
    assert "collcomm run: rank 0 failed too (exit code 4)" in res.stderr, res.stderr
    assert "collcomm run: rank 2 failed too (exit code 5)" in res.stderr, res.stderr
    assert "TERM" not in res.stdout
    # none: they are stopped at once (the default would give them 5 s)
    for f in tmp_path.glob("started-*"):
        f.unlink()
    res = run(["-n", "3", "--grace", "1", prog, "30"], env=NO_SETTLE)
    assert res.returncode == 3, res.stderr
    assert "collcomm run: ranks 0, 2 were stopped by the launcher" in res.stderr, res.stderr
    exited = float(re.findall(r"\[1\] EXIT (\S+)", res.stdout)[0])
    terms = [float(t) for t in re.findall(r"\[[02]\] TERM (\S+)", res.stdout)]
    assert len(terms) == 2 and max(terms) - exited < 4.0, res.stdout
    assert not alive(pids_in(res.stdout))
    # anything but seconds >= 0 is a usage error, before any rank starts
    from collcomm.errors import InvalidArgumentError
    from collcomm.tools.launcher import LaunchConfig, settle_s
    cfg = LaunchConfig(nproc=1, program=prog)
    for good, seconds in (("", 5.0), ("0", 0.0), (" 2.5 ", 2.5)):
        monkeypatch.setenv("COLLCOMM_RUN_SETTLE", good)
        assert settle_s(cfg) == seconds
    for bad in ("-1", "soon", "inf", "nan"):
        monkeypatch.setenv("COLLCOMM_RUN_SETTLE", bad)
        with pytest.raises(InvalidArgumentError, match="COLLCOMM_RUN_SETTLE"):
            settle_s(cfg)
    res = run(["-n", "3", prog, "0"], env={"COLLCOMM_RUN_SETTLE": "soon"})
    assert res.returncode == 2 and "COLLCOMM_RUN_SETTLE='soon'" in res.stderr, res.stderr
    assert "PID" not in res.stdout


@pytest.mark.timeout(60)
def test_sigint_to_launcher_stops_all(tmp_path):
    prog = write_prog(tmp_path, """
        import os, signal, time
        if os.environ["RANK"] == "1":   # a stubborn rank: needs the SIGKILL escalation
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("PID", os.getpid(), flush=True)
        time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-m", "collcomm", "run", "-n", "2", "--grace",
                             "1", prog], env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(2)]
        pids = pids_in("".join(lines))
        assert len(pids) == 2
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
        assert proc.returncode == 130
        assert "SIGINT" in err
        assert not alive(pids)
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.timeout(60)
def test_shm_segments_removed(tmp_path):
    prog = write_prog(tmp_path, """
        import os, signal
        path = f"/dev/shm/collcomm-{os.environ['COLLCOMM_JOB_ID']}-test-{os.environ['RANK']}"
        open(path, "wb").write(b"x")
        print("SHM", path, flush=True)
        if os.environ["RANK"] == "1":
            os.kill(os.getpid(), signal.SIGKILL)
    """)
    for args in (["-n", "2", prog], ["-n", "1", prog]):
        res = run(args)
        paths = re.findall(r"SHM (\S+)", res.stdout)
        assert paths and not any(os.path.exists(p) for p in paths)
    assert res.returncode == 0


@pytest.mark.timeout(30)
def test_usage_errors(tmp_path, monkeypatch):
    assert run(["-n", "2"]).returncode == 2
    res = subprocess.run([sys.executable, "-m", "collcomm", "run", "-n", "2", "--nnodes", "2",
                          "--master-port", "29999", write_prog(tmp_path, "pass\n")],
                         env=_env(), capture_output=True, text=True, timeout=20)
    assert res.returncode == 2 and "COLLCOMM_TOKEN" in res.stderr
