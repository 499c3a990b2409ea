"""Eager rooted calls (native/_arena_sync.c ``enter``, COLLCOMM_EAGER_ROOTED): a one-step
broadcast's or scatter's root leaves without waiting for the others, its receivers wait
for the root alone, and the rest of the call's check (everybody's arrival, every
signature) is settled by the rank's next use of the group's arena, or when it closes.

Here: results against numpy with the mode forced on, every root, several dtypes and
counts, array and list forms, mixed with the other collectives; ranks that differ (the
Python path, the mode off) in one job; the mode really taken (a call left pending, then
settled); a rank that never comes is named by the root's next call, which does not hang;
a mismatch left for the close told there (every group and the job still closed); a root
whose buffer is read in place; collcomm.empty after a mismatch found late.
(The mismatch matrix with the mode on: tests/test_signature.py.)
"""
from __future__ import annotations

import numpy as np
import pytest

from tests.harness import run_ranks

EAGER = {"COLLCOMM_EAGER_ROOTED": "1"}
COUNTS = (1, 7, 1000, 16_384)
DTYPES = ("float32", "int64", "float16", "uint8")


def _core():
    from collcomm.core import runtime as rt

    arena = rt.get_world("test")._arena
    return None if arena is None else arena.native_core


def _results() -> int:
    """Every case on this rank, checked against numpy; the cases done."""
    import collcomm as dist
    from collcomm import MPI

    n, me = dist.get_world_size(), dist.get_rank()
    done = 0
    for dtype in DTYPES:
        for count in COUNTS:
            for root in range(n):
                buf = np.full(count, me + 1, dtype=dtype)
                if me == root:
                    buf[:] = np.arange(count) % 100
                dist.broadcast(buf, src=root)
                assert np.array_equal(buf, (np.arange(count) % 100).astype(dtype)), (dtype, count, root)
                # a scatter (array form, then list form at the root), an all_reduce between
                big = (np.arange(n * count) % 97).astype(dtype)
                mine = np.zeros(count, dtype=dtype)
                dist.scatter(mine, [big[r * count:(r + 1) * count] for r in range(n)]
                             if me == root else None, src=root)
                assert np.array_equal(mine, big[me * count:(me + 1) * count]), (dtype, count, root)
                s = np.full(3, float(me))
                dist.all_reduce(s)
                assert s.tolist() == [n * (n - 1) / 2] * 3
                out = np.zeros(count, dtype=dtype)      # (collcomm.MPI: one flat buffer)
                MPI.COMM_WORLD.Scatter(big if me == root else None, out, root=root)
                assert np.array_equal(out, big[me * count:(me + 1) * count]), (dtype, count, root)
                done += 1
    # a burst of broadcasts from one root, nothing between them (one step of slack)
    for i in range(200):
        v = np.full(4, i if me == 0 else -1, dtype=np.int64)
        dist.broadcast(v, src=0)
        assert v.tolist() == [i] * 4
    dist.barrier()
    return done


@pytest.mark.timeout(240)
@pytest.mark.parametrize("n", [2, 3, 4])
def test_results_with_eager_rooted_calls(n: int) -> None:
    done = run_ranks(_results, n, timeout=200, env=EAGER)
    assert done == [len(DTYPES) * len(COUNTS) * n] * n


@pytest.mark.timeout(240)
def test_ranks_that_differ_in_the_mode_and_path() -> None:
    """Rank 1 on the Python path, rank 2 with the mode off, ranks 0 and 3 eager: the same
    steps in the arena, the same results."""
    done = run_ranks(_results, 4, timeout=200, env=EAGER,
                     rank_env={1: {"COLLCOMM_NATIVE": "0"}, 2: {"COLLCOMM_EAGER_ROOTED": "0"}})
    assert done == [len(DTYPES) * len(COUNTS) * 4] * 4


def _taken() -> list[int]:
    """The root leaves its broadcast with the call pending; the next call settles it."""
    import collcomm as dist

    buf = np.ones(8, dtype=np.float32)
    dist.barrier()
    core = _core()
    if core is None:
        return []
    dist.broadcast(buf, src=0)
    pending = core.lag_target
    dist.all_reduce(buf)
    return [int(bool(pending)), int(bool(core.lag_target))]


@pytest.mark.timeout(120)
def test_the_root_leaves_and_the_next_call_settles() -> None:
    from collcomm import native

    if native.core is None:
        pytest.skip(f"native core: {native.reason}")
    on = run_ranks(_taken, 3, timeout=60, env=EAGER)
    assert [r[0] for r in on] == [1, 1, 1] and [r[1] for r in on] == [0, 0, 0], on
    off = run_ranks(_taken, 3, timeout=60, env={"COLLCOMM_EAGER_ROOTED": "0"})
    assert [r[0] for r in off] == [0, 0, 0], off


