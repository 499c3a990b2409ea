"""Zero-copy buffers (collcomm.empty & co): allocation, in-place collectives, cleanup."""
from __future__ import annotations

import gc

import numpy as np
import pytest

import collcomm as dist
import collcomm.core.runtime as rt
from tests.harness import TORCH, run_ranks


def _expect(cond: bool, what: str, bad: list[str]) -> None:
    if not cond:
        bad.append(what)


def shared_collectives(sizes):
    r, n = dist.get_rank(), dist.get_world_size()
    bad: list[str] = []
    for k in sizes:
        for mine_shared in (True, False, r % 2 == 0):   # all, none, and a mix of ranks
            x_shared = dist.empty(k, np.float64)      # collective: every rank allocates
            x = x_shared if mine_shared else np.empty(k)
            x[:] = np.arange(k) + r
            dist.all_reduce(x)
            _expect(np.array_equal(x, n * np.arange(k) + n * (n - 1) / 2), f"all_reduce k={k} {mine_shared}", bad)
            x[:] = np.arange(k) * (r + 1)
            dist.all_reduce(x, op=dist.ReduceOp.MAX)
            _expect(np.array_equal(x, np.arange(k) * n), f"all_reduce max k={k}", bad)
            for root in range(n):
                z_shared = dist.full(k, r, dtype=np.int32)
                z = z_shared if mine_shared else np.full(k, r, np.int32)
                dist.broadcast(z, root)
                _expect(bool((z == root).all()), f"broadcast k={k} root={root}", bad)
            src_shared = dist.empty(k, np.float32)
            src = src_shared if mine_shared else np.empty(k, np.float32)
            src[:] = np.arange(k) + 10 * r
            out = dist.empty((n, k), np.float32)
            dist.all_gather_into_tensor(out, src)
            want = np.arange(k)[None, :] + 10 * np.arange(n)[:, None]
            _expect(np.array_equal(out, want), f"all_gather k={k} {mine_shared}", bad)
            _expect(dist.is_shared(out) == (n > 1 and k > 0 and rt.get_world("t").can_share_memory),
                    "is_shared", bad)
    return bad


def heap_is_released():
    world = rt.get_world("t")
    heap = world.transport.heap
    before = len(heap)
    a = dist.zeros((256, 256), np.float64)
    b = a[10:20]          # a view keeps the segment alive
    during = len(heap)
    del a
    gc.collect()
    still = len(heap)
    del b
    gc.collect()
    return before, during, still, len(heap)


def torch_shared():
    import torch

    t = dist.zeros((4, 3), dtype=torch.float32)
    t += dist.get_rank() + 1
    dist.all_reduce(t)
    n = dist.get_world_size()
    ok = isinstance(t, torch.Tensor) and bool((t == n * (n + 1) / 2).all())
    bf = dist.full(5, 1.5, dtype=torch.bfloat16)
    dist.all_reduce(bf)
    return ok and bf.dtype == torch.bfloat16 and bool((bf.float() == 1.5 * n).all())


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_shared_buffers_shm(n):
    # 600_001 float64 > the 4 MiB staging slot: chunked; 5 elements: the small path
    assert run_ranks(shared_collectives, n, [0, 5, 600_001], transport="shm") == [[]] * n


@pytest.mark.timeout(120)
def test_shared_buffers_over_tcp_are_plain_arrays():
    assert run_ranks(shared_collectives, 3, [0, 5, 70_001], transport="tcp") == [[]] * 3


@pytest.mark.timeout(60)
def test_heap_forgets_garbage():
    for before, during, still, after in run_ranks(heap_is_released, 2, transport="shm"):
        assert (before, during, still, after) == (0, 1, 1, 0)


@pytest.mark.timeout(60)
def test_torch_dtype_gives_tensors():
    pytest.importorskip("torch")
    assert run_ranks(torch_shared, 2, transport="shm", preload=TORCH) == [True, True]
