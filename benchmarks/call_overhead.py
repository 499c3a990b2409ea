"""What one small call costs above the transport: a world of one, no launcher.

    python benchmarks/call_overhead.py [--rounds 30] [--calls 5000]

In a world of one a collective moves no data, so its time is the per-call cost of the
layers: argument checks, the call plan, the sequence number, the flight recorder. Timed
(thread CPU time, so other processes on a busy machine do not count) in interleaved
rounds, median per mode:

* ``fast``: ``collcomm.all_reduce`` of 8 bytes through the fast call (core/fastpath.py);
* ``fast, no recorder``: the same with the fast call's records switched off;
* ``regular``: the same call with the fast call paused (the Python layers);
* ``regular, no recorder``: and the group's observer removed;
* ``mpi4py``: ``COMM_SELF.Allreduce(IN_PLACE, x)`` when mpi4py is installed;
* ``MPI front end``: ``collcomm.MPI.COMM_SELF.Allreduce(IN_PLACE, x)``.

The recorder's cost is ``fast`` − ``fast, no recorder``.
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Callable

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--calls", type=int, default=5000)
    args = ap.parse_args()

    import collcomm as dist
    from collcomm import MPI as CCMPI
    from collcomm.core import runtime

    dist.init_process_group()
    g = runtime.get_world("overhead")
    fast, obs = g.fast, g.observer
    x = np.ones(2, np.float32)
    cc_self = CCMPI.COMM_SELF
    y = np.ones(2, np.float32)

    def setting(fast_on: bool, record: bool) -> Callable[[], None]:
        def apply() -> None:
            if fast is not None:
                fast.paused = 0 if fast_on else 1
                fast.records = 1 if record else 0
            g.observer = obs if record else None
        return apply

    modes: dict[str, tuple[Callable[[], None], Callable[[], Any]]] = {
        "fast": (setting(True, True), lambda: dist.all_reduce(x)),
        "fast, no recorder": (setting(True, False), lambda: dist.all_reduce(x)),
        "regular": (setting(False, True), lambda: dist.all_reduce(x)),
        "regular, no recorder": (setting(False, False), lambda: dist.all_reduce(x)),
        "MPI front end": (setting(True, True), lambda: cc_self.Allreduce(CCMPI.IN_PLACE, y)),
    }
    try:
        from mpi4py import MPI as REAL

        z = np.ones(2, np.float32)
        real_self = REAL.COMM_SELF
        modes["mpi4py"] = (setting(True, True), lambda: real_self.Allreduce(REAL.IN_PLACE, z))
    except Exception as exc:  # noqa: BLE001 - not installed, or MPI cannot start here
        print(f"# mpi4py: not measured ({type(exc).__name__}: {exc})")
    times: dict[str, list[float]] = {m: [] for m in modes}
    names = list(modes)
    for rnd in range(args.rounds):
        order = names if rnd % 2 == 0 else names[::-1]
        for name in order:
            apply, call = modes[name]
            apply()
            for _ in range(200):
                call()
            t0 = time.thread_time()
            for _ in range(args.calls):
                call()
            times[name].append((time.thread_time() - t0) / args.calls * 1e6)
    setting(True, True)()
    print(f"# call_overhead: world of one, 8-byte all_reduce, median of {args.rounds} interleaved "
          f"rounds of {args.calls} calls, thread CPU µs per call")
    for name in names:
        print(f"  {name:<22} {statistics.median(times[name]):7.3f}")
    rec = statistics.median(times["fast"]) - statistics.median(times["fast, no recorder"])
    print(f"  recorder on the fast call: {rec * 1000:+.0f} ns per call")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
