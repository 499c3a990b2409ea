"""The cases tests/test_torch_backend.py runs on backend "collcomm" and on gloo.

``_cases(dist, rank, size)`` maps a name to a case: a function of the group (None: the
default group) that makes one torch.distributed call and returns what it produced here
(tensors, lists, ints; None where torch leaves the value undefined). Data are small
integers, so floating-point sums are exact in any order. :class:`Checks` collects what
went wrong. Imported by the ranks: torch must be importable (the test module skips first).
"""
from __future__ import annotations

import datetime
from typing import Any, Callable

import torch


class Checks:
    def __init__(self) -> None:
        self.bad: list[str] = []
        self.gloo_lacks: list[str] = []
        self.count = 0

    def same(self, what: str, got: Any, want: Any) -> None:
        self.count += 1
        if not _equal(got, want):
            self.bad.append(f"{what}: got {got!r}, want {want!r}")

    def true(self, what: str, cond: bool) -> None:
        self.count += 1
        if not cond:
            self.bad.append(what)


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return a == b


def _data(r: int, n: int, dtype: Any, salt: int = 0) -> Any:
    x = (torch.arange(n, dtype=torch.int64) * 7 + r * 13 + salt * 5) % 7 - 3
    if dtype in (torch.uint8, torch.bool):
        x = x.abs()
    return x.to(dtype)


# ----------------------------------------------------------------------------- the cases
# Each case takes (dist, group, rank, size) and returns what the call produced here
# (tensors, lists, ints; None where torch leaves the value undefined).

def _cases(dist: Any, r: int, n: int) -> dict[str, Callable[[Any], Any]]:
    R = dist.ReduceOp
    cases: dict[str, Callable[[Any], Any]] = {}

    def all_reduce(dtype: Any, op: Any, count: int = 5) -> Callable[[Any], Any]:
        def case(g: Any) -> Any:
            t = _data(r, count, dtype)
            ptr = t.data_ptr()
            dist.all_reduce(t, op=op, group=g)
            return t if t.data_ptr() == ptr else "storage changed"
        return case

    for dtype in (torch.float32, torch.float64, torch.int64, torch.int32, torch.float16,
                  torch.bfloat16, torch.int8):
        for op in (R.SUM, R.MAX, R.MIN, R.PRODUCT):
            cases[f"all_reduce {dtype} {op}"] = all_reduce(dtype, op)
    for op in (R.BAND, R.BOR, R.BXOR):
        cases[f"all_reduce int64 {op}"] = all_reduce(torch.int64, op)
    cases["all_reduce uint8 MAX"] = all_reduce(torch.uint8, R.MAX)
    cases["all_reduce bool MAX"] = all_reduce(torch.bool, R.MAX)
    cases["all_reduce complex64 SUM"] = lambda g: _complex_sum(dist, g, r)
    cases["all_reduce empty"] = all_reduce(torch.float32, R.SUM, 0)
    cases["all_reduce large"] = all_reduce(torch.float32, R.SUM, 300_001)
    cases["all_reduce async future"] = lambda g: _async_future(dist, g, r)
    cases["all_reduce_coalesced"] = lambda g: _coalesced(dist, g, r)
    cases["coalescing manager"] = lambda g: _coalescing_manager(dist, g, r, n)

    for root in range(n):
        cases[f"broadcast root {root}"] = lambda g, root=root: _broadcast(dist, g, r, root)
        cases[f"reduce root {root}"] = lambda g, root=root: _reduce(dist, g, r, root)
        cases[f"gather root {root}"] = lambda g, root=root: _gather(dist, g, r, n, root)
        cases[f"scatter root {root}"] = lambda g, root=root: _scatter(dist, g, r, n, root)

    cases["all_gather"] = lambda g: _all_gather(dist, g, r, n)
    cases["all_gather_into_tensor"] = lambda g: _all_gather_into_tensor(dist, g, r, n)
    cases["all_gather_coalesced"] = lambda g: _all_gather_coalesced(dist, g, r, n)
    cases["reduce_scatter"] = lambda g: _reduce_scatter(dist, g, r, n)
    cases["reduce_scatter_tensor"] = lambda g: _reduce_scatter_tensor(dist, g, r, n)
    cases["all_to_all"] = lambda g: _all_to_all(dist, g, r, n)
    cases["all_to_all_single even"] = lambda g: _a2a_single(dist, g, r, n, uneven=False)
    cases["all_to_all_single splits"] = lambda g: _a2a_single(dist, g, r, n, uneven=True)
    cases["barrier"] = lambda g: dist.barrier(group=g)
    cases["objects"] = lambda g: _objects(dist, g, r, n)
    if n > 1:
        cases["send/recv ring"] = lambda g: _send_recv(dist, g, r, n)
        cases["recv any source"] = lambda g: _recv_any(dist, g, r, n)
        cases["batch_isend_irecv"] = lambda g: _batch(dist, g, r, n)
    return cases


