"""The ranks tests/harness.py forks from its zygote (tests/rank_zygote.py) are what fresh
ones would be where the tests can tell: each leads its own process group, has the job's
environment and nothing else (Python's and the C library's), writes into its own log,
draws its own numpy random numbers, and reports its exit code as Popen does (a signal:
negative); a job whose environment matters at start-up gets fresh interpreters instead.
"""
from __future__ import annotations

import os
import signal
import time

import pytest

from tests import harness
from tests.harness import run_ranks

pytestmark = pytest.mark.timeout(120)
needs_zygote = pytest.mark.skipif(os.environ.get("COLLCOMM_TEST_ZYGOTE") == "0",
                                  reason="COLLCOMM_TEST_ZYGOTE=0: every rank starts fresh")


def _what_a_rank_sees() -> dict:
    import ctypes
    import sys

    import numpy as np

    print(f"rank {os.environ['RANK']} speaking", flush=True)
    c_getenv = ctypes.CDLL(None).getenv
    c_getenv.restype = ctypes.c_char_p
    return {"pid": os.getpid(), "ppid": os.getppid(), "pgid": os.getpgid(0), "cwd": os.getcwd(),
            "marker": os.environ.get("ZYGOTE_TEST_MARKER"), "c_marker": c_getenv(b"ZYGOTE_TEST_MARKER"),
            "job": os.environ.get("ZYGOTE_TEST_JOB"), "draw": float(np.random.rand()), "argv1": sys.argv[1:],
            "sigint": repr(signal.getsignal(signal.SIGINT)), "sigchld": repr(signal.getsignal(signal.SIGCHLD)),
            "torch": "torch" in sys.modules}


def _exit_with(code: int) -> None:
    if int(os.environ["RANK"]) == 1:
        os._exit(code)
    time.sleep(0.2)


def _sleep(seconds: float, only: int | None = None) -> None:
    if only is None or int(os.environ["RANK"]) == only:
        time.sleep(seconds)


@needs_zygote
def test_a_forked_rank_is_what_a_fresh_one_would_be(monkeypatch: pytest.MonkeyPatch) -> None:
    # a zygote started while a variable was set: a job after it was unset must not see it
    harness.stop_zygotes()
    monkeypatch.setenv("ZYGOTE_TEST_MARKER", "the zygote's")
    run_ranks(_what_a_rank_sees, 1, init=False)
    monkeypatch.delenv("ZYGOTE_TEST_MARKER")
    res = run_ranks(_what_a_rank_sees, 3, env={"ZYGOTE_TEST_JOB": "this job"}, init=False)
    zygotes = harness.zygote_pids()
    for r in res:
        assert r["ppid"] in zygotes and r["pgid"] == r["pid"], r
        assert r["marker"] is None and r["c_marker"] is None and r["job"] == "this job", r
        assert r["cwd"] == harness.ROOT and len(r["argv1"]) == 1 and not r["torch"], r
        assert r["sigint"] == repr(signal.default_int_handler) and r["sigchld"] == repr(signal.SIG_DFL), r
    assert len({r["draw"] for r in res}) == 3, res           # numpy reseeded in each
    outcomes = run_ranks(_what_a_rank_sees, 2, init=False, expect_failure=True)
    for o in outcomes:
        assert o.value["ppid"] in zygotes and o.value["job"] is None, o.value
        assert o.exitcode == 0 and f"rank {o.rank} speaking" in o.output, (o.exitcode, o.output)


@needs_zygote
def test_torch_ranks_fork_from_their_own_zygote() -> None:
    pytest.importorskip("torch")
    res = run_ranks(_what_a_rank_sees, 2, init=False, preload=harness.TORCH)
    assert all(r["torch"] and r["ppid"] == harness.ZYGOTES[harness.TORCH].pid() for r in res), res
    assert res[0]["draw"] != res[1]["draw"], res


def test_exit_codes_and_kills_read_as_popen_gives_them() -> None:
    outcomes = run_ranks(_exit_with, 2, 7, init=False, expect_failure=True)
    assert [o.exitcode for o in outcomes] == [0, 7], outcomes
    outcomes = run_ranks(_sleep, 2, 30.0, 0, init=False, expect_failure=True, kill={0: 0.3}, timeout=20)
    assert outcomes[0].exitcode == -signal.SIGKILL and outcomes[0].killed_at is not None, outcomes[0]
    with pytest.raises(harness.RankFailure, match="did not finish within"):
        run_ranks(_sleep, 2, 30.0, init=False, timeout=1.0)


@needs_zygote
def test_start_up_variables_and_the_switch_start_fresh_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    (forked,) = run_ranks(_what_a_rank_sees, 1, init=False)
    (fresh,) = run_ranks(_what_a_rank_sees, 1, init=False, env={"PYTHONHASHSEED": "7"})
    (forked_again,) = run_ranks(_what_a_rank_sees, 1, init=False)   # (the zygote is not swayed)
    monkeypatch.setenv("COLLCOMM_TEST_ZYGOTE", "0")
    (off,) = run_ranks(_what_a_rank_sees, 1, init=False)
    for r in (forked, forked_again):
        assert r["ppid"] in harness.zygote_pids(), r
    for r in (fresh, off):       # a fresh interpreter, started by this process
        assert r["ppid"] == os.getpid() and r["pgid"] == r["pid"], r
