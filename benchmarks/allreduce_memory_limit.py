"""64 MiB all_reduce on collcomm.empty buffers against the memory-traffic limit (issue 8).

    collcomm run -n 2 python benchmarks/allreduce_memory_limit.py [--mib 64] [--reps 10]

The limit is what 4 × size bytes of memory traffic cost at the bandwidth each rank
measures with ``np.copyto`` of the same size (both ranks copying at once, as in the
all_reduce; a copy is 2 × size bytes of traffic: read and write); the script prints the
median all_reduce time, the median copy time, and the fraction of the limit reached
(limit time / all_reduce time), the two interleaved.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import collcomm as dist


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args()
    dist.init_process_group()
    n = args.mib * (1 << 20) // 4
    buf = dist.empty(n, dtype=np.float32)
    buf.fill(1.0)
    src, dst = np.ones(n, np.float32), np.empty(n, np.float32)
    dist.all_reduce(buf)
    ar, cp = [], []
    for _ in range(args.reps):
        dist.barrier()
        t = time.perf_counter()
        dist.all_reduce(buf)
        mine = np.array([time.perf_counter() - t])
        dist.all_reduce(mine, op=dist.ReduceOp.MAX)
        ar.append(float(mine[0]))
        dist.barrier()
        t = time.perf_counter()
        np.copyto(dst, src)
        mine = np.array([time.perf_counter() - t])
        dist.all_reduce(mine, op=dist.ReduceOp.MAX)
        cp.append(float(mine[0]))
    t_ar, t_cp = statistics.median(ar), statistics.median(cp)
    size = n * 4
    bandwidth = 2 * size / t_cp            # memory traffic of one copy: read + write
    limit = 4 * size / bandwidth
    if dist.get_rank() == 0:
        print(f"all_reduce {args.mib} MiB (collcomm.empty, n={dist.get_world_size()}): "
              f"{t_ar * 1e3:.1f} ms; copy {t_cp * 1e3:.1f} ms ({bandwidth / 1e9:.2f} GB/s of traffic); "
              f"memory-traffic limit {limit * 1e3:.1f} ms; reached {limit / t_ar:.0%}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
