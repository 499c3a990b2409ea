"""Fault behaviour at the API level, on both transports.

* a rank SIGKILLed mid-collective → every other rank raises PeerLostError naming it and
  the collective, within seconds (through the harness and through ``collcomm run``);
* a rank that skips a collective → CommTimeoutError naming it on the others;
* timeouts per call (``call_timeout``), per group (``new_group(timeout=)``) and per job
  (``init_process_group(timeout=)`` / ``COLLCOMM_TIMEOUT``) bound a collective that
  cannot complete;
* bad input on one rank only → InvalidArgumentError there before any traffic, a short
  timeout (not a hang) on the others;
* destroy_process_group then init_process_group again in the same process.

Clocks: ``time.monotonic()`` is CLOCK_MONOTONIC, shared by every process of the host, so
a rank can report *when* it raised and the test compares that with when it killed.
"""
from __future__ import annotations

import datetime
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
from collcomm.errors import CollcommError, CommTimeoutError, InvalidArgumentError, PeerLostError
from tests.harness import ROOT, run_ranks, shm_files

TRANSPORTS = ["shm", "tcp"]


# -- rank bodies (module level: the ranks import them) ------------------------------------
def hold(meet: str | None, count: int, limit: float) -> None:
    """Say this rank is done (a file in the folder ``meet``), then stay until ``count``
    ranks said so, ``limit`` seconds at most: no rank leaves (which its peers could see as a
    lost peer) before every rank it waits for has its own outcome. Polls, so it costs no
    more than the slowest rank, however loaded the machine."""
    if meet is None:
        return
    open(os.path.join(meet, f"done-{dist.get_rank()}"), "w").close()
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if sum(name.startswith("done-") for name in os.listdir(meet)) >= count:
            return
        time.sleep(0.01)


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


def skip_one_collective(skipper: int, timeout: float, later: str, meet: str | None = None):
    """Every rank but ``skipper`` calls all_reduce under call_timeout(timeout).

    ``later`` says what the skipper does afterwards: "sleep" (outlives the others' timeout:
    stays until they all timed out, ``meet``, then returns) or "late" (enters the
    all_reduce after the others gave up, with its own timeout: it must fail, not hang)."""
    rank, n = dist.get_rank(), dist.get_world_size()
    dist.barrier()
    if rank == skipper:
        if later == "sleep":
            hold(meet, n, timeout + 1.5)
            return "skipped"
        time.sleep(timeout + 0.3)
        start = time.monotonic()
        a = np.ones(1000, dtype=np.float32)
        try:
            with dist.call_timeout(2.0):
                dist.all_reduce(a)
        except CollcommError as exc:
            return "skipper", type(exc).__name__, time.monotonic() - start
        return "skipper", sorted(set(a.tolist())), time.monotonic() - start
    a = np.ones(1000, dtype=np.float32)
    start = time.monotonic()
    try:
        with dist.call_timeout(timeout):
            dist.all_reduce(a)
    except CommTimeoutError as exc:
        took = time.monotonic() - start
        if later == "sleep":
            hold(meet, n, 3.0)  # until all timed out, the skipper still there: no lost peer
        else:
            time.sleep(0.5)
        return took, exc.peer, str(exc)
    return "no error"


def stuck_collective(how: str, seconds: float, meet: str, sleeper: int = 1):
    """Rank ``sleeper`` stays out of a broadcast until the others, bounded by ``how``'s
    timeout, all gave up (``seconds + 2`` at most; see :func:`hold`)."""
    rank, n = dist.get_rank(), dist.get_world_size()
    a = np.zeros(10, dtype=np.int64)
    if rank == sleeper:
        hold(meet, n, seconds + 2.0)
        return "slept"
    start = time.monotonic()
    try:
        if how == "call":
            with dist.call_timeout(seconds):
                dist.broadcast(a, src=sleeper)
        elif how == "group":
            g = dist.new_group(list(range(dist.get_world_size())), timeout=datetime.timedelta(seconds=seconds))
            dist.broadcast(a, src=sleeper, group=g)
        else:  # the job's timeout (init_process_group(timeout=) or COLLCOMM_TIMEOUT)
            dist.broadcast(a, src=sleeper)
    except CommTimeoutError as exc:
        took = time.monotonic() - start
        hold(meet, n, seconds + 2.0)  # until every rank is done: nobody sees another leave
        return took, exc.peer, str(exc)
    return "no error"


def init_with_timeout(seconds: float, meet: str):
    dist.init_process_group(timeout=datetime.timedelta(seconds=seconds))
    return stuck_collective("job", seconds, meet)


