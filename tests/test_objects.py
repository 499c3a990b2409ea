"""Object collectives: torch's *_object functions plus all_reduce_object/reduce_object."""
from __future__ import annotations

import numpy as np
import pytest

import collcomm as dist
from collcomm import objects
from tests.harness import run_ranks

TRANSPORTS = ["shm", "tcp"]


def obj_of(r: int) -> dict:
    return {"rank": r, "name": "x" * r, "arr": np.arange(100_000) * r, "small": np.arange(3) + r}


def eq(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(eq(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(eq(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and np.array_equal(a, b)
    return a == b


def all_objects() -> list[str]:
    r, n = dist.get_rank(), dist.get_world_size()
    fails: list[str] = []

    def expect(ok: bool, what: str) -> None:
        if not ok:
            fails.append(f"rank {r}/{n}: {what}")

    for root in range(n):
        lst = [obj_of(root), "two", 3] if r == root else [None, None, None]
        dist.broadcast_object_list(lst, src=root)
        expect(eq(lst, [obj_of(root), "two", 3]), f"broadcast_object_list root {root}")
        out = [None] * n if r == root else None
        dist.gather_object(obj_of(r), out, dst=root)
        expect(eq(out, [obj_of(p) for p in range(n)]) if r == root else out is None, f"gather_object {root}")
        got = [None]
        dist.scatter_object_list(got, [obj_of(p) for p in range(n)] if r == root else None, src=root)
        expect(eq(got[0], obj_of(r)), f"scatter_object_list {root}")
        red = dist.reduce_object(r + 1, op="sum", dst=root)
        expect(red == (n * (n + 1) // 2 if r == root else None), f"reduce_object {root}")
    shared = [1, 2]
    box = [shared, shared] if r == 0 else [None, None]
    dist.broadcast_object_list(box, src=0)
    expect(r == 0 or box[0] is not box[1], "broadcast_object_list: each entry its own object (torch)")
    lst = [None] * n
    dist.all_gather_object(lst, obj_of(r))
    expect(eq(lst, [obj_of(p) for p in range(n)]), "all_gather_object")
    expect(dist.all_reduce_object((r + 1) * 2, op=dist.ReduceOp.MAX) == 2 * n, "all_reduce_object MAX")
    expect(dist.all_reduce_object([r]) == list(range(n)), "all_reduce_object SUM of lists")
    expect(dist.all_reduce_object(r, op=lambda a, b: a * 10 + b) == int("".join(map(str, range(n))) or 0),
           "all_reduce_object callable, rank order")
    expect(abs(dist.all_reduce_object(float(r), op="mean") - (n - 1) / 2) < 1e-12, "all_reduce_object AVG")
    if n > 1:
        nxt, prv = (r + 1) % n, (r - 1) % n
        if r % 2 == 0:
            dist.send_object_list([obj_of(r), r], nxt)
            got = [None, None]
            src = dist.recv_object_list(got, prv)
        else:
            got = [None, None]
            src = dist.recv_object_list(got, prv)
            dist.send_object_list([obj_of(r), r], nxt)
        expect(src == prv and eq(got, [obj_of(prv), prv]), "send/recv_object_list")
        if r == 0:
            seen = set()
            for _ in range(n - 1):
                box = [None]
                s = dist.recv_object_list(box)
                seen.add((s, box[0]))
            expect(seen == {(p, f"from {p}") for p in range(1, n)}, f"recv_object_list any source {seen}")
        else:
            dist.send_object_list([f"from {r}"], 0)
    dist.barrier()
    return fails


@pytest.mark.timeout(90)
@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_objects(n, transport):
    res = run_ranks(all_objects, n, transport=transport, timeout=80)
    assert [f for fs in res for f in fs] == []


def seed_mpi4py() -> tuple:
    r = dist.get_rank()
    total = dist.reduce_object((r + 1) ** 2, op="sum", dst=0)
    biggest = dist.all_reduce_object((r + 1) * 2, op="MPI_MAX")
    box = [{"msg": "Hello", "vec": np.arange(4)} if r == 0 else None]
    dist.broadcast_object_list(box, src=0)
    out = [None]
    dist.scatter_object_list(out, np.split(np.arange(12), 4) if r == 0 else None, src=0)
    return total, biggest, box[0]["msg"], box[0]["vec"].tolist(), out[0].tolist()


@pytest.mark.timeout(60)
def test_seed_mpi4py_examples():
    res = run_ranks(seed_mpi4py, 4)
    assert [x[0] for x in res] == [30, None, None, None]
    assert all(x[1] == 8 and x[2] == "Hello" and x[3] == [0, 1, 2, 3] for x in res)
    assert [x[4] for x in res] == [[3 * r, 3 * r + 1, 3 * r + 2] for r in range(4)]


def test_large_arrays_travel_out_of_band():
    big = np.arange(1 << 20, dtype=np.float64)
    p = objects.pack([{"w": big, "b": np.arange(10)}])
    assert len(p.buffers) == 1 and np.shares_memory(p.buffers[0], big)   # not copied into the pickle
    assert p.payload.nbytes < 4096
    recv = objects.alloc(p.meta.copy())
    np.copyto(recv.payload, p.payload)
    for dst, src in zip(recv.buffers, p.buffers):
        np.copyto(dst, src)
    back = objects.unpack(recv)[0]
    assert np.array_equal(back["w"], big) and np.shares_memory(back["w"], recv.buffers[0])
    assert back["w"].flags.writeable


def test_unpicklable_is_invalid_argument():
    with pytest.raises(dist.InvalidArgumentError, match="cannot be pickled"):
        objects.pack([lambda: 0])
