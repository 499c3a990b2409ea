"""Hangs and failures are named (issue 9, item 3, launcher side): the summary names the rank
that caused the failure from what the ranks say, not from polling order; a stopped rank is
named at once; a clean exit is "left"; one trimmed traceback, printed once."""
from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from collcomm.tools.rootcause import RankState, root_cause, settled
from tests.test_launcher import NO_SETTLE, ROOT, _env, run, write_prog

_spec = importlib.util.spec_from_file_location("fault_matrix",
                                               os.path.join(ROOT, "tools", "fault_matrix.py"))
fault_matrix = importlib.util.module_from_spec(_spec)
assert _spec.loader is not None
_spec.loader.exec_module(fault_matrix)


# --------------------------------------------------------------------------- the verdict

def _reaction(rank: int, peer: int, t: float, etype: str = "PeerLostError") -> RankState:
    return RankState(rank, 100 + rank, returncode=1, exit_t=t + 0.01,
                     report={"t": t, "type": etype, "peers": [peer], "reaction": True})


def test_verdict_genuine_failure_wins_over_reactions_and_order():
    # a survivor's reaction happens to be seen (and even timed) before the victim's death
    states = [_reaction(0, 2, 1.00), _reaction(1, 0, 1.01),
              RankState(2, 102, returncode=-9, exit_t=1.02), _reaction(3, 2, 1.0)]
    v = root_cause(states)
    assert v is not None and v.rank == 2 and v.code == 137 and "SIGKILL" in v.how


def test_verdict_launcher_signals_are_not_causes():
    states = [_reaction(0, 3, 5.0, "CommTimeoutError"),
              RankState(1, 101, returncode=-15, exit_t=6.0, signalled=True),
              _reaction(2, 3, 5.0, "CommTimeoutError"),
              RankState(3, 103, returncode=-15, exit_t=6.0, signalled=True)]
    v = root_cause(states)
    assert v is not None and v.rank == 3 and "never made the call" in v.how and v.code == 1


def test_verdict_abort_ended_ranks_are_not_causes():
    # every rank raised; rank 1's uncaught-exception hook (collcomm.MPI's Abort) sent rank 0
    # SIGTERM before rank 0 got to its own report: rank 0's death is seen first
    states = [RankState(0, 100, returncode=-15, exit_t=1.00),
              RankState(1, 101, returncode=1, exit_t=1.02, report={"t": 1.01, "type": "RuntimeError"}),
              RankState(2, 102, returncode=1, exit_t=1.03, report={"t": 1.015, "type": "RuntimeError"})]
    v = root_cause(states)
    assert v is not None and v.rank == 1 and v.code == 1 and "RuntimeError" in v.how
    # every rank raised, and the first to do so was ended by another's abort while exiting
    states[0] = RankState(0, 100, returncode=-15, exit_t=1.00, report={"t": 0.99, "type": "RuntimeError"})
    v = root_cause(states)
    assert v is not None and v.rank == 0 and v.code == 1 and v.how == "exit code 1 (RuntimeError)"
    # ... but a rank killed by SIGTERM from outside, the others' errors reactions to it, is
    alone = [RankState(0, 100, returncode=-15, exit_t=1.00), _reaction(1, 0, 1.1), _reaction(2, 0, 1.1)]
    v = root_cause(alone)
    assert v is not None and v.rank == 0 and v.code == 143


@pytest.mark.timeout(90)
def test_every_rank_raising_under_mpi_exits_1(tmp_path):
    prog = write_prog(tmp_path, """
        from collcomm import MPI
        MPI.COMM_WORLD.Barrier()
        raise RuntimeError("the same error on every rank")
    """)
    for _ in range(3):               # (which rank's hook ends the others first varies)
        res = run(["-n", "3", "--grace", "1", prog], env=NO_SETTLE)
        assert res.returncode == 1, res.stderr[-2000:]
        first = [ln for ln in res.stderr.splitlines() if "failed first" in ln]
        assert first and "RuntimeError" in first[0] and "SIGTERM" not in first[0], res.stderr[-2000:]


def test_verdict_stopped_rank():
    states = [_reaction(0, 1, 5.0, "CommTimeoutError"), _reaction(2, 0, 5.1),
              RankState(1, 101, returncode=-15, exit_t=6.0, signalled=True, stopped_since=0.5)]
    v = root_cause(states)
    assert v is not None and v.rank == 1 and v.kind == "stopped"


