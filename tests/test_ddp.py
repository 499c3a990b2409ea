"""DistributedDataParallel and the seed-001 script on backend "collcomm".

DDP trains a small model k steps on its share of one fixed full batch; the parameters must
equal (≤ 1e-5) those of single-process full-batch training (computed on every rank) and
of the same DDP training on gloo in the same job. Variants: several buckets, no_sync
(gradient accumulation), find_unused_parameters, static_graph, gradient_as_bucket_view and
the comm hooks allreduce_hook and fp16_compress_hook (the latter to fp16 precision).
"""
from __future__ import annotations

import os
import subprocess
import sys
import datetime
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from tests.harness import ROOT, TORCH, free_port, run_ranks  # noqa: E402

STEPS = 4
BATCH = 24           # the full batch, split evenly over 1, 2, 3 or 4 ranks
LR = 0.1


class Net(torch.nn.Module):
    """Two layers and a branch used only when asked (for find_unused_parameters)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(6, 16)
        self.b = torch.nn.Linear(16, 3)
        self.unused = torch.nn.Linear(16, 3)

    def forward(self, x: Any, use_branch: bool = False) -> Any:
        h = torch.tanh(self.a(x))
        return self.b(h) + (self.unused(h) if use_branch else 0)


def _batch() -> tuple[Any, Any]:
    g = torch.Generator().manual_seed(1234)
    return torch.randn(BATCH, 6, generator=g), torch.randn(BATCH, 3, generator=g)


def _model() -> Any:
    torch.manual_seed(0)
    return Net().double()


def _reference(accumulate: int = 1) -> list[Any]:
    """Single-process full-batch SGD (the batch as ``accumulate`` equal micro-batches)."""
    model = _model()
    x, y = _batch()
    x, y = x.double(), y.double()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for _ in range(STEPS):
        opt.zero_grad()
        for xs, ys in zip(x.chunk(accumulate), y.chunk(accumulate)):
            (torch.nn.functional.mse_loss(model(xs), ys) / accumulate).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def _train(dist: Any, group: Any, variant: str) -> list[Any]:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    r, n = dist.get_rank(group), dist.get_world_size(group)
    torch.manual_seed(100 + r)              # different on every rank: DDP must broadcast rank 0's
    model = Net().double()
    if r == 0:
        model.load_state_dict(_model().state_dict())
    if variant not in ("find_unused", "static_graph"):
        model.unused.requires_grad_(False)   # else DDP waits for gradients that never come
    kw: dict[str, Any] = {"process_group": group, "bucket_cap_mb": 0.001}   # several buckets
    if variant == "find_unused":
        kw["find_unused_parameters"] = True
    elif variant == "static_graph":
        kw["static_graph"] = True
    elif variant == "bucket_view":
        kw["gradient_as_bucket_view"] = True
    ddp = DDP(model, **kw)
    if variant == "allreduce_hook":
        ddp.register_comm_hook(group, default_hooks.allreduce_hook)
    elif variant == "fp16_hook":
        ddp.register_comm_hook(group, default_hooks.fp16_compress_hook)
    x, y = _batch()
    x, y = x.double().chunk(n)[r], y.double().chunk(n)[r]
    opt = torch.optim.SGD(ddp.parameters(), lr=LR)
    for _ in range(STEPS):
        opt.zero_grad()
        if variant == "no_sync":             # two micro-batches, gradients synced on the second
            (xa, xb), (ya, yb) = x.chunk(2), y.chunk(2)
            with ddp.no_sync():
                (torch.nn.functional.mse_loss(ddp(xa), ya) / 2).backward()
            (torch.nn.functional.mse_loss(ddp(xb), yb) / 2).backward()
        else:
            torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in ddp.module.parameters()]


VARIANTS = ["plain", "no_sync", "find_unused", "static_graph", "bucket_view", "allreduce_hook",
            "fp16_hook"]


def ddp_rank(variants: list[str]) -> dict:
    import collcomm.torch  # noqa: F401
    import torch.distributed as dist

    dist.init_process_group("collcomm", timeout=datetime.timedelta(seconds=60))
    gloo = dist.new_group(backend="gloo")
    out: dict[str, Any] = {}
    for v in variants:
        mine = _train(dist, None, v)
        theirs = _train(dist, gloo, v)
        ref = _reference(2 if v == "no_sync" else 1)
        out[v] = (max(float((a - b).abs().max()) for a, b in zip(mine, ref)),
                  max(float((a - b).abs().max()) for a, b in zip(mine, theirs)))
    dist.destroy_process_group()
    return out


@pytest.mark.timeout(150)
@pytest.mark.parametrize("n,transport", [(2, "shm"), (4, "tcp")])
def test_ddp_matches_full_batch_and_gloo(n: int, transport: str) -> None:
    variants = VARIANTS if n == 2 else ["plain", "no_sync", "fp16_hook"]
    res = run_ranks(ddp_rank, n, variants, init=False, transport=transport, timeout=140, preload=TORCH)
    for r, per in enumerate(res):
        for v, (vs_ref, vs_gloo) in per.items():
            tol = 2e-3 if v == "fp16_hook" else 1e-5    # fp16 compression rounds gradients
            assert vs_ref <= tol, f"rank {r} {v}: {vs_ref} from full-batch training"
            assert vs_gloo <= tol, f"rank {r} {v}: {vs_gloo} from DDP on gloo"


def _seed001_ok(out: str) -> None:
    """Every rank prints the four lines; DDP weight means all equal rank 0's weight mean.

    Parsed with a pattern over the whole output, not line by line: under torchrun the two
    ranks write to one pipe and a line of one can run into a line of the other
    ("...=-0.027362Rank 1: DDP Weight mean=...")."""
    import re

    number = r"(-?\d+\.\d+)"
    weight = dict(re.findall(r"(Rank \d): Weight mean=" + number, out))
    ddp = dict(re.findall(r"(Rank \d): DDP Weight mean=" + number, out))
    assert set(ddp) == {"Rank 0", "Rank 1"} and set(weight) == set(ddp), out
    assert set(ddp.values()) == {weight["Rank 0"]}, out
    assert len(re.findall(r"Rank \d: Output mean=" + number, out)) == 2, out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("launcher", ["torchrun", "collcomm run"])
def test_seed001_script(launcher: str, tmp_path: Any) -> None:
    script = os.path.join(ROOT, "examples", "seed001_ddp.py")
    # TMPDIR: torchrun makes its log folder (torchelastic_*) there, not in /tmp
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1", TMPDIR=str(tmp_path))
    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "COLLCOMM_STORE", "LOCAL_RANK"):
        env.pop(k, None)
    if launcher == "torchrun":
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
               f"--master_port={free_port()}", script]
    else:
        cmd = [sys.executable, "-m", "collcomm", "run", "-n", "2", script]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=110, cwd=ROOT,
                       start_new_session=True)
    assert p.returncode == 0, p.stdout + p.stderr
    _seed001_ok(p.stdout)


MULTI_NODE = """
import json, torch, torch.distributed as dist
import collcomm.torch
dist.init_process_group("collcomm")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
g = dist.group.WORLD.core_group
print("RESULT " + json.dumps({"rank": dist.get_rank(), "sum": float(t), "link": g.link,
                              "hosts": g.n_hosts}))
