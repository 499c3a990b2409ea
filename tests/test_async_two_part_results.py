"""Small asynchronous collectives in two parts (native/_fastcall_parts.c): their results.

Results equal to numpy's for dtypes, ops, counts up to and past the two-part limit, every
root, every one-step collective (all_reduce, broadcast, reduce, all_gather, gather,
scatter, reduce_scatter), 2-D, a subgroup, mixed with queued and blocking calls in any
order; a synchronous call right after an unwaited one finishes it first; collcomm.MPI's
I-calls on the same path; bursts of calls with a late rank; in a world of one, each call
done at once (in C, where nothing is queued before it). (How they progress:
tests/test_async_two_part.py.)
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

from tests.fastpath_common import _world
from tests.harness import run_ranks


# numpy's reduction in rank order, as the ranks make it
_NP = {"SUM": np.add, "PROD": np.multiply, "MAX": np.maximum, "MIN": np.minimum}


def _operand(rank: int, count: int, dtype: Any) -> np.ndarray:
    return ((np.arange(count) % 3) + rank + 1).astype(dtype)


def _matrix() -> list[str]:
    """Every case run asynchronously and checked against numpy; returns what differs."""
    import collcomm as dist

    me, n = dist.get_rank(), dist.get_world_size()
    bad: list[str] = []
    dist.all_reduce(np.ones(1))
    fast = _world().fast                 # (None without the native core: all queued)
    started = fast.calls if fast is not None else 0
    counts = [1, 7, (64 << 10) // 4, (64 << 10) // 4 + 1]     # past 64 KiB: queued whole
    for dtype in (np.float32, np.float64, np.int32, np.int64, np.uint8, np.float16, np.complex64):
        for op in ("SUM", "PROD", "MAX", "MIN"):
            if op in ("MAX", "MIN") and np.dtype(dtype).kind == "c":
                continue
            for count in counts if op == "SUM" else counts[:2]:
                x = _operand(me, count, dtype)
                want = _operand(0, count, dtype)
                for r in range(1, n):
                    want = _NP[op](want, _operand(r, count, dtype)).astype(dtype)
                dist.all_reduce(x, op=getattr(dist.ReduceOp, op), async_op=True).wait()
                if not np.array_equal(x, want):
                    bad.append(f"all_reduce {np.dtype(dtype)} {op} {count}")
        for root in range(n):
            for count in (1, 5, (64 << 10) // np.dtype(dtype).itemsize):
                b = _operand(me, count, dtype)
                dist.broadcast(b, src=root, async_op=True).wait()
                if not np.array_equal(b, _operand(root, count, dtype)):
                    bad.append(f"broadcast {np.dtype(dtype)} root {root} {count}")
    # reduce, every root, up to one step and past it (REDUCE_ONE_SHOT: all ranks' bytes)
    from collcomm.transport.arena_layout import REDUCE_ONE_SHOT

    for dtype in (np.float32, np.int64):
        edge = REDUCE_ONE_SHOT // n // np.dtype(dtype).itemsize
        for count in (1, 7, edge, edge + 1):
            want = _operand(0, count, dtype)
            for r in range(1, n):
                want = (want + _operand(r, count, dtype)).astype(dtype)
            for root in range(n):
                x = _operand(me, count, dtype)
                dist.reduce(x, dst=root, async_op=True).wait()
                if not np.array_equal(x, want if me == root else _operand(me, count, dtype)):
                    bad.append(f"reduce {np.dtype(dtype)} {count} root {root}")
    # the other one-step calls: all_gather, gather, scatter, reduce_scatter (every root)
    for dtype in (np.float32, np.int64, np.float16):
        for k in (1, 3, 1000):
            mine = _operand(me, k, dtype)
            every = np.concatenate([_operand(r, k, dtype) for r in range(n)])
            ag = np.zeros(n * k, dtype)
            rs = np.zeros(k, dtype)
            works = [dist.all_gather_into_tensor(ag, mine, async_op=True),
                     dist.reduce_scatter_tensor(rs, np.tile(mine, n), async_op=True)]
            for w in works:
                w.wait()
            want_rs = _operand(0, k, dtype)
            for r in range(1, n):
                want_rs = (want_rs + _operand(r, k, dtype)).astype(dtype)
            if not (np.array_equal(ag, every) and np.array_equal(rs, want_rs)):
                bad.append(f"all_gather/reduce_scatter {np.dtype(dtype)} {k}")
            for root in range(n):
                parts = [np.zeros(k, dtype) for _ in range(n)] if me == root else None
                sc = np.zeros(k, dtype)
                blocks = [_operand(root + 10 * j, k, dtype) for j in range(n)] if me == root else None
                works = [dist.gather(mine, parts, dst=root, async_op=True),
                         dist.scatter(sc, blocks, src=root, async_op=True)]
                for w in reversed(works):
                    w.wait()
                if me == root and not all(np.array_equal(parts[r], _operand(r, k, dtype)) for r in range(n)):
                    bad.append(f"gather {np.dtype(dtype)} {k} root {root}")
                if not np.array_equal(sc, _operand(root + 10 * me, k, dtype)):
                    bad.append(f"scatter {np.dtype(dtype)} {k} root {root}")
    # 2-D, in place; mixed with queued and blocking calls, waited in reverse
    two_d = np.full((3, 2), me + 1.0)
    ag = np.zeros(2 * n, np.int16)
    b1, b2 = np.full(3, me, np.int64), np.full(4, float(me))
    y = np.full(2, me + 1.0, np.float32)
    works = [dist.all_reduce(two_d, async_op=True),
             dist.all_gather_into_tensor(ag, np.full(2, me, np.int16), async_op=True),
             dist.broadcast(b1, src=n - 1, async_op=True),
             dist.barrier(async_op=True)]
    dist.all_reduce(y)                                  # runs the queued ones first
    works.append(dist.broadcast(b2, src=0, async_op=True))
    for w in reversed(works):
        w.wait()
    total = n * (n + 1) / 2
    if (two_d.tolist() != [[total] * 2] * 3 or ag.tolist() != [r for r in range(n) for _ in "ab"]
            or b1.tolist() != [n - 1] * 3 or b2.tolist() != [0.0] * 4 or y.tolist() != [total] * 2):
        bad.append(f"mixed: {two_d.tolist()} {ag.tolist()} {b1.tolist()} {b2.tolist()} {y.tolist()}")
    # a blocking call right after an unwaited one finishes it first
    z = np.full(2, me + 1.0)
    w = dist.all_reduce(z, async_op=True)
    dist.barrier()
    if not (w.done and z.tolist() == [total] * 2):
        bad.append(f"unwaited: done {w.done} {z.tolist()}")
    w.wait()
    if n == 1:       # a world of one: a call runs whole at once in C, its Work done...
        if fast is not None:
            x2 = np.ones(4)
            works = {"all_reduce": dist.all_reduce(x2, async_op=True),
                     "broadcast": dist.broadcast(x2, src=0, async_op=True),
                     "barrier": dist.barrier(async_op=True),
                     "reduce": dist.reduce(x2, dst=0, async_op=True),
                     "all_gather": dist.all_gather_into_tensor(np.zeros(4), x2, async_op=True),
                     "reduce_scatter": dist.reduce_scatter_tensor(np.zeros(4), x2, async_op=True),
                     "gather": dist.gather(x2, [np.zeros(4)], dst=0, async_op=True),
                     "scatter": dist.scatter(np.zeros(4), [x2], src=0, async_op=True)}
            bad += [f"{name}: not done at once" for name, w in works.items() if not w.done]
        # ... unless a call waits in the queue before it (an explicit algorithm: queued
        # on the regular path)
        src, out, again = np.array([0.0, 2.0]), np.zeros(2), np.zeros(2)
        w1 = dist.all_gather_into_tensor(out, src, async_op=True, algorithm="ring")
        w2 = dist.all_gather_into_tensor(again, out, async_op=True)    # must run after w1
        # (the group's worker may have run both by now on a busy machine: only an order
        # broken is wrong here; a w2 run at once before w1 also leaves `again` zeros)
        if w2.done and not w1.done:
            bad.append(f"not queued: w1 done {w1.done}, w2 done {w2.done}")
        w2.wait()
        w1.wait()
        if again.tolist() != [0.0, 2.0]:
            bad.append(f"a call ran before the one queued ahead of it: {again.tolist()}")
        if fast is not None and fast.calls - started < 100:
            bad.append(f"only {fast.calls - started} calls took the fast call")
        return bad
    # on a subgroup of every rank but 0 (its own arena and fast call)
    sub = dist.new_group(list(range(1, n)))
    v = np.full(3, me + 1, np.int64)
    u = np.full(2, me, np.float32)
    if me > 0:
        works = [dist.all_reduce(v, group=sub, async_op=True),
                 dist.broadcast(u, group=sub, group_src=n - 2, async_op=True)]   # rank n-1
        for w in works:
            w.wait()
    else:
        v[:], u[:] = total - 1, n - 1
    if v.tolist() != [total - 1] * 3 or u.tolist() != [n - 1] * 2:
        bad.append(f"subgroup: {v.tolist()} {u.tolist()}")
    if fast is not None and fast.calls - started < 100:
        bad.append(f"only {fast.calls - started} calls took the fast call")
    return bad


@pytest.mark.timeout(240)
@pytest.mark.parametrize("n", [1, 2, 3])
def test_results_are_numpy_s(n: int) -> None:
    for bad in run_ranks(_matrix, n, transport="shm", timeout=200):
        assert bad == [], bad[:10]


def _mpi_requests() -> list[str]:
    """collcomm.MPI's I-calls on the same path: results, send buffers untouched, Waitall
    in reverse, Test polling."""
    from collcomm import MPI

    comm = MPI.COMM_WORLD
    r, n = comm.Get_rank(), comm.Get_size()
    bad = []
    a = np.full(3, r + 1.0)
    b = np.zeros(3)
    ip = np.full(2, r + 1, np.int32)
    red = np.zeros(2) if r == 0 else None
    gat = np.zeros(2 * n) if r == n - 1 else None
    sc = np.zeros(2)
    reqs = [comm.Iallreduce(a, b), comm.Iallreduce(MPI.IN_PLACE, ip, op=MPI.MAX),
            comm.Ireduce(a[:2], red, root=0), comm.Igather(np.full(2, float(r)), gat, root=n - 1),
            comm.Iscatter(np.arange(2.0 * n) if r == 1 else None, sc, root=1), comm.Ibarrier()]
    MPI.Request.Waitall(list(reversed(reqs)))
    total = n * (n + 1) / 2
    if b.tolist() != [total] * 3 or a.tolist() != [r + 1.0] * 3 or ip.tolist() != [n] * 2:
        bad.append(f"Iallreduce {a} {b} {ip}")
    if r == 0 and red.tolist() != [total] * 2:
        bad.append(f"Ireduce {red}")
    if r == n - 1 and gat.tolist() != [float(q) for q in range(n) for _ in "ab"]:
        bad.append(f"Igather {gat}")
    if sc.tolist() != [2.0 * r, 2.0 * r + 1]:
        bad.append(f"Iscatter {sc}")
    x = np.full(2, float(r))
    q = comm.Ibcast(x, root=n - 1)
    while not q.Test():
        pass
    if x.tolist() != [n - 1.0] * 2:
        bad.append(f"Ibcast {x}")
    return bad


@pytest.mark.timeout(120)
def test_mpi_requests() -> None:
    for bad in run_ranks(_mpi_requests, 3, transport="shm", timeout=90):
        assert bad == [], bad


def _burst() -> list[str]:
    """Bursts of small async calls (a call whose predecessor everybody has joined starts at
    once too; the others queue), one rank sometimes late, waited in order or in reverse."""
    import collcomm as dist

    me, n = dist.get_rank(), dist.get_world_size()
    total = n * (n + 1) / 2
    bad = []
    for rnd in range(40):
        xs = [np.full(3, me + 1.0 + i) for i in range(12)]
        bs = [np.full(2, float(me + i)) for i in range(12)]
        works = []
        for i in range(12):
            if me == rnd % n and i == rnd % 12:
                time.sleep(0.002)                       # late: the others queue behind
            works.append(dist.all_reduce(xs[i], async_op=True))
            works.append(dist.broadcast(bs[i], src=i % n, async_op=True))
        for w in (reversed(works) if rnd % 2 else works):
            w.wait()
        for i in range(12):
            if xs[i].tolist() != [total + n * i] * 3 or bs[i].tolist() != [float(i % n + i)] * 2:
                bad.append(f"round {rnd} call {i}: {xs[i].tolist()} {bs[i].tolist()}")
    return bad


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [2, 3])
def test_bursts(n: int) -> None:
    for bad in run_ranks(_burst, n, transport="shm", timeout=90):
        assert bad == [], bad[:5]
