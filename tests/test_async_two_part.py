"""Small asynchronous collectives in two parts (native/_fastcall_parts.c): all_reduce,
broadcast, barrier, all_gather, gather, scatter, reduce_scatter, reduce; how they progress.

When nothing of the group is pending, such a call stages this rank's data and publishes
its arrival at once; its second part (wait for the others, check every signature, combine
or copy out) is queued and run by ``wait()``, the next blocking call or the worker. These
tests hold what that promises: the others finish the call while this rank blocks in a
receive, with no thread at all (the worker never looks); callbacks and polling (polling
alone finishes it); a peer that publishes its buffer in place (the worker finishes the
call); ``destroy_process_group`` finishing a call never waited for; Works nobody keeps.
Results: tests/test_async_two_part_results.py; a mismatch and a lost peer:
tests/test_async_two_part_errors.py.
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

from collcomm import native
from tests.fastpath_common import _world
from tests.harness import run_ranks


def _no_thread_needed() -> dict[str, Any]:
    """Each rank in turn starts a call and blocks in a receive its peer sends only after
    its own (synchronous) part of the call, with no worker thread at all (before two
    parts, a queued call waited for the worker: this hangs on that tree)."""
    import collcomm as dist
    from collcomm.core import async_calls

    async_calls.AsyncCalls._start_worker = lambda self: None     # no worker thread at all
    me, n = dist.get_rank(), dist.get_world_size()
    dist.all_reduce(np.ones(1))                        # the arena: the fast call exists after
    out: dict[str, Any] = {}
    for starter in range(n):
        peer = (starter + 1) % n
        x = np.full(3, me + 1.0, np.float32)
        b = np.full(2, 10 * me, np.int64)
        got = np.zeros(1, np.int64)
        if me == starter:
            w = dist.all_reduce(x, async_op=True)
            dist.recv(got, src=peer)
            w.wait()
            w = dist.broadcast(b, src=starter, async_op=True)
            dist.recv(got, src=peer)
            w.wait()
        else:
            dist.all_reduce(x)
            if me == peer:
                dist.send(np.array([5]), dst=starter)
            dist.broadcast(b, src=starter)
            if me == peer:
                dist.send(np.array([5]), dst=starter)
        # an all_gather
        ag = np.zeros(2 * n, np.int32)
        if me == starter:
            w = dist.all_gather_into_tensor(ag, np.full(2, me, np.int32), async_op=True)
            dist.recv(got, src=peer)
            w.wait()
        else:
            dist.all_gather_into_tensor(ag, np.full(2, me, np.int32))
            if me == peer:
                dist.send(np.array([3]), dst=starter)
        out[f"ag{starter}"] = ag.tolist()
        # a reduce to the peer, and one to the starter
        red = [np.full(2, me + 1.0), np.full(2, me + 1.0)]
        for i, root in enumerate((peer, starter)):
            if me == starter:
                w = dist.reduce(red[i], dst=root, async_op=True)
                dist.recv(got, src=peer)
                w.wait()
            else:
                dist.reduce(red[i], dst=root)
                if me == peer:
                    dist.send(np.array([2]), dst=starter)
        out[f"red{starter}"] = [red[0].tolist() if me == peer else None,
                                red[1].tolist() if me == starter else None]
        # a barrier
        if me == starter:
            w = dist.barrier(async_op=True)
            dist.recv(got, src=peer)
            w.wait()
        else:
            dist.barrier()
            if me == peer:
                dist.send(np.array([4]), dst=starter)
        # a broadcast started by a non-root, alone
        c = np.full(2, 7 * me, np.int32)
        if me == starter:
            w = dist.broadcast(c, src=peer, async_op=True)
            dist.recv(got, src=peer)
            w.wait()
        else:
            dist.broadcast(c, src=peer)
            if me == peer:
                dist.send(np.array([6]), dst=starter)
        out[f"s{starter}"] = (x.tolist(), b.tolist(), c.tolist())
    out["thread"] = _world().async_calls._worker is not None
    out["me"] = me
    return out


@pytest.mark.timeout(120)
@pytest.mark.skipif(native.core is None, reason=f"native core: {native.reason}")
@pytest.mark.parametrize("n", [2, 3])
def test_the_others_finish_without_this_rank_or_a_thread(n: int) -> None:
    total = n * (n + 1) / 2
    for out in run_ranks(_no_thread_needed, n, transport="shm", timeout=90):
        for starter in range(n):
            peer = (starter + 1) % n
            assert out[f"s{starter}"] == ([total] * 3, [10 * starter] * 2, [7 * peer] * 2), out
            assert out[f"ag{starter}"] == [r for r in range(n) for _ in "ab"], out
            me = out["me"]
            assert out[f"red{starter}"] == [[total] * 2 if me == peer else None,
                                            [total] * 2 if me == starter else None], out
        assert out["thread"] is False, out


def _callbacks() -> dict[str, Any]:
    """``then`` and polling on a call in two parts; polling alone finishes it (in C, once
    every rank has arrived) with no worker thread at all, MPI ``Test`` too."""
    import collcomm as dist
    from collcomm import MPI
    from collcomm.core import async_calls

    if native.core is not None:        # (without it every async call is queued: the worker)
        async_calls.AsyncCalls._start_worker = lambda self: None     # no worker thread at all
    me, n = dist.get_rank(), dist.get_world_size()
    dist.all_reduce(np.ones(1))
    out: dict[str, Any] = {}
    for label in ("poll", "then"):
        x = np.full(2, me + 1.0)
        w = dist.all_reduce(x, async_op=True)
        seen: list[Any] = []
        if label == "then":
            w.then(lambda work: seen.append(x.tolist()))
        deadline = time.monotonic() + 20
        while not w.is_completed() and time.monotonic() < deadline:
            time.sleep(0.001 * me)                      # (rank 0 spins, rank 1 sleeps)
        out[label] = (w.is_success(), x.tolist(), seen)
    y = np.full(2, me + 1.0)
    req = MPI.COMM_WORLD.Iallreduce(MPI.IN_PLACE, y)
    while not req.Test():
        pass
    out["Test"] = y.tolist()
    return out


@pytest.mark.timeout(120)
def test_callbacks_and_polling() -> None:
    for out in run_ranks(_callbacks, 2, transport="shm", timeout=90):
        assert out == {"poll": (True, [3.0, 3.0], []), "then": (True, [3.0, 3.0], [[3.0, 3.0]]),
                       "Test": [3.0, 3.0]}, out


def _destroyed_unwaited() -> list[float]:
    """destroy_process_group with a call started and never waited for finishes it."""
    import collcomm as dist

    me = dist.get_rank()
    dist.all_reduce(np.ones(1))
    x = np.full(2, me + 1.0)
    w = dist.all_reduce(x, async_op=True)
    dist.destroy_process_group()
    return x.tolist() if w.done and w.is_success() else [-1.0]


@pytest.mark.timeout(120)
def test_destroy_finishes_a_started_call() -> None:
    for x in run_ranks(_destroyed_unwaited, 2, transport="shm", timeout=60):
        assert x == [3.0, 3.0], x


def _peer_in_place() -> list[Any]:
    """Rank 1 reduces a shared-heap buffer on the Python path (a call_timeout scope: no fast
    call), which publishes it in place and needs more syncs from rank 0, whose call was
    started in two parts and which then blocks in a receive rank 1 sends only after: the
    worker (PART_GRACE) finishes rank 0's call, as it did every async call before."""
    import collcomm as dist

    me = dist.get_rank()
    dist.all_reduce(np.ones(1))
    got = np.zeros(1, np.int64)
    out = []
    for count in (3, 5000):
        h = dist.empty(count, np.float64)        # (collective: every rank makes one)
        if me == 0:
            x = np.full(count, 1.0)
            w = dist.all_reduce(x, async_op=True)
            dist.recv(got, src=1)
            w.wait()
            out.append(float(x[0]))
        else:
            h[:] = 2.0
            with dist.call_timeout(60):
                dist.all_reduce(h)
            dist.send(np.array([1]), dst=0)
            out.append(float(h[0]))
    return out


@pytest.mark.timeout(120)
def test_a_peer_publishing_in_place() -> None:
    for out in run_ranks(_peer_in_place, 2, transport="shm", timeout=90):
        assert out == [3.0, 3.0], out


def _discarded_works() -> list[float]:
    """Async calls whose Works nobody keeps (each finished by the next one's entry or the
    closing blocking call): run under PYTHONMALLOC=debug, where a Work freed while being
    finished crashed the rank."""
    import collcomm as dist

    me = dist.get_rank()
    x = np.full(2, me + 1.0)
    for i in range(200):
        dist.all_reduce(np.full(2, me + 1.0), async_op=True)
        time.sleep(0.0002)                     # (the peer joins it before the next entry)
        dist.broadcast(np.full(3, float(me)), src=1, async_op=True)
    dist.all_reduce(x)
    return x.tolist()


@pytest.mark.timeout(120)
def test_works_nobody_keeps() -> None:
    import os

    env = dict(os.environ, PYTHONMALLOC="debug")
    for x in run_ranks(_discarded_works, 2, transport="shm", timeout=90, env=env):
        assert x == [3.0, 3.0], x
