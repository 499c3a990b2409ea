"""``Scan`` / ``Exscan`` on both of the core's ways (collcomm/algorithms/scan.py): up to
GATHERED_MAX bytes a rank a one-host group all-gathers and folds in rank order, above it
(and over TCP) recursive doubling. A section of the shared MPI job (tests/mpi_checks.py)
at 1-5 ranks and over TCP: sizes on both sides of the bound, SUM / PROD / MAX on ints and
floats, a non-commutative user op (decimal concatenation: associative, exact), inclusive
and exclusive, ``IN_PLACE``, the ``I…`` forms, against values computed from the whole job.
"""
from __future__ import annotations

import numpy as np
import pytest

from collcomm.core.scan import GATHERED_MAX
from tests.mpi_checks import SIZES, Checker, check, job


def _concat(inbuf, inoutbuf, datatype) -> None:   # in ∘ inout, "in" from the lower ranks
    a = np.frombuffer(inbuf, dtype="d")
    b = np.frombuffer(inoutbuf, dtype="d")
    b[:] = a * 10.0 ** (np.floor(np.log10(b)) + 1) + b


def scan_paths_checks(c: Checker, MPI, comm) -> None:
    r, n = comm.rank, comm.size
    ordered = MPI.Op.Create(_concat, commute=False)
    for count in (1, GATHERED_MAX // 8, GATHERED_MAX // 8 + 1, 3000):
        base = np.arange(count) % 5
        for dtype, op, fold in (("i8", MPI.SUM, np.add), ("f8", MPI.PROD, np.multiply),
                                ("i4", MPI.MAX, np.maximum)):
            mine = (base + r + 1).astype(dtype)
            vals = [(base + p + 1).astype(dtype) for p in range(n)]
            incl = [vals[0]]
            for p in range(1, n):
                incl.append(fold(incl[-1], vals[p]))
            out = np.zeros(count, dtype)
            comm.Scan(mine, out, op)
            c.eq(out, incl[r], f"Scan {op} {dtype} x{count}")
            out = np.full(count, -7, dtype)
            comm.Exscan(mine, out, op)
            c.eq(out, incl[r - 1] if r else np.full(count, -7, dtype), f"Exscan {op} {dtype} x{count}")
            out = mine.copy()
            comm.Scan(MPI.IN_PLACE, out, op)
            c.eq(out, incl[r], f"Scan IN_PLACE {op} {dtype} x{count}")
            out = np.zeros(count, dtype)
            comm.Iscan(mine, out, op).Wait()
            c.eq(out, incl[r], f"Iscan {op} {dtype} x{count}")
        # decimal concatenation of one digit a rank: exact, and wrong in any other order
        digit = np.full(count, float(r % 9 + 1))
        want = float("".join(str(p % 9 + 1) for p in range(r + 1)))
        out = np.zeros(count)
        comm.Scan(digit, out, ordered)
        c.eq(out, np.full(count, want), f"Scan non-commutative x{count}")
        out = np.full(count, -7.0)
        comm.Exscan(digit, out, ordered)
        below = float("".join(str(p % 9 + 1) for p in range(r))) if r else -7.0
        c.eq(out, np.full(count, below), f"Exscan non-commutative x{count}")
    ordered.Free()
    # counts that differ between ranks, one on each side of the bound: refused, no hang
    if n > 1:
        mine = np.ones(10 if r == 0 else 1000)
        if comm._h.g.link == "shm":
            c.raises(lambda: comm.Scan(mine, np.empty_like(mine)), MPI.Exception,
                     "Scan whose counts differ between ranks (both ways on one host)")
        else:
            try:
                comm.Scan(mine, np.empty_like(mine))
            except MPI.Exception:
                pass
        c.eq(comm.allreduce(r), n * (n - 1) // 2, "the call after a refused Scan")
    comm.Barrier()


@pytest.mark.timeout(160)
@pytest.mark.parametrize("n", SIZES)
def test_scan_paths(n):
    check(job(n), "scan_paths")


@pytest.mark.timeout(160)
def test_scan_paths_over_tcp():
    check(job(3, "tcp"), "scan_paths")
