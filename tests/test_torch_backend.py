"""torch.distributed on backend "collcomm", checked against gloo in the same job.

Each job initializes torch.distributed with backend "collcomm" (env://, tcp://, file://
or the "cpu:collcomm" device map), makes a gloo group over the same ranks, and runs every
torch.distributed call on both: results must be equal (data are small integers, so
floating-point sums are exact in any order). What gloo lacks (AVG, PREMUL_SUM, uneven
all_gather, reduce_scatter on some versions) is checked against a closed form. One job per
(world size, transport) runs every case and returns the list of what went wrong, so a
handful of processes covers the surface (torch is slow to import). The cases themselves:
tests/torch_backend_cases.py.
"""
from __future__ import annotations

import datetime
import os
import shutil
import tempfile
import time
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from tests.harness import TORCH, run_ranks  # noqa: E402
from tests.torch_backend_cases import (  # noqa: E402
    Checks, _all_gather, _all_gather_coalesced, _broadcast, _cases, _data, _reduce,
)


# ----------------------------------------------------------------------------- the rank side

def _init(dist: Any, how: str, path: str) -> None:
    r, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    timeout = datetime.timedelta(seconds=60)
    if how == "env":
        dist.init_process_group("collcomm", timeout=timeout)
    elif how == "device-map":
        dist.init_process_group("cpu:collcomm", timeout=timeout)
    elif how == "tcp":
        port = int(os.environ["MASTER_PORT"])
        dist.init_process_group("collcomm", init_method=f"tcp://127.0.0.1:{port}", rank=r,
                                world_size=n, timeout=timeout)
    elif how == "file":
        dist.init_process_group("collcomm", init_method=f"file://{path}", rank=r, world_size=n,
                                timeout=timeout)
    else:
        raise ValueError(how)


def every_call(how: str, path: str) -> dict:
    """Every case on collcomm and on gloo; plus what only collcomm has."""
    import collcomm.torch  # noqa: F401 - registers the backend
    import torch.distributed as dist

    _init(dist, how, path)
    c = Checks()
    r, n = dist.get_rank(), dist.get_world_size()
    c.true(f"backend is {dist.get_backend()}", dist.get_backend() in ("collcomm", "cpu:collcomm"))
    gloo = dist.new_group(backend="gloo")
    for name, case in _cases(dist, r, n).items():
        try:
            mine = case(None)
        except Exception as exc:  # noqa: BLE001 - recorded
            c.bad.append(f"{name}: collcomm raised {type(exc).__name__}: {exc}")
            dist.barrier(group=gloo)
            continue
        try:
            theirs = case(gloo)
        except Exception as exc:  # noqa: BLE001 - gloo lacks it: compare with the closed form below
            c.gloo_lacks.append(f"{name}: {type(exc).__name__}: {str(exc)[:80]}")
            dist.barrier(group=gloo)
            continue
        c.same(f"{name} (collcomm vs gloo)", mine, theirs)
        # no case may start before every rank has left the last: a rank sending in the next
        # one could feed a receive-from-any-source still waiting in this one (gloo's
        # "recv any source" once took rank 3's batch_isend_irecv message: 16 vs 8 bytes)
        dist.barrier(group=gloo)
    _only_collcomm(dist, c, r, n, os.path.join(os.path.dirname(path), "timed-out"))
    _sub_groups(dist, c, r, n, gloo)
    _errors(dist, c, r, n)
    dist.destroy_process_group()
    return {"bad": c.bad, "gloo_lacks": c.gloo_lacks, "checks": c.count}