def group_timeout_needs_new_group(seconds: float, meet: str):
    """new_group must be called by every rank (it is collective in torch): do it first."""
    rank, n = dist.get_rank(), dist.get_world_size()
    g = dist.new_group(list(range(n)), timeout=seconds)
    a = np.zeros(10, dtype=np.int64)
    if rank == 1:
        hold(meet, n, seconds + 2.0)
        return "slept"
    start = time.monotonic()
    try:
        dist.broadcast(a, src=1, group=g)
    except CommTimeoutError as exc:
        took = time.monotonic() - start
        hold(meet, n, seconds + 2.0)
        # the world (default timeout) is unaffected by the group's timeout
        return took, exc.peer, str(exc), dist.get_world_size()
    return "no error"


def bad_output_on_one_rank(bad: int, timeout: float, meet: str):
    """Rank ``bad`` passes an output of the wrong size to all_gather_into_tensor."""
    rank, n = dist.get_rank(), dist.get_world_size()
    inp = np.full(4, rank, dtype=np.int32)
    out = np.zeros(4 * n + (1 if rank == bad else 0), dtype=np.int32)
    start = time.monotonic()
    try:
        with dist.call_timeout(timeout):
            dist.all_gather_into_tensor(out, inp)
    except InvalidArgumentError as exc:
        took = time.monotonic() - start
        hold(meet, n, timeout + 1.5)  # stay alive: the others must time out, not lose a peer
        return "invalid", took, str(exc), bool((out == 0).all())
    except CommTimeoutError as exc:
        took = time.monotonic() - start
        hold(meet, n, timeout + 1.5)
        return "timeout", took, exc.peer, str(exc)
    return "no error"


def reinit(rounds: int, skew: str):
    """destroy_process_group, then init_process_group again, ``rounds`` times.

    ``skew``: "host_first" — rank 0 (which hosts the rendezvous store on MASTER_PORT)
    leaves first and the others 0.5 s later; "host_last" — rank 0 leaves 1 s after the
    others (they re-join while the previous job's store is still up)."""
    out = []
    for i in range(rounds):
        rank, n = dist.get_rank(), dist.get_world_size()
        a = np.full(3, rank + i, dtype=np.int64)
        dist.all_reduce(a)
        out.append(int(a[0]))
        g = dist.new_group([0, 1])
        b = np.array([rank + 1.0])
        if g is not dist.GroupMember.NON_GROUP_MEMBER:
            dist.all_reduce(b, group=g)
        out.append(float(b[0]))
        dist.barrier()
        if (rank == 0) == (skew == "host_last"):
            time.sleep(0.5 if skew == "host_first" else 1.0)
        dist.destroy_process_group()
        assert not dist.is_initialized()
        try:
            dist.all_reduce(a)
        except InvalidArgumentError:
            pass
        else:
            raise AssertionError("all_reduce after destroy did not fail")
        with dist.call_timeout(10):
            dist.init_process_group(timeout=15)
        assert dist.get_world_size() == n and dist.get_rank() == rank
    return out


