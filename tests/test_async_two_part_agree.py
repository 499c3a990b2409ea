"""A call goes the same way on every rank, whichever ranks start it in two parts.

Whether a call starts in two parts (native/_fastcall_parts.c) is one rank's affair: the
call is asynchronous there, the group has nothing queued, the native core is built. The
way the call goes (staged in one step, by cross-memory attach, in pair steps) must be
every rank's, or a rank leaves the call while its peer still reads its memory. Found by a
random mix of calls (session 26): between two ranks, a reduce of 16-32 KiB a rank goes by
CMA (the root reads the other's buffer, a closing sync), but started in two parts it was
staged in one step, with no closing sync; its root, in the whole call, then read a
buffer the other rank had let go of ("Bad address", wrong sums, or the next call's
signature). Here each rank's send buffer is overwritten the moment its call returns, so a
late read shows as a wrong result.

The mixes, at n = 2, at the sizes where a whole call leaves the one-step staged way:
rank 0 asynchronous and rank 1 blocking, the reverse, and both asynchronous with rank 1
on the pure-Python path (COLLCOMM_NATIVE=0). And such a call, declined as a two-part
start, is queued, not run at once: its caller stays free to send what its peer waits for
before the call (a review found the first fix, a refusal in the core, ran it whole and
blocked there).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from collcomm import native
from tests.harness import run_ranks

pytestmark = pytest.mark.skipif(native.core is None, reason=f"native core: {native.reason}")

POISON = -7


def _operand(rank: int, count: int, dtype: Any) -> np.ndarray:
    return ((np.arange(count) % 5) + 3 * rank + 1).astype(dtype)


def _run(call: Any, asynchronous: bool, **kw: Any) -> None:
    w = call(async_op=asynchronous, **kw)
    if w is not None:
        w.wait()


def _mixes(async_ranks: list[int]) -> dict[str, Any]:
    """Every case with this rank's calls asynchronous when its rank is in async_ranks;
    returns what differs from numpy, and whether the arena reads peers by CMA."""
    import collcomm as dist

    me, n = dist.get_rank(), dist.get_world_size()
    mine = me in async_ranks
    bad: list[str] = []
    dist.all_reduce(np.ones(1))                      # the arena (and its fast call) first
    for dtype in (np.float32, np.int16):
        isz = np.dtype(dtype).itemsize
        for nbytes in (16 << 10, 24 << 10, 32 << 10, 64 << 10):
            count = nbytes // isz
            for root in range(n):
                for rep in range(3):          # (the reduce's root: its x is the result)
                    x = _operand(me, count, dtype)
                    _run(lambda **kw: dist.reduce(x, dst=root, **kw), mine)
                    got = x.copy()
                    x[:] = POISON                # a read after the call returned shows
                    want = (_operand(0, count, dtype) + _operand(1, count, dtype)).astype(dtype)
                    if me == root and not np.array_equal(got, want):
                        bad.append(f"reduce {np.dtype(dtype)} {nbytes} B root {root}")
                b = _operand(me, count, dtype)
                _run(lambda **kw: dist.broadcast(b, src=root, **kw), mine)
                got = b.copy()
                b[:] = POISON
                if not np.array_equal(got, _operand(root, count, dtype)):
                    bad.append(f"broadcast {np.dtype(dtype)} {nbytes} B root {root}")
                k = count // n
                s = _operand(me, k, dtype)
                views = [np.zeros(k, dtype) for _ in range(n)] if me == root else None
                _run(lambda **kw: dist.gather(s, views, dst=root, **kw), mine)
                s[:] = POISON
                if me == root and not all(np.array_equal(views[r], _operand(r, k, dtype)) for r in range(n)):
                    bad.append(f"gather {np.dtype(dtype)} {nbytes} B root {root}")
                big = _operand(root, k * n, dtype) if me == root else None
                parts = [big[r * k:(r + 1) * k] for r in range(n)] if me == root else None
                o = np.zeros(k, dtype)
                _run(lambda **kw: dist.scatter(o, parts, src=root, **kw), mine)
                if big is not None:
                    big[:] = POISON
                if not np.array_equal(o, _operand(root, k * n, dtype)[me * k:(me + 1) * k]):
                    bad.append(f"scatter {np.dtype(dtype)} {nbytes} B root {root}")
            k = count // n
            s = _operand(me, k, dtype)
            ag = np.zeros(k * n, dtype)
            _run(lambda **kw: dist.all_gather_into_tensor(ag, s, **kw), mine)
            s[:] = POISON
            if not np.array_equal(ag, np.concatenate([_operand(r, k, dtype) for r in range(n)])):
                bad.append(f"all_gather {np.dtype(dtype)} {nbytes} B")
    dist.barrier()
    from collcomm.core.runtime import get_world
    return {"bad": bad, "cma": bool(get_world("test").run("test", lambda c: c.arena()).cma)}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("async_ranks", [[0], [1]], ids=["rank0-async", "rank1-async"])
def test_one_rank_asynchronous_the_other_blocking(async_ranks: list[int]) -> None:
    res = run_ranks(_mixes, 2, async_ranks, transport="shm", timeout=150)
    assert [r["bad"] for r in res] == [[], []]
    if not res[0]["cma"]:
        pytest.skip("no cross-memory attach here: no reduce goes by CMA (the results hold)")


@pytest.mark.timeout(180)
def test_both_asynchronous_with_a_pure_python_rank() -> None:
    res = run_ranks(_mixes, 2, [0, 1], transport="shm", timeout=150, rank_env={1: {"COLLCOMM_NATIVE": "0"}})
    assert [r["bad"] for r in res] == [[], []]
    if not res[0]["cma"]:
        pytest.skip("no cross-memory attach here: no reduce goes by CMA (the results hold)")


def _progress(nbytes: int) -> dict[str, Any]:
    """Rank 0 starts a reduce to itself asynchronously, sends, then waits; rank 1 receives
    first and then makes the reduce: legal (MPI's nonblocking calls allow it), and it must
    not block rank 0 in the call it started (a two-part start that the core refused ran the
    whole call at once, so rank 0 waited for rank 1 while rank 1 waited for its send)."""
    import time

    import collcomm as dist

    me = dist.get_rank()
    dist.all_reduce(np.ones(1))
    count = nbytes // 4
    x = _operand(me, count, np.float32)
    t = np.zeros(1, np.int64)
    t0 = time.monotonic()
    if me == 0:
        w = dist.reduce(x, dst=0, async_op=True)
        started = time.monotonic() - t0
        dist.send(np.array([7]), dst=1)
        w.wait()
    else:
        dist.recv(t, src=0)
        started = 0.0
        dist.reduce(x, dst=0)
    want = (_operand(0, count, np.float32) + _operand(1, count, np.float32))
    from collcomm.core.runtime import get_world
    cma = get_world("test").run("test", lambda c: c.arena()).cma
    return {"ok": bool(me != 0 or np.array_equal(x, want)), "got": int(t[0]), "started": started,
            "cma": cma}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("nbytes", [1 << 10, 16 << 10, 24 << 10, 32 << 10, 256 << 10])
def test_an_asynchronous_reduce_leaves_its_caller_free(nbytes: int) -> None:
    res = run_ranks(_progress, 2, nbytes, transport="shm", timeout=90, env={"COLLCOMM_TIMEOUT": "30"})
    assert res[0]["ok"] and res[1]["got"] == 7
    assert res[0]["started"] < 5.0, res[0]     # the async call returned at once
    if not res[0]["cma"]:
        pytest.skip("no cross-memory attach here: no reduce goes by CMA (the progress holds)")
