"""torch CPU tensors through every collective (zero copy, in place), bfloat16, helpers.

Each rank runs one body that checks everything and returns the list of what went wrong,
so a handful of processes (torch is slow to import) covers the whole surface.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import numpy as np  # noqa: E402

import collcomm as dist  # noqa: E402
from collcomm import helpers  # noqa: E402
from collcomm.errors import InvalidArgumentError  # noqa: E402
from tests.harness import TORCH, run_ranks  # noqa: E402


class _Checks:
    def __init__(self) -> None:
        self.bad: list[str] = []

    def eq(self, what: str, got, want) -> None:
        got_t = got if isinstance(got, torch.Tensor) else torch.as_tensor(got)
        want_t = want if isinstance(want, torch.Tensor) else torch.as_tensor(want)
        if got_t.dtype != want_t.dtype or got_t.shape != want_t.shape or not torch.equal(got_t, want_t):
            self.bad.append(f"{what}: got {got_t!r}, want {want_t!r}")

    def true(self, what: str, cond: bool) -> None:
        if not cond:
            self.bad.append(what)


def every_collective():
    """All the collectives with torch tensors; returns the failed checks (empty = all good)."""
    c = _Checks()
    r, n = dist.get_rank(), dist.get_world_size()
    peers = range(n)

    # all_reduce: in place, same storage, every op
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3) + r
    ptr = t.data_ptr()
    assert dist.all_reduce(t) is None
    c.true("all_reduce kept the tensor's storage", t.data_ptr() == ptr)
    c.eq("all_reduce SUM", t, torch.arange(6, dtype=torch.float32).reshape(2, 3) * n + sum(peers))
    t = torch.full((5,), r + 1, dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.PRODUCT)
    c.eq("all_reduce PRODUCT int64", t, torch.full((5,), int(np.prod([p + 1 for p in peers])), dtype=torch.int64))
    t = torch.tensor([r, -r], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    c.eq("all_reduce MAX int64", t, torch.tensor([n - 1, 0]))
    t = torch.tensor([0.5 * r, 1.0], dtype=torch.float16)
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    c.eq("all_reduce AVG float16", t, torch.tensor([0.5 * sum(peers) / n, 1.0], dtype=torch.float16))
    t = torch.tensor([r % 2 == 0, True, False])
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    c.eq("all_reduce MIN bool", t, torch.tensor([n == 1, True, False]))

    # async all_reduce
    t = torch.ones(1000, dtype=torch.float64)
    w = dist.all_reduce(t, async_op=True)
    w.wait()
    c.true("async all_reduce completed", w.is_completed())
    c.eq("async all_reduce", t, torch.full((1000,), float(n), dtype=torch.float64))

    # broadcast: in place
    t = torch.arange(7, dtype=torch.int64) * 10 if r == n - 1 else torch.zeros(7, dtype=torch.int64)
    ptr = t.data_ptr()
    dist.broadcast(t, src=n - 1)
    c.true("broadcast kept the tensor's storage", t.data_ptr() == ptr)
    c.eq("broadcast int64", t, torch.arange(7, dtype=torch.int64) * 10)

    # reduce to dst=0 (float16): only dst's tensor is defined
    t = torch.full((4,), float(r + 1), dtype=torch.float16)
    dist.reduce(t, dst=0)
    if r == 0:
        c.eq("reduce float16", t, torch.full((4,), float(sum(p + 1 for p in peers)), dtype=torch.float16))

    # all_gather into a list: each output tensor written in place
    outs = [torch.empty(3, dtype=torch.int64) for _ in peers]
    ptrs = [o.data_ptr() for o in outs]
    dist.all_gather(outs, torch.full((3,), r, dtype=torch.int64))
    c.true("all_gather wrote into the given tensors", [o.data_ptr() for o in outs] == ptrs)
    for p in peers:
        c.eq(f"all_gather[{p}]", outs[p], torch.full((3,), p, dtype=torch.int64))

    # all_gather_into_tensor (2-D output), input non-contiguous: inputs may be copied
    big = torch.arange(12, dtype=torch.float32).reshape(3, 4) + 100 * r
    inp = big.t()[0]  # a strided view: [100r, 100r+4, 100r+8]
    out = torch.empty(n, 3, dtype=torch.float32)
    ptr = out.data_ptr()
    dist.all_gather_into_tensor(out, inp)
    c.true("all_gather_into_tensor kept the output", out.data_ptr() == ptr)
    c.eq("all_gather_into_tensor", out,
         torch.stack([torch.tensor([0.0, 4.0, 8.0]) + 100 * p for p in peers]))

    # reduce_scatter (list) and reduce_scatter_tensor
    ins = [torch.full((2,), float(r * 10 + p), dtype=torch.float64) for p in peers]
    out = torch.empty(2, dtype=torch.float64)
    dist.reduce_scatter(out, ins)
    c.eq("reduce_scatter", out, torch.full((2,), float(sum(q * 10 + r for q in peers)), dtype=torch.float64))
    inp = torch.arange(2 * n, dtype=torch.int64) + r
    out = torch.empty(2, dtype=torch.int64)
    dist.reduce_scatter_tensor(out, inp, op=dist.ReduceOp.MAX)
    c.eq("reduce_scatter_tensor MAX", out, torch.arange(2 * r, 2 * r + 2, dtype=torch.int64) + n - 1)

    # all_to_all (list) and all_to_all_single with uneven splits
    ins = [torch.tensor([r * 100 + p], dtype=torch.int64) for p in peers]
    outs = [torch.empty(1, dtype=torch.int64) for _ in peers]
    dist.all_to_all(outs, ins)
    c.eq("all_to_all", torch.cat(outs), torch.tensor([p * 100 + r for p in peers]))
    # rank r sends p+1 rows to rank p; so it receives r+1 rows from every rank
    in_split = [p + 1 for p in peers]
    inp = torch.cat([torch.full((p + 1, 2), float(r * 10 + p)) for p in peers])
    out = torch.empty(n * (r + 1), 2)
    ptr = out.data_ptr()
    dist.all_to_all_single(out, inp, output_split_sizes=[r + 1] * n, input_split_sizes=in_split)
    c.true("all_to_all_single kept the output", out.data_ptr() == ptr)
    c.eq("all_to_all_single uneven", out, torch.cat([torch.full((r + 1, 2), float(p * 10 + r)) for p in peers]))

    # gather / scatter
    lst = [torch.empty(2, dtype=torch.float32) for _ in peers] if r == 0 else None
    dist.gather(torch.tensor([r, r * r], dtype=torch.float32), lst, dst=0)
    if r == 0:
        c.eq("gather", torch.stack(lst), torch.tensor([[p, p * p] for p in peers], dtype=torch.float32))
    t = torch.empty(3, dtype=torch.int64)
    src = n - 1
    dist.scatter(t, [torch.full((3,), p * 7, dtype=torch.int64) for p in peers] if r == src else None, src=src)
    c.eq("scatter", t, torch.full((3,), r * 7, dtype=torch.int64))

    # point to point: send/recv, isend/irecv (ring)
    nxt, prv = (r + 1) % n, (r - 1) % n
    got = torch.empty(4, dtype=torch.float32)
    if r % 2 == 0:
        dist.send(torch.full((4,), float(r)), dst=nxt)
        who = dist.recv(got, src=prv)
    else:
        who = dist.recv(got, src=prv)
        dist.send(torch.full((4,), float(r)), dst=nxt)
    c.true(f"recv returned the sender {who}", who == prv)
    c.eq("send/recv", got, torch.full((4,), float(prv)))
    got = torch.empty(2, dtype=torch.int64)
    ws = dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.tensor([r, 1]), nxt),
                                 dist.P2POp(dist.irecv, got, prv)])
    for w in ws:
        w.wait()
    c.eq("batch_isend_irecv", got, torch.tensor([prv, 1]))

    # outputs that cannot be written in place are refused (on every rank: consistent)
    nc = torch.zeros(4, 6)[:, ::2]
    for what, call in [("all_reduce", lambda: dist.all_reduce(nc)),
                       ("broadcast", lambda: dist.broadcast(nc, src=0)),
                       ("all_gather_into_tensor",
                        lambda: dist.all_gather_into_tensor(torch.zeros(n * 24)[::2], torch.zeros(12)))]:
        try:
            call()
            c.bad.append(f"{what} accepted a non-contiguous output")
        except InvalidArgumentError as exc:
            c.true(f"{what}: message {exc}", "contiguous" in str(exc) and what in str(exc))
    try:
        dist.all_reduce(torch.zeros(3).expand(2, 3))
        c.bad.append("all_reduce accepted an expanded (stride 0) tensor")
    except InvalidArgumentError:
        pass
    t = torch.ones(3, requires_grad=True)
    try:  # torch refuses in-place ops on leaves that need grad; we at least must not crash oddly
        dist.all_reduce(t)
    except InvalidArgumentError:
        pass
    else:
        c.eq("all_reduce of a requires_grad leaf (detached view)", t.detach(), torch.full((3,), float(n)))
    dist.barrier()
    return c.bad


def bfloat16_ops(seed: int):
    """bfloat16 all_reduce SUM/AVG/MAX against a float32 reference of the same bf16 inputs."""
    r, n = dist.get_rank(), dist.get_world_size()
    bad = []
    gens = [torch.Generator().manual_seed(seed + p) for p in range(n)]
    vals = [torch.randn(10_000, generator=g).to(torch.bfloat16) for g in gens]
    ref32 = torch.stack([v.float() for v in vals])
    for op, ref, tol in [(dist.ReduceOp.SUM, ref32.sum(0), 0.03), (dist.ReduceOp.AVG, ref32.mean(0), 0.03),
                         (dist.ReduceOp.MAX, ref32.max(0).values, 0.0)]:
        t = vals[r].clone()
        ptr = t.data_ptr()
        dist.all_reduce(t, op=op)
        if t.dtype != torch.bfloat16 or t.data_ptr() != ptr:
            bad.append(f"{op}: dtype {t.dtype}, storage moved {t.data_ptr() != ptr}")
        err = (t.float() - ref).abs()
        # bf16 keeps 8 significant bits: each rounding costs up to 2^-8 relative
        limit = tol * (ref.abs() + ref32.abs().max(0).values) + (0 if tol == 0 else 1e-2)
        if (err > limit).any():
            i = int((err - limit).argmax())
            bad.append(f"{op}: element {i}: got {float(t[i])}, reference {float(ref[i])}")
    # every rank holds the same result bits
    t = vals[r].clone()
    dist.all_reduce(t)
    everyone = [torch.empty_like(t) for _ in range(n)]
    dist.all_gather(everyone, t)
    if not all(torch.equal(e.view(torch.int16), t.view(torch.int16)) for e in everyone):
        bad.append("bf16 all_reduce results differ between ranks")
    return bad


def objects_and_helpers():
    r, n = dist.get_rank(), dist.get_world_size()
    bad = []
    objs = [{"t": torch.arange(3) * 5, "name": "x", "bf": torch.ones(2, dtype=torch.bfloat16)}, None]
    if r != 0:
        objs = [None, None]
    dist.broadcast_object_list(objs, src=0)
    if not (torch.equal(objs[0]["t"], torch.arange(3) * 5) and objs[0]["bf"].dtype == torch.bfloat16
            and objs[0]["name"] == "x" and objs[1] is None):
        bad.append(f"broadcast_object_list: {objs!r}")
    gathered = [None] * n
    dist.all_gather_object(gathered, (r, torch.full((2, 2), r)))
    for p in range(n):
        if gathered[p][0] != p or not torch.equal(gathered[p][1], torch.full((2, 2), p)):
            bad.append(f"all_gather_object[{p}]: {gathered[p]!r}")
    out = [None]
    dist.scatter_object_list(out, [torch.tensor([p]) for p in range(n)] if r == 0 else None, src=0)
    if not torch.equal(out[0], torch.tensor([r])):
        bad.append(f"scatter_object_list: {out!r}")
    total = dist.all_reduce_object(torch.tensor([r, 1.0]))
    if not torch.equal(total, torch.tensor([sum(range(n)), float(n)])):
        bad.append(f"all_reduce_object: {total!r}")

    # helpers: reduce_tensor returns a NEW tensor and leaves the input alone
    x = torch.tensor([float(r), 2.0])
    before = x.clone()
    m = helpers.reduce_tensor(x, op="mean")
    s = helpers.reduce_tensor(x, op="sum")
    if m is x or s is x or not torch.equal(x, before):
        bad.append("reduce_tensor modified or returned its input")
    if not (isinstance(m, torch.Tensor) and torch.allclose(m, torch.tensor([sum(range(n)) / n, 2.0]))):
        bad.append(f"reduce_tensor mean: {m!r}")
    if not torch.allclose(s, torch.tensor([float(sum(range(n))), 2.0 * n])):
        bad.append(f"reduce_tensor sum: {s!r}")
    mi = helpers.reduce_tensor(torch.tensor([r, 1]), op="mean")  # ints: mean is floating
    if not (mi.is_floating_point() and torch.allclose(mi, torch.tensor([sum(range(n)) / n, 1.0], dtype=mi.dtype))):
        bad.append(f"reduce_tensor mean of int64: {mi!r}")
    g = helpers.gather_tensor(torch.tensor([r * 2]), dst=0)
    if r == 0:
        if not (isinstance(g, list) and all(torch.equal(g[p], torch.tensor([p * 2])) for p in range(n))):
            bad.append(f"gather_tensor: {g!r}")
    elif g is not None:
        bad.append(f"gather_tensor on a non-dst rank: {g!r}")
    y = torch.full((3,), float(r))
    z = helpers.broadcast_tensor(y, src=n - 1)
    if z is not y or not torch.equal(y, torch.full((3,), float(n - 1))):
        bad.append(f"broadcast_tensor: {z!r}")
    return bad


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [2, 3])
def test_every_collective_with_tensors(n):
    assert run_ranks(every_collective, n, timeout=90, preload=TORCH) == [[]] * n


@pytest.mark.timeout(120)
def test_every_collective_with_tensors_tcp():
    assert run_ranks(every_collective, 2, timeout=90, transport="tcp", preload=TORCH) == [[]] * 2


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [2, 3])
def test_bfloat16_all_reduce(n):
    assert run_ranks(bfloat16_ops, n, 1234, timeout=90, preload=TORCH) == [[]] * n


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [2, 3])
def test_objects_and_helpers_with_tensors(n):
    assert run_ranks(objects_and_helpers, n, timeout=90, preload=TORCH) == [[]] * n


def test_helpers_without_init_keep_tensors():
    x = torch.tensor([1.5, 2.5])
    m = helpers.reduce_tensor(x, op="mean")
    assert isinstance(m, torch.Tensor) and m is not x and torch.equal(m, x)
    assert torch.equal(helpers.gather_tensor(x)[0], x)
