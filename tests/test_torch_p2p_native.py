"""The torch backend's point-to-point on the native path (collcomm/torch/p2p.py ``_native``):
``dist.send``/``recv``/``isend``/``irecv``/``batch_isend_irecv`` of plain CPU tensors to
a peer of this host go native (a send completed at once, a receive deferred to its wait),
give the regular path's results, keep MPI's matching order (posting order, any-source
receives after deferred ones), raise the regular path's errors, and meet a rank on the
regular path (``COLLCOMM_FAST=0``) in the same job.

One job of three ranks: ranks 0 and 1 native, rank 2 regular.
"""
from __future__ import annotations

from typing import Any

import pytest

from collcomm import native
from tests.harness import TORCH, run_ranks

pytest.importorskip("torch")
pytestmark = [pytest.mark.timeout(120)]


def _kind(w: Any) -> str:
    """Which path a Work took: its handle's class name (Sent / Deferred: native)."""
    return type(w._handle).__name__


def _job() -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    import collcomm.torch  # noqa: F401 - registers the backend
    from collcomm.core import p2p as core_p2p

    dist.init_process_group("collcomm")
    me = dist.get_rank()
    out: dict[str, Any] = {"native": core_p2p.native(dist.group.WORLD.core_group) is not None}
    f32 = torch.float32

    # native <-> native: both kinds of handle, values, posting order on one tag
    if me == 0:
        w = dist.isend(torch.tensor([1.0, 2.0]), 1, tag=5)
        out["send kind"] = _kind(w)
        w.wait()
        dist.send(torch.tensor([3.0, 4.0]), 1, tag=5)
        dist.send(torch.arange(6, dtype=torch.int64), 1, tag=6)
        back = torch.zeros(3, dtype=torch.int16)
        dist.recv(back, 1, tag=7)
        out["back"] = back.tolist()
    elif me == 1:
        a, b = torch.zeros(2), torch.zeros(2)
        wa, wb = dist.irecv(a, 0, tag=5), dist.irecv(b, 0, tag=5)
        out["recv kind"] = _kind(wa)
        wb.wait()                      # waited in reverse: still matched in posting order
        wa.wait()
        out["order"] = a.tolist() + b.tolist()
        c = torch.zeros(6, dtype=torch.int64)
        out["source"] = dist.recv(c, 0, tag=6)
        out["c"] = c.tolist()
        dist.send(torch.tensor([7, 8, 9], dtype=torch.int16), 0, tag=7)
    dist.barrier()

    # a deferred receive then an any-source receive on the same tag: posting order
    if me == 0:
        for v in (10.0, 11.0):
            dist.send(torch.tensor([v]), 1, tag=8)
    elif me == 1:
        first, second = torch.zeros(1), torch.zeros(1)
        w = dist.irecv(first, 0, tag=8)
        out["any source from"] = dist.recv(second, tag=8)
        w.wait()
        out["deferred then any"] = [first.item(), second.item()]
    dist.barrier()

    # batch_isend_irecv between the two native ranks; with the regular rank
    if me in (0, 1):
        other = 1 - me
        got = torch.zeros(2, dtype=f32)
        ws = dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.full((2,), float(me)), other),
                                     dist.P2POp(dist.irecv, got, other)])
        for w in ws:
            w.wait()
        out["batch"] = got.tolist()
    for peer in (0, 1):
        if me == peer:
            dist.send(torch.tensor([peer + 0.5]), 2, tag=9)
            got = torch.zeros(1)
            dist.recv(got, 2, tag=9)
            out[f"from regular"] = got.item()
        elif me == 2:
            got = torch.zeros(1)
            dist.recv(got, peer, tag=9)
            dist.send(got * 2, peer, tag=9)
    dist.barrier()

    # declined: bfloat16, a non-contiguous tensor, any source -> the regular path, same values
    if me == 0:
        w = dist.isend(torch.tensor([1.5, 2.5], dtype=torch.bfloat16), 1, tag=10)
        out["bf16 kind"] = _kind(w)
        w.wait()
        dist.send(torch.arange(8, dtype=f32).view(2, 4)[:, ::2], 1, tag=11)
    elif me == 1:
        h = torch.zeros(2, dtype=torch.bfloat16)
        dist.recv(h, 0, tag=10)
        nc = torch.zeros(4, 2)[:, 0]
        w = dist.irecv(nc, 0, tag=11)
        out["noncontig kind"] = _kind(w)
        w.wait()
        out["declined"] = h.float().tolist() + nc.tolist()
    dist.barrier()

    # a dtype mismatch: the same error natively and with the native path paused
    def mismatch() -> str:
        if me == 0:
            dist.send(torch.ones(2, dtype=f32), 1, tag=12)
            return ""
        try:
            dist.recv(torch.zeros(2, dtype=torch.int32), 0, tag=12)
        except Exception as exc:  # noqa: BLE001 - its type and text are the result
            return f"{type(exc).__name__}: {exc}"
        return "no error"

    if me in (0, 1):
        g = dist.group.WORLD.core_group
        out["mismatch native"] = mismatch()
        g._p2p_native.paused = 1
        out["mismatch regular"] = mismatch()
        g._p2p_native.paused = 0
    dist.barrier()
    dist.destroy_process_group()
    return out


@pytest.mark.skipif(native.core is None, reason=f"native core: {native.reason}")
def test_torch_p2p_native_and_regular_ranks() -> None:
    res = run_ranks(_job, 3, transport="shm", timeout=100, init=False,
                    rank_env={2: {"COLLCOMM_FAST": "0"}}, preload=TORCH)
    r0, r1, r2 = res
    assert (r0["native"], r1["native"], r2["native"]) == (True, True, False)
    assert r0["send kind"] == "Sent" and r1["recv kind"] == "Deferred"
    assert r1["order"] == [1.0, 2.0, 3.0, 4.0]
    assert r1["source"] == 0 and r1["c"] == list(range(6))
    assert r0["back"] == [7, 8, 9]
    assert r1["any source from"] == 0 and r1["deferred then any"] == [10.0, 11.0]
    assert r0["batch"] == [1.0, 1.0] and r1["batch"] == [0.0, 0.0]
    assert r0["from regular"] == 1.0 and r1["from regular"] == 3.0
    assert r0["bf16 kind"] != "Sent" and r1["noncontig kind"] != "Deferred"
    assert r1["declined"] == [1.5, 2.5, 0.0, 2.0, 4.0, 6.0]
    assert r1["mismatch native"].startswith("BackendMismatchError"), r1["mismatch native"]
    assert r1["mismatch native"] == r1["mismatch regular"]
