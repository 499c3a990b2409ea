"""What ``collcomm bench --check`` compares results with, the same for every library: each
rank's input pattern (small integers, so sums are exact; for prod only 1 and 2, exact
powers of two), the output every op must produce from them, and the count of elements
that differ; and the value timed buffers are filled with (one that repeated in-place
reductions leave unchanged)."""
from __future__ import annotations

import numpy as np

def pattern(rank: int, idx: np.ndarray, redop: str, dtype: str) -> np.ndarray:
    """Rank ``rank``'s input at global element indices ``idx``: small integers, so sums are
    exact; for prod only 1 and 2 (products are exact powers of two)."""
    if redop == "prod":
        vals = 1 + (idx + rank) % 2
    else:
        vals = (idx * 7 + rank * 3) % 11 + 1
    return vals.astype(dtype)


def _reduce(parts: list[np.ndarray], redop: str, n: int) -> np.ndarray:
    acc = parts[0].copy()
    for p in parts[1:]:
        if redop in ("sum", "avg"):
            np.add(acc, p, out=acc)
        elif redop == "prod":
            np.multiply(acc, p, out=acc)
        elif redop == "max":
            np.maximum(acc, p, out=acc)
        else:
            np.minimum(acc, p, out=acc)
    if redop == "avg":
        acc = (acc / n).astype(acc.dtype) if acc.dtype.kind == "f" else acc // n
    return acc


def expected(op: str, rank: int, n: int, count: int, per: int, redop: str, dtype: str,
             root: int) -> np.ndarray | None:
    """What ``Case.recv`` of ``rank`` must hold after one call (see module doc of options)."""
    ar = np.arange(count if op in ("all_reduce", "reduce", "broadcast", "sendrecv") else per)
    if op in ("all_reduce", "reduce"):
        return _reduce([pattern(s, ar, redop, dtype) for s in range(n)], redop, n)
    if op == "broadcast":
        return pattern(root, ar, redop, dtype)
    if op == "sendrecv":
        return pattern((rank - 1) % n, ar, redop, dtype)
    if op in ("all_gather", "gather"):
        return np.concatenate([pattern(s, ar, redop, dtype) for s in range(n)])
    mine = rank * per + ar
    if op == "reduce_scatter":
        return _reduce([pattern(s, mine, redop, dtype) for s in range(n)], redop, n)
    if op == "scatter":
        return pattern(root, mine, redop, dtype)
    if op == "all_to_all":
        return np.concatenate([pattern(s, mine, redop, dtype) for s in range(n)])
    return None


def count_wrong(got: np.ndarray, want: np.ndarray) -> int:
    got = got.reshape(-1)
    if got.shape != want.shape:
        return max(got.size, want.size)
    if want.dtype.kind == "f":
        rtol = 1e-2 if want.dtype.itemsize == 2 else 1e-5
        ok = np.isclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=0)
        return int(ok.size - np.count_nonzero(ok))
    return int(np.count_nonzero(got != want))


def timing_fill(redop: str) -> int:
    """Values that stay put under repeated in-place reductions (no overflow, no denormals)."""
    return 1 if redop in ("prod", "max", "min") else 0
