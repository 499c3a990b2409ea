"""mpi4py programs' everyday small calls: objects (lower case), point to point with probes,
tests and waits on many requests, the vector collectives, the ``I…`` forms and persistent
collectives, µs a call. The same script runs under
collcomm.MPI and under mpi4py + Open MPI (``USE_MPI4PY=1``)::

    collcomm run -n 2 --no-prefix python benchmarks/mpi_calls.py [--blocks 5 --iters 2000 --only int,Wait]
    USE_MPI4PY=1 mpiexec --allow-run-as-root --oversubscribe -x USE_MPI4PY -n 2 \\
        python benchmarks/mpi_calls.py

Rows are timed in interleaved blocks (every rank switching at once; the order reversed
every other block); per row rank 0 prints the median over blocks of the slowest rank's µs
per call, and the smallest block. Buffers are float64, one element a rank (8 B).
(BENCHMARKS.md, session 35.)
"""
from __future__ import annotations

import argparse
import os
import statistics
from typing import Any, Callable

import numpy as np
from _blocks import timed_blocks

if os.environ.get("USE_MPI4PY"):
    from mpi4py import MPI
else:
    from collcomm import MPI


def rows(comm: Any) -> list[tuple[str, Callable[[], Any]]]:
    n, r = comm.Get_size(), comm.Get_rank()
    nxt, prv = (r + 1) % n, (r - 1) % n
    one, o1, nn, out = np.ones(1), np.zeros(1), np.ones(n), np.zeros(n)
    cnt, dis = [1] * n, list(range(n))
    bdis, dts = [8 * i for i in range(n)], [MPI.DOUBLE] * n
    d = {"step": 3, "loss": 0.25, "names": ["a", "b"]}
    raw, raw_in = np.zeros(64, dtype=np.uint8), np.zeros(64, dtype=np.uint8)   # (specs of part of a buffer)
    ba, bb = bytearray(8), bytearray(8)

    def start_wait(p: Any) -> Callable[[], None]:
        def go() -> None:
            p.Start()
            p.Wait()
        return go

    return [
        ("bcast int", lambda: comm.bcast(5, 0)),
        ("bcast dict", lambda: comm.bcast(d, 0)),
        ("bcast 1 KB str", lambda: comm.bcast("x" * 1000, 0)),
        ("gather int", lambda: comm.gather(5, 0)),
        ("scatter int", lambda: comm.scatter(list(range(n)) if r == 0 else None, 0)),
        ("allgather int", lambda: comm.allgather(5)),
        ("allreduce int", lambda: comm.allreduce(5)),
        ("alltoall int", lambda: comm.alltoall(list(range(n)))),
        ("sendrecv int", lambda: comm.sendrecv(5, nxt, 0, None, prv, 0)),
        ("isend+recv int", lambda: (comm.isend(5, nxt, 1), comm.recv(None, prv, 1))[0].wait()),
        ("irecv+send int", lambda: _irecv_send(comm, nxt, prv)),
        ("Isend+Irecv+Waitall", lambda: MPI.Request.Waitall([comm.Irecv(o1, prv, 2), comm.Isend(one, nxt, 2)])),
        ("Send+Probe+Recv", lambda: _probe_recv(comm, MPI, one, o1, nxt, prv, False)),
        ("Send+Iprobe loop+Recv", lambda: _probe_recv(comm, MPI, one, o1, nxt, prv, True)),
        ("Irecv+Send+Test loop", lambda: _test_loop(comm, one, o1, nxt, prv)),
        ("Irecv+Isend+Testall loop", lambda: _testall_loop(comm, MPI, one, o1, nxt, prv)),
        ("Irecv+Isend+Waitany x2", lambda: _waitany(comm, MPI, one, o1, nxt, prv)),
        ("Irecv+Isend+Waitsome", lambda: _waitsome(comm, MPI, one, o1, nxt, prv)),
        ("Sendrecv", lambda: comm.Sendrecv(one, nxt, 4, o1, prv, 4)),
        ("Sendrecv_replace", lambda: comm.Sendrecv_replace(o1, nxt, 9, prv, 9)),
        ("Recv_init+Send_init Startall+Waitall", _persistent_pair(comm, MPI, one, o1, nxt, prv)),
        ("Gatherv", lambda: comm.Gatherv(one, [out, cnt, dis, MPI.DOUBLE], 0)),
        ("Scatterv", lambda: comm.Scatterv([nn, cnt, dis, MPI.DOUBLE], o1, 0)),
        ("Allgatherv", lambda: comm.Allgatherv(one, [out, cnt, dis, MPI.DOUBLE])),
        ("Alltoallv", lambda: comm.Alltoallv([nn, cnt, dis, MPI.DOUBLE], [out, cnt, dis, MPI.DOUBLE])),
        ("Igather+Wait", lambda: comm.Igather(one, out, 0).Wait()),
        ("Iallgather+Wait", lambda: comm.Iallgather(one, out).Wait()),
        ("Ireduce+Wait", lambda: comm.Ireduce(one, o1, MPI.SUM, 0).Wait()),
        ("Ialltoall+Wait", lambda: comm.Ialltoall(nn, out).Wait()),
        ("Igatherv+Wait", lambda: comm.Igatherv(one, [out, cnt, dis, MPI.DOUBLE], 0).Wait()),
        ("Ialltoallv+Wait", lambda: comm.Ialltoallv([nn, cnt, dis, MPI.DOUBLE], [out, cnt, dis, MPI.DOUBLE]).Wait()),
        ("Alltoallw", lambda: comm.Alltoallw([nn, cnt, bdis, dts], [out, cnt, bdis, dts])),
        ("Reduce_scatter counts", lambda: comm.Reduce_scatter(nn, o1, cnt, MPI.SUM)),
        ("Allreduce_init Start+Wait", start_wait(comm.Allreduce_init(one, o1))),
        ("Bcast_init Start+Wait", start_wait(comm.Bcast_init(one, 0))),
        ("Gather_init Start+Wait", start_wait(comm.Gather_init(one, out, 0))),
        ("Alltoallv_init Start+Wait", start_wait(comm.Alltoallv_init([nn, cnt, dis, MPI.DOUBLE],
                                                                     [out, cnt, dis, MPI.DOUBLE]))),
        ("Gatherv_init Start+Wait", start_wait(comm.Gatherv_init(one, [out, cnt, dis, MPI.DOUBLE], 0))),
        ("Scatterv_init Start+Wait", start_wait(comm.Scatterv_init([nn, cnt, dis, MPI.DOUBLE], o1, 0))),
        ("Allgatherv_init Start+Wait", start_wait(comm.Allgatherv_init(one, [out, cnt, dis, MPI.DOUBLE]))),
        ("Iallreduce+Wait", lambda: comm.Iallreduce(one, o1).Wait()),
        ("Iallreduce+Test loop", lambda: _test_until(comm.Iallreduce(one, o1))),
        ("Iallreduce+Irecv+Isend Waitall", lambda: MPI.Request.Waitall(
            [comm.Iallreduce(one, o1), comm.Irecv(o1, prv, 3), comm.Isend(one, nxt, 3)])),
        ("Scan", lambda: comm.Scan(one, o1)),
        ("Exscan", lambda: comm.Exscan(one, o1)),
        ("Barrier", lambda: comm.Barrier()),
        ("Bcast", lambda: comm.Bcast(o1, 0)),
        ("Allreduce [x, DOUBLE]", lambda: comm.Allreduce([one, MPI.DOUBLE], [o1, MPI.DOUBLE])),
        ("Bcast [x, DOUBLE]", lambda: comm.Bcast([o1, MPI.DOUBLE], 0)),
        ("Gather [x, DOUBLE]", lambda: comm.Gather([one, MPI.DOUBLE], [out, MPI.DOUBLE], 0)),
        ("Sendrecv [buf, 8, BYTE]", lambda: comm.Sendrecv([raw, 8, MPI.BYTE], nxt, 4, [raw_in, 8, MPI.BYTE], prv, 4)),
        ("Allreduce [bytearray, DOUBLE]", lambda: comm.Allreduce([ba, MPI.DOUBLE], [bb, MPI.DOUBLE])),
        ("Gather", lambda: comm.Gather(one, out, 0)),
        ("Reduce", lambda: comm.Reduce(one, o1, MPI.SUM, 0)),
        ("Scatter", lambda: comm.Scatter(nn, o1, 0)),
        ("Allreduce", lambda: comm.Allreduce(one, o1)),
    ]


