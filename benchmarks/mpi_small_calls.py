"""Open MPI's side of benchmarks/front_calls.py: the same small calls, timed the same way.

    mpiexec --allow-run-as-root --oversubscribe -n 2 python benchmarks/mpi_small_calls.py [--iters 2000]

Rows are timed in interleaved blocks (every rank switching at once); per row the median over
blocks of the slowest rank's µs per call is printed, as front_calls.py prints collcomm's.
"""
from __future__ import annotations

import argparse
import statistics

import numpy as np
from mpi4py import MPI

from _blocks import timed_blocks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--blocks", type=int, default=9)
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--bytes", type=int, default=8, help="bytes per rank (float32)")
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    n, me = comm.Get_size(), comm.Get_rank()
    k = max(1, args.bytes // 4)
    x, y = np.zeros(k, np.float32), np.zeros(k, np.float32)
    flat = np.zeros(n * k, np.float32)
    rows = [
        ("Barrier", comm.Barrier),
        ("Gather", lambda: comm.Gather(x, flat if me == 0 else None, 0)),
        ("Scatter", lambda: comm.Scatter(flat if me == 0 else None, y, 0)),
        ("Allgather", lambda: comm.Allgather(x, flat)),
        ("Bcast", lambda: comm.Bcast(x, 0)),
        ("Reduce", lambda: comm.Reduce(MPI.IN_PLACE if me == 0 else x, x if me == 0 else None,
                                       MPI.SUM, 0)),
        ("Allreduce", lambda: comm.Allreduce(MPI.IN_PLACE, x)),
        ("Iallreduce+Wait", lambda: comm.Iallreduce(MPI.IN_PLACE, y).Wait()),
        ("Ibcast+Wait", lambda: comm.Ibcast(y, 0).Wait()),
        ("Ibarrier+Wait", lambda: comm.Ibarrier().Wait()),
    ]
    times = timed_blocks(comm, MPI, rows, args.blocks, args.iters, 50)
    if me == 0:
        print(f"# Open MPI ({MPI.Get_library_version().splitlines()[0]}): n={n}, {k * 4} B "
              f"float32, {args.blocks} blocks x {args.iters} calls; µs per call, median [min] "
              "over blocks of the slowest rank")
        for name, _ in rows:
            print(f"  {name:<28} {statistics.median(times[name]):7.2f}  [{min(times[name]):.2f}]")


if __name__ == "__main__":
    main()
