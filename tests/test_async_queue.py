"""Asynchronous calls queued in program order (collcomm/core/async_calls.py).

An ``async_op=True`` call is queued and run by the first thread that needs it: the
caller when it waits (or makes a synchronous call on the group), else the group's worker
within a poll period. These tests hold the progress rules (a queued call completes while
its caller blocks in a receive, in user code, or in another group's call; polling
``is_completed`` or waiting with a timeout hands it over), the order of mixed queued calls
(fast, regular, large, AVG, barrier) waited for in any order, the fast call and the
flight recorder's record of a queued call, and a mismatch inside a queued call; on shared
memory (the fast call) and TCP (no fast call).
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

from collcomm import native
from tests.harness import line_of, run_ranks


def _fast_calls() -> int:
    from collcomm.core import runtime

    fast = runtime.get_world("test").fast
    return -1 if fast is None else fast.calls


def _progress() -> dict[str, Any]:
    import collcomm as dist

    me, n = dist.get_rank(), dist.get_world_size()
    out: dict[str, Any] = {}
    x = np.full(3, me + 1.0, np.float32)
    dist.all_reduce(x)                          # the arena (shm): the fast call exists after
    total = n * (n + 1) / 2

    # 1. the caller blocks in a receive its peer sends only after the collective
    x = np.full(3, me + 1.0, np.float32)
    got = np.zeros(2, np.int64)
    if me == 0:
        w = dist.all_reduce(x, async_op=True)
        dist.recv(got, src=1)
        w.wait()
    else:
        dist.all_reduce(x)
        if me == 1:
            dist.send(np.array([7, 8]), dst=0)
    out["recv"] = (x.tolist(), got.tolist())

    # 2. the caller sleeps in its own code: the others finish long before it wakes
    dist.barrier()
    x = np.full(3, me + 1.0, np.float32)
    t0 = time.monotonic()
    if me == 0:
        w = dist.all_reduce(x, async_op=True)
        time.sleep(0.6)
        w.wait()
    else:
        dist.all_reduce(x)
    out["sleep"] = (x.tolist(), time.monotonic() - t0)

    # 3. another group's synchronous call does not run this group's queued one first
    other = dist.new_group(list(range(n)))
    a, b = np.full(2, me + 1.0), np.full(2, 10.0 * (me + 1))
    if me == 0:
        w = dist.all_reduce(a, group=other, async_op=True)
        dist.all_reduce(b)
    else:
        dist.all_reduce(b)
        w = dist.all_reduce(a, group=other, async_op=True)
    w.wait()
    out["groups"] = (a.tolist(), b.tolist())

    # 4. polling is_completed() with no sleep, and wait(timeout), hand the call over
    x = np.full(3, me + 1.0, np.float32)
    w = dist.all_reduce(x, async_op=True)
    polls = 0
    while not w.is_completed():
        polls += 1
    y = np.full(3, me + 1.0, np.float32)
    w2 = dist.all_reduce(y, async_op=True)
    out["poll"] = (x.tolist(), w2.wait(timeout=30), y.tolist(), w.is_success())
    out["total"] = total
    return out


def _check_progress(res: list[dict[str, Any]], n: int) -> None:
    total = n * (n + 1) / 2
    for me, out in enumerate(res):
        assert out["recv"][0] == [total] * 3, out
        if me == 0:
            assert out["recv"][1] == [7, 8], out
        assert out["sleep"][0] == [total] * 3, out
        if me > 0:          # done by rank 0's worker while rank 0 slept 0.6 s
            assert out["sleep"][1] < 0.45, out
        assert out["groups"] == ([total] * 2, [10 * total] * 2), out
        assert out["poll"] == ([total] * 3, True, [total] * 3, True), out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_queued_calls_progress_without_a_wait(transport: str) -> None:
    n = 3
    _check_progress(run_ranks(_progress, n, transport=transport, timeout=90), n)


def _mixed() -> dict[str, Any]:
    import collcomm as dist
    from collcomm.core import recorder

    me, n = dist.get_rank(), dist.get_world_size()
    dist.all_reduce(np.zeros(1))
    before = _fast_calls()
    s = np.full(5, me + 1.0, np.float32)
    avg = np.full(3, float(me), np.float64)
    bc = np.arange(4, dtype=np.int32) * (me + 1)
    ag = np.zeros(2 * n, np.int16)
    big = np.full(300_000, me + 1.0, np.float32)        # 1.2 MB: handed to the worker at once
    rs_in = np.arange(2 * n, dtype=np.float64) + me
    rs = np.zeros(2)
    red = np.full(2, me + 1, np.int64)
    works = [
        dist.all_reduce(s, async_op=True),
        dist.all_reduce(avg, op=dist.ReduceOp.AVG, async_op=True),    # the regular path
        dist.broadcast(bc, src=1, async_op=True),
        dist.all_gather_into_tensor(ag, np.full(2, me, np.int16), async_op=True),
        dist.all_reduce(big, async_op=True),
        dist.barrier(async_op=True),
        dist.reduce_scatter_tensor(rs, rs_in, async_op=True),
        dist.reduce(red, dst=2, async_op=True),
    ]
    for w in reversed(works):
        w.wait()
    fast = _fast_calls() - before
    before = _fast_calls()
    dist.all_reduce(np.ones(2, np.float32))    # the queue ran empty: the fast call again
    fast_after = _fast_calls() - before
    w = dist.all_reduce(np.ones(2, np.float32), async_op=True)   # the line recorded
    w.wait()
    rec = recorder.recorder()
    last = rec.entry(rec.records()[-1], 0.0, 0.0)
    return {"s": s.tolist(), "avg": avg.tolist(), "bc": bc.tolist(), "ag": ag.tolist(),
            "big": [float(big.min()), float(big.max())], "rs": rs.tolist(), "red": red.tolist(),
            "fast": fast, "fast_after": fast_after, "has_fast": _fast_calls() >= 0, "last": last, "done": all(w.is_completed() for w in works)}


def _check_mixed(res: list[dict[str, Any]], n: int) -> None:
    total = n * (n + 1) / 2
    for me, out in enumerate(res):
        assert out["s"] == [total] * 5 and out["avg"] == [(n - 1) / 2] * 3, out
        assert out["bc"] == [0, 2, 4, 6], out
        assert out["ag"] == [p for p in range(n) for _ in range(2)], out
        assert out["big"] == [total, total], out
        # reduce_scatter: block me of sum over ranks r of (arange(2n) + r)
        assert out["rs"] == [n * (2 * me + i) + n * (n - 1) / 2 for i in range(2)], out
        assert out["red"] == ([total] * 2 if me == 2 else [me + 1] * 2), out
        assert out["done"]
        # all but the AVG and the large all_reduce went through the fast call
        assert out["fast"] == (6 if out["has_fast"] else 0), out
        assert out["fast_after"] == (1 if out["has_fast"] else 0), out
        last = out["last"]
        assert last["op"] == "all_reduce" and last["state"] == "completed", last
        assert last["where"].endswith("test_async_queue.py:" + str(line_of(__file__, "# the line recorded"))), last



@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_mixed_queued_calls_keep_their_order(transport: str) -> None:
    n = 3
    res = run_ranks(_mixed, n, transport=transport, timeout=90)
    _check_mixed(res, n)
    if transport == "shm" and native.core is not None:
        assert all(out["has_fast"] for out in res)


def _mismatch() -> list[str]:
    import collcomm as dist

    me = dist.get_rank()
    x = np.ones(4, np.float32 if me == 0 else np.int32)     # same bytes, another dtype
    dist.all_reduce(np.ones(1))
    w = dist.all_reduce(x, async_op=True)
    try:
        w.wait()
    except dist.CollcommError as exc:
        return [type(exc).__name__, str(exc)]
    return ["no error"]


@pytest.mark.timeout(120)
def test_a_mismatch_in_a_queued_call_is_raised_by_wait() -> None:
    for name, text in run_ranks(_mismatch, 2, transport="shm", timeout=90):
        assert name == "MismatchError" and "all_reduce" in text and "float32" in text, text


def _interrupted_wait(done: str) -> str:
    """Rank 0 runs, in its wait, a queued all_reduce rank 1 never enters (it waits until
    rank 0 is done, 3 s at most); a SIGINT after 0.3 s ends rank 0's wait with
    KeyboardInterrupt (not an error of the call), and the group's worker still runs a
    later queued call (a group of one)."""
    import os
    import signal
    import threading

    import collcomm as dist

    me = dist.get_rank()
    dist.all_reduce(np.ones(2), async_op=True).wait()   # the worker is up and looking: the
    if me == 1:                                         # next call is run by rank 0's wait
        dist.barrier()
        deadline = time.monotonic() + 3.0
        while not os.path.exists(done) and time.monotonic() < deadline:
            time.sleep(0.01)
        return "slept"
    dist.barrier()
    w = dist.all_reduce(np.ones(2), async_op=True)
    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
    try:
        with dist.call_timeout(10):
            w.wait()
        verdict = "not interrupted"
    except KeyboardInterrupt:
        verdict = "interrupted"
    except Exception as exc:  # noqa: BLE001 - what the test looks for
        verdict = f"{type(exc).__name__}: {exc}"
    open(done, "w").close()
    solo = dist.new_group([0], use_local_synchronization=True)
    x = np.ones(2)
    w2 = dist.all_reduce(x, group=solo, async_op=True)
    polls = 0
    while not w2.is_completed():
        time.sleep(0.001)
        polls += 1
    return f"{verdict}; later call {'done' if w2.is_success() and x.tolist() == [1.0, 1.0] else 'failed'}"


@pytest.mark.timeout(120)
def test_ctrl_c_ends_the_wait_of_a_queued_call(tmp_path: Any) -> None:
    got = run_ranks(_interrupted_wait, 2, str(tmp_path / "done"), transport="shm", timeout=60,
                    expect_failure=True)[0]
    assert got.ok and got.value == "interrupted; later call done", (got.value, got.error)


def _threads() -> list[str]:
    """Three threads per rank, each with its own group, each making 150 rounds of queued
    calls (small ones through the fast call, AVG and a large one the regular way), waited
    for in a shuffled order, sometimes polled, sometimes left to a blocking call or to the
    worker: every result right, on every rank."""
    import random
    import threading

    import collcomm as dist

    me, n = dist.get_rank(), dist.get_world_size()
    groups = [dist.new_group(list(range(n))) for _ in range(3)]
    total = n * (n + 1) / 2
    bad: list[str] = []

    def work(k: int) -> None:
        g = groups[k]
        rng = random.Random(1000 * k + me)          # the waits' order differs per rank
        shared = random.Random(k)                   # the calls' kinds: the same on every rank
        for i in range(150):
            bufs = [np.full(3, me + 1.0, np.float32), np.full(2, float(me)),
                    np.full(70_000, me + 1.0, np.float32)]
            works = [dist.all_reduce(bufs[0], group=g, async_op=True),
                     dist.all_reduce(bufs[1], op=dist.ReduceOp.AVG, group=g, async_op=True)]
            if shared.random() < 0.2:
                works.append(dist.all_reduce(bufs[2], group=g, async_op=True))
            mode = shared.random()
            if mode < 0.2:
                x = np.full(1, 1.0)
                dist.all_reduce(x, group=g)          # runs the queued ones first
                if x[0] != n:
                    bad.append(f"thread {k} round {i}: blocking call {x[0]}")
            elif mode < 0.3:
                time.sleep(0.002)                    # the worker's turn
            rng.shuffle(works)
            for w in works:
                if rng.random() < 0.2:
                    while not w.is_completed():
                        pass
                w.wait()
            if bufs[0][0] != total or bufs[1][0] != (n - 1) / 2 or \
                    (len(works) == 3 and (bufs[2][0] != total or bufs[2][-1] != total)):
                bad.append(f"thread {k} round {i}: {bufs[0][0]}, {bufs[1][0]}, {bufs[2][0]}")

    threads = [threading.Thread(target=work, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=80)
    if any(t.is_alive() for t in threads):
        bad.append("a thread did not finish")
    return bad


@pytest.mark.timeout(150)
def test_threads_with_their_own_groups() -> None:
    for bad in run_ranks(_threads, 2, transport="shm", timeout=120):
        assert bad == [], bad[:10]


def _front_end_lane() -> dict[str, Any]:
    """The functional API's async all_reduce / broadcast of a plain writable contiguous
    array go straight to the core (no as_output): a 2-D array written in place, a root
    given as a group rank, and what the lane leaves to the general path (a read-only or a
    strided array, a bad root) raising the general path's errors."""
    import collcomm as dist

    me, n = dist.get_rank(), dist.get_world_size()
    out: dict[str, Any] = {}
    two_d = np.full((2, 3), me + 1.0)
    b = np.arange(4.0) * (me + 1)
    works = [dist.all_reduce(two_d, async_op=True), dist.broadcast(b, group_src=1, async_op=True)]
    for w in works:
        w.wait()
    out["values"] = (two_d.tolist(), b.tolist())
    errors = []
    frozen = np.ones(2)
    frozen.flags.writeable = False
    for call in (lambda: dist.all_reduce(frozen, async_op=True),
                 lambda: dist.all_reduce(np.ones(6)[::2], async_op=True),
                 lambda: dist.broadcast(np.ones(2), src=n, async_op=True)):
        try:
            call().wait()
            errors.append("no error")
        except dist.CollcommError as exc:
            errors.append(type(exc).__name__)
    out["errors"] = errors
    return out


@pytest.mark.timeout(120)
def test_the_front_end_lane() -> None:
    n = 2
    for out in run_ranks(_front_end_lane, n, transport="shm", timeout=90):
        assert out["values"] == ([[3.0] * 3] * 2, [0.0, 2.0, 4.0, 6.0]), out
        assert out["errors"] == ["InvalidArgumentError"] * 3, out
