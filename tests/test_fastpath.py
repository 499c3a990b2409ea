"""The fast call (collcomm/core/fastpath.py, collcomm/native/_fastcall.c).

A front end's small call on numpy arrays runs as one C call; everything it does must be
what the regular path does: the same results (bit for bit, every built-in op and numeric
dtype), the same signature (a fast rank and a regular rank share a job), the same record
in the flight recorder (with the caller's file:line), the same errors (a mismatch named on
every rank, a timeout naming the missing rank and where it is) and no fast call where the
regular path has something else to do (async pending, call_timeout, an algorithm chosen by
COLLCOMM_ALGO_*, tracing, buffers it cannot take).
"""
from __future__ import annotations

import hashlib

import os
from typing import Any

import numpy as np
import pytest

from collcomm import native
from tests.harness import line_of, run_ranks

pytestmark = pytest.mark.skipif(native.core is None, reason=f"native core: {native.reason}")

OPS = ["SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "LAND", "LOR", "LXOR", "AVG"]
DTYPES = ["bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
          "float16", "float32", "float64", "complex64", "complex128"]


def _world() -> Any:
    from collcomm.core import runtime

    return runtime.get_world("test")


def _calls() -> int:
    fast = _world().fast
    return -1 if fast is None else fast.calls


def _every_op_and_dtype() -> dict[str, Any]:
    """all_reduce of every (op, dtype) through the API, 3 and 7 elements; the results' bytes."""
    import collcomm as dist
    from collcomm.errors import InvalidArgumentError

    me = dist.get_rank()
    rng = np.random.default_rng(1234 + me)
    out: dict[str, Any] = {}
    for dt in DTYPES:
        for op in OPS:
            for count in (3, 7):
                raw = rng.integers(-3, 4, size=count) if dt != "bool" else rng.integers(0, 2, size=count)
                x = raw.astype(dt)
                if dt.startswith("complex"):
                    x = x + 1j * x[::-1]
                rop = getattr(dist.ReduceOp, op)
                try:
                    if count == 3:
                        dist.all_reduce(x, op=rop)
                    else:                            # reduce to rank 1, reduce_scatter
                        y = x.copy()
                        dist.reduce(y, dst=1, op=rop)
                        rs = np.empty(2, dtype=x.dtype)
                        dist.reduce_scatter_tensor(rs, np.concatenate([x[:2], x[2:4], x[4:6]]), op=rop)
                        x = np.concatenate([y, rs]) if me == 1 else rs
                except InvalidArgumentError as exc:
                    out[f"{dt}-{op}-{count}"] = f"refused: {exc.kind}"
                    continue
                out[f"{dt}-{op}-{count}"] = x.tobytes().hex()
    # the other fast collectives
    b = np.arange(5, dtype=np.int64) * (me + 1)
    dist.broadcast(b, src=1)
    g = np.empty(3 * dist.get_world_size(), np.float32)
    dist.all_gather_into_tensor(g, np.full(3, me, np.float32))
    dist.barrier()
    n = dist.get_world_size()
    a2a = np.empty((2 * n, 3), np.int32)
    dist.all_to_all_single(a2a, np.arange(6 * n, dtype=np.int32).reshape(2 * n, 3) + 100 * me)
    out["all_to_all"] = a2a.tolist()
    # the list forms (torch's tensor lists): all_gather, gather to rank 2, scatter from rank 1
    parts = [np.empty(3, np.float16) for _ in range(n)]
    dist.all_gather(parts, np.full(3, me + 0.5, np.float16))
    out["all_gather list"] = [p.tolist() for p in parts]
    glist = [np.empty(2, np.int8) for _ in range(n)] if me == 2 else None
    dist.gather(np.array([me, -me], np.int8), glist, dst=2)
    out["gather list"] = None if glist is None else [p.tolist() for p in glist]
    got = np.empty(2, np.uint32)
    dist.scatter(got, [np.full(2, 7 * r, np.uint32) for r in range(n)] if me == 1 else None, src=1)
    out["scatter list"] = got.tolist()
    out["broadcast"] = b.tolist()
    out["all_gather"] = g.tolist()
    # staged sizes above the one-shot size (128-240 KB: two-shot all_reduce, one step)
    big = np.arange(30_000, dtype=np.float64) * (me + 1) / 7
    dist.all_reduce(big)
    bb = np.arange(30_001, dtype=np.int32) * (me + 3)
    dist.broadcast(bb, src=2)
    bg = np.empty(20_000 * n, np.float32)
    dist.all_gather_into_tensor(bg, np.full(20_000, me + 0.25, np.float32))
    # ... and up to a slot where shm_direct stages them in one native call (1.2 MB)
    lg = np.empty(100_000 * n, np.float32)
    dist.all_gather_into_tensor(lg, np.arange(100_000, dtype=np.float32) + me)
    rs = np.empty(100_000, np.float64)
    dist.reduce_scatter_tensor(rs, np.arange(100_000 * n, dtype=np.float64) * (me + 1) / 3)
    out["staged sizes"] = [hashlib.sha256(a.tobytes()).hexdigest() for a in (big, bb, bg, lg)]
    out["reduce_scatter 1.2 MB-7"] = hashlib.sha256(rs.tobytes()).hexdigest()   # per rank
    out["fast_calls"] = _calls()
    return out


@pytest.mark.timeout(240)
def test_fast_and_regular_ranks_compute_the_same_bits() -> None:
    """Rank 0 regular path (COLLCOMM_FAST=0), rank 1 the fast call, rank 2 the regular path
    too; then every rank fast. Same bytes everywhere, no mismatch between the two paths."""
    mixed = run_ranks(_every_op_and_dtype, 3, transport="shm", timeout=180,
                      rank_env={0: {"COLLCOMM_FAST": "0"}, 2: {"COLLCOMM_FAST": "0"}})
    fast = run_ranks(_every_op_and_dtype, 3, transport="shm", timeout=180)
    assert mixed[0]["fast_calls"] == -1 and mixed[1]["fast_calls"] > 0
    for r in range(3):
        calls_m, calls_f = mixed[r].pop("fast_calls"), fast[r].pop("fast_calls")
        assert calls_f > 100, calls_f          # every rank ran most calls fast
        assert fast[r] == mixed[r]             # each rank: the same bytes fast or regular
        # all_reduce (3 elements), broadcast, all_gather: the same on every rank
        per_rank = ("-7", "all_to_all", "gather list", "scatter list")
        assert {k: v for k, v in mixed[r].items() if not k.endswith(per_rank)} == \
            {k: v for k, v in mixed[0].items() if not k.endswith(per_rank)}
    assert mixed[0]["broadcast"] == [0, 2, 4, 6, 8]
    assert mixed[0]["all_gather"] == [0.0] * 3 + [1.0] * 3 + [2.0] * 3
    assert mixed[0]["all_gather list"] == [[0.5] * 3, [1.5] * 3, [2.5] * 3]
    assert mixed[2]["gather list"] == [[0, 0], [1, -1], [2, -2]] and mixed[0]["gather list"] is None
    assert [mixed[r]["scatter list"] for r in range(3)] == [[0, 0], [7, 7], [14, 14]]
    for r in range(3):   # block r of every rank j: rows 2r, 2r+1 of j's input (+100 j)
        expect = [[6 * r + 3 * i + c + 100 * j for c in range(3)] for j in range(3) for i in range(2)]
        assert mixed[r]["all_to_all"] == expect


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


def _recorded() -> Any:
    import collcomm as dist
    from collcomm.core import recorder

    x = np.ones(2, np.float32)
    dist.all_reduce(x)
    before = _calls()
    dist.all_reduce(x)                                  # the line recorded
    rec = recorder.recorder()
    entries = [rec.entry(r, 0.0, 0.0) for r in rec.records()]
    return {"fast": _calls() - before, "last": entries[-1], "prev": entries[-2]}


@pytest.mark.timeout(120)
def test_the_flight_recorder_sees_fast_calls() -> None:
    res = run_ranks(_recorded, 2, transport="shm", timeout=60)
    for out in res:
        assert out["fast"] == 1
        last = out["last"]
        assert last["op"] == "all_reduce" and last["state"] == "completed", last
        assert last["call"] == "all_reduce(float32[2], op=SUM)", last
        assert last["seq"] == out["prev"]["seq"] + 1
        assert last["algorithm"] == "shm_direct"
        assert last["where"].endswith("test_fastpath.py:" + str(line_of(__file__, "# the line recorded"))), last



def _mismatched(kind: str) -> Any:
    import collcomm as dist
    from collcomm.errors import MismatchError

    me = dist.get_rank()
    dist.all_reduce(np.ones(2))
    if kind == "dtype":
        x = np.ones(4, np.float32 if me == 0 else np.int32)
    elif kind == "count":
        x = np.ones(4 + me)
    elif kind == "bytearray count":   # any buffer, not only numpy arrays
        x = bytearray(4 + me)
    else:
        x = np.ones(4)
    try:
        if kind == "op":
            dist.all_reduce(x, op=dist.ReduceOp.SUM if me == 0 else dist.ReduceOp.MAX)
        elif kind == "root":
            dist.reduce(x, dst=me)
        elif kind == "gather list root":   # each rank the root of its own list-form gather
            dist.gather(x, [np.empty_like(x) for _ in range(2)], dst=me)
        elif kind == "split sizes":      # blocks of 2 against blocks of 3 elements
            k = 2 if me == 0 else 3
            dist.all_to_all_single(np.empty(2 * k), np.ones(2 * k))
        elif kind == "barrier":           # a barrier against a list-form gather to rank 1
            if me == 0:
                dist.barrier()
            else:
                dist.gather(x, [np.empty_like(x) for _ in range(2)], dst=1)
        elif kind == "collective":
            if me == 0:
                dist.all_reduce(x)
            else:
                dist.broadcast(x, src=0)
        else:
            dist.all_reduce(x)
    except MismatchError as exc:
        return str(exc)
    return "no error"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["dtype", "count", "op", "collective", "root", "split sizes",
                                  "gather list root", "bytearray count", "barrier"])
