"""Small-message point-to-point latency over shared memory, layer by layer.

    collcomm run -n 2 python benchmarks/p2p_latency.py [--blocks 7] [--iters 2000] [--bytes 8]
    mpiexec --allow-run-as-root --oversubscribe -n 2 python benchmarks/p2p_latency.py --mpi4py

Two ranks ping-pong a message (rank 0 sends, rank 1 answers); the time printed is half a
round trip (one-way latency, OSU style), in µs, median over blocks of the slower rank.
The modes run in interleaved blocks (the order turning every block), so every one sees
the same machine load: on a shared machine only the ratios mean much.

* ``api send/recv``: ``collcomm.send`` / ``collcomm.recv``; ``[no recorder]``: the same
  with the flight recorder's point-to-point records off for the block (the recorder's
  cost is the difference), ``[no native]``: with the native path paused;
* ``api isend/irecv+wait``: ``collcomm.isend(...).wait()`` / ``collcomm.irecv(...).wait()``;
* ``api batch sendrecv``: both ranks ``batch_isend_irecv([isend, irecv])`` then wait both
  (an exchange: the time is the whole exchange, not half of it);
* ``MPI Isend/Irecv+Waitall``: both ranks ``Waitall([Irecv, Isend])`` (an exchange);
  ``[no native]`` on the non-blocking modes: the native path paused (the Python engine);
* ``MPI Send/Recv``, ``MPI Sendrecv`` (exchange): ``collcomm.MPI.COMM_WORLD``; the
  ``ANY_TAG`` modes receive without a tag (the default of ``Recv``/``Irecv``/``Sendrecv``);
* ``group p2p_isend/irecv``: the core (``ProcessGroup.p2p_isend`` / ``p2p_irecv``, wait);
* ``engine isend/irecv``: the transport alone (``Engine.isend`` / ``irecv``, ``wait``).

``--profile``: cProfile one mode (``--mode``) on rank 0 and print the top functions.
``--mpi4py`` (under mpiexec): the same ping-pong and exchange with mpi4py for reference.
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Callable


def _pingpong(me: int, send: Callable[[], Any], recv: Callable[[], Any]) -> Callable[[], None]:
    if me == 0:
        def step() -> None:
            send()
            recv()
    else:
        def step() -> None:
            recv()
            send()
    return step


def _mpi4py(args: Any) -> None:
    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    me = comm.Get_rank()
    other = 1 - me
    s = np.zeros(max(1, args.bytes), np.uint8)
    r = np.zeros_like(s)
    modes = {
        "mpi4py Send/Recv": (_pingpong(me, lambda: comm.Send(s, other, 0), lambda: comm.Recv(r, other, 0)), 2),
        "mpi4py Sendrecv": (lambda: comm.Sendrecv(s, other, 0, r, other, 0), 1),
        "mpi4py Isend/Irecv+Waitall": (lambda: MPI.Request.Waitall([comm.Irecv(r, other, 0),
                                                                    comm.Isend(s, other, 0)]), 1),
    }
    _run(modes, args, me, comm.Barrier, lambda x: comm.allreduce(x, op=MPI.MAX), "mpi4py (mpiexec)")


def _run(modes: dict[str, tuple[Callable[[], None], int] | tuple[Callable[[], None], int, Callable[[], None]]],
         args: Any, me: int,
         barrier: Callable[[], Any], maxall: Callable[[float], float], title: str) -> None:
    import os

    times: dict[str, list[float]] = {m: [] for m in modes}
    names = list(modes)
    for b in range(args.blocks):
        order = names if b % 2 == 0 else names[::-1]
        for name in order:
            step, per, *before = modes[name]
            for b4 in before:
                b4()     # e.g. the native path on or off for this block
            barrier()
            for _ in range(50):
                step()
            barrier()
            t0 = time.perf_counter()
            for _ in range(args.iters):
                step()
            mine = (time.perf_counter() - t0) / args.iters / per * 1e6
            times[name].append(maxall(mine))
    if me == 0:
        print(f"# p2p_latency {title}: {args.bytes} B, blocks={args.blocks} iters={args.iters}; "
              f"load {os.getloadavg()[0]:.2f}; µs (one-way for ping-pongs, whole exchange for "
              "sendrecv), median [min] over blocks")
        for name in names:
            ts = times[name]
            print(f"  {name:<28} {statistics.median(ts):8.2f}  [{min(ts):7.2f}]")


def _burst(args: Any, me: int, dist: Any, s: Any, r: Any,
           switches: dict[str, Callable[[], None]]) -> None:
    """Per-call CPU cost of ``collcomm.send`` / ``recv`` without the wait: rank 0 sends a
    burst of ``--burst`` messages (they fit the ring), then rank 1 receives them, all
    queued already; thread CPU time per call, median over blocks, each switch (recorder
    on / off ...) in interleaved blocks."""
    import os

    n, other = args.burst, 1 - me
    times: dict[str, list[float]] = {k: [] for k in switches}
    names = list(switches)
    for b in range(args.blocks * 3):
        for name in (names if b % 2 == 0 else names[::-1]):
            switches[name]()
            dist.barrier()
            if me == 0:
                t0 = time.thread_time()
                for _ in range(n):
                    dist.send(s, other)
                times[name].append((time.thread_time() - t0) / n * 1e6)
            dist.barrier()
            if me == 1:
                t0 = time.thread_time()
                for _ in range(n):
                    dist.recv(r, other)
                times[name].append((time.thread_time() - t0) / n * 1e6)
            dist.barrier()
    import numpy as np

    mine = np.array([statistics.median(times[k]) for k in names])
    theirs = mine.copy()                 # rank 0: the sends, rank 1: the receives
    dist.broadcast(theirs, src=1)
    if me == 0:
        print(f"# p2p_latency burst: {args.bytes} B, {n} calls a block, {args.blocks * 3} blocks; "
              f"load {os.getloadavg()[0]:.2f}; thread CPU µs per call, median over blocks")
        for i, k in enumerate(names):
            print(f"  {k:<30} send {mine[i]:6.3f}   recv (queued) {theirs[i]:6.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--blocks", type=int, default=7)
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--bytes", type=int, default=8)
    ap.add_argument("--modes", default="", help="comma-separated substrings of the modes to run")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--mode", default="api send/recv", help="the mode --profile profiles")
    ap.add_argument("--mpi4py", action="store_true")
    ap.add_argument("--burst", type=int, default=0,
                    help="N: the per-call CPU cost of send/recv in bursts of N (recorder on/off)")
    args = ap.parse_args()
    if args.mpi4py:
        _mpi4py(args)
        return

    import numpy as np

    import collcomm as dist
    from collcomm import MPI as CCMPI
    from collcomm.core import runtime
    from collcomm.algorithms import signature

    dist.init_process_group()
    me, n = dist.get_rank(), dist.get_world_size()
    if n != 2:
        raise SystemExit("run with -n 2")
    other = 1 - me
    g = runtime.get_world("p2p_latency")
    eng = g.transport
    s = np.zeros(max(1, args.bytes // 4), np.float32)
    r = np.zeros_like(s)
    sb, rb = memoryview(s.view(np.uint8)), memoryview(r.view(np.uint8))
    world = CCMPI.COMM_WORLD
    sig = signature.p2p(s.dtype)
    tag = g._p2p_tag(0, "bench")
    P2POp = dist.P2POp

    def batch() -> None:
        for w in dist.batch_isend_irecv([P2POp(dist.isend, s, other), P2POp(dist.irecv, r, other)]):
            w.wait()

    def mpi_exchange() -> None:
        CCMPI.Request.Waitall([world.Irecv(r, other, 0), world.Isend(s, other, 0)])

    from collcomm.core import p2p as core_p2p

    fast = getattr(core_p2p, "native", lambda g: None)(g)   # None: a tree without it (A/B)

    obs = g.observer

    def native(on: bool, record: bool = True) -> Callable[[], None]:
        """The native path on or off, and the flight recorder's point-to-point records
        (``record`` False: the group's observer removed for the block, and the native
        entry's C records off where it has them), for the next block."""
        def switch() -> None:
            if fast is not None:
                fast.paused = 0 if on else 1
                if hasattr(fast, "record"):
                    fast.record = 1 if record else 0
            g.observer = obs if record else None
        return switch

    on, off = native(True), native(False)
    modes: dict[str, Any] = {
        "api send/recv": (_pingpong(me, lambda: dist.send(s, other), lambda: dist.recv(r, other)), 2, on),
        "api send/recv [no recorder]": (_pingpong(me, lambda: dist.send(s, other),
                                                  lambda: dist.recv(r, other)), 2, native(True, False)),
        "api send/recv [no native]": (_pingpong(me, lambda: dist.send(s, other),
                                                lambda: dist.recv(r, other)), 2, off),
        "api isend/irecv+wait": (_pingpong(me, lambda: dist.isend(s, other).wait(),
                                           lambda: dist.irecv(r, other).wait()), 2, on),
        "api batch sendrecv": (batch, 1, on),
        "api batch sendrecv [no native]": (batch, 1, off),
        "api isend/irecv+wait [no native]": (_pingpong(me, lambda: dist.isend(s, other).wait(),
                                                       lambda: dist.irecv(r, other).wait()), 2, off),
        "MPI Isend/Irecv+Waitall": (mpi_exchange, 1, on),
        "MPI Isend/Irecv+Waitall [no native]": (mpi_exchange, 1, off),
        "MPI Send/Recv": (_pingpong(me, lambda: world.Send(s, other), lambda: world.Recv(r, other, 0)), 2, on),
        "MPI Send/Recv [no native]": (_pingpong(me, lambda: world.Send(s, other),
                                                lambda: world.Recv(r, other, 0)), 2, off),
        "MPI Send/Recv, ANY_TAG": (_pingpong(me, lambda: world.Send(s, other),
                                             lambda: world.Recv(r, other)), 2, on),
        "MPI Sendrecv": (lambda: world.Sendrecv(s, other, 0, r, other, 0), 1, on),
        "MPI Sendrecv, ANY_TAG": (lambda: world.Sendrecv(s, other, 0, r, other), 1, on),
        "MPI Isend/Irecv+Waitall, ANY_TAG": (
            lambda: CCMPI.Request.Waitall([world.Irecv(r, other), world.Isend(s, other, 0)]), 1, on),
        "MPI Sendrecv [no native]": (lambda: world.Sendrecv(s, other, 0, r, other, 0), 1, off),
        "group p2p_isend/irecv": (_pingpong(me, lambda: g.p2p_isend(s, other, 0, sig).wait(),
                                            lambda: g.p2p_irecv(r, other, 0, sig).wait()), 2, on),
        "engine isend/irecv": (_pingpong(me, lambda: eng.isend(sb, other, tag, sig).wait(),
                                         lambda: eng.irecv(rb, other, tag, sig=sig).wait()), 2, on),
    }
    if args.modes:
        keep = args.modes.split(",")
        modes = {k: v for k, v in modes.items() if any(x in k for x in keep)}

    def maxall(x: float) -> float:
        a = np.array([x])
        dist.all_reduce(a, op=dist.ReduceOp.MAX)
        return float(a[0])

    if args.burst:
        _burst(args, me, dist, s, r, {"api, recorder": on, "api, no recorder": native(True, False),
                                      "api [no native], recorder": off,
                                      "api [no native], no recorder": native(False, False)})
    elif args.profile:
        import cProfile
        import pstats

        step = modes[args.mode][0]
        for b4 in modes[args.mode][2:]:
            b4()
        for _ in range(200):
            step()
        for b4 in modes[args.mode][2:]:
            b4()
        dist.barrier()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.iters):
            step()
        prof.disable()
        dist.barrier()
        if me == 0:
            pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    else:
        import os
        _run(modes, args, me, dist.barrier, maxall, f"collcomm ({os.path.dirname(dist.__file__)})")
    on()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
