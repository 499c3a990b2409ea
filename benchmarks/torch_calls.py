"""Small collectives through ``torch.distributed``: collcomm's backend against Gloo, one job.

    collcomm run -n 2 --no-prefix python benchmarks/torch_calls.py [--blocks 7] [--iters 2000]
    python benchmarks/torch_calls.py        # a world of one: the per-call cost alone

The default group is collcomm's; a ``new_group(backend="gloo")`` of the same ranks gives
Gloo's figures side by side (``--no-gloo`` leaves it out). Each row is one call made back
to back (``--iters`` times for collcomm, a twentieth of that for Gloo), 8-byte float32
tensors (``--bytes``); the rows are timed in interleaved blocks, the order turning every
block, and per row the median [min] over blocks of the slowest rank's µs per call is
printed. In a world of one the time is thread CPU time (other processes on a busy machine
do not count), and a row ``backend method`` calls the group's method directly: the
difference to the ``dist.`` row is torch's own Python (argument checks, options, its
logging decorators), the rest is the backend's.

Rows: ``all_reduce``, ``broadcast``, ``all_gather_into_tensor``, ``reduce_scatter_tensor``,
``barrier``, ``all_gather_single`` / ``reduce_scatter_single`` (torch 2.13's names for
the ``*_tensor`` calls, which warn that they are deprecated on every call: rows left out
where torch lacks them), ``all_reduce async+wait`` (``async_op=True`` then ``.wait()``, as DDP-style
code does), and ``all_reduce new tensor`` / ``reduce_scatter new tensors`` (tensors made
for every call: ``dist.all_reduce(torch.zeros(k))``, their making included).
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any, Callable


def _rows(dist: Any, torch: Any, group: Any, k: int, n: int, direct: bool) -> dict[str, Callable[[], Any]]:
    from torch.distributed.distributed_c10d import AllreduceOptions

    x = torch.zeros(k)
    out, inp = torch.zeros(n * k), torch.zeros(n * k)
    one = torch.zeros(k)
    rows: dict[str, Callable[[], Any]] = {
        "all_reduce": lambda: dist.all_reduce(x, group=group),
        "broadcast": lambda: dist.broadcast(x, 0, group=group),
        "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(out, one, group=group),
        "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(one, inp, group=group),
        "barrier": lambda: dist.barrier(group=group),
        # torch 2.13's names for the two above (without their deprecation warning's cost)
        "all_gather_single": lambda: dist.all_gather_single(out, one, group=group),
        "reduce_scatter_single": lambda: dist.reduce_scatter_single(one, inp, group=group),
        "all_reduce async+wait": lambda: dist.all_reduce(x, group=group, async_op=True).wait(),
        "all_reduce new tensor": lambda: dist.all_reduce(torch.zeros(k), group=group),
        "reduce_scatter new tensors": lambda: dist.reduce_scatter_tensor(
            torch.zeros(k), torch.zeros(n * k), group=group),
    }
    if not hasattr(dist, "all_gather_single"):
        del rows["all_gather_single"], rows["reduce_scatter_single"]
    if direct:
        opts = AllreduceOptions()
        opts.asyncOp = False
        tensors = [x]
        rows["backend method allreduce"] = lambda: group.allreduce(tensors, opts)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--blocks", type=int, default=7)
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--bytes", type=int, default=8, help="bytes per rank (float32)")
    ap.add_argument("--no-gloo", action="store_true")
    ap.add_argument("--only", default="", help="comma-separated row names (prefixes) to time")
    args = ap.parse_args()

    import warnings

    import torch
    import torch.distributed as dist

    import collcomm.torch  # noqa: F401 - registers the backend

    warnings.filterwarnings("ignore", category=FutureWarning)   # *_tensor's deprecation notes
    alone = "RANK" not in os.environ
    if alone:
        dist.init_process_group("collcomm", store=dist.HashStore(), rank=0, world_size=1)
    else:
        dist.init_process_group("collcomm")
    me, n = dist.get_rank(), dist.get_world_size()
    k = max(1, args.bytes // 4)
    world = dist.group.WORLD
    groups = {"collcomm": world}
    if not args.no_gloo:
        groups["gloo"] = dist.new_group(list(range(n)), backend="gloo")
    rows: dict[str, tuple[Callable[[], Any], int]] = {}
    for name, g in groups.items():
        for row, f in _rows(dist, torch, g, k, n, alone and name == "collcomm").items():
            rows[f"{row} {name}"] = (f, args.iters if name == "collcomm" else max(10, args.iters // 20))
    only = [s for s in args.only.split(",") if s]
    if only:
        rows = {r: v for r, v in rows.items() if any(r.startswith(s) for s in only)}
    clock = time.thread_time if alone else time.perf_counter
    slowest = torch.zeros(1, dtype=torch.float64)
    times: dict[str, list[float]] = {r: [] for r in rows}
    names = list(rows)
    for b in range(args.blocks):
        for row in (names if b % 2 == 0 else names[::-1]):
            f, iters = rows[row]
            for _ in range(max(5, iters // 20)):
                f()
            dist.barrier()
            t0 = clock()
            for _ in range(iters):
                f()
            slowest[0] = (clock() - t0) / iters * 1e6
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            times[row].append(float(slowest[0]))
    if me == 0:
        what = "thread CPU µs, a world of one" if alone else f"µs, n={n}, slowest rank"
        print(f"# torch_calls: {args.bytes} B, blocks={args.blocks} iters={args.iters}; "
              f"load {os.getloadavg()[0]:.2f}; {what}, median [min] over blocks; "
              f"collcomm from {os.path.dirname(os.path.dirname(collcomm.torch.__file__))}")
        for row in names:
            ts = times[row]
            print(f"  {row:<36} {statistics.median(ts):9.2f}  [{min(ts):8.2f}]")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
