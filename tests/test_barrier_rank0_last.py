"""The barrier with more ranks than CPUs (COLLCOMM_EAGER_ROOTED on): rank 0 arrives last,
once every other rank is there (native/_arena_sync.c ``enter_last``, Python
``Arena.sync_last``), so the others leave only when rank 0 runs.

Here, on the native and the Python path: rank 0 really holds its arrival back (another
rank sees its HOLD word and its counter not moved while a third is missing), and with the
mode off it does not; a rank that never comes is the one named by every waiting rank's
timeout, rank 0 never (it holds, it is not missing); results with the barrier in between
other calls, and ranks that differ in path and mode in one job.
"""
from __future__ import annotations

import time

import numpy as np
import pytest

from tests.harness import run_ranks
from tests.test_native_checks import _await_file

EAGER = {"COLLCOMM_EAGER_ROOTED": "1"}
PATHS = {"native": {}, "python": {"COLLCOMM_NATIVE": "0"}}


def _arena():
    from collcomm.core import runtime as rt

    return rt.get_world("test")._arena


def _watch_rank0(flag: str) -> str:
    """Rank 1 watches rank 0's header while rank 2 is late for a barrier: 'held' when rank
    0 publishes HOLD for the next counter without arriving, 'arrived' when its counter moves
    first. Rank 2 comes once rank 1 has seen which (the flag file)."""
    import collcomm as dist
    from collcomm.transport.arena_layout import COUNTER, HOLD, SIZE

    me = dist.get_rank()
    x = np.ones(2, dtype=np.float32)
    dist.all_reduce(x)                       # the arena is built
    seen = "-"
    if me == 1:
        arena = _arena()
        target = arena.get(1, COUNTER) + 1
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if arena.get(0, COUNTER) >= target:
                seen = "arrived"
                break
            if HOLD | target in (arena.get(0, SIZE), arena.get(0, SIZE + 1)):
                seen = "held"
                break
            time.sleep(0.001)
        open(flag, "w").close()
    elif me == 2:
        _await_file(flag, 30)
    dist.barrier()
    dist.all_reduce(x)
    assert x.tolist() == [9.0, 9.0]
    return seen


@pytest.mark.timeout(120)
@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("mode", ["1", "0"])
def test_rank0_holds_its_arrival_until_every_other_rank_is_there(tmp_path, path: str, mode: str) -> None:
    env = dict(PATHS[path], COLLCOMM_EAGER_ROOTED=mode)
    res = run_ranks(_watch_rank0, 3, str(tmp_path / "seen"), transport="shm", env=env, timeout=90)
    assert res[1] == ("held" if mode == "1" else "arrived"), res


def _skip_barrier(victim: int, gave_up: str) -> str:
    import collcomm as dist

    me = dist.get_rank()
    x = np.ones(2, dtype=np.float32)
    dist.all_reduce(x)
    if me == victim:
        _await_file(gave_up + "-0", 20)    # skips the barrier; leaves after the others gave up
        _await_file(gave_up + "-1", 20)
        return "skipped"
    try:
        with dist.call_timeout(1.0):
            dist.barrier()
    except dist.CommTimeoutError as exc:
        open(f"{gave_up}-{me}", "w").close()
        # nobody leaves before the other waiting rank has given up too: a rank that left
        # first is what that one's wait would name (PeerLostError "left the job", CI once)
        _await_file(f"{gave_up}-{1 - me}", 20)
        return f"{exc.peer} {exc}"
    return "no error"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("path", sorted(PATHS))
def test_the_missing_rank_is_named_not_rank0(tmp_path, path: str) -> None:
    env = dict(PATHS[path], **EAGER)
    res = run_ranks(_skip_barrier, 3, 2, str(tmp_path / "gave-up"), transport="shm", env=env, timeout=90)
    assert res[2] == "skipped"
    for me in (0, 1):
        peer, text = res[me].split(" ", 1)
        assert peer == "2", res[me]
        assert "still waiting for rank 2 (at step" in text and "rank 0 (at" not in text, res[me]


def _mixed() -> int:
    """Barriers between rooted calls from every root; the results checked."""
    import collcomm as dist

    n, me = dist.get_world_size(), dist.get_rank()
    done = 0
    for i in range(60):
        root = i % n
        v = np.full(5, i if me == root else -1, dtype=np.int64)
        dist.barrier()
        dist.broadcast(v, src=root)
        assert v.tolist() == [i] * 5
        out = np.zeros(3, dtype=np.float32)
        dist.scatter(out, [np.full(3, r + i, dtype=np.float32) for r in range(n)] if me == root else None,
                     src=root)
        assert out.tolist() == [float(me + i)] * 3
        dist.barrier()
        s = np.full(2, float(me))
        dist.all_reduce(s)
        assert s.tolist() == [n * (n - 1) / 2] * 2
        done += 1
    return done


@pytest.mark.timeout(180)
@pytest.mark.parametrize("n", [2, 4])
def test_barriers_between_calls(n: int) -> None:
    assert run_ranks(_mixed, n, transport="shm", env=EAGER, timeout=120) == [60] * n


@pytest.mark.timeout(180)
def test_ranks_that_differ_in_path_and_mode() -> None:
    """Rank 0 on the Python path holding, rank 1 native with the mode off, rank 2 native
    holding nothing (not rank 0), rank 3 on the Python path: the same steps."""
    rank_env = {0: {"COLLCOMM_NATIVE": "0", **EAGER}, 1: {"COLLCOMM_EAGER_ROOTED": "0"},
                2: EAGER, 3: {"COLLCOMM_NATIVE": "0", **EAGER}}
    assert run_ranks(_mixed, 4, transport="shm", rank_env=rank_env, timeout=120) == [60] * 4
