"""Flight recorder: who is missing on a timeout, dumps, SIGUSR1, trace analyze, stall warning."""
from __future__ import annotations

import json
import os
import signal
import time

import numpy as np
import pytest

from tests.harness import run_ranks


def _await_files(paths: list[str], limit: float) -> None:
    deadline = time.monotonic() + limit
    while not all(os.path.exists(p) for p in paths) and time.monotonic() < deadline:
        time.sleep(0.01)


def _skip_call(skipper: int, fr_dir: str) -> str:
    import collcomm as dist

    me, n = dist.get_rank(), dist.get_world_size()
    done = [os.path.join(fr_dir, f"done{r}") for r in range(n) if r != skipper]
    x = np.ones(4)
    dist.all_reduce(x)
    dist.barrier()                                   # LINE_BARRIER
    if me == skipper:                                # skips the next all_reduce, alive
        _await_files(done, 8.0)                      # until the others have their reports
        return "skipped"
    try:
        with dist.call_timeout(1.0):
            dist.all_reduce(x)                       # LINE_SKIPPED
    except dist.CommTimeoutError as exc:
        open(os.path.join(fr_dir, f"done{me}"), "w").close()
        _await_files(done, 5.0)   # rank 0 hosts the store here (as under torchrun): stay for the others
        return str(exc) + "\nREPORT " + json.dumps(getattr(exc, "report", {}))
    return "no error"


def _line(marker: str) -> int:
    with open(__file__) as f:
        for i, text in enumerate(f, 1):
            if f"# {marker}" in text and "def " not in text:
                return i
    raise AssertionError(marker)


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_skipped_call_names_missing_rank_and_its_last_call(tmp_path, transport):
    fr = str(tmp_path / "fr")
    out = run_ranks(_skip_call, 3, 2, fr, env={"COLLCOMM_FR_DIR": fr}, transport=transport,
                    timeout=60)
    barrier_at = f"test_recorder.py:{_line('LINE_BARRIER')}"
    for r in (0, 1):
        msg = out[r]
        assert "timed out" in msg
        assert "call #3 (all_reduce) of group WORLD: ranks [2] never entered it" in msg, msg
        assert "rank 2 never entered #3; its last call on this group: barrier #2 at" in msg, msg
        assert barrier_at in msg and "(completed)" in msg, msg
        report = json.loads(msg.split("REPORT ", 1)[1])
        assert report["missing"] == [2] and report["unknown"] == []
        assert sorted(report["arrived"]) == [0, 1]
        assert "flight recorder dump:" in msg
    assert out[2] == "skipped"
    # the dumps load, and trace analyze finds the first divergent call
    for r in (0, 1):
        with open(os.path.join(fr, f"rank{r}.json")) as f:
            d = json.load(f)
        assert d["rank"] == r and d["world_size"] == 3
        last = d["entries"][-1]
        assert (last["op"], last["seq"], last["state"]) == ("all_reduce", 3, "failed")
        assert last["where"].endswith(f"test_recorder.py:{_line('LINE_SKIPPED')}")
        assert last["call"] == "all_reduce(float64[4], op=SUM)"
        assert d["entries"][-2]["state"] == "completed"
    from collcomm.tools.trace import analyze, format_analysis

    a = analyze(fr)
    assert a["missing_dumps"] == [2]
    (g,) = [g for g in a["groups"] if g["name"] == "WORLD"]
    assert g["first_divergent"] == 3
    assert g["last_entered"] == {0: 3, 1: 3, 2: 2}
    assert g["behind"] == [2]
    text = format_analysis(a)
    assert "first divergent call: #3" in text
    assert f"rank 2: never entered; last: #2 barrier at " in text and barrier_at in text, text


def _dump_on_sigusr1(fr_dir: str) -> str:
    import collcomm as dist

    x = np.ones(2)
    dist.all_reduce(x)
    dist.broadcast(x, src=0)
    os.kill(os.getpid(), signal.SIGUSR1)
    for _ in range(100):                     # the handler runs in the main thread, soon
        path = os.path.join(fr_dir, f"rank{dist.get_rank()}.json")
        if os.path.exists(path):
            break
        time.sleep(0.01)
    with open(path) as f:
        d = json.load(f)
    return json.dumps([d["reason"], [(e["op"], e["seq"], e["state"]) for e in d["entries"]]])


