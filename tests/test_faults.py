"""Fault behaviour at the API level, on both transports: a lost peer.

* a rank SIGKILLed mid-collective → every other rank raises PeerLostError naming it and
  the collective, within seconds (through the harness and through ``collcomm run``);
* a rank SIGSTOPped in shared memory → the others give it up (PeerLostError) within the
  heartbeat bound.

Timeouts, bad input and mismatched calls: tests/test_faults_timeouts.py; destroy and init
again: tests/test_faults_reinit.py.

Clocks: ``time.monotonic()`` is CLOCK_MONOTONIC, shared by every process of the host, so
a rank can report *when* it raised and the test compares that with when it killed.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import psutil
import pytest

import collcomm as dist
from collcomm.errors import PeerLostError
from tests.faults_common import TRANSPORTS, hold
from tests.harness import ROOT, run_ranks, shm_files


# -- rank bodies (module level: the ranks import them) ------------------------------------
def allreduce_until_lost(nbytes: int, hold_s: float = 0.0, limit: float = 30.0,
                         meet: str | None = None):
    """Loop all_reduce of ``nbytes`` until a peer is lost; report when and what was raised.

    ``hold_s``, ``meet``: after raising, stay until every survivor raised, ``hold_s`` at most
    (see :func:`hold`), so that no other rank learns of the loss from *this* rank leaving
    (each survivor must see the victim's death by itself)."""
    rank, n = dist.get_rank(), dist.get_world_size()
    a = np.empty(nbytes // 8, dtype=np.float64)
    loops = 0
    start = time.monotonic()
    try:
        while time.monotonic() - start < limit:
            a.fill(rank + 1.0)
            dist.all_reduce(a)
            assert a[0] == a[-1] == n * (n + 1) / 2
            loops += 1
    except PeerLostError as exc:
        when = time.monotonic()
        if meet:
            hold(meet, n - 1, hold_s)  # n - 1: every rank but the victim
        else:
            time.sleep(hold_s)
        return when, exc.peer, str(exc), loops, start
    return "no error", loops


def broadcast_until_lost(src: int, hold_s: float, limit: float = 30.0, meet: str | None = None):
    """Loop a small broadcast from ``src`` until a peer is lost (see allreduce_until_lost)."""
    n = dist.get_world_size()
    a = np.zeros(1024, dtype=np.float64)
    loops = 0
    start = time.monotonic()
    try:
        while time.monotonic() - start < limit:
            dist.broadcast(a, src=src)
            loops += 1
    except PeerLostError as exc:
        when = time.monotonic()
        if meet:
            hold(meet, n - 1, hold_s)  # n - 1: every rank but the victim
        else:
            time.sleep(hold_s)
        return when, exc.peer, str(exc), loops, start
    return "no error", loops


# -- the tests -------------------------------------------------------------------------------
def _check_lost(outcomes, victim, killed_at, strict, collective="all_reduce"):
    assert outcomes[victim].exitcode == -signal.SIGKILL
    for o in outcomes:
        if o.rank == victim:
            continue
        assert o.ok, f"rank {o.rank}: {o.error_type}: {o.error}\n{o.output}"
        assert o.value[0] != "no error", f"rank {o.rank} never noticed the kill: {o.value}"
        when, peer, msg, loops, started = o.value
        assert started < killed_at, "the rank had not reached the loop when the victim was killed"
        assert loops > 0
        assert when - killed_at < 5.0, f"rank {o.rank} raised {when - killed_at:.2f} s after the kill: {msg}"
        assert collective in msg and f"rank {peer}" in msg, msg
        if strict:
            assert peer == victim, (peer, msg)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("n,victim", [(3, 1), (4, 3)])
def test_sigkill_mid_all_reduce(transport, n, victim):
    """Survivors leave as soon as they raise: every survivor raises PeerLostError within 5 s
    (naming the victim, or, further along the ring, a survivor that left because of it)."""
    t_kill = 1.0
    outcomes = run_ranks(allreduce_until_lost, n, 4 << 20, 0.0, transport=transport, timeout=60,
                         expect_failure=True, kill={victim: t_kill})
    _check_lost(outcomes, victim, outcomes[victim].killed_at, strict=False)
    # the ranks that wait on the victim directly name it
    assert victim in [o.value[1] for o in outcomes if o.rank != victim]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_sigkill_every_survivor_names_the_victim(transport, tmp_path):
    """Survivors stay in the job after raising until every survivor raised (5.5 s at most:
    each must raise within 5 s of the kill anyway): each must see the victim's death itself."""
    t_kill = 1.0
    outcomes = run_ranks(allreduce_until_lost, 4, 4 << 20, 5.5, 30.0, str(tmp_path),
                         transport=transport, timeout=60, expect_failure=True, kill={2: t_kill})
    _check_lost(outcomes, 2, outcomes[2].killed_at, strict=True)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_sigkill_broadcast_root_indirect_child(transport, tmp_path):
    """Broadcast from rank 2 over 4 ranks (binomial tree: 2 → 0 → 1): rank 1 waits only on
    rank 0, which raises at once and stays (until rank 1 raised too, 5.5 s at most); rank 1
    must still raise within 5 s."""
    t_kill = 1.0
    outcomes = run_ranks(broadcast_until_lost, 4, 2, 5.5, 30.0, str(tmp_path),
                         transport=transport, timeout=60, expect_failure=True, kill={2: t_kill})
    _check_lost(outcomes, 2, outcomes[2].killed_at, strict=True, collective="broadcast")


_LAUNCHED = """
    import os, signal, sys, time
    import numpy as np
    import collcomm as dist
    dist.init_process_group()
    rank, n = dist.get_rank(), dist.get_world_size()
    print("PID", os.getpid(), "JOB", os.environ["COLLCOMM_JOB_ID"], flush=True)
    a = np.empty((4 << 20) // 8)
    for i in range(1000000):
        if rank == 1 and i == 20:
            os.kill(os.getpid(), signal.SIGKILL)
        a.fill(rank)
        try:
            dist.all_reduce(a)
        except dist.PeerLostError as exc:
            print("LOST", exc.peer, str(exc).replace("\\n", " "), flush=True)
            time.sleep(30)   # the launcher must stop us
            sys.exit(5)
"""


@pytest.mark.timeout(90)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_sigkill_through_launcher(tmp_path, transport):
    prog = tmp_path / "prog.py"
    prog.write_text(textwrap.dedent(_LAUNCHED))
    env = dict(os.environ, PYTHONPATH=ROOT, COLLCOMM_TRANSPORT=transport,
               COLLCOMM_FR_DIR=str(tmp_path / "fr"))   # the dumps: not in /tmp/collcomm-fr-<job>
    for name in ("COLLCOMM_STORE", "COLLCOMM_TOKEN", "COLLCOMM_JOB_ID", "RANK", "WORLD_SIZE",
                 "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        env.pop(name, None)
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "collcomm", "run", "-n", "3", "--grace", "1", str(prog)],
                         env=env, capture_output=True, text=True, timeout=60)
    took = time.monotonic() - t0
    assert res.returncode == 128 + signal.SIGKILL, (res.returncode, res.stdout[-2000:], res.stderr[-3000:])
    assert re.search(r"rank 1 \(pid \d+\) failed first: killed by signal SIGKILL", res.stderr), res.stderr
    assert took < 30
    pids = [int(p) for p in re.findall(r"PID (\d+)", res.stdout)]
    assert len(pids) == 3
    for pid in pids:
        try:
            assert psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, f"rank pid {pid} survived"
        except psutil.NoSuchProcess:
            pass
    # survivors that got to report it named the lost rank and the collective
    for line in res.stdout.splitlines():
        if " LOST " in line:
            assert line.split(" LOST ", 1)[1].startswith("1 ") and "rank 1" in line and "all_reduce" in line
    jobs = set(re.findall(r"JOB ([0-9a-f]+)", res.stdout))
    assert len(jobs) == 1
    assert not shm_files(jobs.pop())


def stops_itself_at(step: int) -> tuple[str, int | None, float]:
    """Rank 1 SIGSTOPs itself in a loop of all_reduces; the others must give up on it
    within the heartbeat bound (shared memory has no heartbeat: the wait watches the
    late rank's process state)."""
    import collcomm as dist

    rank = dist.get_rank()
    x = np.ones(4)
    for i in range(10 ** 6):
        if rank == 1 and i == step:
            os.kill(os.getpid(), signal.SIGSTOP)
        t0 = time.monotonic()
        try:
            dist.all_reduce(x)
        except dist.PeerLostError as exc:
            return "PeerLostError", exc.peer, time.monotonic() - t0
    return "no error", None, 0.0


@pytest.mark.timeout(60)
def test_stopped_rank_is_given_up_on_in_shared_memory():
    # the stopped rank never exits by itself: killed once the others have left (they must
    # give up on it within 8 s of the job joining, else it is killed then)
    outcomes = run_ranks(stops_itself_at, 3, 20, transport="shm", expect_failure=True, timeout=40,
                         env={"COLLCOMM_HEARTBEAT_TIMEOUT": "2", "COLLCOMM_TIMEOUT": "60"},
                         kill={1: 8.0})
    for o in outcomes:
        if o.rank == 1:
            continue
        assert o.ok, o.error + o.output
        kind, peer, took = o.value
        assert (kind, peer) == ("PeerLostError", 1), o.value
        assert 2 <= took < 8, took


def test_an_arena_gone_at_setup_names_the_member_that_died() -> None:
    """A member dies while a group's arena is set up: the group's first rank's sync finds
    the death, raises PeerLostError and unlinks the arena, so a rank that comes to open it
    later finds it gone; it too raises PeerLostError naming the dead rank (it raised a
    ClosedError guessing at /dev/shm or a timeout: the random fault campaign of session 28).
    With every member alive the ClosedError and its causes stay."""
    import subprocess
    import sys

    from collcomm.errors import ClosedError
    from collcomm.transport.arena_setup import _arena_gone

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()                                   # a pid nobody has any more
    err = _arena_gone(1, "/dev/shm/x", [os.getpid(), os.getpid(), gone.pid], [4, 5, 6])
    assert isinstance(err, PeerLostError) and err.peer == 6, err
    assert "rank 6" in str(err) and "died" in str(err) and "rank 5 found the arena" in str(err), err
    err = _arena_gone(1, "/dev/shm/x", [os.getpid()] * 3, [4, 5, 6])
    assert type(err) is ClosedError and "Rank 4 (the group's first)" in str(err), err
    # the first rank gone says nothing: it gave the arena up (no room, a timeout) and left
    err = _arena_gone(1, "/dev/shm/x", [gone.pid, os.getpid(), os.getpid()], [4, 5, 6])
    assert type(err) is ClosedError, err


def test_an_arena_whose_creator_died_is_unlinked_by_the_others() -> None:
    """The group's first rank died after creating the arena, before it could unlink it
    (its sync unlinks once everyone mapped it): a rank that hears of the death while
    setting up unlinks the name, so nothing stays in /dev/shm without a launcher to sweep
    it (a random kill left one behind, session 28)."""
    import subprocess
    import sys

    from collcomm.transport import arena_setup
    from collcomm.transport.shm_segments import SHM_DIR

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    name = f"collcomm-test{os.getpid()}-arena-1"
    open(os.path.join(SHM_DIR, name), "wb").close()

    def creator_died() -> None:
        raise PeerLostError("rank 0 died (the test)", peer=0)

    path = os.path.join(SHM_DIR, name)
    try:
        with pytest.raises(PeerLostError):
            arena_setup.build(2, 1, name, [gone.pid, os.getpid()], [0, 1], 1.0, False, lambda: None, creator_died)
        assert not os.path.exists(path)
    finally:
        if os.path.exists(path):      # (failing, the test leaves nothing behind either)
            os.unlink(path)


@pytest.mark.timeout(120)
def test_a_rank_killed_in_random_overlapping_traffic() -> None:
    """tests/random_faults.py: random messages and collectives overlapping (subgroups, an
    asynchronous rank) until rank 1 is SIGKILLed: every survivor raises PeerLostError
    within 5 s of the kill, having seen no wrong result before it. (The campaign of
    session 28 runs such jobs by seed: n = 2-5, the three front ends, TCP.)"""
    from tests import random_faults

    outs = run_ranks(random_faults.until_lost, 3, 27000, 6, timeout=90, expect_failure=True,
                     kill={1: 2.0}, env={"COLLCOMM_TIMEOUT": "60", "RANDOM_GROUPS": "1",
                                         "RANDOM_ASYNC_RANKS": "2"})
    killed_at = outs[1].killed_at
    assert outs[1].exitcode == -signal.SIGKILL and killed_at is not None
    for o in (outs[0], outs[2]):
        assert o.ok and o.value[0] != "no error", (o.rank, o.error_type, o.error, o.value)
        when, cls, msg, rounds, wrong = o.value
        assert cls == "PeerLostError" and wrong == [] and when - killed_at < 5.0, (o.rank, o.value)


def _waitany_on(dead: bool) -> dict:
    from collcomm import MPI
    comm = MPI.COMM_WORLD
    comm.Barrier()
    if comm.Get_rank() == 1:
        if dead:
            time.sleep(0.3)
            os._exit(3)
        time.sleep(6.0)                 # alive, silent: rank 0's polls must time out
        return {}
    out = {}
    for call in ("Waitany", "Waitsome", "Waitany-any"):
        reqs = [comm.Irecv(np.zeros(4), 1, 5), comm.Irecv(np.zeros(4), 1, 6)]
        if call == "Waitany-any":      # (every peer lost: nobody can answer it either)
            reqs = [comm.Irecv(np.zeros(4), MPI.ANY_SOURCE, 7)]
        t0 = time.monotonic()
        try:
            getattr(MPI.Request, call.split("-")[0])(reqs)
            out[call] = "returned"
        except MPI.Exception as exc:
            out[call] = (type(exc).__name__, round(time.monotonic() - t0, 2), str(exc)[:200])
    return out


@pytest.mark.timeout(90)
@pytest.mark.parametrize("dead", [True, False], ids=["peer-died", "peer-silent"])
def test_waitany_and_waitsome_check_peers_and_time_out(dead: bool) -> None:
    """collcomm.MPI's Waitany / Waitsome poll their requests with tests, which check no
    peer: a rank whose requests wait on a rank that died polled forever (a random kill,
    session 28). Now the peers are checked every 100 ms (PeerLostError naming the dead
    rank) and the world's timeout bounds the poll (CommTimeoutError)."""
    outs = run_ranks(_waitany_on, 2, dead, timeout=60, expect_failure=True,
                     env={"COLLCOMM_TIMEOUT": "1.5"})
    got = outs[0].value
    assert outs[0].ok, (outs[0].error_type, outs[0].error)
    for call in ("Waitany", "Waitsome", "Waitany-any"):
        kind, seconds, text = got[call]
        if dead:
            assert kind == "PeerLostError" and "rank 1" in text and seconds < 3.0, got
        elif call != "Waitany-any":
            assert kind == "CommTimeoutError" and call in text and 1.4 < seconds < 4.0, got