def _one_never_comes() -> str:
    import time

    import collcomm as dist

    me = dist.get_rank()
    buf = np.ones(4, dtype=np.float32)
    dist.barrier()
    if me == 2:
        time.sleep(4)          # never makes the broadcast; exits after the others gave up
        return "slept"
    dist.broadcast(buf, src=0)          # the root leaves; rank 1 waits for the root alone
    try:
        with dist.call_timeout(1.0):
            dist.barrier()
    except dist.CommTimeoutError as exc:
        return str(exc)
    return "no error"


@pytest.mark.timeout(120)
def test_a_rank_that_never_comes_is_named_by_the_next_call() -> None:
    from collcomm import native

    if native.core is None:
        pytest.skip(f"native core: {native.reason}")
    out = run_ranks(_one_never_comes, 3, timeout=60, env=EAGER)
    assert out[2] == "slept"
    for text in out[:2]:       # the root (settling) and rank 1 (its barrier) name rank 2
        assert "rank 2" in text and "timed out" in text, out


def _mismatch_then_close() -> tuple[str, list[str], bool]:
    """A mismatch in a subgroup's eager broadcast right before destroy_process_group."""
    import time
    import warnings

    import collcomm as dist
    from collcomm.core import runtime as rt

    me = dist.get_rank()
    sub = dist.new_group([0, 1, 2])
    dist.barrier(group=sub)
    job = rt._job
    buf = np.ones(4, dtype=np.float64 if me == 2 else np.float32)
    try:
        dist.broadcast(buf, src=0, group=sub)
        seen = "no error"
    except dist.MismatchError:
        seen = "in the call"
    time.sleep(0.5)          # (everybody has arrived at the broadcast: the close can tell)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist.destroy_process_group()
    return seen, [str(w.message) for w in caught], job.transport is None


@pytest.mark.timeout(120)
def test_a_mismatch_left_for_the_close_is_told_and_everything_closes() -> None:
    """destroy_process_group neither waits nor raises for a call left early: it closes
    every group and the job, and a difference it can see (everybody already there) is a
    RuntimeWarning; the rank that could see it in the call raised there."""
    from collcomm import native

    if native.core is None:
        pytest.skip(f"native core: {native.reason}")
    out = run_ranks(_mismatch_then_close, 3, timeout=60, env=EAGER)
    assert out[2][0] == "in the call", out          # it waited for the root: it saw it
    assert all(closed for _, _, closed in out), out   # the job's transport closed everywhere
    for seen, warned, _ in out[:2]:
        assert seen == "no error", out
        assert any("differs in dtype" in w and "next call" in w for w in warned), out


def _in_place_root(mismatch: bool, scope: int) -> tuple[list[str], list[float]]:
    """A broadcast whose root's buffer is in the shared heap and taken by the regular path
    (a call_timeout scope: on every rank, 1, or at the root only, 2), which publishes it
    in place and waits for everybody: the eager receivers then take the whole call."""
    import contextlib

    import collcomm as dist

    me, n = dist.get_rank(), dist.get_world_size()
    heap = dist.empty(4, np.float32)
    heap[:] = 7
    dist.barrier()
    scoped = scope == 1 or (scope == 2 and me == 0)
    buf = heap if me == 0 else np.zeros(4, dtype=np.float64 if (mismatch and me == 2) else np.float32)
    out = []
    for step in (lambda: dist.broadcast(buf, src=0), lambda: dist.all_reduce(np.ones(2))):
        try:
            with dist.call_timeout(30.0) if scoped else contextlib.nullcontext():
                step()
            out.append("ok")
        except dist.MismatchError:
            out.append("MismatchError")
    if not mismatch:
        assert buf.tolist() == [7.0] * 4
    sums = []
    for _ in range(3):
        t = np.full(2, me + 1.0)
        dist.all_reduce(t)
        sums.append(float(t[0]))
    return out, sums


@pytest.mark.timeout(180)
@pytest.mark.parametrize("mismatch", [False, True])
@pytest.mark.parametrize("scope", [1, 2])
def test_a_root_publishing_in_place(mismatch: bool, scope: int) -> None:
    out = run_ranks(_in_place_root, 3, mismatch, scope, timeout=90, env=EAGER)
    for seen, sums in out:
        assert sums == [6.0] * 3, out                   # in step, right
        assert seen == (["MismatchError", "ok"] if mismatch else ["ok", "ok"]), out


