"""``Scan`` / ``Exscan`` on both of the core's ways (collcomm/algorithms/scan.py): up to
GATHERED_MAX bytes a rank the group all-gathers and folds in rank order (shared memory
and TCP alike, so small float scans agree bit for bit across transports), above it
recursive doubling. A section of the shared MPI job (tests/mpi_checks.py)
at 1-5 ranks and over TCP: sizes on both sides of the bound, SUM / PROD / MAX on ints and
floats, a non-commutative user op (decimal concatenation: associative, exact), inclusive
and exclusive, ``IN_PLACE``, the ``I…`` forms, against values computed from the whole job;
the fast call's scan in C (native/_fastcall_scan.c) on every dtype and op it takes, bit
for bit against numpy's fold, beside a rank on the Python way.
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


_FOLDS = {"SUM": np.add, "PROD": np.multiply, "MIN": np.minimum, "MAX": np.maximum,
          "LAND": np.logical_and, "LOR": np.logical_or, "LXOR": np.logical_xor,
          "BAND": np.bitwise_and, "BOR": np.bitwise_or, "BXOR": np.bitwise_xor}
_CASES = [("int8", "SUM PROD MIN MAX BAND BOR BXOR LAND LOR LXOR"), ("uint16", "SUM MAX BXOR"),
          ("int32", "SUM PROD MIN BOR"), ("int64", "SUM MAX BAND"), ("float16", "SUM PROD MIN"),
          ("float32", "SUM PROD MAX"), ("float64", "SUM PROD MIN MAX"), ("complex128", "SUM PROD"),
          ("bool", "LAND LOR LXOR")]


def _values(p: int, dtype: str, k: int) -> np.ndarray:
    v = (np.arange(k) * 7 + p * 3) % 11 - 3
    if dtype == "bool":
        return v % 2 == 0
    if dtype.startswith("float") or dtype.startswith("complex"):
        return (v / 4 + 0.3 * p).astype(dtype)
    return v.astype(dtype)


def _native(c: Checker, MPI, comm) -> None:
    """The fast call's scan (native/_fastcall_scan.c): one fast call; every dtype and op it
    takes gives numpy's fold in rank order bit for bit; rank 0's Exscan untouched; a rank
    on the Python way (a strided view) beside ranks in C."""
    r, n = comm.rank, comm.size
    g = comm._h.g
    fast = g.fast if g is not None else None
    one, out = np.ones(3), np.zeros(3)
    comm.Scan(one, out)
    if fast is not None:
        before = fast.calls
        comm.Scan(one, out)
        c.eq(fast.calls - before, 1, "a small Scan is one fast call")
    for dtype, ops in _CASES:
        for name in ops.split():
            k = 5
            vals = [_values(p, dtype, k) for p in range(n)]
            acc = [vals[0].copy()]
            for p in range(1, n):
                acc.append(_FOLDS[name](acc[-1], vals[p]).astype(dtype))
            got = np.zeros(k, dtype)
            comm.Scan(vals[r], got, getattr(MPI, name))
            c.true(got.tobytes() == acc[r].tobytes(), f"Scan {name} {dtype}: {got} want {acc[r]}")
            got = np.ones(k, dtype)
            comm.Exscan(vals[r], got, getattr(MPI, name))
            want = acc[r - 1] if r else np.ones(k, dtype)
            c.true(got.tobytes() == want.tobytes(), f"Exscan {name} {dtype}: {got} want {want}")
    for k in (5, 2, 5, 1, 2):          # (C keeps the last call's block array: other sizes)
        got = np.zeros(k)
        comm.Scan(np.arange(k, dtype=float) + r, got)
        c.eq(got, sum(np.arange(k) + p for p in range(r + 1)).astype(float), f"Scan of {k} after other sizes")
    got = np.zeros(4)
    spec = [got, MPI.DOUBLE] if r == 0 else got      # rank 0: a buffer spec (the Python way)
    comm.Scan(np.full(4, float(r + 1)), spec)
    c.eq(got, np.full(4, float((r + 1) * (r + 2) // 2)), "Scan, rank 0 on the Python way")


def scan_paths_checks(c: Checker, MPI, comm) -> None:
    _native(c, MPI, comm)
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
        c.raises(lambda: comm.Scan(mine, np.empty_like(mine)), MPI.Exception,
                 f"Scan whose counts differ between ranks (both ways, {comm._h.g.link})")
        c.eq(comm.allreduce(r), n * (n - 1) // 2, "the call after a refused Scan")
    comm.Barrier()


def test_native_bounds_match_python():
    native = pytest.importorskip("collcomm.native._shmcore")
    from collcomm.algorithms import signature
    assert native.SCAN_GATHERED_MAX == GATHERED_MAX
    assert (native.SIG_SCAN, native.SIG_EXSCAN) == (signature.make("scan") >> 60, signature.make("exscan") >> 60)


@pytest.mark.timeout(160)
@pytest.mark.parametrize("n", SIZES)
def test_scan_paths(n):
    check(job(n), "scan_paths")


@pytest.mark.timeout(160)
def test_scan_paths_over_tcp():
    check(job(4, "tcp", only="scan_paths"), "scan_paths")   # 4: recursive doubling would differ from rank 3 on
