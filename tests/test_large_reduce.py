"""reduce past a slot on the shared-memory arena, staged slot by slot (between two ranks
as a pipeline: shm_reduce._reduce_pair, the native core's reduce_pair), in C or Python
alike, and with a Python rank among native ones. Slots of
256 KiB make a few-MB buffer go past a slot. Every root, in place and out of place,
several dtypes and ops, odd counts; the values are small integers so every order of
reduction gives the same bits, and the result is checked against numpy.
"""
from __future__ import annotations

import numpy as np
import pytest

from tests.harness import run_ranks

SLOT = 256 << 10
CASES = (("float32", "sum", 300_007), ("int64", "max", 70_001), ("float64", "prod", 65_537),
         ("int32", "sum", 1_000_003), ("float32", "min", 5))


def _value(dt: str, rank: int, count: int) -> np.ndarray:
    return ((np.arange(count) * 7 + rank * 3) % 5 + 1).astype(dt)


def _cases() -> int:
    import collcomm as dist

    n, me = dist.get_world_size(), dist.get_rank()
    ops = {"sum": (dist.ReduceOp.SUM, np.add), "max": (dist.ReduceOp.MAX, np.maximum),
           "prod": (dist.ReduceOp.PRODUCT, np.multiply), "min": (dist.ReduceOp.MIN, np.minimum)}
    done = 0
    for dt, name, count in CASES:
        op, ufunc = ops[name]
        want = _value(dt, 0, count)
        for r in range(1, n):
            want = ufunc(want, _value(dt, r, count)).astype(dt)
        for root in range(n):
            buf = _value(dt, me, count)                 # torch's in-place reduce
            dist.reduce(buf, dst=root, op=op)
            if me == root:
                assert np.array_equal(buf, want), (dt, name, count, root)
            else:
                assert np.array_equal(buf, _value(dt, me, count)), "a non-root's buffer changed"
            done += 1
    # the group still works, and a mismatched count raises on every rank
    if n > 1:
        with pytest.raises(dist.MismatchError):
            dist.reduce(np.ones(300_007 + me, np.float32), dst=0)
        buf = np.ones(300_007, np.float32)
        dist.reduce(buf, dst=n - 1)
        if me == n - 1:
            assert np.array_equal(buf, np.full(300_007, n, np.float32))
    return done


ROWS = [(1, {}), (2, {}), (3, {}), (4, {"COLLCOMM_CMA": "0"}), (2, {"COLLCOMM_NATIVE": "0"}),
        (3, {"COLLCOMM_CMA": "0", "COLLCOMM_NATIVE": "0"})]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n,env", ROWS, ids=[
    f"n{n}-" + ("-".join(f"{k[9:]}={v}" for k, v in e.items()) or "measured") for n, e in ROWS])
def test_large_reduce(n, env):
    res = run_ranks(_cases, n, env={"COLLCOMM_SHM_SLOT": str(SLOT), **env}, timeout=100)
    assert len(set(res)) == 1 and res[0] == len(CASES) * n


@pytest.mark.timeout(60)
@pytest.mark.parametrize("n", [2, 3])
def test_large_reduce_native_and_python_ranks_together(n):
    # (n = 2: the pipelined pair, reduce_pair in C and _reduce_pair in Python, step for step)
    res = run_ranks(_cases, n, env={"COLLCOMM_SHM_SLOT": str(SLOT)}, timeout=100,
                    rank_env={1: {"COLLCOMM_NATIVE": "0"}})
    assert len(set(res)) == 1 and res[0] == len(CASES) * n


def _pair_cases() -> list:
    """reduce between two ranks past REDUCE_PAIR_FROM (and a 1 MiB slot, or within the
    default one), and at its edge (the last size by CMA, the first pipelined), through the
    core layer (out of place and
    in place, roots 0 and 1): steps of an eighth of the buffer, not a multiple of the
    itemsize for some dtypes; random data with signed zeros and NaNs up front, so a swap of
    the operands shows in the bits (max/min of -0.0 and 0.0, NaN payloads). Each result is
    compared bit for bit with numpy's in rank order."""
    import collcomm.core.collectives as cc
    from collcomm import ReduceOp
    from collcomm.core import runtime
    from collcomm.transport.arena_layout import REDUCE_PAIR_FROM

    g = runtime.get_world("test")
    me = g.rank
    out = []
    edge = REDUCE_PAIR_FROM // 4       # float32: the last count by CMA, and the first pipelined
    for dt, count in (("float64", 500_001), ("float32", 700_003), ("complex64", 300_001),
                      ("int16", 1_500_001), ("float32", edge), ("float32", edge + 1)):
        rng = np.random.default_rng(7)
        a = [(rng.standard_normal(count) * 100).astype(dt) for _ in range(2)]
        if dt.startswith("float"):
            a[0][:4] = [-0.0, 0.0, np.nan, 1.0]
            a[1][:4] = [0.0, -0.0, 1.0, -np.nan]
        for op, uf in ((ReduceOp.SUM, np.add), (ReduceOp.MAX, np.maximum), (ReduceOp.MIN, np.minimum)):
            if dt == "complex64" and op is not ReduceOp.SUM:
                continue
            with np.errstate(all="ignore"):
                want = uf(a[0], a[1])
            for root in (0, 1):
                for in_place in (True, False):
                    send = a[me].copy()
                    recv = (send if in_place else np.full(count, 3, dt)) if me == root else None
                    cc.reduce(g, send, recv, op, root)
                    got = recv if me == root else send
                    expect = want if me == root else a[me]
                    out.append((dt, str(op), root, in_place,
                                bool(np.array_equal(got.view(np.uint8), expect.view(np.uint8)))))
    return [g._arena.slot] + out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("slot", [1 << 20, None], ids=["past-a-slot", "within-the-default-slot"])
@pytest.mark.parametrize("python_rank", [None, 0, 1])
def test_reduce_pair_bits_steps_and_mixed_ranks(python_rank, slot):
    # (the default slot, 4 MiB, holds every buffer: pipelined past REDUCE_PAIR_FROM there)
    env = None if python_rank is None else {python_rank: {"COLLCOMM_NATIVE": "0"}}
    res = run_ranks(_pair_cases, 2, env={"COLLCOMM_SHM_SLOT": str(slot)} if slot else None,
                    timeout=100, rank_env=env)
    slots = [rank.pop(0) for rank in res]
    bad = [case for rank in res for case in rank if not case[-1]]
    assert not bad, bad
    assert len(res[0]) == len(res[1]) == 64
    if slot is None and min(slots) < 4_000_008:      # (the largest buffer: 500_001 float64)
        pytest.skip(f"the arena's slot came back at {min(slots)} bytes (a small /dev/shm): "
                    "the buffers did not all fit one slot")
    assert slots == [slot or 4 << 20] * 2, slots        # (the default: every buffer fits)