def mismatched_collectives():
    """Rank 0 calls all_reduce while rank 1 calls barrier: neither may 'succeed'."""
    a = np.ones(1000)
    try:
        with dist.call_timeout(2):
            if dist.get_rank() == 0:
                dist.all_reduce(a)
            else:
                dist.barrier()
    except CollcommError as exc:
        time.sleep(0.5)
        return type(exc).__name__
    time.sleep(0.5)
    return "completed"


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


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("n", [2, 3])
def test_skipped_collective_times_out_naming_the_skipper(transport, n, tmp_path):
    skipper = n - 1
    outcomes = run_ranks(skip_one_collective, n, skipper, 1.0, "sleep", str(tmp_path),
                         transport=transport, timeout=45, expect_failure=True)
    assert all(o.ok for o in outcomes), [(o.error_type, o.error, o.output) for o in outcomes]
    assert outcomes[skipper].value == "skipped"
    named = []
    for o in outcomes[:skipper]:
        took, peer, msg = o.value
        assert 0.9 < took < 4.0, took
        assert "timed out" in msg and "all_reduce" in msg, msg
        assert f"rank {peer}" in msg
        named.append(peer)
    # at least one rank waits on the skipper directly and names it
    assert skipper in named, named


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_skipper_entering_a_later_collective_does_not_hang(transport):
    outcomes = run_ranks(skip_one_collective, 3, 2, 1.0, "late", transport=transport,
                         timeout=45, expect_failure=True)
    assert all(o.ok for o in outcomes), [(o.error_type, o.error, o.output) for o in outcomes]
    for o in outcomes[:2]:
        took, peer, msg = o.value
        assert took < 4.0 and "timed out" in msg
    who, err, took = outcomes[2].value
    assert who == "skipper" and took < 3.0, outcomes[2].value
    # the others gave up and left: its all_reduce fails, or completes from the messages they
    # had already sent before giving up -- then with the right sum, never with garbage
    assert err in ("CommTimeoutError", "PeerLostError", [3.0]), err


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_call_timeout_bounds_a_collective(transport, tmp_path):
    outcomes = run_ranks(stuck_collective, 3, "call", 0.5, str(tmp_path), transport=transport,
                         timeout=45, expect_failure=True)
    assert all(o.ok for o in outcomes), [(o.error_type, o.error, o.output) for o in outcomes]
    for o in (outcomes[0], outcomes[2]):
        took, peer, msg = o.value
        assert 0.45 < took < 2.5, took
        assert "broadcast" in msg and "timed out after 0.5 s" in msg, msg


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_group_timeout(transport, tmp_path):
    outcomes = run_ranks(group_timeout_needs_new_group, 3, 0.7, str(tmp_path),
                         transport=transport, timeout=45, expect_failure=True)
    assert all(o.ok for o in outcomes), [(o.error_type, o.error, o.output) for o in outcomes]
    for o in (outcomes[0], outcomes[2]):
        took, peer, msg, _ = o.value
        assert 0.65 < took < 2.5, took
        assert "broadcast" in msg and "timed out after 0.7 s" in msg and "group2" not in msg, msg


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_job_timeout_from_init_argument(transport, tmp_path):
    outcomes = run_ranks(init_with_timeout, 3, 3.0, str(tmp_path), transport=transport,
                         timeout=45, init=False, expect_failure=True)
    assert all(o.ok for o in outcomes), [(o.error_type, o.error, o.output) for o in outcomes]
    for o in (outcomes[0], outcomes[2]):
        took, peer, msg = o.value
        assert 2.9 < took < 5.5, took
        assert "broadcast" in msg and "timed out after 3 s" in msg, msg


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_job_timeout_from_env(transport, tmp_path):
    outcomes = run_ranks(stuck_collective, 3, "job", 3.0, str(tmp_path), transport=transport,
                         timeout=45, env={"COLLCOMM_TIMEOUT": "3"}, expect_failure=True)
    assert all(o.ok for o in outcomes), [(o.error_type, o.error, o.output) for o in outcomes]
    for o in (outcomes[0], outcomes[2]):
        took, peer, msg = o.value
        assert 2.9 < took < 5.5, took
        assert "broadcast" in msg and "timed out after 3 s" in msg, msg


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("n", [2, 3])
def test_bad_input_on_one_rank(transport, n, tmp_path):
    bad = 1
    outcomes = run_ranks(bad_output_on_one_rank, n, bad, 1.0, str(tmp_path), transport=transport,
                         timeout=45, expect_failure=True)
    assert all(o.ok for o in outcomes), [(o.error_type, o.error, o.output) for o in outcomes]
    kind, took, msg, untouched = outcomes[bad].value
    assert kind == "invalid" and took < 0.5 and untouched
    assert "all_gather_into_tensor" in msg and "output_tensor" in msg and str(4 * n) in msg, msg
    for o in outcomes:
        if o.rank == bad:
            continue
        kind, took, peer, msg = o.value
        assert kind == "timeout" and 0.9 < took < 4.0, o.value
        assert "all_gather_into_tensor" in msg and "timed out" in msg, msg


@pytest.mark.timeout(90)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_destroy_then_init_again(transport):
    res = run_ranks(reinit, 3, 3, "host_first", transport=transport, timeout=60)
    for i in range(3):
        assert [r[2 * i] for r in res] == [3 + 3 * i] * 3
        assert [r[2 * i + 1] for r in res] == [3.0, 3.0, 3.0]  # rank 2 (not in the group) keeps 3.0


@pytest.mark.timeout(90)
def test_destroy_then_init_again_store_host_last():
    run_ranks(reinit, 3, 1, "host_last", transport="shm", timeout=30)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_mismatched_collectives_are_detected(transport):
    res = run_ranks(mismatched_collectives, 2, transport=transport, timeout=30)
    assert res[0] != "completed" and res[1] != "completed", res


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
