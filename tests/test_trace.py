"""Chrome traces (COLLCOMM_TRACE), stats (COLLCOMM_STATS), logging and DETAIL mismatch checks."""
from __future__ import annotations

import json
import os
import time

import numpy as np
import pytest

from tests.harness import run_ranks


def _traced_job() -> str:
    import collcomm as dist

    x = np.arange(10.0)
    dist.all_reduce(x, algorithm="ring")
    dist.broadcast(x, src=1, algorithm="tree")
    if dist.get_rank() == 0:
        time.sleep(0.05)             # the others wait in the barrier for rank 0
    dist.barrier()
    dist.all_reduce(np.ones(3))
    return json.dumps(dist.stats())


def _load(folder: str) -> list[dict]:
    from collcomm.tools.trace import merge

    with open(merge(folder)) as f:
        return json.load(f)["traceEvents"]


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_trace_pairs_every_send_with_a_receive_and_aligns_clocks(tmp_path, transport):
    folder = str(tmp_path / "trace")
    out = run_ranks(_traced_job, 3, env={"COLLCOMM_TRACE": folder, "COLLCOMM_STATS": "1"},
                    transport=transport, timeout=60)
    events = _load(folder)
    calls = [e for e in events if e.get("cat") == "collective"]
    assert sorted({e["pid"] for e in calls}) == [0, 1, 2]
    ring = [e for e in calls if e["args"]["seq"] == 1]
    assert len(ring) == 3 and all(e["name"] == "all_reduce" for e in ring)
    assert all(e["args"]["algorithm"] == "ring" for e in ring)
    a = ring[0]["args"]
    assert (a["group"], a["dtype"], a["count"], a["bytes"], a["op"]) == ("WORLD", "float64", 10, 80, "SUM")
    # every send (flow start) has exactly one receive (flow end) with its id, and vice versa
    starts = [e["id"] for e in events if e["ph"] == "s"]
    ends = [e["id"] for e in events if e["ph"] == "f"]
    assert starts and sorted(starts) == sorted(ends) and len(set(starts)) == len(starts)
    # ring all_reduce on 3 ranks: 2(n-1) = 4 steps per rank, 4 sends of ~1/3 of the data
    sends = [e for e in events if e.get("cat") == "message" and e["ph"] == "X"
             and e["args"]["op"] == "all_reduce" and e["name"].startswith("send")
             and e["args"]["seq"] == a["seq"]]
    for r in range(3):
        mine = [e for e in sends if e["pid"] == r]
        assert sorted(e["args"]["step"] for e in mine) == [1, 2, 3, 4]
    # chunks of 4, 3, 3 elements: rank 0 sends 14, ranks 1 and 2 send 13 (2(n-1)/n·K each on average)
    assert [sum(e["args"]["bytes"] for e in sends if e["pid"] == r) for r in range(3)] == [112, 104, 104]
    # the barrier's slices overlap on the common clock
    barrier = [e for e in calls if e["name"] == "barrier"]
    assert len(barrier) == 3
    assert max(e["ts"] for e in barrier) < min(e["ts"] + e["dur"] for e in barrier)
    # clock offsets measured through the store: on one host the truth is 0
    for r in range(1, 3):
        with open(os.path.join(folder, f"trace-rank{r}.json")) as f:
            meta = json.load(f)["metadata"]
        lower, upper = meta["measured_bounds_ns"]        # causal bounds hold the truth, 0
        assert lower <= 0 <= upper and lower <= meta["measured_offset_ns"] <= upper, meta
        assert upper - lower < 100e6, meta
    s = json.loads(out[0])
    assert s["all_reduce"]["calls"] == 2 and s["all_reduce"]["bytes"] == 80 + 24
    assert s["barrier"]["calls"] == 1 and s["broadcast"]["calls"] == 1


def _stats_off() -> str:
    import collcomm as dist

    dist.all_reduce(np.ones(2))
    return json.dumps(dist.stats())


def test_stats_empty_unless_enabled_and_printed_at_exit():
    assert run_ranks(_stats_off, 2) == ["{}", "{}"]


