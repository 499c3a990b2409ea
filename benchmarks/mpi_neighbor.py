"""Neighbourhood collectives: µs a call of ``Neighbor_alltoall`` / ``Neighbor_allgather`` on a
periodic ring (2 neighbours a rank), a ``Neighbor_alltoallv`` on a distributed graph, the
ring's ``Ineighbor_alltoall`` + ``Wait`` and persistent ``Start`` + ``Wait``, at a small and a
large block, against the same exchange written as ``Sendrecv`` calls along ``Shift``; and
the object form ``neighbor_allgather`` of an int. The same script runs under collcomm.MPI and under mpi4py + Open MPI
(``USE_MPI4PY=1``); rank 0 prints one JSON line (each figure the slower rank's mean over
the loop, after a warm-up and a barrier)::

    collcomm run -n 4 python benchmarks/mpi_neighbor.py [--sizes 8,65536 --iters 2000]
    USE_MPI4PY=1 mpiexec --allow-run-as-root --oversubscribe -x USE_MPI4PY -n 4 \\
        python benchmarks/mpi_neighbor.py

(BENCHMARKS.md, sessions 34 and 39.)
"""
import argparse
import json
import os
import time

import numpy as np

if os.environ.get("USE_MPI4PY"):
    from mpi4py import MPI
else:
    from collcomm import MPI

parser = argparse.ArgumentParser()
parser.add_argument("--sizes", default="8,65536", help="bytes a block")
parser.add_argument("--iters", type=int, default=2000, help="calls a case at the smallest size")
args = parser.parse_args()

comm = MPI.COMM_WORLD
r, n = comm.Get_rank(), comm.Get_size()
ring = comm.Create_cart([n], [True])
down, up = ring.Shift(0, 1)
graph = comm.Create_dist_graph_adjacent([(r - 1) % n, (r - 2) % n], [(r + 1) % n, (r + 2) % n])
res = {}


def timeit(name, fn, iters):
    for _ in range(max(10, iters // 20)):
        fn()
    comm.Barrier()
    t = time.perf_counter()
    for _ in range(iters):
        fn()
    dt = (time.perf_counter() - t) / iters * 1e6
    res[name] = round(comm.allreduce(dt, op=MPI.MAX), 2)


for k, size in enumerate(int(x) for x in args.sizes.split(",")):
    m = max(1, size // 8)
    send, recv = np.ones(2 * m), np.zeros(2 * m)
    it = max(10, args.iters // (8 ** k))
    timeit(f"ring Neighbor_alltoall {size} B", lambda: ring.Neighbor_alltoall(send, recv), it)
    timeit(f"ring Neighbor_allgather {size} B", lambda: ring.Neighbor_allgather(send[:m], recv), it)
    timeit(f"ring Neighbor_allgatherv {size} B",
           lambda: ring.Neighbor_allgatherv(send[:m], [recv, [m, m], [0, m], MPI.DOUBLE]), it)
    timeit(f"ring two Sendrecv {size} B", lambda: (ring.Sendrecv(send[:m], down, 0, recv[m:], up, 0),
                                                   ring.Sendrecv(send[m:], up, 1, recv[:m], down, 1)), it)
    timeit(f"graph Neighbor_alltoallv {size} B",
           lambda: graph.Neighbor_alltoallv([send, [m, m], [0, m], MPI.DOUBLE], [recv, [m, m], [0, m], MPI.DOUBLE]), it)
    timeit(f"ring Ineighbor_alltoall+Wait {size} B", lambda: ring.Ineighbor_alltoall(send, recv).Wait(), it)
    persistent = ring.Neighbor_alltoall_init(send, recv)
    timeit(f"ring Neighbor_alltoall_init Start+Wait {size} B", lambda: (persistent.Start(), persistent.Wait()), it)
    persistent.Free()
timeit("ring neighbor_allgather (an int)", lambda: ring.neighbor_allgather(r), args.iters)
if r == 0:
    print(json.dumps({"library": "mpi4py" if os.environ.get("USE_MPI4PY") else "collcomm", "n": n, **res}),
          flush=True)