def _allocate_after_a_late_mismatch() -> list[str]:
    """A mismatch the root and a receiver learn late, then collcomm.empty (whose syncs
    carry no signature: it does not settle), then two all_reduces."""
    import collcomm as dist

    me = dist.get_rank()
    dist.barrier()
    out = []
    steps = (lambda: dist.broadcast(np.ones(4, dtype=np.float64 if me == 2 else np.float32), src=0),
             lambda: dist.empty(4, np.float32),
             lambda: dist.all_reduce(np.ones(2)))
    for step in steps:
        try:
            step()
            out.append("ok")
        except dist.MismatchError:
            out.append("MismatchError")
    t = np.full(2, me + 1.0)
    dist.all_reduce(t)
    out.append(str(float(t[0])))
    return out


@pytest.mark.timeout(120)
def test_allocate_after_a_late_mismatch() -> None:
    from collcomm import native

    if native.core is None:
        pytest.skip(f"native core: {native.reason}")
    out = run_ranks(_allocate_after_a_late_mismatch, 3, timeout=60, env=EAGER)
    assert out[2] == ["MismatchError", "ok", "MismatchError", "6.0"], out   # in the call; then
    for seen in out[:2]:                  # the ABANDONED step's word in its next collective
        assert seen == ["ok", "ok", "MismatchError", "6.0"], out


def _random_sequence(seed: int, steps: int) -> int:
    """The same random sequence of calls on every rank (random roots, sizes from one
    element to several slots, dtypes, list and flat forms, shared-heap roots, a rank now
    and then in a call_timeout scope), every result checked."""
    import contextlib
    import random

    import collcomm as dist
    from collcomm import MPI

    rng = random.Random(seed)
    me, n = dist.get_rank(), dist.get_world_size()
    kinds = ("bcast", "bcast", "bcast_heap", "scatter", "scatter_flat", "all_reduce", "gather",
             "barrier", "all_to_all", "empty")
    for step in range(steps):
        kind, root = rng.choice(kinds), rng.randrange(n)
        count, dt = rng.choice((1, 3, 64, 1000, 70_000, 300_000)), rng.choice(DTYPES[:3])
        scoped = rng.random() < 0.15 and me == rng.randrange(n)
        c = max(1, count // n)
        with dist.call_timeout(60) if scoped else contextlib.nullcontext():
            if kind in ("bcast", "bcast_heap"):
                b = dist.empty(count, dt) if kind == "bcast_heap" else np.zeros(count, dt)
                want = (np.arange(count) % 50).astype(dt)
                b[:] = want if me == root else 0
                dist.broadcast(b, src=root)
                assert np.array_equal(b, want), (step, kind)
            elif kind in ("scatter", "scatter_flat"):
                big, out = (np.arange(n * c) % 31).astype(dt), np.zeros(c, dt)
                if kind == "scatter":
                    dist.scatter(out, [big[i * c:(i + 1) * c] for i in range(n)]
                                 if me == root else None, src=root)
                else:
                    MPI.COMM_WORLD.Scatter(big if me == root else None, out, root=root)
                assert np.array_equal(out, big[me * c:(me + 1) * c]), (step, kind)
            elif kind == "all_reduce":
                t = np.full(count, me + 1.0)
                dist.all_reduce(t)
                assert (t == n * (n + 1) / 2).all(), (step, kind)
            elif kind == "gather":
                outs = [np.zeros(c, dt) for _ in range(n)] if me == root else None
                dist.gather(np.full(c, me, dt), outs, dst=root)
                assert outs is None or all((outs[i] == i).all() for i in range(n)), (step, kind)
            elif kind == "barrier":
                dist.barrier()
            elif kind == "all_to_all":
                k = max(1, count // (4 * n))
                out = np.zeros(n * k, "int32")
                dist.all_to_all_single(out, np.full(n * k, me, "int32"))
                assert np.array_equal(out, np.repeat(np.arange(n, dtype="int32"), k)), (step, kind)
            else:
                dist.empty(16, "float32")
    return steps


@pytest.mark.timeout(240)
@pytest.mark.parametrize("n", [3, 4])
def test_a_random_sequence_of_calls(n: int) -> None:
    """Eager ranks beside a Python-path rank and a rank with the mode off, a random mix of
    calls (the other collectives between the rooted ones, settling them)."""
    done = run_ranks(_random_sequence, n, 7 + n, 150, timeout=200, env=EAGER,
                     rank_env={1: {"COLLCOMM_NATIVE": "0"}, 2: {"COLLCOMM_EAGER_ROOTED": "0"}})
    assert done == [150] * n
