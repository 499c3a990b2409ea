"""Idioms of mpi4py's own demo programs (demo/reductions, demo/threads/issue784.py,
demo/sequential) that collcomm.MPI must take as mpi4py does, a section of the shared MPI
job (tests/mpi_checks.py) at 1-5 ranks and over TCP:

- a communicator subclass made by ``__new__(cls, comm)`` passing the communicator on
  (mpi4py's handles are made by ``__new__``), and the other handles' ``X.__new__(X, x)``
  copies (``Datatype``, ``Op``, ``Group``, ``Info``, ``Request``, ``Errhandler``);
- a program that joins every other thread (``threading.enumerate()``) ends: collcomm's own
  threads return from ``join()`` at once (collcomm/helper_thread.py), still running;
- a token passed around the ranks in order with empty messages ``[None, 'B']``;
- what mpi4py's own test suite found (a message of no bytes received as an object,
  ``Create_cart`` with one period, ``Comm.fromint`` of a Cartesian communicator,
  ``Create_dist_graph_adjacent(None, None)``, statuses given as a tuple, ``Status(123)``);
- ``None`` where ``IN_PLACE`` may stand (a send buffer; ``Scatter``'s receive buffer at
  the root), as mpi4py takes it.
"""
from __future__ import annotations

import threading
from typing import Any

import pytest

from tests.mpi_checks import SIZES, Checker, check, job


def _subclasses(c: Checker, MPI: Any, comm: Any) -> None:
    class Intracomm(MPI.Intracomm):
        def __new__(cls, comm: Any = None) -> Any:
            return super().__new__(cls, comm)

    mine = Intracomm(comm)
    c.eq((type(mine).__name__, mine.Get_size(), mine.allreduce(1)), ("Intracomm", comm.size, comm.size),
         "a communicator subclass made by __new__(cls, comm)")
    c.true(mine == comm and Intracomm() == MPI.COMM_NULL, "... the same communicator; none: COMM_NULL")
    for cls, handle in ((MPI.Datatype, MPI.INT), (MPI.Op, MPI.SUM), (MPI.Group, comm.Get_group()),
                        (MPI.Info, MPI.INFO_ENV), (MPI.Errhandler, MPI.ERRORS_RETURN)):
        copy = cls.__new__(cls, handle)
        c.true(copy == handle, f"{cls.__name__}.__new__({cls.__name__}, x) is a copy of x")
    c.eq(MPI.Datatype.__new__(MPI.Datatype, MPI.DOUBLE).Get_size(), 8, "... usable at once")
    q = comm.Isend(b"", comm.rank, 1)
    copy = MPI.Request.__new__(MPI.Request, q)
    comm.Recv(bytearray(0), comm.rank, 1)
    c.true(copy.Wait() and bool(MPI.Request.__new__(MPI.Request)) is False, "Request.__new__ copies")
    q.Wait()


def _threads_joined(c: Checker, MPI: Any, comm: Any) -> None:
    comm.Iallreduce(MPI.IN_PLACE, [bytearray(4), MPI.INT]).Wait()    # (the group's worker, if any)
    mine = threading.Thread(target=lambda: comm.Get_rank(), name="the program's")
    mine.start()
    done = threading.Event()

    def join_all() -> None:
        for t in threading.enumerate():
            if t is not threading.current_thread() and t is not threading.main_thread():
                t.join()
        done.set()

    joiner = threading.Thread(target=join_all, daemon=True)
    joiner.start()
    c.true(done.wait(10.0), "joining every other thread ends (collcomm's return at once)")
    mine.join(5.0)   # (3.13: a thread that has just ended leaves threading.enumerate()
    #                  before is_alive() turns False, so the joiner may not have joined it)
    c.true(not mine.is_alive(), "... after the program's own thread ended")
    ours = [t for t in threading.enumerate() if t.name.startswith("collcomm-")]
    c.true(all(t.daemon for t in ours), "collcomm's threads are daemons")
    comm.Barrier()


def _token_ring(c: Checker, MPI: Any, comm: Any) -> None:
    r, n = comm.rank, comm.size
    order: list[int] = []
    if r > 0:
        comm.Recv([None, "B"], r - 1, 5)
    order.append(r)
    if r < n - 1:
        comm.Send([None, "B"], r + 1, 5)
    got = comm.gather(order, root=n - 1)
    if r == n - 1:
        c.eq([x for part in got for x in part], list(range(n)), "a token passed in rank order with [None, 'B']")
    comm.Barrier()