def _test_until(req: Any) -> None:
    while not req.Test():
        pass


def _probe_recv(comm: Any, MPI: Any, one: Any, o1: Any, nxt: int, prv: int, spin: bool) -> None:
    st = MPI.Status()
    comm.Send(one, nxt, 4)
    if spin:
        while not comm.Iprobe(prv, 4, st):
            pass
    else:
        comm.Probe(prv, 4, st)
    comm.Recv(o1, st.Get_source(), st.Get_tag())


def _test_loop(comm: Any, one: Any, o1: Any, nxt: int, prv: int) -> None:
    q = comm.Irecv(o1, prv, 5)
    comm.Send(one, nxt, 5)
    while not q.Test():
        pass


def _testall_loop(comm: Any, MPI: Any, one: Any, o1: Any, nxt: int, prv: int) -> None:
    reqs = [comm.Irecv(o1, prv, 6), comm.Isend(one, nxt, 6)]
    while not MPI.Request.Testall(reqs):
        pass


def _waitany(comm: Any, MPI: Any, one: Any, o1: Any, nxt: int, prv: int) -> None:
    reqs = [comm.Irecv(o1, prv, 7), comm.Isend(one, nxt, 7)]
    MPI.Request.Waitany(reqs)
    MPI.Request.Waitany(reqs)


