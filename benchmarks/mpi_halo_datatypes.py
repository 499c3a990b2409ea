"""A halo exchange with derived datatypes: µs a ``Sendrecv`` of an N x (N+2) grid's column
(subarray types both sides; a vector send into a contiguous receive), against a row of
plain arrays, a struct type over many records, and small collectives (Bcast of struct
records and of a column, Allreduce of a column: collcomm only, Open MPI refuses it). The same script runs under
collcomm.MPI and under mpi4py + Open MPI (``USE_MPI4PY=1``); rank 0 prints one JSON line
(each figure the slower rank's mean over the loop, after a warm-up and a barrier)::

    collcomm run -n 2 python benchmarks/mpi_halo_datatypes.py [--sizes 64,1000 --iters 2000]
    USE_MPI4PY=1 mpiexec --allow-run-as-root --oversubscribe -x USE_MPI4PY -n 2 \\
        python benchmarks/mpi_halo_datatypes.py

(BENCHMARKS.md, session 33.)
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
parser.add_argument("--sizes", default="64,1000", help="grid sizes N (the column has N doubles)")
parser.add_argument("--iters", type=int, default=2000, help="calls a case at the smallest size")
parser.add_argument("--records", type=int, default=100_000, help="struct records sent at once")
args = parser.parse_args()

comm = MPI.COMM_WORLD
r, n = comm.Get_rank(), comm.Get_size()
right, left = (r + 1) % n, (r - 1) % n
D = MPI.DOUBLE
res = {}


def timeit(name, fn, iters):
    for _ in range(max(10, iters // 20)):
        fn()
    comm.Barrier()
    t = time.perf_counter()
    for _ in range(iters):
        fn()
    dt = (time.perf_counter() - t) / iters * 1e6
    res[name] = round(comm.allreduce(dt, op=MPI.MAX), 1)


for k, N in enumerate(int(x) for x in args.sizes.split(",")):
    g = np.zeros((N, N + 2))
    sub_send = D.Create_subarray([N, N + 2], [N, 1], [0, N]).Commit()
    sub_recv = D.Create_subarray([N, N + 2], [N, 1], [0, 0]).Commit()
    column = D.Create_vector(N, 1, N + 2).Commit()
    row, row2, flat = np.zeros(N), np.zeros(N), g.reshape(-1)
    it = max(10, args.iters // (4 ** k))
    timeit(f"row {N} doubles (contiguous)", lambda: comm.Sendrecv(row, right, 0, row2, left, 0), it)
    timeit(f"column {N} (subarray both sides)",
           lambda: comm.Sendrecv([g, 1, sub_send], right, 0, [g, 1, sub_recv], left, 0), it)
    timeit(f"column {N} (vector send, contiguous recv)",
           lambda: comm.Sendrecv([flat[N:], 1, column], right, 0, row2, left, 0), it)
    for t in (sub_send, sub_recv, column):
        t.Free()
rec = np.zeros(args.records, dtype=np.dtype({"names": ["i", "d"], "formats": ["i4", "f8"], "offsets": [0, 8],
                                              "itemsize": 16}))
st = MPI.Datatype.Create_struct([1, 1], [0, 8], [MPI.INT, D]).Commit()
rec2 = np.zeros_like(rec)
timeit(f"{args.records} struct{{int,double}} records",
       lambda: comm.Sendrecv([rec, st], right, 0, [rec2, st], left, 0), max(5, args.iters // 20))
ten, col8 = rec[:10].copy(), D.Create_vector(8, 1, 4).Commit()
a32, b32 = np.arange(32.0), np.zeros(32)
timeit("Bcast 10 struct records", lambda: comm.Bcast([ten, st], root=0), args.iters)
timeit("Bcast a column of 8 (vector)", lambda: comm.Bcast([a32, 1, col8], root=0), args.iters)
if not os.environ.get("USE_MPI4PY"):       # (Open MPI refuses predefined ops on derived types)
    timeit("Allreduce SUM a column of 8 (vector)",
           lambda: comm.Allreduce([a32, 1, col8], [b32, 1, col8], op=MPI.SUM), args.iters)
if r == 0:
    print("JSON " + json.dumps(res), flush=True)
