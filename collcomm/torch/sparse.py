"""``all_reduce`` of a sparse COO tensor, as gloo does it: every rank's entries gathered,
summed where they meet, the tensor replaced in place by that coalesced sum.

What DDP does with the gradient of ``nn.Embedding(..., sparse=True)``, and what
``dist.all_reduce(sparse)`` does in a program. Steps, each one core call of the group:

1. every rank's (nnz, sparse dims, dense dims, elements per entry, a digest of the shape)
   all-gathered: ranks whose tensors differ in anything but nnz all raise the same
   InvalidArgumentError naming them, before any entry moves;
2. the indices (int64, ``nnz x sparse_dim`` each: entry by entry) and then the values (``nnz x`` the dense
   part each) all-gathered with each rank's own count (an all_to_all of the rank's block
   to every rank: the core checks that every rank's values have one dtype);
3. ``torch.sparse_coo_tensor`` of them all, in rank order, coalesced (duplicates summed
   the same way on every rank: identical results), copied into the tensor.

SUM only (PREMUL_SUM, AVG, MIN, ... raise, as gloo's). The call runs to its end before it
returns, also asked for asynchronously (its Work is then complete).
"""
from __future__ import annotations

import zlib
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ..core import collectives as core
from ..core.group import ProcessGroup
from ..errors import CollcommError, InvalidArgumentError
from ..tensor_memory import tensor_array
from .errors import translate

__all__ = ["all_reduce_sparse", "is_sparse"]

_SUM = dist.ReduceOp.RedOpType.SUM


def is_sparse(tensors: Any) -> bool:
    """Whether a call's tensor list holds a sparse COO tensor (checked off the fast path)."""
    return (isinstance(tensors, (list, tuple)) and len(tensors) > 0
            and isinstance(tensors[0], torch.Tensor) and tensors[0].layout == torch.sparse_coo)


def _fail(g: ProcessGroup, text: str) -> InvalidArgumentError:
    return InvalidArgumentError(f"all_reduce on {g.describe()}: {text}")


def _gather_blocks(g: ProcessGroup, mine: np.ndarray, counts: list[int], dtype: Any) -> np.ndarray:
    """Every rank's block (``counts[r]`` items of ``dtype``), in rank order, on every rank."""
    out = np.empty(sum(counts), dtype=mine.dtype)
    core.all_to_all(g, np.tile(mine, g.size), [mine.size] * g.size, out, counts, dtype=dtype,
                    name="all_reduce")
    return out


def all_reduce_sparse(g: ProcessGroup, tensors: list[torch.Tensor], op: Any) -> None:
    """Sum ``tensors[0]`` (sparse COO, on every rank of ``g``) in place (see module doc)."""
    if len(tensors) != 1:
        raise _fail(g, f"a sparse all_reduce takes one tensor, got {len(tensors)}")
    kind = getattr(op, "op", op)
    if kind != _SUM:
        raise _fail(g, f"a sparse tensor can only be summed (ReduceOp.SUM, as gloo), got {op}")
    t = tensors[0]
    if not t.is_cpu:
        raise _fail(g, f"tensor is on device {t.device}: the collcomm backend handles CPU tensors only")
    c = t.detach().coalesce()
    idx, val = c.indices().t().contiguous(), c.values().contiguous()   # (entries, sparse dims)
    per = int(np.prod(val.shape[1:], dtype=np.int64))
    digest = zlib.crc32(repr((tuple(t.shape), str(t.dtype))).encode())   # (the same on every rank)
    mine = np.array([c._nnz(), c.sparse_dim(), c.dense_dim(), per, digest], dtype=np.int64)
    try:
        meta = np.empty(5 * g.size, dtype=np.int64)
        core.all_gather(g, mine, meta, name="all_reduce")
        rows = meta.reshape(g.size, 5)
        odd = [r for r in range(g.size) if (rows[r, 1:] != rows[0, 1:]).any()]
        if odd:
            raise _fail(g, f"the sparse tensors of ranks {odd} differ from rank 0's in shape, "
                           "dtype or sparse/dense dims")
        nnz = rows[:, 0].tolist()
        sd = int(rows[0, 1])
        all_idx = _gather_blocks(g, tensor_array(idx), [sd * k for k in nnz], None)
        vals = tensor_array(val, "<u2" if val.dtype == torch.bfloat16 else None)
        all_val = _gather_blocks(g, vals, [per * k for k in nnz],
                                 "bfloat16" if val.dtype == torch.bfloat16 else None)
    except CollcommError as exc:
        raise translate(exc) from None
    total = int(sum(nnz))
    indices = torch.from_numpy(all_idx).reshape(total, sd).t()
    values = torch.from_numpy(all_val)
    if val.dtype == torch.bfloat16:
        values = values.view(torch.bfloat16)
    values = values.reshape((total,) + tuple(val.shape[1:]))
    with torch.no_grad():
        t.copy_(torch.sparse_coo_tensor(indices, values, t.shape, dtype=t.dtype).coalesce())
