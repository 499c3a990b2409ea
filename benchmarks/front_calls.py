"""The small calls of the functional API against collcomm.MPI, side by side in one job.

    collcomm run -n 2 --no-prefix python benchmarks/front_calls.py [--blocks 9] [--iters 2000]
    python benchmarks/front_calls.py                # a world of one: the per-call cost alone

Each row is one call made back to back ``--iters`` times; the rows are timed in
interleaved blocks (every rank switching at once), and per row the median over blocks of
the slowest rank's µs per call is printed. In a world of one the time is thread CPU time
(other processes on a busy machine do not count). The layers of the barrier are timed
too: the fast call alone (``Fast.barrier``), the C collective (``Core.barrier``) and the
arena's counter barrier (``Core.sync``).
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Callable

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--blocks", type=int, default=9)
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--bytes", type=int, default=8, help="bytes per rank (float32)")
    ap.add_argument("--only", default="", help="comma-separated row names (prefixes) to time")
    args = ap.parse_args()

    import collcomm as dist
    from collcomm import MPI
    from collcomm.core import runtime

    dist.init_process_group()
    n, me = dist.get_world_size(), dist.get_rank()
    world = runtime.get_world("front_calls")
    comm = MPI.COMM_WORLD
    k = max(1, args.bytes // 4)
    x = np.zeros(k, np.float32)
    outs = [np.zeros(k, np.float32) for _ in range(n)]
    flat = np.zeros(n * k, np.float32)
    ins = [np.ones(k, np.float32) for _ in range(n)]
    y = np.zeros(k, np.float32)
    fast = world.fast
    rows: list[tuple[str, Callable[[], Any]]] = [
        ("barrier functional", dist.barrier),
        ("barrier MPI", comm.Barrier),
        ("barrier Fast.barrier", (lambda: fast.barrier("barrier")) if fast is not None else None),
        ("gather list functional", lambda: dist.gather(x, outs if me == 0 else None, dst=0)),
        ("gather MPI", lambda: comm.Gather(x, flat if me == 0 else None, 0)),
        ("scatter list functional", lambda: dist.scatter(y, ins if me == 0 else None, src=0)),
        ("scatter MPI", lambda: comm.Scatter(flat if me == 0 else None, y, 0)),
        ("all_gather list functional", lambda: dist.all_gather(outs, x)),
        ("all_gather MPI", lambda: comm.Allgather(x, flat)),
        ("broadcast functional", lambda: dist.broadcast(x, src=0)),
        ("broadcast MPI", lambda: comm.Bcast(x, 0)),
        ("reduce functional", lambda: dist.reduce(x, dst=0)),
        ("reduce MPI", lambda: comm.Reduce(MPI.IN_PLACE if me == 0 else x, x if me == 0 else None,
                                           MPI.SUM, 0)),
        ("all_reduce functional", lambda: dist.all_reduce(x)),
        ("all_reduce async+wait functional", lambda: dist.all_reduce(x, async_op=True).wait()),
        ("Iallreduce+Wait MPI", lambda: comm.Iallreduce(MPI.IN_PLACE, y).Wait()),
        ("broadcast async+wait functional", lambda: dist.broadcast(x, src=0, async_op=True).wait()),
        ("Ibcast+Wait MPI", lambda: comm.Ibcast(y, 0).Wait()),
        ("barrier async+wait functional", lambda: dist.barrier(async_op=True).wait()),
        ("Ibarrier+Wait MPI", lambda: comm.Ibarrier().Wait()),
    ]
    if n > 1:
        arena = world.run("front_calls", lambda c: c.arena())
        core = getattr(arena, "native_core", None)
        if core is not None:
            rows += [("barrier Core.barrier", lambda: core.barrier(arena, 1)),
                     ("barrier Core.sync", lambda: core.sync(arena))]
    only = [o for o in args.only.split(",") if o]
    rows = [(name, call) for name, call in rows
            if call is not None and (not only or any(name.startswith(o) for o in only))]
    clock = time.thread_time if n == 1 else time.perf_counter
    times: dict[str, list[float]] = {name: [] for name, _ in rows}
    for b in range(args.blocks):
        order = rows if b % 2 == 0 else rows[::-1]
        for name, call in order:
            dist.barrier()
            for _ in range(50):
                call()
            dist.barrier()
            t0 = clock()
            for _ in range(args.iters):
                call()
            mine = np.array([(clock() - t0) / args.iters * 1e6])
            dist.all_reduce(mine, op=dist.ReduceOp.MAX)
            times[name].append(float(mine[0]))
    if me == 0:
        print(f"# front_calls: n={n}, {k * 4} B float32, {args.blocks} blocks x {args.iters} calls; "
              f"µs per call, median [min] over blocks of the slowest rank"
              f"{' (thread CPU time)' if n == 1 else ''}")
        for name, _ in rows:
            print(f"  {name:<28} {statistics.median(times[name]):7.2f}  [{min(times[name]):.2f}]")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
