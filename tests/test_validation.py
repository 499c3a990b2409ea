"""Bad arguments raise InvalidArgumentError before any traffic, with a message that names
the collective, the group/rank and expected vs actual; the other ranks never hang."""
from __future__ import annotations

import numpy as np
import pytest

import collcomm as dist
from tests.harness import run_ranks


def _raises(fn, *needles: str) -> str | None:
    """None if ``fn()`` raises InvalidArgumentError whose message has every needle, else why not."""
    try:
        fn()
    except dist.InvalidArgumentError as exc:
        msg = str(exc)
        missing = [s for s in needles if s not in msg]
        return f"message {msg!r} lacks {missing}" if missing else None
    except Exception as exc:  # noqa: BLE001
        return f"raised {type(exc).__name__}: {exc}"
    return "did not raise"


def bad_calls() -> dict[str, tuple]:
    """name -> (thunk, needles). Every rank passes the same bad argument."""
    n, r = dist.get_world_size(), dist.get_rank()
    f4 = np.zeros(4, dtype=np.float32)
    ro = np.zeros(4)
    ro.flags.writeable = False
    return {
        "broadcast src out of range": (lambda: dist.broadcast(f4, src=n), ("broadcast", f"src={n}", "WORLD")),
        "reduce dst negative": (lambda: dist.reduce(f4, dst=-1), ("reduce", "dst=-1")),
        "gather dst range": (lambda: dist.gather(f4, None, dst=n + 3), ("gather", f"dst={n + 3}")),
        "scatter src range": (lambda: dist.scatter(f4, None, src=n), ("scatter", f"src={n}")),
        "both src and group_src": (lambda: dist.broadcast(f4, src=0, group_src=0), ("broadcast", "not both")),
        "all_gather_into_tensor size": (lambda: dist.all_gather_into_tensor(np.zeros(4 * n + 1, np.float32), f4),
                                        ("all_gather_into_tensor", f"expected {4 * n}", f"{4 * n + 1}")),
        "all_gather_into_tensor dtype": (lambda: dist.all_gather_into_tensor(np.zeros(4 * n), f4),
                                         ("all_gather_into_tensor", "float64", "float32")),
        "reduce_scatter_tensor divisible": (lambda: dist.reduce_scatter_tensor(np.zeros(1), np.zeros(n * 3 + 1)),
                                            ("reduce_scatter_tensor", "not divisible", str(n))),
        "reduce_scatter_tensor size": (lambda: dist.reduce_scatter_tensor(np.zeros(2), np.zeros(n * 3)),
                                       ("reduce_scatter_tensor", "expected 3")),
        "non-contiguous output": (lambda: dist.all_reduce(np.zeros(8)[::2]), ("all_reduce", "contiguous")),
        "read-only output": (lambda: dist.broadcast(ro, src=0), ("broadcast", "read-only")),
        "read-only bytes": (lambda: dist.all_reduce(b"abc"), ("all_reduce", "read-only")),
        "not a buffer": (lambda: dist.all_reduce([1.0, 2.0]), ("all_reduce", "list")),
        "op invalid for dtype": (lambda: dist.all_reduce(np.zeros(3, np.int32), op=dist.ReduceOp.AVG),
                                 ("all_reduce", "AVG", "int32")),
        "bitwise on float": (lambda: dist.all_reduce(np.zeros(3), op=dist.ReduceOp.BAND), ("BAND", "float64")),
        "unknown op": (lambda: dist.all_reduce(np.zeros(3), op="median"), ("all_reduce", "median")),
        "tensor_list length": (lambda: dist.all_gather([np.zeros(4, np.float32)] * (n + 1), f4),
                               ("all_gather", f"expected {n}", f"got {n + 1}")),
        "tensor_list element size": (lambda: dist.all_gather([np.zeros(3, np.float32)] * n, f4),
                                     ("all_gather", "tensor_list[0]", "expected 4")),
        "reduce_scatter list dtype": (lambda: dist.reduce_scatter(f4, [np.zeros(4)] * n),
                                      ("reduce_scatter", "float64", "float32")),
        "all_to_all_single splits": (lambda: dist.all_to_all_single(np.zeros(n), np.zeros(n), [1] * n, [2] * n),
                                     ("all_to_all_single", "input_split_sizes", "sum")),
        "all_to_all_single split count": (lambda: dist.all_to_all_single(np.zeros(n), np.zeros(n), None, [0] * (n + 1)),
                                          ("all_to_all_single", f"expected {n}", f"got {n + 1}")),
        "all_to_all list": (lambda: dist.all_to_all([np.zeros(1)] * n, [np.zeros(1)] * (n + 2)),
                            ("all_to_all", "input_tensor_list", f"got {n + 2}")),
        "gather_list off root": (lambda: dist.gather(f4, [f4] * n, dst=(r + 1) % n) if n > 1 else
                                 dist.gather(f4, [f4], dst=1), ("gather",)),
        "object list length": (lambda: dist.all_gather_object([None] * (n + 1), 1),
                               ("all_gather_object", f"expected {n}")),
        "send to self": (lambda: dist.send(f4, r), ("send", "itself")),
        "p2p tag": (lambda: dist.isend(f4, (r + 1) % n, tag=-1) if n > 1 else dist.isend(f4, 1), ("isend",)),
        "group not a group": (lambda: dist.all_reduce(f4, group="world"), ("all_reduce", "ProcessGroup")),
        "P2POp op": (lambda: dist.P2POp(dist.send, f4, 0), ("P2POp",)),
    }