dist.destroy_process_group()
"""


@pytest.mark.timeout(120)
def test_torchrun_two_nodes(tmp_path: Any) -> None:
    """torchrun --nnodes 2 (static rendezvous), each "node" its own COLLCOMM_HOST_ID: the
    collcomm transport spans two hosts (TCP between them)."""
    script = tmp_path / "two_nodes.py"
    script.write_text(MULTI_NODE)
    port = free_port()
    procs = []
    for node in range(2):
        env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1", COLLCOMM_HOST_ID=f"node{node}",
                   TMPDIR=str(tmp_path))      # torchrun's log folder (torchelastic_*): not in /tmp
        for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "COLLCOMM_STORE", "LOCAL_RANK"):
            env.pop(k, None)
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1",
             f"--node_rank={node}", "--master_addr=127.0.0.1", f"--master_port={port}", str(script)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
            start_new_session=True))
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=110)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
    assert all(p.returncode == 0 for p in procs), "\n".join(outs)
    import json

    got = sorted((json.loads(ln.split("RESULT ", 1)[1]) for o in outs for ln in o.splitlines()
                  if "RESULT " in ln), key=lambda x: x["rank"])
    assert got == [{"rank": r, "sum": 3.0, "link": "tcp", "hosts": 2} for r in range(2)], outs