def _none_is_in_place(c: Checker, MPI: Any, comm: Any) -> None:
    """mpi4py takes ``None`` where ``IN_PLACE`` may stand (its test suite does)."""
    import numpy as np
    r, n = comm.rank, comm.size
    every = np.full(n, -1, dtype="i")
    every[r] = r
    comm.Allgather(None, every)
    c.eq(every.tolist(), list(range(n)), "Allgather(None, buf)")
    total = np.full(2, r + 1.0)
    comm.Allreduce(None, total)
    c.eq(total.tolist(), [n * (n + 1) / 2] * 2, "Allreduce(None, buf)")
    part = np.full(1, r + 1.0)
    comm.Scan(None, part)
    c.eq(part[0], (r + 1) * (r + 2) / 2, "Scan(None, buf)")
    red = np.full(1, 2.0)
    comm.Reduce(None if r == 0 else red, red if r == 0 else None, op=MPI.SUM, root=0)
    if r == 0:
        c.eq(red[0], 2.0 * n, "Reduce(None, buf) at the root")
    whole = np.arange(n, dtype="d") if r == 0 else None
    mine = np.zeros(1)
    comm.Scatter(whole, None if r == 0 else mine, root=0)
    c.eq((whole[0] if r == 0 else mine[0]), float(r), "Scatter(buf, None) at the root")
    comm.Barrier()


def _suite_cases(c: Checker, MPI: Any, comm: Any) -> None:
    """What mpi4py 4.1.2's own test suite found different (its test files under collcomm)."""
    r, n = comm.rank, comm.size
    nxt, prv = (r + 1) % n, (r - 1) % n
    q = comm.irecv(None, prv, 40)
    comm.Send([None, 0, "B"], nxt, 40)
    got = q.wait()
    comm.Send([None, 0, "B"], nxt, 41)
    c.eq((got, comm.recv(None, prv, 41)), (None, None), "a message of no bytes received as an object: None")
    cart = comm.Create_cart([n], True)
    c.eq((cart.Get_topo()[1], type(MPI.Comm.fromint(cart.toint())).__name__), ([True], "Cartcomm"),
         "Create_cart with one period for all; fromint gives a Cartcomm")
    cart.Free()
    dist = comm.Create_dist_graph_adjacent(None, None)
    c.eq(dist.Get_dist_neighbors()[:2], ([], []), "Create_dist_graph_adjacent(None, None): no neighbours")
    dist.Free()
    reqs = [MPI.REQUEST_NULL] * 3
    statuses = [MPI.Status() for _ in range(3)]
    for given in (tuple(statuses), (statuses[0],), ()):
        MPI.Request.Waitall(reqs, given)          # (a tuple is filled as far as it goes)
    grown: list[Any] = []
    MPI.Request.Waitall(reqs, grown)
    c.eq(len(grown), 3, "Waitall: a shorter list of statuses grows")
    c.raises(lambda: MPI.Status(123), TypeError, "Status(123)")
    st = MPI.Status()
    comm.Sendrecv_replace(None, MPI.PROC_NULL, 0, MPI.PROC_NULL, 0, st)
    c.eq(st.Get_source(), MPI.PROC_NULL, "Sendrecv_replace(None, PROC_NULL, …, PROC_NULL): nothing moved")

    class Mine(MPI.Intracomm):
        pass

    mine = Mine(comm)
    dup, clone = mine.Dup(), mine.Clone()
    c.eq((type(dup).__name__, type(clone).__name__, type(comm.Dup()).__name__), ("Mine", "Mine", "Intracomm"),
         "a communicator subclass's Dup and Clone are of its class")
    c.eq(dup.allreduce(1), comm.size, "... and work")
    for x in (dup, clone):
        x.Free()
    comm.Barrier()


def demo_idiom_checks(c: Checker, MPI: Any, comm: Any) -> None:
    _subclasses(c, MPI, comm)
    _threads_joined(c, MPI, comm)
    _token_ring(c, MPI, comm)
    _none_is_in_place(c, MPI, comm)
    _suite_cases(c, MPI, comm)
    comm.Barrier()


@pytest.mark.timeout(160)
@pytest.mark.parametrize("n", SIZES)
def test_demo_idioms(n):
    check(job(n), "demo_idioms")


@pytest.mark.timeout(160)
def test_demo_idioms_over_tcp():
    check(job(3, "tcp"), "demo_idioms")