def test_verdict_follows_chains_and_breaks_cycles():
    # ring: 0 waits on 3, 3 waits on 2, 1 waits on 0; 2 is stuck (still running)
    states = [_reaction(0, 3, 5.0, "CommTimeoutError"), _reaction(1, 0, 5.0, "CommTimeoutError"),
              _reaction(3, 2, 5.0, "CommTimeoutError"), RankState(2, 102)]
    v = root_cause(states)
    assert v is not None and v.rank == 2
    # mismatches name each other: the majority wins
    states = [_reaction(0, 2, 1.0, "MismatchError"), _reaction(1, 2, 1.0, "MismatchError"),
              _reaction(2, 0, 1.0, "MismatchError"), _reaction(3, 2, 1.0, "MismatchError")]
    v = root_cause(states)
    assert v is not None and v.rank == 2 and "differ" in v.how


def test_verdict_mismatch_seen_by_one_side_only():
    """Over TCP only the skipping rank may see the mismatch (naming the rank it disagrees
    with); the others only see it leave. The call each was in tells who is odd."""
    def rep(rank, etype, peer, call):
        return RankState(rank, 100 + rank, returncode=1, exit_t=1.0, report={
            "t": 1.0, "type": etype, "peers": [peer], "reaction": True,
            "message": f"{call} on group 'WORLD' (rank {rank} of 4, global rank {rank}): ..."})
    states = [rep(0, "PeerLostError", 1, "all_reduce"), rep(1, "MismatchError", 0, "barrier"),
              rep(2, "PeerLostError", 0, "all_reduce"), rep(3, "PeerLostError", 1, "all_reduce")]
    v = root_cause(states)
    assert v is not None and v.rank == 1 and "barrier" in v.how


def test_settled_only_when_the_running_ranks_are_the_cause():
    # recursive doubling, rank 0 stuck: 2 gave up on 0, 3 on 1 -- but 1 is a survivor still
    # waiting on 0 (it has not reported yet): killing it now would lose its report
    stuck, survivor = RankState(0, 100), RankState(1, 101)
    states = [stuck, survivor, _reaction(2, 0, 5.0, "CommTimeoutError"),
              _reaction(3, 1, 5.0, "CommTimeoutError")]
    assert not settled(states)
    states[1] = _reaction(1, 0, 5.1, "CommTimeoutError")   # now it reported: 0 it is
    assert settled(states)
    # a stopped rank needs nobody's word; survivors not yet reporting are waited for
    assert settled([RankState(0, 100, stopped_since=1.0), _reaction(1, 2, 5.0)])
    assert not settled([RankState(0, 100, returncode=-9, exit_t=1.0), RankState(1, 101)])


def test_verdict_left_and_remote():
    states = [_reaction(0, 1, 2.0), RankState(1, 101, returncode=0, exit_t=1.0),
              _reaction(2, 1, 2.0)]
    v = root_cause(states)
    assert v is not None and v.rank == 1 and v.how.startswith("left (exit code 0)")
    states = [_reaction(0, 5, 2.0), _reaction(1, 4, 2.0), _reaction(2, 5, 2.1)]
    v = root_cause(states)
    assert v is not None and v.rank == 5 and not v.local and "another node" in v.how
    assert root_cause([RankState(0, 1, returncode=0, exit_t=1.0)]) is None


# --------------------------------------------------------------------------- real jobs

@pytest.mark.timeout(300)
@pytest.mark.parametrize("transport", ["shm", "tcp"])
@pytest.mark.parametrize("cell", fault_matrix.CELLS)
def test_fault_cell_names_the_victim(cell, transport, tmp_path):
    victim = 1 + fault_matrix.CELLS.index(cell) % 3
    t = fault_matrix.run_trial(cell, transport, victim, n=4, at=10, trial_timeout=60,
                               env_extra={"COLLCOMM_TIMEOUT": "3",
                                          "COLLCOMM_HEARTBEAT_TIMEOUT": "2",
                                          # the dumps: not in /tmp/collcomm-fr-<job>
                                          "COLLCOMM_FR_DIR": str(tmp_path / "fr")})
    detail = "\n".join(t["stderr_tail"])
    assert not t["hung"] and t["faulted"], detail
    assert t["named"] == victim, (t["named_how"], detail)
    assert t["survivors_raised"], t
    assert t["exit_code"] == {"sigkill": 137, "sigterm": 143}.get(cell, 1)
    assert t["orphans"] == 0 and t["shm_left"] == 0
    bound = 0.2 + (3 + 1.5 if cell in ("sigstop", "stuck") else 0.0)
    assert t["detect_s"] is not None and t["detect_s"] < bound + 1.5, t
    # the launcher: detection + SETTLE_S + grace at most, with slack for 2 busy cores
    assert t["launcher_exit_s"] < t["detect_s"] + 1.0 + 1.0 + 2.0, t