def _stats_reset() -> str:
    import collcomm as dist

    for _ in range(3):
        dist.all_reduce(np.ones(4, dtype=np.float32))
    first = dist.stats(reset=True)
    second = dist.stats()
    return json.dumps([first, second])


def test_stats_counts_and_resets():
    out = run_ranks(_stats_reset, 2, env={"COLLCOMM_STATS": "1"})
    first, second = json.loads(out[0])
    s = first["all_reduce"]
    assert s["calls"] == 3 and s["bytes"] == 3 * 16 and s["mean_s"] > 0
    assert s["busbw_GBps"] == pytest.approx(s["algbw_GBps"] * 2 * (2 - 1) / 2)
    assert second == {}


def _mismatch(kind: str) -> str:
    import collcomm as dist

    r = dist.get_rank()
    x = np.ones(4, dtype=np.float32)
    try:
        if kind == "op" and r == 1:  # OTHER_op
            dist.all_gather_into_tensor(np.empty(12, dtype=np.float32), x)   # LINE_OTHER
        elif kind == "dtype" and r == 1:  # OTHER_dtype
            dist.all_reduce(np.ones(4, dtype=np.float64))                  # LINE_OTHER
        elif kind == "count" and r == 1:  # OTHER_count
            dist.all_reduce(np.ones(5, dtype=np.float32))                  # LINE_OTHER
        elif kind == "root" and r == 1:  # OTHER_root
            dist.broadcast(x, src=1)                                        # LINE_OTHER
        elif kind == "root":
            dist.broadcast(x, src=0)                                        # LINE_MINE_ROOT
        elif kind == "redop" and r == 1:  # OTHER_redop
            dist.all_reduce(x, op=dist.ReduceOp.MAX)                        # LINE_OTHER
        else:
            dist.all_reduce(x)                                              # LINE_MINE
    except dist.MismatchError as exc:
        return str(exc)
    return "no error"


def _line(marker: str) -> int:
    with open(__file__) as f:
        for i, text in enumerate(f, 1):
            if text.rstrip().endswith(f"# {marker}"):
                return i + 1 if marker.startswith("OTHER_") else i
    raise AssertionError(marker)


@pytest.mark.parametrize("kind,theirs", [
    ("op", "all_gather(float32[4])"), ("dtype", "all_reduce(float64[4], op=SUM)"),
    ("count", "all_reduce(float32[5], op=SUM)"), ("root", "broadcast(float32[4], root=1)"),
    ("redop", "all_reduce(float32[4], op=MAX)")])
def test_detail_names_both_sides_of_each_mismatch(kind, theirs):
    out = run_ranks(_mismatch, 3, kind, env={"COLLCOMM_DEBUG": "DETAIL"}, timeout=60)
    mine = "broadcast(float32[4], root=0)" if kind == "root" else "all_reduce(float32[4], op=SUM)"
    mine_line = _line("LINE_MINE_ROOT" if kind == "root" else "LINE_MINE")
    for r in range(3):
        msg = out[r]
        assert f"ranks [0, 2] called {mine} as #1 on group WORLD at " in msg, msg
        assert f"test_trace.py:{mine_line}" in msg, msg
        assert f"rank 1 called {theirs} at test_trace.py:{_line('OTHER_' + kind)}" in msg \
            or f"rank 1 called {theirs} at tests/test_trace.py:{_line('OTHER_' + kind)}" in msg, msg
        assert "COLLCOMM_DEBUG=DETAIL" in msg


def _log_lines() -> None:
    import collcomm as dist

    dist.all_reduce(np.ones(2), algorithm="ring")


def test_log_info_names_transport_and_algorithm():
    outcomes = run_ranks(_log_lines, 2, env={"COLLCOMM_LOG": "INFO"}, transport="tcp",
                         expect_failure=True)
    for o in outcomes:
        assert o.ok, o.error
        assert f"[collcomm rank {o.rank}] INFO rank {o.rank}: transport per peer: {1 - o.rank}:tcp" in o.output
        assert "INFO all_reduce on group WORLD: algorithm ring (all_reduce(float64[2], op=SUM))" in o.output