def test_sigusr1_dumps_and_chains_faulthandler(tmp_path):
    fr = str(tmp_path / "fr")
    outcomes = run_ranks(_dump_on_sigusr1, 2, fr, env={"COLLCOMM_FR_DIR": fr},
                         expect_failure=True)
    for o in outcomes:
        assert o.ok, o.error + o.traceback
        reason, entries = json.loads(o.value)
        assert reason == "SIGUSR1"
        assert [e[0] for e in entries[-2:]] == ["all_reduce", "broadcast"]
        assert all(e[2] == "completed" for e in entries[-2:])
        # tests/rank_main.py registered faulthandler on SIGUSR1 first: it still dumps stacks
        assert "most recent call first" in o.output, o.output


def _p2p_recorded() -> str:
    import collcomm as dist
    from collcomm.core import recorder

    x = np.zeros(3)
    if dist.get_rank() == 0:
        dist.send(x + 1, dst=1)
    else:
        dist.recv(x, src=0)
    snap = recorder.recorder().snapshot("test")
    return json.dumps([(e["op"], e.get("peer"), e["state"]) for e in snap["entries"]])


def test_point_to_point_calls_recorded():
    out = run_ranks(_p2p_recorded, 2)
    assert ["isend", 1, "completed"] in json.loads(out[0])
    assert ["irecv", 0, "completed"] in json.loads(out[1])


def _stall(stuck: int) -> str:
    import io
    import logging

    import collcomm as dist

    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    logging.getLogger("collcomm").addHandler(handler)
    x = np.ones(2)
    dist.all_reduce(x)
    if dist.get_rank() == stuck:
        time.sleep(2.5)
    dist.all_reduce(x)
    time.sleep(0.3)
    logging.getLogger("collcomm").removeHandler(handler)
    return buf.getvalue()


def test_stall_warning_names_the_late_rank():
    out = run_ranks(_stall, 3, 1, env={"COLLCOMM_STALL_WARN": "1"}, timeout=60)
    for r in (0, 2):
        assert "has waited" in out[r] and "COLLCOMM_STALL_WARN" in out[r], out[r]
        assert "ranks [1] never entered it" in out[r], out[r]
        assert "its last call on this group: all_reduce #1" in out[r], out[r]
    assert "has waited" not in out[1]


def _fr_off() -> str:
    import collcomm as dist
    from collcomm.core import runtime

    dist.all_reduce(np.ones(2))
    return repr(runtime._world.observer)


def test_fr_size_zero_turns_it_off():
    assert run_ranks(_fr_off, 2, env={"COLLCOMM_FR_SIZE": "0"}) == ["None", "None"]


def _monitored(absent: list[int], where: str) -> str:
    import collcomm as dist

    me, n = dist.get_rank(), dist.get_world_size()
    done = [os.path.join(where, f"done{r}") for r in range(n) if r not in absent]
    dist.barrier()
    if me in absent:
        _await_files(done, 6.0)
        return "absent"
    try:
        dist.monitored_barrier(timeout=1.0, wait_all_ranks=True)
    except dist.CommTimeoutError as exc:
        open(os.path.join(where, f"done{me}"), "w").close()
        _await_files(done, 5.0)
        return str(exc)
    return "no error"


def test_monitored_barrier_names_every_absent_rank(tmp_path):
    out = run_ranks(_monitored, 4, [1, 3], str(tmp_path), transport="tcp", timeout=60)
    for r in (0, 2):
        assert "ranks [1, 3] never entered it" in out[r], out[r]


HANG = """
import time, numpy as np, collcomm as dist
dist.init_process_group(timeout=2)
x = np.ones(8)
for step in range(3):
    if dist.get_rank() == 2 and step == 1:
        time.sleep(20)
    dist.all_reduce(x)
    dist.barrier()
dist.destroy_process_group()
"""


def test_launcher_prints_the_merged_analysis_once_and_merges_traces(tmp_path):
    import subprocess
    import sys

    script = tmp_path / "hang.py"
    script.write_text(HANG)
    env = dict(os.environ, COLLCOMM_FR_DIR=str(tmp_path / "fr"))
    run = subprocess.run([sys.executable, "-m", "collcomm", "run", "-n", "3", "--trace",
                          str(tmp_path / "trace"), str(script)], env=env, capture_output=True,
                         text=True, timeout=90)
    assert run.returncode != 0
    err = run.stderr
    assert err.count("first divergent call: #3") == 1, err
    assert "rank 2: never entered; last: #2 barrier at " in err and "hang.py:9" in err, err
    assert "ranks [2] never entered it" in err + run.stdout
    # the ranks that left cleanly before the failure wrote their traces; merged into one file
    assert f"trace of every rank in {tmp_path / 'trace' / 'trace.json'}" in err, err
