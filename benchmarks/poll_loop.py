"""A nonblocking all_reduce completed by polling ``Test()`` in a tight loop (what MPI
programs that overlap do), per size; the same script runs on collcomm.MPI or mpi4py.

    collcomm run -n 2 --no-prefix python benchmarks/poll_loop.py cc 8 262144 4194304
    mpiexec --allow-run-as-root --oversubscribe -n 2 python benchmarks/poll_loop.py mpi 8 262144 4194304

Prints, per size, the median over three blocks of µs per ``Iallreduce`` + ``Test`` loop
(rank 0) and the median number of ``Test`` calls that returned False.
"""
from __future__ import annotations

import sys
import time

import numpy as np


def main() -> None:
    which, sizes = sys.argv[1], [int(a) for a in sys.argv[2:]] or [8]
    if which == "cc":
        from collcomm import MPI
    else:
        from mpi4py import MPI  # type: ignore[no-redef]
    comm = MPI.COMM_WORLD
    for nbytes in sizes:
        y = np.zeros(max(1, nbytes // 4), np.float32)
        iters = 2000 if nbytes <= 65536 else 200
        times, polls = [], []
        for _ in range(3):
            comm.Barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                req = comm.Iallreduce(MPI.IN_PLACE, y)
                misses = 0
                while not req.Test():
                    misses += 1
                polls.append(misses)
            times.append((time.perf_counter() - t0) / iters * 1e6)
        if comm.Get_rank() == 0:
            print(f"{which} {nbytes:>9} B  Iallreduce+Test loop {sorted(times)[1]:9.1f} us"
                  f"  failed Tests (median) {sorted(polls)[len(polls) // 2]}")


if __name__ == "__main__":
    main()
