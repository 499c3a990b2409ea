"""collcomm.helpers.allreduce_gradients / GradientBuckets: bucketed, overlapped gradient sync.

In one process (no init) it is the identity. On 3 ranks: ~100 numpy arrays of mixed sizes
and dtypes, mean and sum, buckets of several sizes (one bucket per array, several, one for
everything); a bucket starts as soon as it is full (before the caller's next add); torch
Parameters' ``.grad`` (and bfloat16 gradients) are reduced in place, parameters without a
gradient skipped.
"""
from __future__ import annotations

import numpy as np
import pytest

from collcomm import helpers
from collcomm.errors import InvalidArgumentError
from tests.harness import TORCH, run_ranks

SIZES = [(i * 37) % 500 + 1 for i in range(100)]


def arrays(r: int) -> list[np.ndarray]:
    out = []
    for i, n in enumerate(SIZES):
        dtype = (np.float32, np.float64, np.int64)[i % 3]
        out.append(((np.arange(n) * 3 + i + r * 11) % 17).astype(dtype))
    return out


def test_one_process_is_identity() -> None:
    xs = arrays(0)
    before = [x.copy() for x in xs]
    assert helpers.allreduce_gradients(xs, bucket_bytes=64) is None
    assert all(np.array_equal(a, b) for a, b in zip(xs, before))
    with pytest.raises(InvalidArgumentError):
        helpers.GradientBuckets(bucket_bytes=0)
    with pytest.raises(InvalidArgumentError):
        helpers.allreduce_gradients(xs, op="median")


def rank_body() -> list[str]:
    import torch

    import collcomm as dist

    r, n = dist.get_rank(), dist.get_world_size()
    bad: list[str] = []
    want_sum = [sum(arrays(p)[i] for p in range(n)) for i in range(len(SIZES))]
    for bucket_bytes in (1, 4096, 1 << 30):
        xs = arrays(r)
        helpers.allreduce_gradients(xs, bucket_bytes=bucket_bytes, op="sum")
        wrong = [i for i, (x, w) in enumerate(zip(xs, want_sum)) if not np.array_equal(x, w)]
        if wrong:
            bad.append(f"sum, buckets of {bucket_bytes} B: arrays {wrong[:5]} wrong")
    floats = [x for x in arrays(r) if x.dtype.kind == "f"]
    handle = helpers.allreduce_gradients(floats, bucket_bytes=2048, async_op=True)
    handle.wait()
    want = [w / n for i, w in enumerate(want_sum) if i % 3 != 2]
    if not all(np.allclose(x, w, rtol=1e-6) for x, w in zip(floats, want)):
        bad.append("mean of float arrays wrong")
    # a bucket starts the moment it is full, before the next add
    b = helpers.GradientBuckets(bucket_bytes=800, op="sum")
    xs = [np.full(100, float(r)) for _ in range(3)]       # 800 bytes each
    b.add(xs[0])
    started_after_first = b.buckets_started
    b.add(xs[1])
    b.add(xs[2])
    started = b.buckets_started
    b.wait()
    if (started_after_first, started) != (1, 3):
        bad.append(f"buckets started {started_after_first}, {started}, expected 1, 3")
    if not all(np.array_equal(x, np.full(100, float(sum(range(n))))) for x in xs):
        bad.append("GradientBuckets results wrong")
    # torch: Parameters' .grad, bfloat16, a parameter without a gradient
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    frozen = torch.nn.Parameter(torch.zeros(3))
    model(torch.full((5, 4), float(r + 1))).sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    all_grads = [torch.zeros_like(g) for g in grads]
    for p in range(n):
        model.zero_grad()
        model(torch.full((5, 4), float(p + 1))).sum().backward()
        for acc, p_ in zip(all_grads, model.parameters()):
            acc += p_.grad
    model.zero_grad()
    model(torch.full((5, 4), float(r + 1))).sum().backward()
    ptrs = [p.grad.data_ptr() for p in model.parameters()]
    helpers.allreduce_gradients(list(model.parameters()) + [frozen], bucket_bytes=64)
    if [p.grad.data_ptr() for p in model.parameters()] != ptrs:
        bad.append("gradients replaced instead of written in place")
    if not all(torch.allclose(p.grad, acc / n, atol=1e-5) for p, acc in zip(model.parameters(), all_grads)):
        bad.append("torch .grad mean wrong")
    if frozen.grad is not None:
        bad.append("a parameter without a gradient got one")
    bf = [torch.full((7,), float(r + 1), dtype=torch.bfloat16), torch.ones(3, dtype=torch.bfloat16)]
    helpers.allreduce_gradients(bf, op="sum")
    if bf[0].tolist() != [float(sum(range(1, n + 1)))] * 7 or bf[1].tolist() != [float(n)] * 3:
        bad.append(f"bfloat16 sum wrong: {bf}")
    return bad


@pytest.mark.timeout(90)
def test_three_ranks() -> None:
    pytest.importorskip("torch")
    res = run_ranks(rank_body, 3, timeout=80, preload=TORCH)
    assert not [b for r in res for b in r], res
