"""What a persistent collective's ``Start`` + ``Wait`` makes again instead of anew (session 47):
the request's op (a WorkOp nobody else holds, kept by the C waits, native/_mpi_request.c
``rq_op_drop``), the queue's item and the second part's arguments (the prepared tuple
itself, native/_fastcall_parts.c ``part_item`` / ``fc_args_tuple``), the Fast a wait
finished last (``fc_wait_hint``), and an all-to-all part's counts, parsed once
(``a2a_part_tab``), their pair and the equal blocks' list (``a2a_kept``,
native/_fastcall_a2a_parts.c). A section of the shared MPI job (tests/mpi_checks.py) at
1-5 ranks and over TCP, with the installed and with the Python waits:

- an op the program still holds after ``Wait`` keeps its fields (only an op nobody holds
  is made again) and the next ``Start`` gets another one; the same for an ``Iallreduce``'s;
- cycles of every persistent collective the fast call starts in two parts, new data each
  time, the results right;
- ``Alltoallv_init`` of uneven blocks and ``Alltoall_init`` cycles; ``Ialltoall`` of one and
  two elements a block in turn; ``Ialltoallv`` given new count lists each call;
- two communicators' requests started together and waited for in either order, one
  communicator freed and collected, the other's cycles going on; a blocking call between
  ``Start`` and ``Wait`` (the queue's way finishes the part) and a ``Test`` loop.
"""
from __future__ import annotations

import gc
import sys
from typing import Any

import numpy as np
import pytest

from tests.mpi_checks import SIZES, Checker, check, each_wait_way, job


def _held_op(c: Checker, MPI: Any, comm: Any) -> None:
    from collcomm.MPI._request_ops import WorkOp
    r, n = comm.rank, comm.size
    x, y = np.zeros(2), np.zeros(2)
    p = comm.Allreduce_init(x, y)
    for k in range(3):
        x[:] = r + k
        p.Start()
        op = p._op
        p.Wait()
        if type(op) is WorkOp:
            c.true(op._done is True and op._work is not None and op._finish is None,
                   f"an op held past Wait keeps its fields (cycle {k})")
        p.Start()
        c.true(p._op is not op, f"the next Start gets another op (cycle {k})")
        p.Wait()
        c.eq(y, np.full(2, n * k + n * (n - 1) / 2), f"Allreduce_init with its op held, cycle {k}")
    p.Free()
    q = comm.Iallreduce(np.full(1, 1.0 + r), y[:1])
    op = q._op
    q.Wait()
    if type(op) is WorkOp:
        c.true(op._done is True and op._work is not None, "an Iallreduce's op held past Wait")
    c.eq(y[0], n + n * (n - 1) / 2, "... its result")


def _every_two_part_call(c: Checker, MPI: Any, comm: Any) -> None:
    r, n = comm.rank, comm.size
    root = n - 1
    send, got, out = np.zeros(2), np.zeros(2 * n), np.zeros(2)
    b = np.zeros(2)
    reqs = {
        "Bcast_init": comm.Bcast_init(b, root=root),
        "Gather_init": comm.Gather_init(send, got, root=root),
        "Allgather_init": comm.Allgather_init(send, got),
        "Reduce_init": comm.Reduce_init(send, out, MPI.SUM, root=root),
        "Scatter_init": comm.Scatter_init(got, out, root=root),
        "Barrier_init": comm.Barrier_init(),
    }
    for k in range(4):
        for name, p in reqs.items():
            send[:] = [r + k, 10 * r - k]
            b[:] = k + 5 if r == root else -1
            got[:] = np.arange(2 * n) + k if name == "Scatter_init" and r == root else -1
            out[:] = -1
            p.Start()
            p.Wait()
            everyone = np.array([[q + k, 10 * q - k] for q in range(n)], dtype=float).ravel()
            if name == "Bcast_init":
                c.eq(b, np.full(2, k + 5.0), f"{name} cycle {k}")
            elif name == "Allgather_init" or (name == "Gather_init" and r == root):
                c.eq(got, everyone, f"{name} cycle {k}")
            elif name == "Reduce_init" and r == root:
                c.eq(out, everyone.reshape(n, 2).sum(axis=0), f"{name} cycle {k}")
            elif name == "Scatter_init":
                c.eq(out, np.arange(2 * r, 2 * r + 2) + float(k), f"{name} cycle {k}")
    for p in reqs.values():
        p.Free()


