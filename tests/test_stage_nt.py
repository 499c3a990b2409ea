"""COLLCOMM_STAGE_NT=1: the native core writes staged copies of 64 KiB or more with
streaming (non-temporal) stores (native/_stage_nt.c). Results stay bit for bit what they
are with plain stores, ranks in C and on the Python path together; the switch is read and
checked; below 64 KiB nothing is streamed."""
from __future__ import annotations

import numpy as np
import pytest

from collcomm import native
from tests.harness import run_ranks
from tests.native_common import lone_core

pytestmark = pytest.mark.skipif(native.core is None, reason="the native core is not built")


def test_the_switch(monkeypatch):
    assert lone_core().stage_nt == 0 and lone_core(stage_nt=1).stage_nt == 1
    with pytest.raises(ValueError, match="stage_nt"):
        lone_core(stage_nt=2)
    monkeypatch.setenv("COLLCOMM_STAGE_NT", "1")
    assert native.stage_nt() == 1
    monkeypatch.setenv("COLLCOMM_STAGE_NT", "yes")
    with pytest.warns(RuntimeWarning, match="neither 0 nor 1"):
        assert native.stage_nt() == 0
    monkeypatch.delenv("COLLCOMM_STAGE_NT")
    assert native.stage_nt() == 0 and native.core.NT_MIN == 64 << 10


#: (dtype, elements): odd counts, 1/2/4/8-byte items, all but the last >= 64 KiB a rank
CASES = [(np.float32, 40_001), (np.float16, 65_537), (np.int8, 300_001), (np.float64, 20_000),
         (np.int32, 1_001)]


def _collectives() -> tuple:
    """The staged collectives that write through stage() on every rank, checked against
    numpy; then (the core's switch, copies it streamed) or (None, 0) on the Python path."""
    import collcomm as dist
    from collcomm.core import runtime as rt

    me, n = dist.get_rank(), dist.get_world_size()
    for dt, count in CASES:
        base = (np.arange(count) % 13).astype(dt)
        total = sum((base + r for r in range(n)), np.zeros(count, dt))
        mine = base + me
        out = np.zeros(count * n, dt)
        dist.all_gather_into_tensor(out, mine)
        assert np.array_equal(out, np.concatenate([base + r for r in range(n)])), dt
        buf = base + 5 if me == 1 else np.zeros(count, dt)
        dist.broadcast(buf, src=1)
        assert np.array_equal(buf, base + 5), dt
        acc = mine.copy()
        dist.all_reduce(acc)
        assert np.array_equal(acc, total), dt
        red = mine.copy()
        dist.reduce(red, dst=0)
        if me == 0:
            assert np.array_equal(red, total), dt
        parts = [np.zeros(count, dt) for _ in range(n)] if me == n - 1 else None
        dist.gather(mine, parts, dst=n - 1)
        if me == n - 1:
            assert all(np.array_equal(p, base + r) for r, p in enumerate(parts)), dt
    arena = rt.get_world("test")._arena
    core = None if arena is None else arena.native_core
    return (None, 0) if core is None else (core.stage_nt, core.streamed)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("setting", ["1", "0"])
def test_streamed_copies_give_the_same_results(setting: str) -> None:
    """Rank 1 runs the Python path and reads what the C ranks streamed."""
    env = {"COLLCOMM_STAGE_NT": setting, "COLLCOMM_CMA_COST": "9"}   # staged at these sizes
    res = run_ranks(_collectives, 3, transport="shm", timeout=100, env=env,
                    rank_env={1: {"COLLCOMM_NATIVE": "0"}})
    assert res[1] == (None, 0)
    for switch, streamed in (res[0], res[2]):
        assert switch == int(setting)
        # every rank stages its block in an all_gather, all_reduce and reduce of each case,
        # and rank 2 none in a gather it roots: at least 3 copies a large case
        assert streamed >= 3 * 4 if setting == "1" else streamed == 0
