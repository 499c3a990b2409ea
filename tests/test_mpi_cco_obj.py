"""collcomm.MPI object collectives, in the style of mpi4py's test_cco_obj: bcast, gather,
scatter, allgather, alltoall, reduce/allreduce (every built-in op, MAXLOC/MINLOC pairs,
any callable, non-commutative functions in rank order), scan/exscan, barrier; every root,
objects small and large (numpy payloads over 64 KiB travel out of band); sizes 1–5.
"""
from __future__ import annotations

import numpy as np
import pytest

from tests.mpi_checks import SIZES, Checker, check, job


def obj_of(r: int) -> dict:
    return {"rank": r, "name": "x" * r, "big": np.arange(20_000) * r, "small": (r, [r] * 3), "none": None}


def same(a, b) -> bool:
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    return a == b


def cco_obj(c: Checker, MPI, comm) -> None:
    r, n = comm.rank, comm.size
    for root in range(n):
        got = comm.bcast(obj_of(root) if r == root else None, root=root)
        c.true(same(got, obj_of(root)), f"bcast root {root}")
        got = comm.gather(obj_of(r), root=root)
        c.true(same(got, [obj_of(p) for p in range(n)]) if r == root else got is None, f"gather root {root}")
        got = comm.scatter([obj_of(p) for p in range(n)] if r == root else None, root=root)
        c.true(same(got, obj_of(r)), f"scatter root {root}")
        got = comm.reduce(r + 1, op=MPI.SUM, root=root)
        c.eq(got if r == root else 0, n * (n + 1) // 2 if r == root else 0, f"reduce SUM root {root}")
        c.true(r == root or got is None, f"reduce gives None off the root {root}")
        got = comm.reduce(str(r), op=lambda a, b: a + b, root=root)
        c.true(got == ("".join(map(str, range(n))) if r == root else None), f"reduce callable in rank order root {root}")
    mine = obj_of(r)
    c.true(comm.bcast(mine, root=r if n == 1 else 0) is not mine, "bcast returns a copy, on the root too")
    c.true(same(comm.allgather(obj_of(r)), [obj_of(p) for p in range(n)]), "allgather")
    c.true(comm.alltoall([f"{r}->{j}" for j in range(n)]) == [f"{p}->{r}" for p in range(n)], "alltoall")
    c.true(comm.alltoall([np.full(70_000, r * 10 + j) for j in range(n)])[n - 1][0] == (n - 1) * 10 + r,
           "alltoall of large arrays")
    ops = {"SUM": sum(range(1, n + 1)), "PROD": int(np.prod(range(1, n + 1))), "MAX": n, "MIN": 1,
           "BAND": int(np.bitwise_and.reduce(np.arange(1, n + 1))), "BOR": int(np.bitwise_or.reduce(np.arange(1, n + 1))),
           "BXOR": int(np.bitwise_xor.reduce(np.arange(1, n + 1))), "LAND": True, "LOR": True, "LXOR": n % 2 == 1}
    for name, want in ops.items():
        c.eq(comm.allreduce(r + 1, op=getattr(MPI, name)), want, f"allreduce {name}")
    c.eq(comm.allreduce((r % 2, r), op=MPI.MAXLOC), (1 if n > 1 else 0, 1 if n > 1 else 0), "allreduce MAXLOC")
    c.eq(comm.allreduce((r % 2, r), op=MPI.MINLOC), (0, 0), "allreduce MINLOC")
    c.true(comm.allreduce([r]) == list(range(n)), "allreduce SUM of lists concatenates in rank order")
    c.eq(comm.allreduce(np.full(3, r + 1.0), op=MPI.MAX), np.full(3, float(n)), "allreduce MAX of arrays")
    c.true(comm.allreduce(str(r), op=lambda a, b: a + b) == "".join(map(str, range(n))), "allreduce callable")
    c.eq(comm.allreduce(r, op=MPI.REPLACE), n - 1, "allreduce REPLACE keeps the last")
    c.eq(comm.allreduce(r, op=MPI.NO_OP), 0, "allreduce NO_OP keeps the first")
    user = MPI.Op.Create(lambda a, b, dt: a * 10 + b, commute=False)
    want = 0
    for p in range(n):     # (rank order: past 9 ranks no longer a concatenation of digits)
        want = want * 10 + p + 1
    c.eq(comm.allreduce(r + 1, op=user), want, "allreduce Op.Create")
    c.eq(comm.scan(r + 1), (r + 1) * (r + 2) // 2, "scan SUM")
    c.true(comm.scan(str(r), op=lambda a, b: a + b) == "".join(map(str, range(r + 1))), "scan callable")
    got = comm.exscan(r + 1)
    c.true(got is None if r == 0 else got == r * (r + 1) // 2, f"exscan SUM gives {got!r}")
    # a rank's own result is a copy, never its input (large arrays travel out of band)
    for root in range(n):
        x = np.zeros(100_000)
        got = comm.bcast(x if r == root else None, root=root)
        got[0] = 7.0
        c.eq(float(x[0]), 0.0, f"bcast root {root}: the result is not the root's array")
    mine = np.zeros(100_000)
    for what, res in (("allgather", comm.allgather(mine)[r]), ("alltoall", comm.alltoall([mine] * n)[r]),
                      ("gather", (comm.gather(mine, root=0) or [mine.copy()] * n)[r]),
                      ("scatter", comm.scatter([mine] * n if r == 0 else None, root=0))):
        res[0] = 7.0
        c.eq(float(mine[0]), 0.0, f"{what}: this rank's result is not its input")
    # MPI.pickle swapped for functions of the program's own, on every object call
    import json
    calls = []

    def dumps(o, *protocol):
        calls.append("dumps")
        return json.dumps(o).encode()

    MPI.pickle.__init__(dumps, lambda d: json.loads(bytes(d)))
    try:
        got = [comm.bcast((1, 2), root=0), comm.gather((r,), root=0), comm.scatter([(p,) for p in range(n)] if r == 0 else None, root=0),
               comm.allgather((r,)), comm.alltoall([(r, p) for p in range(n)]), comm.reduce([r], root=0),
               comm.allreduce([r]), comm.scan([r]), comm.exscan([r])]
        if n > 1:
            if r == 0:
                comm.send((1,), dest=1, tag=5)
                comm.isend((2,), dest=1, tag=6).wait()
            elif r == 1:
                got += [comm.recv(source=0, tag=5), comm.irecv(source=0, tag=6).wait()]
    finally:
        MPI.pickle.__init__()
    c.eq(got[0], [1, 2], "bcast through the program's serializer (json: a tuple comes back a list)")
    c.eq(got[3], [[p] for p in range(n)], "allgather through the program's serializer")
    c.eq(got[6], list(range(n)), "allreduce through the program's serializer")
    c.true(n == 1 or r != 1 or got[-2:] == [[1], [2]], f"send/isend through it: {got[-2:]}")
    c.true(calls and comm.bcast((1, 2), root=0) == (1, 2), "the standard pickle back")
    comm.barrier()
    c.raises(lambda: comm.scatter(list(range(n + 1)) if r == 0 else None, root=0) if r == 0 else
             (_ for _ in ()).throw(ValueError("not the root")), ValueError, "scatter of n+1 items")
    c.raises(lambda: comm.alltoall(list(range(n + 1))), ValueError, "alltoall of n+1 items")
    c.raises(lambda: comm.bcast(1, root=n), MPI.Exception, "bcast root out of range", MPI.ERR_ROOT)
    c.raises(lambda: comm.reduce(1, op="sum"), TypeError, "a string op")


@pytest.mark.timeout(160)
@pytest.mark.parametrize("n", SIZES)
def test_cco_obj(n):
    check(job(n), "cco_obj")


@pytest.mark.timeout(160)
def test_cco_obj_tcp():
    check(job(3, "tcp"), "cco_obj")