def _two_comms(c: Checker, MPI: Any, comm: Any) -> None:
    r, n = comm.rank, comm.size
    dup = comm.Dup()
    a, s, b = np.zeros(3), np.zeros(3), np.zeros(2)
    pa = comm.Allreduce_init(a, s)
    pb = dup.Bcast_init(b, root=n - 1)

    def total(k: int) -> np.ndarray:
        return np.full(3, n * k + n * (n - 1) / 2)

    for k in range(4):
        a[:] = r + k
        b[:] = k + 20 if r == n - 1 else -1
        pa.Start()
        pb.Start()
        for p in ((pb, pa) if k % 2 else (pa, pb)):
            p.Wait()
        c.eq((s, b), (total(k), np.full(2, k + 20.0)), f"two communicators' requests, cycle {k}")
    pb.Free()
    dup.Free()
    del pb, dup
    gc.collect()
    for k in range(3):
        a[:] = r + k
        pa.Start()
        pa.Wait()
        c.eq(s, total(k), f"after the other communicator was freed, cycle {k}")
    a[:] = r + 7
    pa.Start()
    comm.Barrier()          # (finishes the started part the queue's way first)
    pa.Wait()
    c.eq(s, total(7), "a blocking call between Start and Wait")
    a[:] = r + 8
    pa.Start()
    while not pa.Test():
        pass
    c.eq(s, total(8), "Start, then a Test loop")
    pa.Free()


def _a2a_cycles(c: Checker, MPI: Any, comm: Any) -> None:
    """The all-to-all parts: the counts parsed once handed to the core, the kept pair of
    count lists, the equal blocks' list made again only while its count holds."""
    r, n = comm.rank, comm.size
    sc = [r + 2 * j + 1 for j in range(n)]        # (what r sends j: j expects as much from r)
    rc = [j + 2 * r + 1 for j in range(n)]
    send, got = np.zeros(sum(sc)), np.zeros(sum(rc))
    p = comm.Alltoallv_init([send, sc, MPI.DOUBLE], [got, rc, MPI.DOUBLE])
    eq_send, eq_got = np.zeros(2 * n), np.zeros(2 * n)
    q = comm.Alltoall_init(eq_send, eq_got)

    def expect(k: int) -> np.ndarray:
        return np.concatenate([np.full(j + 2 * r + 1, 100.0 * j + r + k) for j in range(n)])

    for k in range(4):
        send[:] = np.concatenate([np.full(r + 2 * j + 1, 100.0 * r + j + k) for j in range(n)])
        p.Start()
        p.Wait()
        c.eq(got, expect(k), f"Alltoallv_init cycle {k}")
        eq_send[:] = np.repeat(10.0 * r + np.arange(n) + k, 2)
        q.Start()
        q.Wait()
        c.eq(eq_got, np.repeat(10.0 * np.arange(n) + r + k, 2), f"Alltoall_init cycle {k}")
        m = 1 + k % 2                              # (equal blocks of 1 or 2: the list remade)
        a, b = np.full(m * n, 1.0 * r + k), np.zeros(m * n)
        comm.Ialltoall(a, b).Wait()
        c.eq(b, np.repeat(np.arange(n) + float(k), m), f"Ialltoall of {m} a block, cycle {k}")
        got[:] = -1                                # (new count lists each call)
        comm.Ialltoallv([send, list(sc), MPI.DOUBLE], [got, list(rc), MPI.DOUBLE]).Wait()
        c.eq(got, expect(k), f"Ialltoallv with new count lists, cycle {k}")
    k = 16384                                      # (128 KiB a block: too large to go eager)
    big, big_got, even = np.zeros(k * n), np.zeros(k * n), [k] * n
    before = sys.getrefcount(None)
    for _ in range(100):
        comm.Ialltoallv([big, even, MPI.DOUBLE], [big_got, even, MPI.DOUBLE]).Wait()
    c.true(sys.getrefcount(None) - before < 50, "an Ialltoallv the two parts decline leaks no reference")
    fast = p._persist.comm._h.g.fast if n > 1 else None   # (the request's own group's)
    if fast is not None:     # (the fast call finished the cycles itself, none handed back)
        c.true(fast.calls >= 3, f"Alltoallv_init cycles run by the fast call ({fast.calls})")
    p.Free()
    q.Free()


def start_spares_checks(c: Checker, MPI: Any, comm: Any) -> None:
    each_wait_way(c, MPI, comm, [_held_op, _every_two_part_call, _two_comms, _a2a_cycles])


@pytest.mark.timeout(160)
@pytest.mark.parametrize("n", SIZES)
def test_start_spares(n):
    check(job(n), "start_spares")


@pytest.mark.timeout(160)
def test_start_spares_over_tcp():
    check(job(3, "tcp"), "start_spares")
