"""``collcomm run`` takes what users type (issue 9, item 6): ``python prog.py``, executables,
``--no-python``, torchrun's and mpiexec's spellings, a MASTER_PORT left free for the
program, ``--version``, help texts that name only what ships, the world-of-one warning."""
from __future__ import annotations

import json
import os
import re
import socket
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import collcomm
from tests.test_launcher import ROOT, _env, run, write_prog

_SHOW = """
    import json, os, sys
    keys = ["RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "COLLCOMM_STORE", "NODE_RANK"]
    print("ENV " + json.dumps({"argv": sys.argv[1:], "exe": sys.executable,
                               **{k: os.environ.get(k) for k in keys}}))
"""


def _envs(stdout: str) -> list[dict]:
    return sorted((json.loads(line.split("ENV ", 1)[1]) for line in stdout.splitlines()
                   if "ENV " in line), key=lambda e: e["RANK"])


@pytest.mark.timeout(90)
@pytest.mark.parametrize("head", [["python"], ["python3"], [sys.executable], ["python", "-u"]])
def test_leading_python_is_the_interpreter(tmp_path, head):
    prog = write_prog(tmp_path, _SHOW)
    res = run(["-n", "2", *head, prog, "a", "--b"])
    assert res.returncode == 0, res.stderr
    envs = _envs(res.stdout)
    assert [e["RANK"] for e in envs] == ["0", "1"]
    for e in envs:
        assert e["argv"] == ["a", "--b"]
        assert os.path.realpath(e["exe"]) == os.path.realpath(sys.executable)


@pytest.mark.timeout(60)
def test_python_dash_m(tmp_path):
    (tmp_path / "ccmod_show.py").write_text(textwrap.dedent(_SHOW))
    res = run(["-n", "2", "python", "-m", "ccmod_show", "x"], extra_path=str(tmp_path))
    assert res.returncode == 0, res.stderr
    assert [e["argv"] for e in _envs(res.stdout)] == [["x"], ["x"]]