def _only_collcomm(dist: Any, c: Checks, r: int, n: int, timed_out: str) -> None:
    """What gloo has not: AVG, PREMUL_SUM, reduce leaving inputs alone, uneven all_gather,
    strided tensors (gloo reads a strided tensor's storage as if it were contiguous),
    Work.wait(timeout) that times out and later succeeds, monitored_barrier."""
    R, total = dist.ReduceOp, sum(range(1, n + 1))
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4) + r
    dist.all_reduce(base[:, 1])                            # a strided view, written back
    want = torch.arange(12, dtype=torch.float32).reshape(3, 4) + r
    want[:, 1] = (torch.arange(3, dtype=torch.float32) * 4 + 1) * n + sum(range(n))
    c.same("all_reduce strided view", base, want)
    nc = torch.zeros(4, 3)
    if r == n - 1:
        nc[:, 2] = torch.arange(4.0) + 1
    dist.broadcast(nc[:, 2], src=n - 1)
    c.same("broadcast strided view", nc[:, 2], torch.arange(4.0) + 1)
    out = torch.empty(n, 3, dtype=torch.float16)
    dist.all_gather_into_tensor(out, (torch.arange(9, dtype=torch.float16).reshape(3, 3) + r).t()[0])
    c.same("all_gather_into_tensor strided input", out,
           torch.tensor([[p, p + 3, p + 6] for p in range(n)], dtype=torch.float16))
    t = torch.full((3,), float(r + 1))
    dist.all_reduce(t, op=R.AVG)
    c.same("all_reduce AVG", t, torch.full((3,), total / n))
    t = torch.full((3,), float(r + 1), dtype=torch.bfloat16)
    dist.all_reduce(t, op=dist._make_nccl_premul_sum(2.0))
    c.same("all_reduce PREMUL_SUM bf16", t, torch.full((3,), 2.0 * total, dtype=torch.bfloat16))
    t = torch.full((2,), float(r + 1))
    dist.reduce(t, dst=n - 1, op=dist._make_nccl_premul_sum(0.5))
    want = torch.full((2,), 0.5 * total) if r == n - 1 else torch.full((2,), float(r + 1))
    c.same("reduce PREMUL_SUM (others untouched)", t, want)
    out = torch.empty(n)
    dist.reduce_scatter_tensor(out[:1], torch.full((n,), float(r + 1)), op=R.AVG)
    c.same("reduce_scatter_tensor AVG", out[:1], torch.tensor([total / n]))
    for root in range(n):
        t = _data(r, 5, torch.float64)
        before = t.clone()
        dist.reduce(t, dst=root, op=R.MAX)
        if r != root:
            c.same(f"reduce root {root}: non-root input untouched", t, before)
    outs = [torch.empty(p + 1, dtype=torch.int64) for p in range(n)]
    dist.all_gather(outs, torch.full((r + 1,), r, dtype=torch.int64))
    c.same("all_gather uneven", outs, [torch.full((p + 1,), p, dtype=torch.int64) for p in range(n)])
    got = _all_gather_coalesced(dist, None, r, n)
    c.same("all_gather_coalesced", got, [[torch.full((2,), float(p)), torch.arange(3.0) * p]
                                         for p in range(n)])
    e4 = [torch.empty(2, dtype=torch.float8_e4m3fn) for _ in range(n)]
    dist.all_gather(e4, torch.full((2,), float(r), dtype=torch.float8_e4m3fn))
    c.same("all_gather float8 (raw bytes)", [x.float() for x in e4],
           [torch.full((2,), float(p)) for p in range(n)])
    if n > 1:
        t = torch.ones(4)
        if r == 1:   # asleep until rank 0's wait timed out (1 s at most)
            deadline = time.monotonic() + 1.0
            while not os.path.exists(timed_out) and time.monotonic() < deadline:
                time.sleep(0.01)
        w = dist.all_reduce(t, async_op=True)
        if r == 0:
            try:
                w.wait(timeout=datetime.timedelta(seconds=0.1))
                c.bad.append("Work.wait(0.1 s) returned while rank 1 was still asleep")
            except dist.DistBackendError as exc:
                c.true(f"Work.wait timeout is a TimeoutError: {exc!r}", isinstance(exc, TimeoutError))
            open(timed_out, "w").close()
        c.true("Work.wait() after a timed-out wait", w.wait() and torch.equal(t, torch.full((4,), float(n))))
    if n > 1 and r < 2:      # a receive into another dtype is refused, not reinterpreted
        if r == 0:
            dist.send(torch.ones(2), dst=1)
        else:
            try:
                dist.recv(torch.empty(2, dtype=torch.int32), src=0)
                c.bad.append("a float32 message was received into an int32 tensor")
            except dist.DistBackendError as exc:
                c.true(f"dtype mismatch names both: {exc}", "float32" in str(exc) and "int32" in str(exc))
    dist.monitored_barrier(timeout=datetime.timedelta(seconds=30))
    if n > 1:
        if r == 0:
            start = time.monotonic()
            try:
                dist.monitored_barrier(timeout=datetime.timedelta(seconds=0.5), wait_all_ranks=True)
                c.bad.append("monitored_barrier passed while ranks skipped it")
            except dist.DistBackendError as exc:
                late = ", ".join(str(p) for p in range(1, n))
                c.true(f"monitored_barrier names the late ranks: {exc}",
                       f"Ranks {late} failed to pass monitoredBarrier in 500 ms" in str(exc)
                       or (n == 2 and "Rank 1 failed" in str(exc)))
                c.true("monitored_barrier waited about its timeout", time.monotonic() - start < 5)
        dist.barrier()


