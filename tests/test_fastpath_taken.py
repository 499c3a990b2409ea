"""Which calls take the fast call (collcomm/core/fastpath.py, collcomm/native/_fastcall.c).

No fast call where the regular path has something else to do (async pending,
call_timeout, an algorithm chosen by COLLCOMM_ALGO_*, tracing, buffers it cannot take), and
one everywhere else: a subgroup, a world of one, the MPI front end, the torch backend; none
at all without the native core.
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

from collcomm import native
from tests.fastpath_common import _calls, _world
from tests.harness import TORCH, run_ranks

pytestmark = pytest.mark.skipif(native.core is None, reason=f"native core: {native.reason}")


def _taken_or_not() -> dict[str, Any]:
    import collcomm as dist

    me = dist.get_rank()
    x = np.ones(4, np.float32)
    dist.all_reduce(x)                      # builds the arena, then the fast call exists
    seen: dict[str, Any] = {}

    def taken(name: str, call: Any) -> None:
        before = _calls()
        call()
        seen[name] = _calls() > before

    taken("plain", lambda: dist.all_reduce(x))
    taken("all_gather list", lambda: dist.all_gather([np.empty(4, np.float32) for _ in range(2)], x))
    taken("gather list", lambda: dist.gather(x, [np.empty(4, np.float32) for _ in range(2)]
                                             if me == 0 else None, dst=0))
    taken("complex list", lambda: dist.all_gather([np.empty(1, np.complex64) for _ in range(2)],
                                                  np.ones(1, np.complex64)))
    taken("avg", lambda: dist.all_reduce(x, op=dist.ReduceOp.AVG))
    taken("ufunc", lambda: dist.all_reduce(x, op=np.maximum))      # is MAX: taken
    taken("user op", lambda: dist.all_reduce(x, op=lambda a, b: np.maximum(a, b)))
    taken("longdouble", lambda: dist.all_reduce(np.ones(2, np.longdouble)))
    taken("staged", lambda: dist.all_reduce(np.ones(1 << 15, np.float32)))   # 128 KiB
    taken("large", lambda: dist.all_reduce(np.ones((1 << 16) + 16, np.float32)))   # > 256 KiB
    taken("algorithm", lambda: dist.all_reduce(x, algorithm="ring"))
    with dist.call_timeout(30):
        taken("call_timeout", lambda: dist.all_reduce(x))
    taken("after call_timeout", lambda: dist.all_reduce(x))
    w = dist.all_reduce(np.ones(2), async_op=True)
    before = _calls()
    dist.all_reduce(x)      # runs the queued async call first (through the fast call), then
    seen["async pending"] = _calls() - before != 1    # itself the regular way
    w.wait()
    taken("after drain", lambda: dist.all_reduce(x))
    sub = dist.new_group([0, 1])
    y = np.full(2, me + 1.0)
    dist.broadcast(y, src=1, group=sub)     # a subgroup: no fast broadcast (src is global)
    dist.all_reduce(y, group=sub)
    seen["subgroup fast"] = sub.fast is not None and sub.fast.calls > 0
    seen["subgroup result"] = y.tolist()
    seen["x"] = x.tolist()
    return seen


@pytest.mark.timeout(120)
def test_what_takes_the_fast_call() -> None:
    res = run_ranks(_taken_or_not, 2, transport="shm", timeout=90)
    for seen in res:
        assert seen["plain"] and seen["after call_timeout"] and seen["after drain"], seen
        assert seen["ufunc"] and seen["all_gather list"] and seen["gather list"], seen
        assert seen["staged"], seen
        assert seen["complex list"], seen   # list forms move raw bytes: complex dtypes too
        for name in ("avg", "user op", "longdouble", "large", "algorithm", "call_timeout",
                     "async pending"):
            assert seen[name] is False, (name, seen)
        assert seen["subgroup fast"] and seen["subgroup result"] == [4.0, 4.0]
    assert res[0]["x"] == res[1]["x"]


def _algo_override() -> Any:
    import collcomm as dist

    x = np.ones(3)
    dist.all_reduce(x)
    dist.all_reduce(x)
    b = np.ones(3)
    dist.broadcast(b, src=0)   # the group's first arena call: builds it (regular path)
    dist.broadcast(b, src=0)   # fast
    return {"calls": _calls(), "x": x.tolist()}


@pytest.mark.timeout(120)
def test_an_algorithm_override_keeps_its_algorithm() -> None:
    # COLLCOMM_ALGO_ALL_REDUCE=ring: all_reduce goes the regular way (ring), broadcast fast
    res = run_ranks(_algo_override, 2, transport="shm", timeout=60,
                    env={"COLLCOMM_ALGO_ALL_REDUCE": "ring"})
    assert [r["x"] for r in res] == [[4.0] * 3] * 2
    assert [r["calls"] for r in res] == [1, 1]


def _observed() -> Any:
    import collcomm as dist

    dist.all_reduce(np.ones(2))
    return _world().fast is None


@pytest.mark.timeout(120)
def test_tracing_takes_the_observed_path(tmp_path: Any) -> None:
    assert run_ranks(_observed, 2, transport="shm", timeout=60,
                     env={"COLLCOMM_TRACE": str(tmp_path)}) == [True, True]


def _world_of_one() -> Any:
    import collcomm as dist

    fast = _world().fast
    x = np.arange(4.0)
    dist.all_reduce(x)
    out = np.zeros(3, np.int16)
    dist.all_gather_into_tensor(out, np.array([1, 2, 3], np.int16))
    dist.broadcast(x, src=0)
    dist.barrier()
    r = np.ones(2)
    dist.reduce(r, dst=0)
    rs = np.zeros(2, np.int32)
    dist.reduce_scatter_tensor(rs, np.array([5, 6], np.int32))
    lst = [np.zeros(2)]
    dist.all_gather(lst, np.array([3.0, 4.0]))
    rs = np.concatenate([rs, lst[0].astype(np.int32)])
    return {"calls": fast.calls, "x": x.tolist(), "out": out.tolist(), "r": r.tolist(),
            "rs": rs.tolist()}


@pytest.mark.timeout(60)
def test_a_world_of_one_has_it_too() -> None:
    (res,) = run_ranks(_world_of_one, 1, timeout=30)
    assert res == {"calls": 7, "x": [0.0, 1.0, 2.0, 3.0], "out": [1, 2, 3], "r": [1.0, 1.0],
                   "rs": [5, 6, 3, 4]}


def _mpi_fast() -> Any:
    from collcomm import MPI

    comm = MPI.COMM_WORLD
    me = comm.Get_rank()
    a = np.full(3, me + 1.0)
    r = np.empty(3)
    comm.Allreduce(a, r, op=MPI.MAX)
    comm.Allreduce(MPI.IN_PLACE, a, op=MPI.SUM)
    b = np.arange(4, dtype=np.int32) if me == 0 else np.zeros(4, np.int32)
    comm.Bcast(b, root=0)
    g = np.empty(2 * comm.Get_size(), np.int64)
    comm.Allgather(np.array([me, me], np.int64), g)
    comm.Barrier()
    n = comm.Get_size()
    red = np.empty(3) if me == 1 else None
    comm.Reduce(np.full(3, me + 1.0), red, op=MPI.SUM, root=1)
    gat = np.empty(2 * n, np.int16) if me == 0 else None
    comm.Gather(np.array([me, 7], np.int16), gat, root=0)
    sc = np.empty(2, np.float32)
    comm.Scatter(np.arange(2.0 * n, dtype=np.float32) if me == 1 else None, sc, root=1)
    rsb = np.empty(2, np.int64)
    comm.Reduce_scatter_block(np.arange(2 * n, dtype=np.int64), rsb, op=MPI.MAX)
    a2a = np.empty(n, np.float64)
    comm.Alltoall(np.arange(n, dtype=np.float64) + 10 * me, a2a)
    return {"r": r.tolist(), "a": a.tolist(), "b": b.tolist(), "g": g.tolist(), "calls": _calls(),
            "red": None if red is None else red.tolist(), "gat": None if gat is None else gat.tolist(),
            "sc": sc.tolist(), "rsb": rsb.tolist(), "a2a": a2a.tolist()}


@pytest.mark.timeout(120)
def test_mpi_front_end_takes_it() -> None:
    res = run_ranks(_mpi_fast, 2, transport="shm", timeout=60)
    for me, out in enumerate(res):
        assert out["r"] == [2.0] * 3 and out["a"] == [3.0] * 3
        assert out["b"] == [0, 1, 2, 3] and out["g"] == [0, 0, 1, 1]
        assert out["red"] == ([3.0] * 3 if me == 1 else None)
        assert out["gat"] == ([0, 7, 1, 7] if me == 0 else None)
        assert out["sc"] == [2.0 * me, 2.0 * me + 1]
        assert out["rsb"] == [2 * me, 2 * me + 1]
        assert out["a2a"] == [float(me), 10.0 + me]
        assert out["calls"] >= 9, out


def test_without_the_native_core_there_is_none() -> None:
    import subprocess
    import sys

    code = ("import collcomm.core.fastpath as f, collcomm.native as n; "
            "print(n.core is None, f.enabled())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, COLLCOMM_NATIVE="0"))
    assert out.stdout.split() == ["True", "False"], out.stderr


def _torch_fast() -> Any:
    import torch
    import torch.distributed as tdist

    import collcomm.torch  # noqa: F401 - registers the backend

    tdist.init_process_group("collcomm")
    me = tdist.get_rank()
    t = torch.full((3,), me + 1.0)
    tdist.all_reduce(t)                          # the arena's first call: regular
    fast = tdist.group.WORLD.core_group.fast
    before = fast.calls
    tdist.all_reduce(t, op=tdist.ReduceOp.MAX)
    b = torch.arange(4) * (me + 1)
    tdist.broadcast(b, src=1)
    out = torch.empty(2 * tdist.get_world_size(), dtype=torch.int32)
    tdist.all_gather_into_tensor(out, torch.full((2,), me, dtype=torch.int32))
    taken = fast.calls - before
    bf = torch.ones(2, dtype=torch.bfloat16)
    tdist.all_reduce(bf)                          # bfloat16: the regular path
    w = tdist.all_reduce(torch.ones(2), async_op=True)    # async: queued, then fast
    w.wait()
    res = {"t": t.tolist(), "b": b.tolist(), "out": out.tolist(), "taken": taken,
           "after": fast.calls - before, "bf": bf.float().tolist()}
    tdist.destroy_process_group()
    return res


@pytest.mark.timeout(120)
def test_torch_backend_takes_it() -> None:
    pytest.importorskip("torch")
    res = run_ranks(_torch_fast, 2, transport="shm", timeout=90, init=False, preload=TORCH)
    for out in res:
        assert out["t"] == [3.0] * 3 and out["b"] == [0, 2, 4, 6] and out["out"] == [0, 0, 1, 1]
        assert out["taken"] == 3 and out["after"] == 4, out
        assert out["bf"] == [2.0, 2.0]
