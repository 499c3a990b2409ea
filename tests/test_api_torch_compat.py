"""The functional API where a torch.distributed program passes torch's own arguments:
``new_group(..., use_local_synchronization=True)`` called by the members only (it was
accepted, then the world's group count drifted and the next group hung to the timeout),
``Work.wait(timedelta)`` on collectives and point to point (TypeError), and torch's
``ReduceOp`` values (``ReduceOp.MAX`` is a callable enum member: it was taken for a custom
function, ``reduce`` then raised on the destination only).
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tests.harness import TORCH, run_ranks  # noqa: E402


def torch_arguments() -> dict:
    import datetime

    import numpy as np
    import torch.distributed as td

    import collcomm as dist

    r, n = dist.get_rank(), dist.get_world_size()
    out: dict = {}
    x = np.full(2, float(r + 1))
    if r in (0, 1):                               # rank 2 skips the call, as torch allows
        g = dist.new_group([0, 1], use_local_synchronization=True)
        dist.all_reduce(x, group=g)
        g_again = dist.new_group([0, 1], use_local_synchronization=True)
        dist.all_reduce(x, group=g_again)
    out["local group"] = x.tolist()
    y = np.full(2, float(r + 1))
    whole = dist.new_group(list(range(n)))        # every rank: the world's count agrees
    dist.all_reduce(y, group=whole)
    out["next group"] = y.tolist()
    week = datetime.timedelta(days=7)
    w = dist.all_reduce(np.ones(3), async_op=True)
    out["collective wait(timedelta)"] = w.wait(timeout=week)
    s, q = np.full(4, float(r)), np.zeros(4)
    big, bigq = np.full(1 << 18, float(r)), np.zeros(1 << 18)     # (a lent send)
    works = dist.batch_isend_irecv([dist.P2POp(dist.isend, s, (r + 1) % n), dist.P2POp(dist.irecv, q, (r - 1) % n),
                                    dist.P2POp(dist.isend, big, (r + 1) % n),
                                    dist.P2POp(dist.irecv, bigq, (r - 1) % n)])
    out["p2p wait(timedelta)"] = all(wk.wait(timeout=week) for wk in works) and q[0] == bigq[-1] == (r - 1) % n
    ops = {}
    for name in ("SUM", "MAX", "MIN", "PRODUCT", "AVG"):
        z = np.full(1, float(r + 2))
        dist.all_reduce(z, op=getattr(td.ReduceOp, name))
        ops[name] = float(z[0])
    z = np.full(1, float(r + 2))
    dist.all_reduce(z, op=td.ReduceOp(td.ReduceOp.MAX))
    ops["ReduceOp(MAX)"] = float(z[0])
    z = np.full(1, float(r + 2))
    dist.reduce(z, dst=1, op=td.ReduceOp.MAX)
    ops["reduce MAX on dst"] = float(z[0]) if r == 1 else None
    try:
        dist.all_reduce(np.ones(1), op=td.ReduceOp.PREMUL_SUM)
        ops["PREMUL_SUM"] = "no error"
    except Exception as exc:  # noqa: BLE001 - inspected by the test
        ops["PREMUL_SUM"] = type(exc).__name__
    out["ops"] = ops
    return out


@pytest.mark.timeout(120)
def test_local_synchronization_groups_timedelta_waits_and_torch_reduce_ops() -> None:
    out = run_ranks(torch_arguments, 3, timeout=100, preload=TORCH, env={"COLLCOMM_TIMEOUT": "30"})
    for r, got in enumerate(out):
        assert got["local group"] == ([6.0, 6.0] if r < 2 else [3.0, 3.0]), (r, got)
        assert got["next group"] == [6.0, 6.0], (r, got)
        assert got["collective wait(timedelta)"] is True and got["p2p wait(timedelta)"], (r, got)
        ops = got["ops"]
        assert ops["SUM"] == 9 and ops["MAX"] == 4 and ops["MIN"] == 2 and ops["PRODUCT"] == 24, ops
        assert ops["AVG"] == 3 and ops["ReduceOp(MAX)"] == 4, ops
        assert ops["reduce MAX on dst"] == (4.0 if r == 1 else None), ops
        assert ops["PREMUL_SUM"] == "InvalidArgumentError", ops
