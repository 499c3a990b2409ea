"""``torch.distributed.all_reduce(async_op=True)`` on the collcomm backend: one plain CPU
tensor goes straight to the core's queue (ProcessGroupCollcomm._async_all_reduce), to run
through the fast call; anything else (several tensors, a strided or bfloat16 tensor, AVG,
PREMUL_SUM) takes the general path. Results, futures, the fast call really taken, a
tensor whose Work and name are dropped before the call ran, and errors translated."""
from __future__ import annotations

from typing import Any

import pytest

from tests.harness import TORCH, run_ranks

pytest.importorskip("torch")


def _async_calls() -> dict[str, Any]:
    import gc

    import torch
    import torch.distributed as dist

    import collcomm.torch  # noqa: F401 - registers the backend

    dist.init_process_group("collcomm")
    me, n = dist.get_rank(), dist.get_world_size()
    total = n * (n + 1) / 2
    dist.barrier()
    g = dist.group.WORLD.core_group
    out: dict[str, Any] = {}
    before = g.fast.calls if g.fast is not None else 0

    t = torch.full((3,), me + 1.0)
    w = dist.all_reduce(t, async_op=True)
    out["plain"] = (w.wait(), t.tolist())
    t = torch.full((4,), me + 1, dtype=torch.int32)
    fut = dist.all_reduce(t, op=dist.ReduceOp.MAX, async_op=True).get_future()
    out["future"] = [x.tolist() for x in fut.wait()]
    out["fast"] = (g.fast.calls - before) if g.fast is not None else None

    # the general path: strided, bfloat16, AVG, two in flight
    s = torch.full((6,), me + 1.0)[::2]
    b = torch.full((2,), me + 1.0, dtype=torch.bfloat16)
    a = torch.full((2,), float(me))
    works = [dist.all_reduce(s, async_op=True), dist.all_reduce(b, async_op=True),
             dist.all_reduce(a, op=dist.ReduceOp.AVG, async_op=True)]
    for x in works:
        x.wait()
    out["general"] = (s.tolist(), b.float().tolist(), a.tolist())

    # queued with its tensor and Work dropped: the queued call keeps the memory alive
    dist.all_reduce(torch.full((1 << 12,), me + 1.0), async_op=True)
    gc.collect()
    junk = [torch.full((1 << 12,), -7.0) for _ in range(8)]   # reuse freed memory if any
    check = torch.full((2,), me + 1.0)
    dist.all_reduce(check)                 # runs the queued call first, then this one
    out["dropped"] = (check.tolist(), all(bool((j == -7).all()) for j in junk))

    try:
        dist.all_reduce(torch.ones(2, dtype=torch.complex64), op=dist.ReduceOp.MAX, async_op=True).wait()
        out["error"] = "no error"
    except Exception as exc:  # noqa: BLE001 - its type and text are checked
        out["error"] = f"{type(exc).__name__}: {exc}"
    out["total"] = total
    dist.destroy_process_group()
    return out


@pytest.mark.timeout(120)
def test_async_all_reduce_of_torch_tensors() -> None:
    n = 3
    for me, out in enumerate(run_ranks(_async_calls, n, transport="shm", timeout=100, init=False, preload=TORCH)):
        total = out["total"]
        assert out["plain"] == (True, [total] * 3), out
        assert out["future"] == [[n] * 4], out
        assert out["fast"] in (2, None), out          # both went through the fast call
        assert out["general"] == ([total] * 3, [total] * 2, [(n - 1) / 2] * 2), out
        assert out["dropped"] == ([total] * 2, True), out
        assert "all_reduce" in out["error"] and "MAX" in out["error"], out