@pytest.mark.parametrize("mixed", [False, True])
def test_a_mismatch_is_named_on_every_rank(kind: str, mixed: bool) -> None:
    rank_env = {0: {"COLLCOMM_FAST": "0"}} if mixed else None
    res = run_ranks(_mismatched, 2, kind, transport="shm", timeout=60, rank_env=rank_env)
    for text in res:
        assert "rank 0" in text and "rank 1" in text, text
        want = {"split sizes": "all_to_all", "gather list root": "gather", "barrier": "gather"}.get(kind, "reduce")
        assert want in text, text
        if kind == "barrier":            # each rank names both calls, whichever path it took
            assert "called barrier" in text and "called gather" in text, text


def _one_skips(done: str) -> Any:
    import time

    import collcomm as dist
    from collcomm.errors import CommTimeoutError

    x = np.ones(2)
    dist.all_reduce(x)
    if dist.get_rank() == 1:
        dist.all_reduce(x)   # the last call rank 1 makes
        deadline = time.monotonic() + 8.0   # then it never enters the next one (and stays
        while not os.path.exists(done) and time.monotonic() < deadline:   # for the report
            time.sleep(0.01)                # that asks it, until rank 0 has its error)
        return "slept"
    dist.all_reduce(x)
    try:
        dist.all_reduce(x)   # the waiting call: #3
    except CommTimeoutError as exc:
        return str(exc)
    finally:
        open(done, "w").close()
    return "no error"