@pytest.mark.timeout(60)
def test_executable_and_no_python(tmp_path):
    script = tmp_path / "hello.sh"
    script.write_text("#!/bin/sh\necho \"hello $RANK of $WORLD_SIZE: $*\"\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    res = subprocess.run([sys.executable, "-m", "collcomm", "run", "-n", "2", "./hello.sh", "a"],
                         cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    assert "[0] hello 0 of 2: a" in res.stdout and "[1] hello 1 of 2: a" in res.stdout
    # a command on PATH, and --no-python
    res = run(["-n", "2", "echo", "on-path"])
    assert res.returncode == 0 and res.stdout.count("on-path") == 2, res.stderr
    res = run(["-n", "2", "--no-python", "sh", "-c", "echo nopy-$RANK"])
    assert res.returncode == 0, res.stderr
    assert "[0] nopy-0" in res.stdout and "[1] nopy-1" in res.stdout


@pytest.mark.timeout(60)
def test_missing_program_is_a_usage_error(tmp_path):
    for prog in ("no_such_script.py", "no-such-command-xyz"):
        res = run(["-n", "2", str(tmp_path / prog) if prog.endswith(".py") else prog])
        assert res.returncode == 2, res.stderr
        assert "collcomm run: error:" in res.stderr and prog in res.stderr


@pytest.mark.timeout(90)
@pytest.mark.parametrize("spelling", [
    ["--nproc_per_node=2"], ["--nproc-per-node", "2"], ["-np", "2"],
    ["--nproc_per_node", "2", "--nnodes=1", "--node_rank=0", "--master_addr=127.0.0.1",
     "--master_port={port}"],
])
def test_torchrun_and_mpiexec_spellings(tmp_path, spelling):
    # the store listens on MASTER_PORT + 1: take a port whose next one is free too, and try
    # again with another if something took that one meanwhile (the ephemeral ports other
    # tests' connections use come from the same range; CI failed on it once)
    for _ in range(5):
        port = _free_pair()
        args = [a.replace("{port}", str(port)) for a in spelling]
        res = run([*args, write_prog(tmp_path, _SHOW)])
        if not (res.returncode == 2 and "Address already in use" in res.stderr):
            break
    assert res.returncode == 0, res.stderr
    envs = _envs(res.stdout)
    assert [e["RANK"] for e in envs] == ["0", "1"] and envs[0]["WORLD_SIZE"] == "2"
    if "--master_port={port}" in spelling:
        assert all(e["MASTER_PORT"] == str(port) for e in envs)
        assert all(e["COLLCOMM_STORE"] == f"127.0.0.1:{port + 1}" for e in envs)


def _free_pair() -> int:
    """A port P of this host such that P and P + 1 could both be bound just now."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", port + 1))
            return port
        except OSError:
            continue


@pytest.mark.timeout(90)
def test_master_port_is_free_for_the_program(tmp_path):
    """Rank 0 listens on MASTER_ADDR:MASTER_PORT (as torch's env:// store does) while the
    job also runs collcomm collectives through its own store."""
    prog = write_prog(tmp_path, """
        import os, socket, time
        import numpy as np
        import collcomm as dist
        addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
        if os.environ["RANK"] == "0":
            srv = socket.create_server((addr, port))   # EADDRINUSE if collcomm sat there
            conns = [srv.accept()[0] for _ in range(int(os.environ["WORLD_SIZE"]) - 1)]
        else:
            for _ in range(200):
                try:
                    c = socket.create_connection((addr, port)); break
                except OSError:
                    time.sleep(0.05)
        dist.init_process_group()
        x = np.ones(4)
        dist.all_reduce(x)
        print("SUM", x[0])
        dist.destroy_process_group()
    """)
    res = run(["-n", "3", prog])
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("SUM 3.0") == 3


@pytest.mark.timeout(180)
def test_torch_env_store_under_collcomm_run(tmp_path):
    pytest.importorskip("torch")
    prog = write_prog(tmp_path, """
        import numpy as np, torch, torch.distributed as tdist
        import collcomm as dist
        tdist.init_process_group("gloo", init_method="env://")   # torch's store on MASTER_PORT
        dist.init_process_group()                                # collcomm's on COLLCOMM_STORE
        t = torch.ones(3); tdist.all_reduce(t)
        x = np.ones(3); dist.all_reduce(x)
        print("TORCH", t[0].item(), "COLLCOMM", x[0])
        dist.destroy_process_group(); tdist.destroy_process_group()
    """)
    res = run(["-n", "2", "python", prog], timeout=150)
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("TORCH 2.0 COLLCOMM 2.0") == 2


@pytest.mark.timeout(30)
def test_version():
    res = subprocess.run([sys.executable, "-m", "collcomm", "--version"], env=_env(),
                         capture_output=True, text=True, timeout=20)
    assert res.returncode == 0 and res.stdout.strip() == f"collcomm {collcomm.__version__}"


# documents (X.md) and source paths (dir/x.py) a help text sends the reader to; names of
# outputs (DIR/trace.json) and placeholders (prog.py) are not references
_FILE_REF = re.compile(r"\b([\w.-]+\.md|[a-z_]+(?:/[\w.-]+)+\.py)\b")


@pytest.mark.timeout(60)
def _commands() -> list[list[str]]:
    from collcomm.tools.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return [[]] + [[name] for name in sub.choices]  # type: ignore[union-attr]


@pytest.mark.parametrize("command", _commands(), ids=lambda c: " ".join(c) or "collcomm")
def test_help_names_only_what_ships(command):
    res = subprocess.run([sys.executable, "-m", "collcomm", *command, "--help"], env=_env(),
                         capture_output=True, text=True, timeout=20)
    assert res.returncode == 0
    shipped = {p.name for p in Path(ROOT).rglob("*") if ".git" not in p.parts}
    for ref in _FILE_REF.findall(res.stdout):
        exists = os.path.exists(os.path.join(ROOT, ref)) if "/" in ref else ref in shipped
        assert exists, \
            f"'collcomm {' '.join(command)} --help' names {ref}, which is not in the repository"


@pytest.mark.timeout(60)
def test_world_of_one_warns_once_under_a_launcher():
    code = ("from collcomm.core import runtime\n"
            "runtime.world_of_one('reduce_tensor'); runtime.world_of_one('barrier')\n")
    env = _env()
    res = subprocess.run([sys.executable, "-c", code], env={**env, "WORLD_SIZE": "4"},
                         capture_output=True, text=True, timeout=20)
    assert res.returncode == 0, res.stderr
    assert res.stderr.count("RuntimeWarning") == 1
    assert "reduce_tensor" in res.stderr and "world of one" in res.stderr
    assert "WORLD_SIZE=4" in res.stderr
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=20)
    assert res.returncode == 0 and "Warning" not in res.stderr


@pytest.mark.timeout(60)
def test_rank_0_reads_the_launchers_stdin(tmp_path):
    # as under mpiexec: `echo 42 | collcomm run -n 2 prog.py` (mpi4py's demo/compute-pi
    # reads n at rank 0 so); the other ranks read an empty stream
    prog = write_prog(tmp_path, """
        import os, sys
        print(f"rank {os.environ['RANK']} read {sys.stdin.readline()!r}", flush=True)
    """)
    res = subprocess.run([sys.executable, "-m", "collcomm", "run", "-n", "2", "--no-prefix", prog],
                         input="42\n", env=_env(), capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert sorted(res.stdout.splitlines()) == ["rank 0 read '42\\n'", "rank 1 read ''"]