def _complex_sum(dist: Any, g: Any, r: int) -> Any:
    t = torch.tensor([1 + 2j, r - 1j], dtype=torch.complex64)
    dist.all_reduce(t, group=g)
    return t


def _async_future(dist: Any, g: Any, r: int) -> Any:
    t = torch.full((1000,), float(r + 1), dtype=torch.float64)
    w = dist.all_reduce(t, group=g, async_op=True)
    fut = w.get_future()
    doubled = fut.then(lambda f: f.value()[0] * 2)
    ok = w.wait(timeout=datetime.timedelta(seconds=30))
    return [t, doubled.wait(), bool(ok), w.is_completed(), w.is_success(), w.exception() is None,
            w.result()]


def _coalesced(dist: Any, g: Any, r: int) -> Any:
    ts = [torch.full((3,), float(r)), torch.arange(4, dtype=torch.float32) * r]
    dist.all_reduce_coalesced(ts, group=g)
    return ts


def _coalescing_manager(dist: Any, g: Any, r: int, n: int) -> Any:
    """torch's _coalescing_manager turns these into one *_coalesced call each."""
    a, b = torch.full((2,), float(r)), torch.arange(3.0) + r
    with dist._coalescing_manager(group=g):
        dist.all_reduce(a, group=g)
        dist.all_reduce(b, group=g)
    outs = [torch.empty(2 * n), torch.empty(3 * n)]
    with dist._coalescing_manager(group=g):
        dist.all_gather_into_tensor(outs[0], torch.full((2,), float(r)), group=g)
        dist.all_gather_into_tensor(outs[1], torch.arange(3.0) * r, group=g)
    rs = [torch.empty(1), torch.empty(2)]
    with dist._coalescing_manager(group=g):
        dist.reduce_scatter_tensor(rs[0], torch.arange(float(n)) + r, group=g)
        dist.reduce_scatter_tensor(rs[1], torch.arange(2.0 * n) * r, group=g)
    return [a, b, outs, rs]


def _broadcast(dist: Any, g: Any, r: int, root: int) -> Any:
    t = _data(r, 7, torch.int64, salt=root) if r == root else torch.zeros(7, dtype=torch.int64)
    dist.broadcast(t, src=dist.get_global_rank(g, root) if g is not None else root, group=g)
    return t


def _reduce(dist: Any, g: Any, r: int, root: int) -> Any:
    t = _data(r, 6, torch.float32)
    dist.reduce(t, group_dst=root, group=g)
    return t if r == root else None        # non-root values: undefined in gloo


def _gather(dist: Any, g: Any, r: int, n: int, root: int) -> Any:
    lst = [torch.empty(3, dtype=torch.int32) for _ in range(n)] if r == root else None
    dist.gather(_data(r, 3, torch.int32), lst, group_dst=root, group=g)
    return lst


def _scatter(dist: Any, g: Any, r: int, n: int, root: int) -> Any:
    out = torch.empty(2, 2, dtype=torch.float64)
    lst = [torch.full((2, 2), float(p * 10 + root), dtype=torch.float64) for p in range(n)]
    dist.scatter(out, lst if r == root else None, group_src=root, group=g)
    return out


def _all_gather(dist: Any, g: Any, r: int, n: int) -> Any:
    outs = [torch.empty(4, dtype=torch.bfloat16) for _ in range(n)]
    ptrs = [o.data_ptr() for o in outs]
    dist.all_gather(outs, _data(r, 4, torch.bfloat16), group=g)
    return outs if [o.data_ptr() for o in outs] == ptrs else "outputs replaced"


def _all_gather_coalesced(dist: Any, g: Any, r: int, n: int) -> Any:
    outs = [[torch.empty(2), torch.empty(3)] for _ in range(n)]     # outs[rank][input]
    dist.all_gather_coalesced(outs, [torch.full((2,), float(r)), torch.arange(3.0) * r], group=g)
    return outs


def _all_gather_into_tensor(dist: Any, g: Any, r: int, n: int) -> Any:
    out = torch.empty(n * 3, dtype=torch.float16)   # gloo refuses a 2-D output (collcomm: below)
    inp = torch.arange(3, dtype=torch.float16) * 3 + r
    dist.all_gather_into_tensor(out, inp, group=g)
    return out


