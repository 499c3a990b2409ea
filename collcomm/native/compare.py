"""Native core vs pure Python, interleaved in one job: ``collcomm run -n 2 -m collcomm.native.compare``.

Each (collective, size) is timed in blocks of back-to-back calls through the functional
API, alternating the native core and the Python implementation block by block (the
group's arena is switched between them on every rank at once), so that both see the same
machine load; per mode the median over blocks of the slowest rank's time per call is
printed, with the ratio. On a shared or busy machine only the ratios mean much.

Options: ``--ops all_reduce,broadcast,...`` (also all_gather, reduce_scatter, all_to_all,
reduce, barrier), ``--sizes 8,64,4K,256K`` (bytes per rank), ``--dtype float32``,
``--blocks 6``, ``--iters 100``.

``--layers``: where the time of one small all_reduce goes instead: an 8-byte float32
all_reduce called back to back through each layer in turn (the functional API, the core's
``collectives.all_reduce``, the family function ``shm_direct.all_reduce``, the C call
alone) and the arena's sync, native and Python, interleaved the same way. "native" is the
fast call (collcomm/core/fastpath.py) and the C core; "python" pauses both.
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Callable

import numpy as np

from . import core as native_core


def _switch(world: Any, arena: Any, core: Any, mode: str) -> None:
    """Native (the fast call and the C core) or pure Python, on this rank."""
    arena.native_core = core if mode == "native" else None
    if world.fast is not None:
        world.fast.paused = 0 if mode == "native" else 1


def _interleaved(dist: Any, world: Any, arena: Any, core: Any, call: Callable[[], Any],
                 blocks: int, warmup: int, iters: int, both: bool) -> dict[str, list[float]]:
    """µs per ``call`` of the slowest rank, one entry per block and mode; the modes (native,
    and Python when ``both``) alternate block by block, every rank switching at once."""
    times: dict[str, list[float]] = {"native": [], "python": []}
    for b in range(blocks):
        for mode in (("native", "python") if b % 2 == 0 else ("python", "native")) if both else ("native",):
            dist.barrier()
            _switch(world, arena, core, mode)
            for _ in range(warmup):
                call()
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                call()
            mine = np.array([(time.perf_counter() - t0) / iters * 1e6])
            _switch(world, arena, core, "native")
            dist.all_reduce(mine, op=dist.ReduceOp.MAX)
            times[mode].append(float(mine[0]))
    return times


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
    ap.add_argument("--layers", action="store_true", help="time one small all_reduce layer by layer")
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
    if args.layers:
        _layers(dist, world, arena, core, args, me)
        dist.destroy_process_group()
        return
    dtype = np.dtype(args.dtype)
    rows = []
    for op in args.ops.split(","):
        for nbytes in ([0] if op == "barrier" else [_size(s) for s in args.sizes.split(",")]):
            call = _call(dist, op, nbytes, dtype, n)
            times = _interleaved(dist, world, arena, core, call, args.blocks, 5, args.iters, True)
            rows.append((op, nbytes, statistics.median(times["native"]), statistics.median(times["python"])))
    if me == 0:
        print(f"# collcomm.native.compare: n={n} dtype={dtype.name} blocks={args.blocks} "
              f"iters={args.iters}; µs per call, median over blocks of the slowest rank")
        print(f"# {'collective':>14} {'bytes':>8} {'native':>10} {'python':>10} {'python/native':>14}")
        for op, nbytes, nat, py in rows:
            print(f"  {op:>14} {nbytes:>8} {nat:>10.2f} {py:>10.2f} {py / nat:>13.2f}x")
    dist.destroy_process_group()


def _layers(dist: Any, world: Any, arena: Any, core: Any, args: Any, me: int) -> None:
    """Back-to-back 8-byte all_reduce through each layer, native and Python interleaved."""
    from collcomm import native
    from collcomm.algorithms import shm_direct
    from collcomm.core import collectives
    from collcomm.core.call_comm import GroupComm

    x = np.zeros(2, np.float32)
    fn = world.plan.reducer(dist.ReduceOp.SUM, x.dtype, "compare")[0]
    comm = GroupComm(world, 0, world.timeout, 0)
    code = native.code_for(fn, x.dtype)
    fast = world.fast
    layers: list[tuple[str, Callable[[], Any], bool]] = [
        ("functional API  dist.all_reduce", lambda: dist.all_reduce(x), True),
        ("fast call       Fast.all_reduce", lambda: fast.all_reduce(x, x, dist.ReduceOp.SUM, "all_reduce"),
         False),
        ("core            collectives.all_reduce", lambda: collectives.all_reduce(world, x), True),
        ("family          shm_direct.all_reduce", lambda: shm_direct.all_reduce(comm, x, fn), True),
        ("C call          Core.all_reduce", lambda: core.all_reduce(arena, x, code, 1), False),
        ("arena           Arena.sync", arena.sync, True),
    ]
    rows = []
    for name, call, both in layers:
        times = _interleaved(dist, world, arena, core, call, args.blocks, 20, args.iters * 10, both)
        rows.append((name, statistics.median(times["native"]),
                     statistics.median(times["python"]) if times["python"] else float("nan")))
    if me == 0:
        print(f"# collcomm.native.compare --layers: n={dist.get_world_size()}, 8-byte float32 "
              f"all_reduce back to back; µs per call, median over {args.blocks} blocks of the slowest rank")
        print(f"# {'layer':<40} {'native':>8} {'python':>8}")
        for name, nat, py in rows:
            print(f"  {name:<40} {nat:>8.2f} {py:>8.2f}")


if __name__ == "__main__":
    main()
