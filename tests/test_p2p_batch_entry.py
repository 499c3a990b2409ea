"""``collcomm.batch_isend_irecv`` is a C callable where the native core is built
(native/_p2p_entry.c ``BatchCall``): the Python function's first lines without its frame,
the function itself (``__wrapped__``) the reference and the fallback. These check that the
two give the same works, results and errors for every shape of call: a plain batch, a
tuple, a keyword argument, an empty list, bad lists, a batch C starts only in part (more
sends than the ring holds), a subgroup's ops, and no process group at all.
"""
from __future__ import annotations

import numpy as np
import pytest

from collcomm import native
from tests.harness import run_ranks
from tests.test_p2p_native import _err

pytestmark = [pytest.mark.timeout(90),
              pytest.mark.skipif(native.core is None, reason=f"native core: {native.reason}")]


def _calls() -> dict:
    import collcomm as dist

    me, other = dist.get_rank(), 1 - dist.get_rank()
    entry = dist.batch_isend_irecv
    out: dict = {"kind": type(entry).__name__, "name": entry.__name__}
    sub = dist.new_group([0, 1])
    for label, call in (("C", entry), ("python", entry.__wrapped__)):
        got: list = []
        s = np.array([me, 10 + me], np.int32)
        r = np.zeros(2, np.int32)
        ws = call([dist.P2POp(dist.isend, s, other, tag=1), dist.P2POp(dist.irecv, r, other, tag=1)])
        got.append(([type(w).__name__ for w in ws], [w.wait() for w in ws], r.tolist()))
        r[:] = 0
        ws = call((dist.P2POp(dist.irecv, r, other, tag=2), dist.P2POp(dist.isend, s, other, tag=2)))
        got.append(([w.wait() for w in ws], r.tolist()))
        r[:] = 0
        ws = call(p2p_op_list=[dist.P2POp(dist.isend, s, other, tag=3),
                               dist.P2POp(dist.irecv, r, other, tag=3)])
        got.append(([w.wait() for w in ws], r.tolist()))
        got.append(call([]))
        got.append(_err(lambda: call("not a list")))
        got.append(_err(lambda: call([dist.P2POp(dist.isend, s, other), 7])))
        got.append(_err(lambda: call(None)))
        got.append(_err(lambda: call([dist.P2POp(dist.isend, s, 5)])))           # no rank 5
        got.append(_err(lambda: call([dist.P2POp(dist.isend, s, other, tag=-1)])))
        # more than the ring holds: C starts what fits, the rest go one by one, in order
        if me == 0:
            sends = [np.full(8192, float(i), np.float32) for i in range(40)]
            ws = call([dist.P2POp(dist.isend, x, other, tag=4) for x in sends])
            got.append((len(ws), all(w.wait() for w in ws)))
        else:
            bufs = [np.zeros(8192, np.float32) for _ in range(40)]
            ws = call([dist.P2POp(dist.irecv, x, other, tag=4) for x in bufs])
            got.append((len(ws), all(w.wait() for w in ws) and
                        all((x == i).all() for i, x in enumerate(bufs))))
        r[:] = 0                           # a subgroup's ops: the regular path
        ws = call([dist.P2POp(dist.isend, s, group=sub, group_peer=other, tag=5),
                   dist.P2POp(dist.irecv, r, group=sub, group_peer=other, tag=5)])
        got.append(([w.wait() for w in ws], r.tolist()))
        out[label] = got
        dist.barrier()
    return out


def test_the_c_entry_and_the_python_function_agree() -> None:
    res = run_ranks(_calls, 2, transport="shm", timeout=80)
    for me, out in enumerate(res):
        assert out["kind"] == "BatchCall" and out["name"] == "batch_isend_irecv", out
        assert out["C"] == out["python"], (out["C"], out["python"])
        mine = [1 - me, 11 - me]
        assert out["C"][0] == (["SentWork", "RecvWork"], [True, True], mine), out["C"][0]
        assert out["C"][1] == ([True, True], mine) and out["C"][2] == ([True, True], mine)
        assert out["C"][3] == []
        assert all(e.startswith("InvalidArgumentError: batch_isend_irecv") for e in out["C"][4:7]), out["C"][4:7]
        assert out["C"][7].startswith("InvalidArgumentError") and out["C"][8].startswith("InvalidArgumentError")
        assert out["C"][9] == (40, True) and out["C"][10] == ([True, True], mine), out["C"][9:]


def test_without_a_process_group_both_raise_alike() -> None:
    import collcomm as dist

    ops = [dist.P2POp(dist.isend, np.zeros(2, np.float32), 1)]
    entry = dist.batch_isend_irecv
    assert type(entry).__name__ == "BatchCall"
    assert _err(lambda: entry(ops)) == _err(lambda: entry.__wrapped__(ops)) != "no error"
