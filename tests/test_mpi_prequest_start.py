"""``Prequest.Start`` in C (native/_mpi_prequest.c, MPI/_prequest.py ``_native_start``): a
persistent collective's quick start without a Python frame, the Python method for the rest.
A section of the shared MPI job (tests/mpi_checks.py) at 1-5 ranks and over TCP: the
method is the core's where the core is; cycles of ``Start``/``Wait`` with new data each
time (``Allreduce_init``, ``Bcast_init``, ``Startall``); a request whose start has no
quick way (a user op; persistent point to point) still starts; ``Start`` of an active
request and of a freed one raise ``MPI.Exception`` as before, and the request stays usable
after the first.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tests.mpi_checks import SIZES, Checker, check, job


def _cycles(c: Checker, MPI: Any, comm: Any) -> None:
    r, n = comm.rank, comm.size
    x, y = np.zeros(3), np.zeros(3)
    p = comm.Allreduce_init(x, y)
    for k in range(5):
        x[:] = r + k
        p.Start()
        p.Wait()
        c.eq(y, np.full(3, n * k + n * (n - 1) / 2), f"Allreduce_init cycle {k}")
    b = np.zeros(2)
    q = comm.Bcast_init(b, root=n - 1)
    for k in range(3):
        b[:] = k + 10 if r == n - 1 else -1
        MPI.Prequest.Startall([p, q])
        MPI.Request.Waitall([p, q])
        c.eq(b, np.full(2, k + 10.0), f"Bcast_init with Startall, cycle {k}")
    p.Free()
    q.Free()


def _no_quick_way(c: Checker, MPI: Any, comm: Any) -> None:
    r, n = comm.rank, comm.size

    def add(a: Any, b: Any, dt: Any) -> None:
        np.frombuffer(b, dtype="d")[:] += np.frombuffer(a, dtype="d")

    op = MPI.Op.Create(add, commute=True)
    x, y = np.full(2, float(r + 1)), np.zeros(2)
    p = comm.Allreduce_init(x, y, op)
    for k in range(2):
        p.Start()
        p.Wait()
        c.eq(y, np.full(2, n * (n + 1) / 2), f"Allreduce_init with a user op, cycle {k}")
    p.Free()
    op.Free()
    out, got = np.full(2, float(r)), np.zeros(2)
    s = comm.Send_init(out, (r + 1) % n, tag=7)
    v = comm.Recv_init(got, (r - 1) % n, tag=7)
    for k in range(2):
        MPI.Prequest.Startall([v, s])
        MPI.Request.Waitall([v, s])
        c.eq(got, np.full(2, float((r - 1) % n)), f"Send_init/Recv_init, cycle {k}")
    s.Free()
    v.Free()


def prequest_start_checks(c: Checker, MPI: Any, comm: Any) -> None:
    from collcomm import native
    from collcomm.MPI import _prequest

    c.eq(_prequest.NATIVE_START, native.core is not None, "Prequest.Start is the core's where it is")
    c.eq(type(MPI.Prequest.Start).__name__,
         "method_descriptor" if native.core is not None else "function", "... its kind")
    _cycles(c, MPI, comm)
    _no_quick_way(c, MPI, comm)
    x, y = np.ones(1), np.zeros(1)
    p = comm.Allreduce_init(x, y)
    p.Start()
    c.raises(p.Start, MPI.Exception, "Start of an active request")
    p.Wait()
    c.eq(y, np.full(1, float(comm.size)), "... which then completes")
    p.Start()
    p.Wait()
    c.eq(y, np.full(1, float(comm.size)), "... and starts again")
    p.Free()
    c.raises(p.Start, MPI.Exception, "Start of a freed request")
    comm.Barrier()


@pytest.mark.timeout(160)
@pytest.mark.parametrize("n", SIZES)
def test_prequest_start(n):
    check(job(n), "prequest_start")


@pytest.mark.timeout(160)
def test_prequest_start_over_tcp():
    check(job(3, "tcp"), "prequest_start")