def _waitsome(comm: Any, MPI: Any, one: Any, o1: Any, nxt: int, prv: int) -> None:
    reqs = [comm.Irecv(o1, prv, 8), comm.Isend(one, nxt, 8)]
    done = 0
    while done < 2:
        done += len(MPI.Request.Waitsome(reqs) or [])


def _persistent_pair(comm: Any, MPI: Any, one: Any, o1: Any, nxt: int, prv: int) -> Callable[[], None]:
    reqs = [comm.Recv_init(o1, prv, 10), comm.Send_init(one, nxt, 10)]

    def go() -> None:
        MPI.Prequest.Startall(reqs)
        MPI.Request.Waitall(reqs)
    return go


def _irecv_send(comm: Any, nxt: int, prv: int) -> None:
    req = comm.irecv(source=prv, tag=3)
    comm.send(5, nxt, 3)
    req.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--blocks", type=int, default=5)
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--only", default="", help="comma-separated parts of row names: those rows only")
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    only = [part for part in args.only.split(",") if part]
    table = [row for row in rows(comm) if not only or any(part in row[0] for part in only)]
    times = timed_blocks(comm, MPI, table, args.blocks, args.iters, max(10, args.iters // 20))
    if comm.Get_rank() == 0:
        lib = "mpi4py + Open MPI" if os.environ.get("USE_MPI4PY") else "collcomm.MPI"
        print(f"# mpi_calls, {lib}: n={comm.Get_size()}, {args.blocks} blocks x {args.iters} calls; "
              "µs per call, median [min] over blocks of the slowest rank")
        for name, _ in table:
            print(f"  {name:<26} {statistics.median(times[name]):7.2f}  [{min(times[name]):.2f}]")


if __name__ == "__main__":
    main()
