"""The torch backend's fast calls (collcomm/torch/fast.py): every blocking call of plain
CPU tensors that the group's fast call takes gives the same results as the regular path,
a rank on the fast call and a rank on the regular path (``COLLCOMM_FAST=0``) meet in one
job, the fast call is really taken, and what it declines (uneven splits, AVG, bfloat16,
non-contiguous tensors, bad lists) goes the regular way with the regular errors."""
from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

from tests.harness import TORCH, run_ranks

pytest.importorskip("torch")


def _every_call() -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    import collcomm.torch  # noqa: F401 - registers the backend

    dist.init_process_group("collcomm")
    me, n = dist.get_rank(), dist.get_world_size()
    dist.barrier()                            # the arena's first call goes the regular way
    fast = dist.group.WORLD.core_group.fast
    before = fast.calls if fast is not None else 0
    bad: list[str] = []
    calls = 0

    def same(what: str, got: Any, want: Any) -> None:
        if not np.array_equal(np.asarray(got), np.asarray(want)):
            bad.append(f"rank {me}: {what}: got {np.asarray(got).tolist()}, want {np.asarray(want).tolist()}")

    def mine(r: int, count: int, dtype: Any) -> Any:
        return torch.arange(count, dtype=dtype) + 10 * r + 1

    for dtype in (torch.float32, torch.int64, torch.int8):
        for count in (0, 1, 5):
            for root in range(n):
                t = mine(me, count, dtype)
                dist.reduce(t, dst=root, op=dist.ReduceOp.SUM)
                same(f"reduce {dtype} {count} root {root}", t,
                     sum(mine(r, count, dtype) for r in range(n)) if me == root else mine(me, count, dtype))
                outs = [torch.full((count,), -1, dtype=dtype) for _ in range(n)] if me == root else None
                dist.gather(mine(me, count, dtype), gather_list=outs, dst=root)
                if me == root:
                    for r in range(n):
                        same(f"gather {dtype} {count} root {root} [{r}]", outs[r], mine(r, count, dtype))
                out = torch.full((count,), -1, dtype=dtype)
                ins = [mine(r, count, dtype) * 2 for r in range(n)] if me == root else None
                dist.scatter(out, scatter_list=ins, src=root)
                same(f"scatter {dtype} {count} root {root}", out, mine(me, count, dtype) * 2)
                calls += 3 if count else 0     # an empty call goes the regular way
            t = mine(me, count, dtype)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            same(f"all_reduce MAX {dtype} {count}", t, mine(n - 1, count, dtype))
            lst = [torch.empty(count, dtype=dtype) for _ in range(n)]
            dist.all_gather(lst, mine(me, count, dtype))
            for r in range(n):
                same(f"all_gather {dtype} {count} [{r}]", lst[r], mine(r, count, dtype))
            full = torch.cat([mine(r, n * count, dtype) for r in range(n)])
            rs = torch.empty(count, dtype=dtype)
            dist.reduce_scatter_tensor(rs, mine(me, n * count, dtype))
            same(f"reduce_scatter_tensor {dtype} {count}", rs,
                 sum(mine(r, n * count, dtype) for r in range(n))[me * count:(me + 1) * count])
            a2a = torch.empty(n * count, dtype=dtype)
            dist.all_to_all_single(a2a, mine(me, n * count, dtype))
            same(f"all_to_all_single {dtype} {count}", a2a,
                 torch.cat([full[r * n * count + me * count:r * n * count + (me + 1) * count]
                            for r in range(n)]))
            dist.barrier()
            calls += 5 if count else 1
    taken = (fast.calls - before) if fast is not None else None

    # tensors reused call after call (tensors.call_array keeps their arrays): the right
    # values every time, and no tensor.numpy() per call once kept (on the fast call)
    t, outs, scalar, numpys = torch.zeros(3), torch.zeros(3 * n), torch.tensor(0.0), []
    real = torch.Tensor.numpy
    torch.Tensor.numpy = lambda self, *a, **k: (numpys.append(1), real(self, *a, **k))[1]
    for i in range(5):
        t.fill_(me + i)
        scalar.fill_(me * i)
        dist.all_gather_into_tensor(outs, t)
        dist.all_reduce(t)
        dist.broadcast(scalar, n - 1)
        if i < 2:    # the second sighting keeps them
            numpys.clear()
        got = len(numpys)
        same(f"reused all_gather_into_tensor {i}", outs,
             torch.tensor([float(r + i) for r in range(n) for _ in range(3)]))
        same(f"reused all_reduce {i}", t, torch.full((3,), float(sum(range(n)) + n * i)))
        same(f"reused 0-d broadcast {i}", scalar, torch.tensor(float((n - 1) * i)))
        del numpys[got:]     # same()'s own
    torch.Tensor.numpy = real
    # a group of one runs an async call at once (a completed Work), unless an earlier one
    # is pending (then it is queued behind it); with peers it is queued, and it runs through
    # the fast call when it is waited for (an AVG queued before it: the regular path)
    async_taken: list[Any] = []
    calls_now = (lambda: fast.calls) if fast is not None else (lambda: 0)
    t, k0 = torch.ones(2) * (me + 1), calls_now()
    w = dist.all_reduce(t, async_op=True)
    async_taken.append((calls_now() - k0, w.is_completed() if n == 1 else False))
    w.wait()
    same("async all_reduce", t, torch.ones(2) * sum(range(1, n + 1)))
    k0 = calls_now()
    w1 = dist.all_reduce(t, op=dist.ReduceOp.AVG, async_op=True)   # the regular path
    w2 = dist.all_reduce(t, async_op=True)
    w2.wait()
    w1.wait()
    async_taken.append(calls_now() - k0)
    same("async AVG then SUM", t, torch.ones(2) * sum(range(1, n + 1)) * n)
    fut = dist.all_gather_into_tensor(torch.zeros(n), torch.ones(1), async_op=True).get_future()
    same("async all_gather_into_tensor", fut.wait()[0], torch.ones(n))
    # the group's methods called without options (torch.distributed has no AllgatherOptions)
    pg, lst, one = dist.group.WORLD, [torch.zeros(2) for _ in range(n)], torch.zeros(2 * n)
    pg.allgather([lst], [torch.ones(2) * me]).wait()
    pg._allgather_base(one, torch.ones(2) * me).wait()
    same("allgather without options", torch.cat(lst), torch.arange(n).repeat_interleave(2))
    same("_allgather_base without options", one, torch.arange(n).repeat_interleave(2))

    # what the fast call declines goes the regular way, with the same results
    t = torch.ones(4) * (me + 1)
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    same("AVG", t, torch.ones(4) * (n + 1) / 2)
    x = torch.arange(6 * n, dtype=torch.float32).reshape(2, 3 * n)[:, ::3].contiguous().t()
    dist.reduce(x, dst=0)                                    # non-contiguous
    splits = [1] * n
    a2a = torch.empty(n)
    dist.all_to_all_single(a2a, torch.arange(n, dtype=torch.float32) + 10 * me, splits, splits)
    same("all_to_all_single with splits", a2a, torch.tensor([10.0 * r + me for r in range(n)]))
    bf = torch.ones(3, dtype=torch.bfloat16)
    dist.reduce_scatter_tensor(torch.empty(1, dtype=torch.bfloat16), torch.ones(n, dtype=torch.bfloat16))

    # a bad list on a root that is alone in the call: raised before any traffic
    errors = []
    for call in ("gather", "scatter"):
        try:
            if call == "gather":
                dist.gather(torch.ones(2), gather_list=[torch.ones(2)] * (n + 1), dst=me)
            else:
                dist.scatter(torch.ones(2), scatter_list=[torch.ones(3)] * n, src=me)
            bad.append(f"rank {me}: {call} with a bad list did not raise")
        except ValueError as exc:
            errors.append(re.sub(r"rank \d+", "rank R", str(exc)))

    # a mismatched root: every rank raises, on either path
    mismatch = None
    try:
        dist.reduce(torch.ones(2), dst=me % 2)
    except dist.DistBackendError as exc:
        mismatch = type(exc).__name__
    dist.destroy_process_group()
    from collcomm import native
    return {"bad": bad, "taken": taken, "calls": calls, "errors": errors, "numpys": len(numpys),
            "async": async_taken,
            "mismatch": mismatch, "bf": bf.float().tolist(), "native": native.core is not None}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n,regular", [(1, None), (3, 1)])
def test_torch_fast_calls_match_the_regular_path(n: int, regular: int | None) -> None:
    env = {regular: {"COLLCOMM_FAST": "0"}} if regular is not None else None
    res = run_ranks(_every_call, n, transport="shm", timeout=100, init=False, rank_env=env, preload=TORCH)
    for r, out in enumerate(res):
        assert not out["bad"], "\n".join(out["bad"][:20])
        if r == regular or not out["native"]:   # (no native core, e.g. COLLCOMM_NATIVE=0: no fast call)
            assert out["taken"] is None
        else:   # every call above was one fast call (the first dtype's barrier included)
            assert out["taken"] == out["calls"], out
            assert out["numpys"] == 0, out
            assert out["async"] == ([(1, True), 1] if n == 1 else [(0, False), 1]), out
    assert len({tuple(o["errors"]) for o in res}) == 1 and len(res[0]["errors"]) == 2, res
    if n > 1:
        assert all(o["mismatch"] == "BackendMismatchError" for o in res), res
