"""Native core vs pure Python, interleaved in one job: ``collcomm run -n 2 -m collcomm.native.compare``.

Each (collective, size) is timed in blocks of back-to-back calls through the functional
API, alternating the native core and the Python implementation block by block (the
group's arena is switched between them on every rank at once), so that both see the same
machine load; per mode the median over blocks of the slowest rank's time per call is
printed, with the ratio. On a shared or busy machine only the ratios mean much.

Options: ``--ops all_reduce,broadcast,...`` (also all_gather, reduce_scatter, all_to_all,
reduce, barrier), ``--sizes 8,64,4K,256K`` (bytes per rank), ``--dtype float32``,
``--blocks 6``, ``--iters 100``.
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Callable

import numpy as np

from . import core as native_core


def _size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20}
    return int(text[:-1]) * units[text[-1].upper()] if text[-1].upper() in units else int(text)


def _call(dist: Any, op: str, nbytes: int, dtype: np.dtype, n: int) -> Callable[[], Any]:
    k = max(1, nbytes // dtype.itemsize)
    if op == "all_reduce":
        buf = np.zeros(k, dtype)
        return lambda: dist.all_reduce(buf)
    if op == "reduce":
        buf = np.zeros(k, dtype)
        return lambda: dist.reduce(buf, dst=0)
    if op == "broadcast":
        buf = np.zeros(k, dtype)
        return lambda: dist.broadcast(buf, src=0)
    if op == "all_gather":
        send, recv = np.zeros(k, dtype), np.empty(n * k, dtype)
        return lambda: dist.all_gather_into_tensor(recv, send)
    if op == "reduce_scatter":
        send, recv = np.zeros(n * k, dtype), np.empty(k, dtype)
        return lambda: dist.reduce_scatter_tensor(recv, send)
    if op == "all_to_all":
        send, recv = np.zeros(n * k, dtype), np.empty(n * k, dtype)
        return lambda: dist.all_to_all_single(recv, send)
    if op == "barrier":
        return dist.barrier
    raise SystemExit(f"unknown collective {op!r}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m collcomm.native.compare", description=__doc__.split("\n")[0])
    ap.add_argument("--ops", default="all_reduce,broadcast,all_gather,reduce_scatter,all_to_all")
    ap.add_argument("--sizes", default="8,64,512,4K,32K,256K")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--blocks", type=int, default=6)
    ap.add_argument("--iters", type=int, default=100)
    args = ap.parse_args(argv)

    import collcomm as dist
    from collcomm.core.runtime import get_world

    dist.init_process_group()
    n, me = dist.get_world_size(), dist.get_rank()
    world = get_world("compare")
    arena = world.run("compare", lambda c: c.arena()) if n > 1 else None
    if arena is None or native_core is None or arena.native_core is None:
        if me == 0:
            from . import reason
            print(f"nothing to compare: {'one rank' if n == 1 else 'no shared-memory arena' if arena is None else reason}")
        dist.destroy_process_group()
        return
    core = arena.native_core
    dtype = np.dtype(args.dtype)
    rows = []
    for op in args.ops.split(","):
        for nbytes in ([0] if op == "barrier" else [_size(s) for s in args.sizes.split(",")]):
            call = _call(dist, op, nbytes, dtype, n)
            times: dict[str, list[float]] = {"native": [], "python": []}
            for b in range(args.blocks):
                for mode in ("native", "python") if b % 2 == 0 else ("python", "native"):
                    dist.barrier()
                    arena.native_core = core if mode == "native" else None
                    for _ in range(5):
                        call()
                    dist.barrier()
                    t0 = time.perf_counter()
                    for _ in range(args.iters):
                        call()
                    mine = np.array([(time.perf_counter() - t0) / args.iters * 1e6])
                    arena.native_core = core
                    dist.all_reduce(mine, op=dist.ReduceOp.MAX)
                    times[mode].append(float(mine[0]))
            rows.append((op, nbytes, statistics.median(times["native"]), statistics.median(times["python"])))
    if me == 0:
        print(f"# collcomm.native.compare: n={n} dtype={dtype.name} blocks={args.blocks} "
              f"iters={args.iters}; µs per call, median over blocks of the slowest rank")
        print(f"# {'collective':>14} {'bytes':>8} {'native':>10} {'python':>10} {'python/native':>14}")
        for op, nbytes, nat, py in rows:
            print(f"  {op:>14} {nbytes:>8} {nat:>10.2f} {py:>10.2f} {py / nat:>13.2f}x")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
