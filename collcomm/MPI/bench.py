"""What ``collcomm.MPI`` costs over the functional API: the same collectives both ways.

::

    collcomm run -n 2 -m collcomm.MPI.bench                  # default sizes 8 B .. 1 MiB
    collcomm run -n 4 -m collcomm.MPI.bench --sizes 8,4096 --ops allreduce,bcast

For each collective and size it alternates rounds of the functional call
(``collcomm.all_reduce(b)``) and the mpi4py-style call (``comm.Allreduce(MPI.IN_PLACE, b)``),
so both see the same machine load; a round is ``iters`` calls after a barrier, timed on
every rank, the slowest rank counts; the table shows the median round per call and the
difference (what the MPI front end adds). :func:`run` returns the rows, so tests can check
them; ``python -m collcomm.MPI.bench`` prints them (rank 0).
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Callable

import numpy as np

OPS = ("allreduce", "bcast", "allgather", "reduce_scatter", "alltoall", "barrier")


def _pairs(op: str, nbytes: int, n: int, dist: Any, MPI: Any) -> tuple[Callable[[], Any], Callable[[], Any]]:
    comm = MPI.COMM_WORLD
    count = max(1, nbytes // 4)
    a = np.ones(count, dtype=np.float32)
    b = np.ones(count, dtype=np.float32)
    whole = np.ones(count * n, dtype=np.float32)
    out = np.ones(count * n, dtype=np.float32)
    if op == "allreduce":
        return (lambda: dist.all_reduce(b)), (lambda: comm.Allreduce(MPI.IN_PLACE, b))
    if op == "bcast":
        return (lambda: dist.broadcast(b, 0)), (lambda: comm.Bcast(b, 0))
    if op == "allgather":
        return (lambda: dist.all_gather_into_tensor(out, a)), (lambda: comm.Allgather(a, out))
    if op == "reduce_scatter":
        return (lambda: dist.reduce_scatter_tensor(b, whole)), (lambda: comm.Reduce_scatter_block(whole, b))
    if op == "alltoall":
        return (lambda: dist.all_to_all_single(out, whole)), (lambda: comm.Alltoall(whole, out))
    if op == "barrier":
        return (lambda: dist.barrier()), (lambda: comm.Barrier())
    raise ValueError(f"unknown op {op!r}; choose from {', '.join(OPS)}")


def _round(fn: Callable[[], Any], iters: int, comm: Any, MPI: Any) -> float:
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    mine = np.array([(time.perf_counter() - t0) / iters])
    slowest = np.empty(1)
    comm.Allreduce(mine, slowest, op=MPI.MAX)
    return float(slowest[0]) * 1e6


def run(ops: tuple[str, ...] = OPS, sizes: tuple[int, ...] = (8, 1024, 65536, 1 << 20), iters: int = 200,
        rounds: int = 7) -> list[dict[str, Any]]:
    """Rows ``{op, bytes, api_us, mpi_us, extra_us}`` (every rank gets the same rows)."""
    import collcomm as dist
    from collcomm import MPI

    comm = MPI.COMM_WORLD
    n = comm.Get_size()
    rows = []
    for op in ops:
        for nbytes in (sizes if op != "barrier" else (0,)):
            f_api, f_mpi = _pairs(op, nbytes, n, dist, MPI)
            f_api()
            f_mpi()
            api, mpi = [], []
            for _ in range(rounds):
                api.append(_round(f_api, iters, comm, MPI))
                mpi.append(_round(f_mpi, iters, comm, MPI))
            a, m = statistics.median(api), statistics.median(mpi)
            rows.append({"op": op, "bytes": nbytes, "api_us": round(a, 2), "mpi_us": round(m, 2),
                         "extra_us": round(m - a, 2)})
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="collcomm.MPI.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--ops", default=",".join(OPS), help="comma-separated: " + ", ".join(OPS))
    p.add_argument("--sizes", default="8,1024,65536,1048576", help="bytes per rank, comma-separated")
    p.add_argument("--iters", type=int, default=200, help="calls per round (default 200)")
    p.add_argument("--rounds", type=int, default=7, help="rounds per library (default 7; the median counts)")
    args = p.parse_args(argv)
    rows = run(tuple(args.ops.split(",")), tuple(int(s) for s in args.sizes.split(",")), args.iters, args.rounds)
    from collcomm import MPI

    if MPI.COMM_WORLD.Get_rank() == 0:
        print(f"# {MPI.COMM_WORLD.Get_size()} ranks; time per call, slowest rank, median of {args.rounds} rounds")
        print(f"{'op':>15} {'bytes':>9} {'functional us':>14} {'MPI us':>9} {'MPI - functional':>17}")
        for r in rows:
            print(f"{r['op']:>15} {r['bytes']:>9} {r['api_us']:>14.2f} {r['mpi_us']:>9.2f} {r['extra_us']:>+17.2f}")


if __name__ == "__main__":
    main()
