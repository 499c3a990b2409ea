"""A ping-pong whose receive is completed by polling ``Test()`` in a tight loop, on
collcomm.MPI or mpi4py (the same script), per size; set ``COLLCOMM_TRANSPORT=tcp`` to take
TCP between the two ranks of one machine.

    collcomm run -n 2 --no-prefix python benchmarks/p2p_poll_loop.py cc 8 1048576
    COLLCOMM_TRANSPORT=tcp collcomm run -n 2 --no-prefix python benchmarks/p2p_poll_loop.py cc 8 1048576
    mpiexec --allow-run-as-root --oversubscribe -n 2 python benchmarks/p2p_poll_loop.py mpi 8 1048576

Prints, per size, the median over three blocks of µs per round trip (rank 0).
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
    me = comm.Get_rank()
    for nbytes in sizes:
        x = np.zeros(max(1, nbytes // 4), np.float32)
        y = np.empty_like(x)

        def round_trip() -> None:
            if me == 0:
                comm.Send(x, 1, 0)
                req = comm.Irecv(y, 1, 0)
            else:
                req = comm.Irecv(y, 0, 0)
            while not req.Test():
                pass
            if me == 1:
                comm.Send(x, 0, 0)

        times = []
        for _ in range(3):
            comm.Barrier()
            t0 = time.perf_counter()
            for _ in range(300):
                round_trip()
            times.append((time.perf_counter() - t0) / 300 * 1e6)
        if me == 0:
            print(f"{which} {nbytes:>9} B  ping-pong, Irecv + Test loop {sorted(times)[1]:9.1f} us")


if __name__ == "__main__":
    main()