def _sub_groups(dist: Any, c: Checks, r: int, n: int, gloo: Any) -> None:
    """new_group / new_subgroups on collcomm and on gloo, and members vs non-members."""
    ranks = list(range(0, n, 2))
    mine = dist.new_group(ranks)
    theirs = dist.new_group(ranks, backend="gloo")
    c.same("get_process_group_ranks", dist.get_process_group_ranks(mine) if r in ranks else ranks,
           ranks)
    if r in ranks:
        for name, case in [("sub all_reduce", lambda g: _reduce(dist, g, ranks.index(r), 0)),
                           ("sub all_gather", lambda g: _all_gather(dist, g, ranks.index(r), len(ranks))),
                           ("sub broadcast", lambda g: _broadcast(dist, g, ranks.index(r), len(ranks) - 1))]:
            c.same(f"{name} (collcomm vs gloo)", case(mine), case(theirs))
    else:
        c.true("non-member gets NON_GROUP_MEMBER", mine == dist.GroupMember.NON_GROUP_MEMBER)
    if n % 2 == 0:
        sub, _ = dist.new_subgroups(group_size=2)
        t = torch.tensor([float(r)])
        dist.all_reduce(t, group=sub)
        c.same("new_subgroups all_reduce", t, torch.tensor([float(4 * (r // 2) + 1)]))
    dist.barrier(group=gloo)


def _errors(dist: Any, c: Checks, r: int, n: int) -> None:
    """CUDA-style tensors, a collective a rank skips (timeout naming it)."""
    meta = torch.empty(3, device="meta")
    try:
        dist.all_reduce(meta)
        c.bad.append("a meta-device tensor was accepted")
    except ValueError as exc:
        c.true(f"device named in the error: {exc}", "device meta" in str(exc) and "CPU" in str(exc))
    if n > 1:
        short = dist.new_group(timeout=datetime.timedelta(seconds=1))
        if r == 0:
            try:
                dist.all_reduce(torch.ones(2), group=short)
                c.bad.append("all_reduce returned although the other ranks skipped it")
            except dist.DistBackendError as exc:
                c.true(f"timeout error is a TimeoutError naming the call: {exc}",
                       isinstance(exc, TimeoutError) and "all_reduce" in str(exc))
        dist.barrier()


# ----------------------------------------------------------------------------- the tests

def _check(res: list[dict]) -> None:
    bad = [b for x in res for b in x["bad"]]
    assert not bad, "\n".join(bad[:40])
    assert all(x["checks"] > 40 for x in res)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("n,transport,how", [
    (1, "shm", "env"), (2, "tcp", "tcp"), (3, "tcp", "device-map"), (4, "shm", "file"),
])
def test_every_call_against_gloo(n: int, transport: str, how: str) -> None:
    folder = tempfile.mkdtemp(prefix="collcomm-torch-")
    try:
        res = run_ranks(every_call, n, how, os.path.join(folder, "rdzv"), init=False,
                        transport=transport, timeout=140, preload=TORCH)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    _check(res)
    # gloo lacks nothing we compare with it, except (some versions) reduce_scatter, and
    # all_gather_coalesced unless there are as many inputs as ranks (closed form: below)
    lacks = {x.split(":")[0] for r in res for x in r["gloo_lacks"]}
    assert lacks <= {"reduce_scatter", "reduce_scatter_tensor", "all_gather_coalesced"}, lacks
