"""``all_reduce`` of sparse COO tensors on the collcomm backend (collcomm/torch/sparse.py):
summed in place as gloo sums them, hybrid tensors (dense parts per entry) included, a rank
with no entries, every rank with none, bfloat16 and integer values, ``async_op``; DDP with
``nn.Embedding(sparse=True)`` gets the averaged gradient; ops other than SUM and tensors
that differ across ranks raise on every rank instead of hanging or mixing.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tests.harness import TORCH, run_ranks  # noqa: E402


def _entries(r: int, case: str):
    """Rank r's sparse tensor of ``case`` (the same formula on every rank)."""
    if case == "1d":
        return torch.sparse_coo_tensor([[r % 4, 5, 7 - r]], torch.tensor([1.0, 2.0, 3.0]) * (r + 1), (9,))
    if case == "hybrid":       # 2 sparse dims, 1 dense dim of 2
        return torch.sparse_coo_tensor([[0, 1, r % 2], [r, 0, 2]], torch.tensor([[1., 2.], [3., 4.], [r, -r]]),
                                       (2, 4, 2))
    if case == "int64":
        return torch.sparse_coo_tensor([[r, 0]], torch.tensor([10 ** 12, r], dtype=torch.int64), (6,))
    if case == "bfloat16":
        return torch.sparse_coo_tensor([[0, r + 1]], torch.tensor([0.5, 1.5], dtype=torch.bfloat16), (6,))
    if case == "empty on rank 1":
        if r == 1:
            return torch.sparse_coo_tensor(torch.zeros((1, 0), dtype=torch.int64), torch.zeros(0), (5,))
        return torch.sparse_coo_tensor([[r]], torch.tensor([float(r + 1)]), (5,))
    if case == "empty everywhere":
        return torch.sparse_coo_tensor(torch.zeros((1, 0), dtype=torch.int64), torch.zeros(0), (5,))
    raise KeyError(case)


CASES = ["1d", "hybrid", "int64", "bfloat16", "empty on rank 1", "empty everywhere"]


def sparse_job() -> dict:
    import datetime

    import collcomm.torch  # noqa: F401
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("collcomm", timeout=datetime.timedelta(seconds=60))
    r, n = dist.get_rank(), dist.get_world_size()
    out: dict = {}
    for case in CASES:
        s = _entries(r, case)
        want = sum(_entries(q, case).to_dense().double() for q in range(n))
        work = dist.all_reduce(s, async_op=(case == "hybrid"))
        if work is not None:
            work.wait()
        out[case] = (s.is_sparse and s.is_coalesced() and s.dtype == _entries(r, case).dtype
                     and torch.equal(s.to_dense().double(), want))
    errors = []
    for bad in ("max", "shape"):
        try:
            if bad == "max":
                dist.all_reduce(_entries(r, "1d"), op=dist.ReduceOp.MAX)
            else:
                dist.all_reduce(torch.sparse_coo_tensor([[0]], torch.tensor([1.0]), (5 + (r == n - 1),)))
            errors.append("no error")
        except Exception as exc:  # noqa: BLE001 - inspected by the test
            errors.append(f"{type(exc).__name__}: {exc}")
    out["errors"] = errors
    dist.barrier()                       # (the group still works after them)
    # DDP with a sparse embedding: the gradient averaged over the ranks' batches
    torch.manual_seed(0)
    ref = torch.nn.Embedding(10, 3, sparse=True)
    model = DDP(torch.nn.Embedding(10, 3, sparse=True))
    model.module.weight.data.copy_(ref.weight.data)
    batch = lambda q: torch.tensor([q, 5, (3 * q) % 10])  # noqa: E731
    model(batch(r)).sum().backward()
    for q in range(n):
        ref(batch(q)).sum().backward()
    out["ddp"] = torch.allclose(model.module.weight.grad.to_dense(), ref.weight.grad.to_dense() / n)
    dist.destroy_process_group()
    return out


@pytest.mark.timeout(120)
def test_sparse_all_reduce_sums_in_place_and_ddp_sparse_embeddings_train() -> None:
    out = run_ranks(sparse_job, 3, init=False, timeout=100, preload=TORCH)
    for rank, got in enumerate(out):
        for case in CASES:
            assert got[case], (rank, case)
        assert got["ddp"], rank
        max_err, shape_err = got["errors"]
        assert "InvalidArgumentError" in max_err and "only be summed" in max_err, max_err
        assert "InvalidArgumentError" in shape_err and "ranks [2]" in shape_err, shape_err