def _reduce_scatter(dist: Any, g: Any, r: int, n: int) -> Any:
    ins = [_data(r, 2, torch.float32, salt=p) for p in range(n)]
    out = torch.empty(2)
    dist.reduce_scatter(out, ins, group=g)
    return out


def _reduce_scatter_tensor(dist: Any, g: Any, r: int, n: int) -> Any:
    inp = _data(r, 3 * n, torch.int64)
    out = torch.empty(3, dtype=torch.int64)
    dist.reduce_scatter_tensor(out, inp, op=dist.ReduceOp.MAX, group=g)
    return [out, inp]


def _all_to_all(dist: Any, g: Any, r: int, n: int) -> Any:
    ins = [torch.tensor([r * 100 + p, p], dtype=torch.int64) for p in range(n)]
    outs = [torch.empty(2, dtype=torch.int64) for _ in range(n)]
    dist.all_to_all(outs, ins, group=g)
    return outs


def _a2a_single(dist: Any, g: Any, r: int, n: int, uneven: bool) -> Any:
    if not uneven:
        inp = torch.arange(2 * n, dtype=torch.float32) + 100 * r
        out = torch.empty(2 * n)
        dist.all_to_all_single(out, inp, group=g)
        return out
    # rank r sends p+1 rows of 2 to rank p, so it receives r+1 rows from every rank
    inp = torch.cat([torch.full((p + 1, 2), float(r * 10 + p)) for p in range(n)])
    out = torch.empty(n * (r + 1), 2)
    dist.all_to_all_single(out, inp, output_split_sizes=[r + 1] * n,
                           input_split_sizes=[p + 1 for p in range(n)], group=g)
    return out


def _objects(dist: Any, g: Any, r: int, n: int) -> Any:
    res: list[Any] = []
    objs = [{"from": 0, "vec": list(range(4))}, "x"] if r == 0 else [None, None]
    dist.broadcast_object_list(objs, group_src=0, group=g)
    res.append(objs)
    every = [None] * n
    dist.all_gather_object(every, (r, "r" * r), group=g)
    res.append(every)
    got = [None] * n if r == n - 1 else None
    dist.gather_object({"r": r}, got, group_dst=n - 1, group=g)
    res.append(got)
    out = [None]
    dist.scatter_object_list(out, [p * p for p in range(n)] if r == 0 else None, group_src=0, group=g)
    res.append(out)
    return res


def _send_recv(dist: Any, g: Any, r: int, n: int) -> Any:
    nxt, prv = (r + 1) % n, (r - 1) % n
    got = torch.empty(4)
    if r % 2 == 0:
        dist.send(torch.full((4,), float(r)), group_dst=nxt, group=g)
        dist.recv(got, group_src=prv, group=g)
    else:
        dist.recv(got, group_src=prv, group=g)
        dist.send(torch.full((4,), float(r)), group_dst=nxt, group=g)
    w = dist.isend(torch.tensor([r, 7]), group_dst=prv, group=g, tag=5)
    got2 = torch.empty(2, dtype=torch.int64)
    w2 = dist.irecv(got2, group_src=nxt, group=g, tag=5)
    w2.wait()
    w.wait()
    objs = [None, None]
    if r % 2 == 0:
        dist.send_object_list([{"from": r}, [r] * r], group_dst=nxt, group=g)
        dist.recv_object_list(objs, group_src=prv, group=g)
    else:
        dist.recv_object_list(objs, group_src=prv, group=g)
        dist.send_object_list([{"from": r}, [r] * r], group_dst=nxt, group=g)
    return [got, got2, objs]


def _recv_any(dist: Any, g: Any, r: int, n: int) -> Any:
    if r == 0:
        senders = []
        for _ in range(n - 1):
            t = torch.empty(1, dtype=torch.int64)
            sender = dist.recv(t, group=g) if g is None else dist.recv(t, group=g)
            senders.append((dist.get_group_rank(g, sender) if g is not None else sender, int(t)))
        return sorted(senders)
    dist.send(torch.tensor([r * 3]), group_dst=0, group=g)
    return None


def _batch(dist: Any, g: Any, r: int, n: int) -> Any:
    nxt, prv = (r + 1) % n, (r - 1) % n
    got = torch.empty(2, dtype=torch.int64)
    glob = (lambda p: dist.get_global_rank(g, p)) if g is not None else (lambda p: p)
    ws = dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.tensor([r, 1]), glob(nxt), g),
                                 dist.P2POp(dist.irecv, got, glob(prv), g)])
    for w in ws:
        w.wait()
    return got