@pytest.mark.timeout(90)
def test_traceback_trimmed_and_printed_once(tmp_path):
    prog = write_prog(tmp_path, """
        import os, time
        import numpy as np
        import collcomm as dist
        dist.init_process_group()
        def step(x):
            if dist.get_rank() == 1:
                raise ValueError("bad batch 7")
            dist.all_reduce(x)
        step(np.ones(4))
    """)
    res = run(["-n", "3", "--grace", "1", prog])
    assert res.returncode == 1
    err = res.stderr
    summary = err.split("collcomm run: rank 1 (pid", 1)[1]
    assert "failed first: exit code 1 (ValueError)" in summary
    assert 'in step\n' in summary and 'raise ValueError("bad batch 7")' in summary
    assert "ValueError: bad batch 7" in summary
    # ranks 0 and 2 lost rank 1: one line each in their stream, no traceback of theirs
    assert re.search(r"ranks 0, 2 raised PeerLostError naming rank 1", summary)
    assert err.count("Traceback (most recent call last)") == 1
    assert "collcomm/core/" not in err and "collcomm/transport/" not in err
    for r in (0, 2):
        mine = [ln for ln in err.splitlines() if ln.startswith(f"[{r}] ")]
        assert mine and mine[0].startswith(f"[{r}] collcomm.errors.PeerLostError: ")
        assert not any(ln.startswith((f"[{r}]   File ", f"[{r}] Traceback")) for ln in mine)
    # COLLCOMM_DEBUG=1: the full trace, collcomm's frames included
    env = _env()
    env["COLLCOMM_DEBUG"] = "1"
    env["COLLCOMM_FR_DIR"] = str(tmp_path / "fr")   # the dumps: not in /tmp/collcomm-fr-<job>
    res = subprocess.run([sys.executable, "-m", "collcomm", "run", "-n", "3", "--grace", "1", prog],
                         env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 1 and "collcomm/core/" in res.stderr


@pytest.mark.timeout(90)
def test_clean_exit_of_a_peer_is_left(tmp_path):
    prog = write_prog(tmp_path, """
        import numpy as np
        import collcomm as dist
        dist.init_process_group()
        x = np.ones(4)
        dist.all_reduce(x)
        if dist.get_rank() != 2:
            dist.all_reduce(x)      # rank 2 is done: it exits 0 while the others wait
    """)
    res = run(["-n", "3", "--grace", "1", prog])
    assert res.returncode == 1, res.stderr
    assert re.search(r"collcomm run: rank 2 \(pid \d+\) failed first: left \(exit code 0\)",
                     res.stderr), res.stderr
    assert "died" not in res.stderr.split("collcomm run: rank 2 (pid", 1)[1].splitlines()[0]


def test_named_stopped_rank_that_exits_between_polls_is_said_resumed(capsys):
    """A resumed rank can finish before the next poll sees it running; its exit still says
    "resumed" (CI once missed the line). One killed while stopped (SIGKILL) did not resume."""
    import types
    from collcomm.tools.rank_procs import Output, Rank, check_stopped
    for code, said in ((0, True), (1, True), (-signal.SIGKILL, False)):
        r = Rank(rank=1, local_rank=1, proc=types.SimpleNamespace(pid=4242))  # type: ignore[arg-type]
        r.stop_seen = r.stopped_since = 1.0
        r.stop_named = True
        r.returncode = code
        check_stopped(r, 2.0, Output())
        err = capsys.readouterr().err
        assert ("rank 1 (pid 4242) resumed" in err) is said, (code, err)
        assert not r.stop_named and r.stop_seen is None
        check_stopped(r, 3.0, Output())  # said once
        assert capsys.readouterr().err == ""


@pytest.mark.timeout(90)
def test_stopped_rank_named_at_once_and_resumed(tmp_path):
    prog = write_prog(tmp_path, """
        import os, signal, time
        import numpy as np
        import collcomm as dist
        dist.init_process_group()
        if dist.get_rank() == 1:
            print("STOPPING", os.getpid(), flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)
        x = np.ones(4)
        dist.all_reduce(x)
        print("SUM", x[0], flush=True)
    """)
    env = _env()
    env["COLLCOMM_TIMEOUT"] = "60"
    env["COLLCOMM_HEARTBEAT_TIMEOUT"] = "60"
    proc = subprocess.Popen([sys.executable, "-m", "collcomm", "run", "-n", "3", prog], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        assert proc.stdout is not None and proc.stderr is not None
        line = proc.stdout.readline()
        pid = int(re.search(r"STOPPING (\d+)", line).group(1))  # type: ignore[union-attr]
        t0 = time.monotonic()
        named = proc.stderr.readline()
        assert re.match(rf"collcomm run: rank 1 \(pid {pid}\) is stopped", named), named
        assert time.monotonic() - t0 < 3.0
        os.kill(pid, signal.SIGCONT)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert "rank 1 (pid" in err and "resumed" in err
        assert out.count("SUM 3.0") == 3
    finally:
        if proc.poll() is None:  # the launcher stops (and SIGCONTs) its ranks on SIGTERM
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