def all_bad() -> list[str]:
    """Run every bad call on every rank, then prove the group still works (nobody hung)."""
    calls = bad_calls()
    if dist.get_world_size() == 1:
        del calls["reduce_scatter_tensor divisible"]  # everything divides by 1
    fails = [f"{name}: {why}" for name, (thunk, needles) in calls.items()
             if (why := _raises(thunk, *needles))]
    t = np.full(3, float(dist.get_rank() + 1))
    dist.all_reduce(t)
    n = dist.get_world_size()
    if not np.all(t == n * (n + 1) / 2):
        fails.append("collective after the bad calls gave a wrong result")
    return fails


def non_member_p2p() -> list[str]:
    r = dist.get_rank()
    g = dist.new_group([0])
    fails = []
    if r != 0:
        why = _raises(lambda: dist.send(np.zeros(1), 0, group=g), "send", "not in the group")
        if why:
            fails.append(why)
        why = _raises(lambda: dist.recv_object_list([None], 0, group=g), "recv_object_list", "not in the group")
        if why:
            fails.append(why)
        if dist.all_reduce(np.zeros(1), group=g) is not None:
            fails.append("non-member collective did not return None")
    dist.barrier()
    return fails


def one_rank_bad_root() -> str:
    """Only rank 1 passes a bad root: it raises at once; rank 0's matching call times out."""
    if dist.get_rank() == 1:
        why = _raises(lambda: dist.broadcast(np.zeros(2), src=9), "broadcast", "src=9")
        return why or "ok"
    try:
        dist.broadcast(np.zeros(2), src=1)
    except dist.CollcommError as exc:
        return f"timed out: {type(exc).__name__}"
    return "no error"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("n", [2, 3])
def test_bad_arguments_multi_rank(n):
    res = run_ranks(all_bad, n)
    assert [f for fs in res for f in fs] == []


@pytest.mark.timeout(60)
def test_non_member_p2p():
    res = run_ranks(non_member_p2p, 3)
    assert [f for fs in res for f in fs] == []


@pytest.mark.timeout(60)
def test_only_one_rank_knows():
    res = run_ranks(one_rank_bad_root, 2, env={"COLLCOMM_TIMEOUT": "1.5"}, timeout=40)
    assert res[1] == "ok"
    assert res[0].startswith("timed out")


def test_use_before_init():
    assert not dist.is_initialized()
    for call in (lambda: dist.all_reduce(np.zeros(2)), lambda: dist.get_rank(),
                 lambda: dist.barrier(), lambda: dist.broadcast_object_list([1], 0)):
        why = _raises(call, "not initialized")
        assert why is None, why


def test_bad_arguments_world_of_one(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    dist.init_process_group()
    try:
        assert all_bad() == []
    finally:
        dist.destroy_process_group()
