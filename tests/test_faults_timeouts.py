"""Fault behaviour at the API level, on both transports: calls that cannot complete.

* a rank that skips a collective → CommTimeoutError naming it on the others (and, entering
  a later one, it fails rather than hangs);
* timeouts per call (``call_timeout``), per group (``new_group(timeout=)``) and per job
  (``init_process_group(timeout=)`` / ``COLLCOMM_TIMEOUT``) bound a collective that
  cannot complete;
* bad input on one rank only → InvalidArgumentError there before any traffic, a short
  timeout (not a hang) on the others;
* ranks calling different collectives → none of them "succeeds".
"""
from __future__ import annotations

import datetime
import time

import numpy as np
import pytest

import collcomm as dist
from collcomm.errors import CollcommError, CommTimeoutError, InvalidArgumentError
from tests.faults_common import TRANSPORTS, hold
from tests.harness import run_ranks


# -- rank bodies (module level: the ranks import them) ------------------------------------
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


def _timed_out_in_broadcast(outcomes: list, low: float, high: float, seconds: str,
                            absent: str | None = None, width: int = 3) -> None:
    """Every rank returned; ranks 0 and 2 (the ones left waiting) gave up in the broadcast
    after ``seconds`` (the first of their ``width`` values, in (low, high)), naming it (the
    third)."""
    assert all(o.ok for o in outcomes), [(o.error_type, o.error, o.output) for o in outcomes]
    for o in (outcomes[0], outcomes[2]):
        assert len(o.value) == width, o.value
        took, msg = o.value[0], o.value[2]
        assert low < took < high, took
        assert "broadcast" in msg and f"timed out after {seconds} s" in msg, msg
        assert absent is None or absent not in msg, msg


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_call_timeout_bounds_a_collective(transport, tmp_path):
    outcomes = run_ranks(stuck_collective, 3, "call", 0.5, str(tmp_path), transport=transport,
                         timeout=45, expect_failure=True)
    _timed_out_in_broadcast(outcomes, 0.45, 2.5, "0.5")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_group_timeout(transport, tmp_path):
    outcomes = run_ranks(group_timeout_needs_new_group, 3, 0.7, str(tmp_path),
                         transport=transport, timeout=45, expect_failure=True)
    _timed_out_in_broadcast(outcomes, 0.65, 2.5, "0.7", absent="group2", width=4)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_job_timeout_from_init_argument(transport, tmp_path):
    outcomes = run_ranks(init_with_timeout, 3, 3.0, str(tmp_path), transport=transport,
                         timeout=45, init=False, expect_failure=True)
    _timed_out_in_broadcast(outcomes, 2.9, 5.5, "3")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_job_timeout_from_env(transport, tmp_path):
    outcomes = run_ranks(stuck_collective, 3, "job", 3.0, str(tmp_path), transport=transport,
                         timeout=45, env={"COLLCOMM_TIMEOUT": "3"}, expect_failure=True)
    _timed_out_in_broadcast(outcomes, 2.9, 5.5, "3")


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


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_mismatched_collectives_are_detected(transport):
    res = run_ranks(mismatched_collectives, 2, transport=transport, timeout=30)
    assert res[0] != "completed" and res[1] != "completed", res
