"""Gradient sync strategies for a model of ~100 tensors, with simulated backward compute.

    collcomm run -n 2 benchmarks/bucketed_allreduce.py                # defaults below
    collcomm run -n 2 benchmarks/bucketed_allreduce.py --compute busy --backward-ms 100
    collcomm run -n 4 benchmarks/bucketed_allreduce.py --bucket-mb 1 4 25 --json out.json

Each iteration runs a simulated backward pass, layer by layer from the last: "computing"
a layer takes a time proportional to its parameter count (``--backward-ms`` in all),
then its gradient is ready. Strategies (seed 002's best practices, without DDP):

* ``backward-only``  no sync at all: the baseline the others add to
* ``per-tensor``     after backward, one blocking all_reduce per gradient (seed 002's "bad")
* ``per-tensor-async`` each gradient's all_reduce started async the moment it is ready,
  waited for at the end (seed 002's overlap pattern, without buckets)
* ``flat``           after backward, concatenate all gradients, one all_reduce, copy back
  (seed 002's "good")
* ``bucketed-N``     :class:`collcomm.helpers.GradientBuckets` with N MiB buckets, fed as
  gradients become ready: each bucket's all_reduce starts when full, overlapping the
  backward of the layers before it

``--compute sleep`` (default) stands for an accelerator computing while the CPU is free;
``busy`` burns a CPU core in numpy instead (then communication and compute compete for the
cores). Reported per strategy: the median iteration time of the slowest rank, what the
sync adds to backward-only (exposed communication) and the speed-up against per-tensor.
The strategies take turns in every round, so a change of machine load hits them alike. Every strategy's result is checked (the mean of known per-rank values).
"""
from __future__ import annotations

import argparse
import json
import time
from typing import Any, Callable

import numpy as np

import collcomm as dist
from collcomm import helpers


def model_sizes(scale: float) -> list[int]:
    """~100 tensors of mixed sizes: 8 transformer-like blocks + embedding/head (float32)."""
    d, ff = int(256 * scale), int(1024 * scale)
    sizes = [32000 * d // 8]                           # embedding (a small vocabulary)
    for _ in range(8):
        sizes += [d, d,                                # layer norm weight, bias
                  3 * d * d, 3 * d,                    # qkv projection
                  d * d, d,                            # output projection
                  d, d,                                # layer norm
                  d * ff, ff, ff * d, d]               # MLP
    sizes += [d, d]                                    # final norm
    return sizes


def backward(grads: list[np.ndarray], per_elem_s: float, compute: str,
             ready: Callable[[int], None]) -> None:
    """Simulated backward: last layer first; ``ready(i)`` once gradient i is 'computed'.

    Layer i ends ``per_elem_s × (elements of layers i..last)`` after the start (a schedule,
    so a late wake-up does not push every later layer back); ``sleep`` sleeps until then,
    ``busy`` computes until then."""
    scratch = np.ones(1 << 14, dtype=np.float64)
    start, done = time.perf_counter(), 0
    for i in reversed(range(len(grads))):
        done += grads[i].size
        end = start + done * per_elem_s
        if compute == "sleep":
            left = end - time.perf_counter()
            if left > 0:
                time.sleep(left)
        else:
            while time.perf_counter() < end:
                np.sqrt(scratch, out=scratch)
        ready(i)


def run_strategy(name: str, grads: list[np.ndarray], per_elem_s: float, compute: str,
                 bucket_bytes: int) -> None:
    if name == "backward-only":
        backward(grads, per_elem_s, compute, lambda i: None)
    elif name == "per-tensor":
        backward(grads, per_elem_s, compute, lambda i: None)
        for g in grads:
            dist.all_reduce(g, op=dist.ReduceOp.AVG)
    elif name == "per-tensor-async":
        works: list[Any] = []
        backward(grads, per_elem_s, compute,
                 lambda i: works.append(dist.all_reduce(grads[i], op=dist.ReduceOp.AVG, async_op=True)))
        for w in works:
            w.wait()
    elif name == "flat":
        backward(grads, per_elem_s, compute, lambda i: None)
        flat = np.concatenate(grads)
        dist.all_reduce(flat, op=dist.ReduceOp.AVG)
        pos = 0
        for g in grads:
            g[:] = flat[pos:pos + g.size]
            pos += g.size
    else:
        buckets = helpers.GradientBuckets(bucket_bytes=bucket_bytes, op="mean")
        backward(grads, per_elem_s, compute, lambda i: buckets.add(grads[i]))
        buckets.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scale", type=float, default=1.0, help="model width factor (1.0: 99 tensors, 7.4M floats)")
    ap.add_argument("--backward-ms", type=float, default=60.0, help="simulated backward time")
    ap.add_argument("--compute", choices=["sleep", "busy"], default="sleep")
    ap.add_argument("--bucket-mb", type=float, nargs="+", default=[1.0, 4.0, 25.0])
    ap.add_argument("--iters", type=int, default=7)
    ap.add_argument("--json", default=None, help="also write the results here (rank 0)")
    args = ap.parse_args()

    dist.init_process_group()
    r, n = dist.get_rank(), dist.get_world_size()
    sizes = model_sizes(args.scale)
    total = sum(sizes)
    per_elem_s = args.backward_ms / 1e3 / total
    strategies = ["backward-only", "per-tensor", "per-tensor-async", "flat"] + [f"bucketed-{mb:g}" for mb in args.bucket_mb]
    times: dict[str, list[float]] = {name: [] for name in strategies}
    want = [(n + 1) / 2 + i % 5 for i in range(len(sizes))]
    for it in range(args.iters + 1):          # strategies interleaved; round 0 warms up
        for name in strategies:
            bucket_bytes = int(float(name.split("-")[1]) * (1 << 20)) if name.startswith("bucketed") else 0
            grads = [np.full(s, float(r + 1 + i % 5), dtype=np.float32) for i, s in enumerate(sizes)]
            dist.barrier()
            t0 = time.perf_counter()
            run_strategy(name, grads, per_elem_s, args.compute, bucket_bytes)
            dt = np.array([time.perf_counter() - t0])
            dist.all_reduce(dt, op=dist.ReduceOp.MAX)     # the slowest rank's time
            if it:
                times[name].append(float(dt[0]))
            if name != "backward-only" and any(not np.allclose(g, w) for g, w in zip(grads, want)):
                raise SystemExit(f"rank {r}: {name} gave wrong gradients")
    results = {name: float(np.median(ts)) for name, ts in times.items()}
    if r == 0:
        base = results["per-tensor"]
        backward_s = results["backward-only"]
        print(f"# {len(sizes)} tensors, {total / 1e6:.2f}M float32 ({total * 4 / 2**20:.1f} MiB), "
              f"{n} ranks, backward {args.backward_ms:g} ms ({args.compute}), median of {args.iters} "
              "interleaved rounds")
        print(f"{'strategy':<18} {'iter (ms)':>10} {'exposed comm (ms)':>18} {'vs per-tensor':>14}")
        for name, t in results.items():
            print(f"{name:<18} {t * 1e3:>10.1f} {(t - backward_s) * 1e3:>18.1f} {base / t:>13.2f}x")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"ranks": n, "tensors": len(sizes), "floats": total,
                           "backward_ms": args.backward_ms, "compute": args.compute,
                           "iter_s": results}, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
