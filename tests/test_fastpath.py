"""The fast call (collcomm/core/fastpath.py, collcomm/native/_fastcall.c): what it does is
what the regular path does.

A front end's small call on numpy arrays runs as one C call; everything it does must be
what the regular path does: the same results (bit for bit, every built-in op and numeric
dtype), the same signature (a fast rank and a regular rank share a job), the same record
in the flight recorder (with the caller's file:line) and the same mismatch errors (named
on every rank, whichever path each rank took). Which calls take it:
tests/test_fastpath_taken.py; timeouts, bad input and a killed peer:
tests/test_fastpath_errors.py.
"""
from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import pytest

from collcomm import native
from tests.fastpath_common import _calls
from tests.harness import line_of, run_ranks

pytestmark = pytest.mark.skipif(native.core is None, reason=f"native core: {native.reason}")

OPS = ["SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "LAND", "LOR", "LXOR", "AVG"]
DTYPES = ["bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
          "float16", "float32", "float64", "complex64", "complex128"]


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
