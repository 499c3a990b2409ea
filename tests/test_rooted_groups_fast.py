"""Rooted collectives (broadcast, reduce, gather, scatter) on a group other than the world
take the fast call too (api_args.fast_root maps torch's global ``src``/``dst``, or
``group_src``/``group_dst``, to the group rank; before, only the world's did, and a
subgroup's broadcast cost ~10 µs of the regular path instead of ~1).

Three ranks, the group [1, 2] (group ranks 0, 1 = global 1, 2), every root both ways: the
results are right, the calls were fast ones (the group's ``fast.calls`` counted them), and
a root outside the group, a group rank out of range and both forms at once still raise the
regular path's errors on every member.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from collcomm import native
from tests.harness import run_ranks

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(native.core is None, reason=f"native core: {native.reason}")]


def _rooted() -> dict[str, Any]:
    import collcomm as dist
    from collcomm.errors import InvalidArgumentError

    me = dist.get_rank()
    sub = dist.new_group([1, 2])
    out: dict[str, Any] = {}
    if me == 0:
        dist.barrier()
        return out
    local = me - 1
    dist.barrier(group=sub)                  # (the group's arena and fast call start)
    fast = sub.fast
    before = -1 if fast is None else fast.calls
    got = []
    for glob, loc in ((1, 0), (2, 1)):
        for kw in ({"src": glob}, {"group_src": loc}):
            x = np.full(3, 10.0 * me)
            dist.broadcast(x, group=sub, **kw)
            got.append(("broadcast", loc, x.tolist() == [10.0 * glob] * 3))
        for kw in ({"dst": glob}, {"group_dst": loc}):
            x = np.array([me, 2 * me], np.int64)
            dist.reduce(x, group=sub, **kw)
            want = [3, 6] if local == loc else [me, 2 * me]
            got.append(("reduce", loc, x.tolist() == want))
        for kw in ({"dst": glob}, {"group_dst": loc}):
            outs = [np.zeros(2, np.float32) for _ in range(2)] if local == loc else None
            dist.gather(np.full(2, me, np.float32), outs, group=sub, **kw)
            ok = outs is None or [o.tolist() for o in outs] == [[1, 1], [2, 2]]
            got.append(("gather", loc, ok))
        for kw in ({"src": glob}, {"group_src": loc}):
            ins = ([np.full(2, 7.0 * i + glob) for i in range(2)] if local == loc else None)
            y = np.zeros(2)
            dist.scatter(y, ins, group=sub, **kw)
            got.append(("scatter", loc, y.tolist() == [7.0 * local + glob] * 2))
    out["results"] = got
    out["fast calls"] = None if fast is None else fast.calls - before
    errors = []
    for call in (lambda: dist.broadcast(np.zeros(2), src=0, group=sub),
                 lambda: dist.broadcast(np.zeros(2), group_src=2, group=sub),
                 lambda: dist.reduce(np.zeros(2), dst=1, group_dst=0, group=sub),
                 lambda: dist.scatter(np.zeros(2), None, src=0, group=sub)):
        try:
            call()
            errors.append("no error")
        except InvalidArgumentError as exc:
            errors.append(str(exc))
    out["errors"] = errors
    dist.barrier(group=sub)
    dist.barrier()
    return out


def test_rooted_calls_on_a_subgroup_are_fast_and_right() -> None:
    res = run_ranks(_rooted, 3, transport="shm", timeout=90)
    for rank in (1, 2):
        out = res[rank]
        assert all(ok for _, _, ok in out["results"]), out["results"]
        assert len(out["results"]) == 16
        assert out["fast calls"] == 16, out
        e = out["errors"]
        assert "src=0 is not a rank of the group" in e[0], e
        assert "group_src must be a rank of the group in [0, 2), got 2" in e[1], e
        assert "give either dst=1 (a global rank) or group_dst=0" in e[2], e
        assert "src=0 is not a rank of the group" in e[3], e