@pytest.mark.timeout(120)
def test_a_timeout_names_the_missing_rank_and_its_line(tmp_path: Any) -> None:
    res = run_ranks(_one_skips, 2, str(tmp_path / "done"), transport="shm", timeout=90,
                    env={"COLLCOMM_TIMEOUT": "3"})
    text = res[0]
    assert res[1] == "slept"
    assert "timed out" in text and "all_reduce" in text, text
    assert "rank 1" in text, text
    line = line_of(__file__, "# the last call rank 1 makes")
    assert f"test_fastpath.py:{line}" in text, text


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


def _bad_input() -> Any:
    import collcomm as dist
    from collcomm.errors import InvalidArgumentError

    dist.all_reduce(np.ones(2))
    texts = []
    for call in (lambda: dist.all_reduce(np.ones(4)[::2]),
                 lambda: dist.all_gather_into_tensor(np.ones(3), np.ones(2)),
                 lambda: dist.broadcast(np.ones(2), src=5),
                 lambda: dist.all_reduce(np.ones(2), op=dist.ReduceOp.BAND)):
        try:
            call()
            texts.append("no error")
        except (InvalidArgumentError, ValueError) as exc:
            texts.append(str(exc))
    x = np.ones(2)
    dist.all_reduce(x)      # the ranks still agree on their sequence
    return texts + [x.tolist()]


@pytest.mark.timeout(120)
def test_bad_input_still_gets_the_regular_errors() -> None:
    res = run_ranks(_bad_input, 2, transport="shm", timeout=60)
    for texts in res:
        assert all(t != "no error" for t in texts[:4]), texts
        assert "contiguous" in texts[0] or "stride" in texts[0], texts[0]
        assert "src" in texts[2] or "rank" in texts[2], texts[2]
        assert "BAND" in texts[3] and "float64" in texts[3], texts[3]
        assert texts[4] == [2.0, 2.0]


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
    res = run_ranks(_torch_fast, 2, transport="shm", timeout=90, init=False)
    for out in res:
        assert out["t"] == [3.0] * 3 and out["b"] == [0, 2, 4, 6] and out["out"] == [0, 0, 1, 1]
        assert out["taken"] == 3 and out["after"] == 4, out
        assert out["bf"] == [2.0, 2.0]


def _barrier_peer_killed() -> Any:
    import time

    import collcomm as dist
    from collcomm.errors import CollcommError

    dist.barrier()
    before = _calls()
    dist.barrier()                       # fast on both ranks
    if dist.get_rank() == 1:
        time.sleep(30)                   # killed by the harness meanwhile
        return "not killed"
    start = time.monotonic()
    try:
        dist.barrier()                   # the peer never comes: it was killed
    except CollcommError as exc:
        return type(exc).__name__, str(exc), _calls() - before, time.monotonic() - start
    return "no error"


@pytest.mark.timeout(120)
def test_a_fast_barrier_notices_a_killed_peer() -> None:
    res = run_ranks(_barrier_peer_killed, 2, transport="shm", timeout=60, expect_failure=True,
                    kill={1: 1.5}, env={"COLLCOMM_TIMEOUT": "20"})
    o = res[0]
    assert o.ok, (o.error_type, o.error, o.output)
    kind, text, calls, waited = o.value
    assert calls == 1, o.value           # the first barrier fast; the third failed in it
    assert kind == "PeerLostError" and "barrier" in text and "rank 1" in text, o.value
    assert waited < 10, o.value
