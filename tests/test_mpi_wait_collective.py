"""collcomm.MPI's waits and tests of non-blocking and persistent collectives in C
(native/_mpi_wait.c ``mw_workop``: a call the fast call started in two parts is finished
by ``Wait``, ``Test``, ``Waitall``, ``Waitany``, ``Testsome`` … in the same C call that
completes the point-to-point requests beside it), a section of the shared MPI job
(tests/mpi_checks.py) at 1-5 ranks and over TCP (there, and at one rank, the Python way:
the same checks, the results must not differ).

- ``Iallreduce``/``Ibcast``/``Ireduce`` waited for, tested in a loop, with ``Waitall``
  beside point-to-point requests, ``Waitany``/``Waitsome``/``Testsome``/``Testall``; every
  result right, every request null after, statuses of a collective (``ANY_SOURCE``,
  ``ANY_TAG``, count 0);
- ``Allreduce_init`` started and completed 20 times each way (``Wait``, a ``Test`` loop,
  ``Startall``+``Waitall`` with a ``Bcast_init`` and a point-to-point pair): the data read
  at each ``Start``, the request inactive (not null) after;
- where the group has the native entry (and no more ranks than CPUs): a recorder around the C calls checks that the
  collective's request is completed in C (``Wait`` answers True, ``Waitall`` counts it,
  a ``Test`` loop ends on True);
- a call's Work is made again for the next call only when nobody else holds it (the
  program, or a weak reference: those stay as they ended);
- what C leaves to the Python code: a collective queued behind another; a call whose
  ranks disagree (``Iallreduce`` of 1 element on rank 0, 2 elsewhere) raises
  ``MPI.Exception`` from ``Wait`` and from a ``Test`` loop on every rank, the request
  null, and the ranks stay in step (an ``Allreduce`` after it is right).
"""
from __future__ import annotations

import os
import weakref
from typing import Any

import numpy as np
import pytest

from tests.mpi_checks import SIZES, Checker, check, core_waits, each_wait_way, job


def _swap(name: str, fn: Any) -> None:
    """collcomm.MPI's native wait or test entry ``name`` replaced by ``fn`` in every
    module that calls it."""
    from collcomm.MPI import _request, _request_many
    for module in (_request, _request_many):
        if hasattr(module, name):
            setattr(module, name, fn)


def _in_c(comm: Any) -> bool:
    """Does this group start small collectives in two parts (the fast call's entries), and
    will the caller finish them? (With more ranks than CPUs a rank may be off its CPU past
    the group's worker's grace, async_calls.PART_GRACE: the worker then finishes the call,
    and C leaves the request to the Python code while the worker runs it.)"""
    from collcomm import native
    g = comm._h.g
    return native.core is not None and 1 < comm.size <= (os.cpu_count() or 1) and g.fast is not None


def _nonblocking(c: Checker, MPI: Any, comm: Any) -> None:
    from collcomm.MPI import _request
    r, n = comm.rank, comm.size
    nxt, prv = (r + 1) % n, (r - 1) % n
    total = n * (n - 1) / 2
    comm.Allreduce(np.ones(1), np.zeros(1))        # (the group's fast call made)
    in_c = _in_c(comm)
    wait, test = _request._wait_native, _request._test_native
    waits: list[Any] = []
    tests: list[Any] = []

    def wait_recorder(*args: Any) -> Any:
        got = wait(*args)
        waits.append(got)
        return got

    def test_recorder(*args: Any) -> Any:
        got = test(*args)
        tests.append(got)
        return got

    _swap("_wait_native", wait_recorder if wait is not None else None)
    _swap("_test_native", test_recorder if test is not None else None)
    try:
        x, y = np.full(3, float(r)), np.zeros(3)
        q = comm.Iallreduce(x, y)
        st = MPI.Status()
        c.true(q.Wait(st), "Wait of an Iallreduce")
        c.eq((y.tolist(), bool(q)), ([total] * 3, False), "Wait: the sum, the request null")
        c.eq((st.Get_source(), st.Get_tag(), st.Get_count(MPI.DOUBLE)), (MPI.ANY_SOURCE, MPI.ANY_TAG, 0),
             "Wait: a collective's status")
        b = np.arange(4.0) if r == 0 else np.zeros(4)
        q = comm.Ibcast(b, 0)
        polls = 0
        while not q.Test():
            polls += 1
        c.eq((b.tolist(), bool(q)), ([0.0, 1.0, 2.0, 3.0], False), "a Test loop of an Ibcast")
        got, into = np.zeros(2), np.zeros(2)
        reqs = [comm.Iallreduce(np.full(2, 1.0 + r), into), comm.Irecv(got, prv, 90),
                comm.Isend(np.full(2, 10.0 + r), nxt, 90)]
        c.true(MPI.Request.Waitall(reqs), "Waitall of an Iallreduce beside a pair")
        c.eq((into.tolist(), got.tolist(), any(reqs)), ([n + total] * 2, [10.0 + prv] * 2, False),
             "Waitall: the sum, the data, every request null")
        red = np.zeros(1)
        reqs = [comm.Ireduce(np.full(1, 2.0), red if r == 0 else None, MPI.SUM, 0), comm.Irecv(got, prv, 91)]
        comm.Barrier()
        comm.Send(np.full(2, 20.0 + r), nxt, 91)
        seen: list[int] = []
        while len(seen) < 2:
            seen += MPI.Request.Waitsome(reqs) or []
        c.eq((sorted(seen), got.tolist()), ([0, 1], [20.0 + prv] * 2), "Waitsome: both, once")
        if r == 0:
            c.eq(red[0], 2.0 * n, "Ireduce's result")
        z = np.zeros(1)
        reqs = [comm.Irecv(got, prv, 92), comm.Iallreduce(np.ones(1), z)]
        c.eq(MPI.Request.Waitany(reqs), 1, "Waitany: the collective (no message yet)")
        comm.Barrier()                   # (nobody sends 92 before every rank's first Waitany)
        comm.Send(np.full(2, 30.0 + r), nxt, 92)
        c.eq((MPI.Request.Waitany(reqs), z[0], got[0]), (0, float(n), 30.0 + prv), "Waitany: then the receive")
        q = comm.Iallreduce(np.ones(1), z)
        while not MPI.Request.Testall([q]):
            pass
        c.eq((z[0], bool(q)), (float(n), False), "a Testall loop of an Iallreduce")
        q = comm.Iallreduce(np.full(1, 3.0), z)
        done: list[int] = []
        while not done:
            done = MPI.Request.Testsome([q]) or []
        c.eq((done, z[0]), ([0], 3.0 * n), "a Testsome loop of an Iallreduce")
        del waits[:], tests[:]
        q = comm.Iallreduce(np.ones(1), z)
        q.Wait()
        q = comm.Iallreduce(np.ones(1), z)
        MPI.Request.Waitall([q, comm.Irecv(got, prv, 93), comm.Isend(np.ones(2), nxt, 93)])
        q = comm.Iallreduce(np.ones(1), z)
        while not q.Test():
            pass
    finally:
        _swap("_wait_native", wait)
        _swap("_test_native", test)
    if in_c and not core_waits(MPI):     # (the C methods call the core without the recorder)
        c.eq(waits, [True, 3], "the collective's request completed in C (Wait; Waitall, with the pair)")
        c.eq(tests[-1], True, "... and by the Test loop's last C test")
    comm.Barrier()


def _persistent(c: Checker, MPI: Any, comm: Any) -> None:
    from collcomm.MPI import _request
    r, n = comm.rank, comm.size
    nxt, prv = (r + 1) % n, (r - 1) % n
    x, y = np.zeros(2), np.zeros(2)
    p = comm.Allreduce_init(x, y)
    wait = _request._wait_native
    answers: list[Any] = []

    def recorder(*args: Any) -> Any:
        got = wait(*args)
        answers.append(got)
        return got

    right = True
    _swap("_wait_native", recorder if wait is not None else None)
    try:
        for k in range(20):
            x[:] = k + r                      # (read at Start)
            p.Start()
            p.Wait()
            right = right and y.tolist() == [n * k + n * (n - 1) / 2] * 2
    finally:
        _swap("_wait_native", wait)
    c.true(right, "Allreduce_init: 20 rounds of Start + Wait")
    c.true(bool(p) and p._op is None, "... inactive, not null, after each")
    if _in_c(comm) and not core_waits(MPI):
        c.eq(answers[1:], [True] * 19, "... completed in C (the first Start builds the arena)")
    for k in range(20):
        x[:] = 2 * k
        p.Start()
        while not p.Test():
            pass
        right = right and y.tolist() == [2.0 * k * n] * 2
    c.true(right, "Allreduce_init: 20 rounds of Start + a Test loop")
    b = np.zeros(3)
    pb = comm.Bcast_init(b, n - 1)
    got = np.zeros(1)
    recv, send = comm.Recv_init(got, prv, 94), comm.Send_init(np.full(1, 5.0 + r), nxt, 94)
    for k in range(20):
        x[:] = 1.0
        if r == n - 1:
            b[:] = k
        reqs = [p, pb, recv, send]
        MPI.Prequest.Startall(reqs)
        MPI.Request.Waitall(reqs)
        right = right and y.tolist() == [float(n)] * 2 and b.tolist() == [float(k)] * 3 and got[0] == 5.0 + prv
    c.true(right, "Startall + Waitall of two persistent collectives and a pair, 20 rounds")
    c.true(all(bool(q) for q in (p, pb, recv, send)), "... every request inactive, not null")
    for q in (p, pb, recv, send):
        q.Free()
    comm.Barrier()


def _left_to_python(c: Checker, MPI: Any, comm: Any) -> None:
    r, n = comm.rank, comm.size
    z1, z2 = np.zeros(1), np.zeros(1)
    first, second = comm.Iallreduce(np.ones(1), z1), comm.Iallreduce(np.full(1, 2.0), z2)
    c.true(MPI.Request.Waitall([second, first]), "Waitall of two collectives, the later one first")
    c.eq((z1[0], z2[0]), (float(n), 2.0 * n), "... both results")
    if n == 1:
        return
    count = 1 if r == 0 else 2                  # the ranks disagree: every rank raises
    q = comm.Iallreduce(np.ones(count), np.zeros(count))
    c.raises(q.Wait, MPI.Exception, "Wait of an Iallreduce whose ranks disagree")
    c.true(not q, f"... the request null after Wait: {q!r} {q._op!r}")
    q = comm.Iallreduce(np.ones(count), np.zeros(count))

    def test_loop() -> None:
        while not q.Test():
            pass

    c.raises(test_loop, MPI.Exception, "a Test loop of an Iallreduce whose ranks disagree")
    c.true(not q, f"... the request null after the Test loop: {q!r}")
    after = np.zeros(1)
    comm.Allreduce(np.ones(1), after)
    c.eq(after[0], float(n), "the ranks in step after both")
    comm.Barrier()


def _works_kept(c: Checker, MPI: Any, comm: Any) -> None:
    """The Work of a call finished is made again for the next call only when nobody else
    holds it (native/_fastcall_parts.c part_work): one the program holds, or refers to
    weakly, stays as it ended."""
    n = comm.size
    z = np.zeros(1)
    q = comm.Iallreduce(np.ones(1), z)
    held = q._op._work
    q.Wait()
    q2 = comm.Iallreduce(np.full(1, 2.0), z)
    c.true(q2._op._work is not held and held.done and held._exc is None,
           "a Work the program holds is not made again")
    q2.Wait()
    c.eq(z[0], 2.0 * n, "... the next call's result")
    q3 = comm.Iallreduce(np.ones(1), z)
    weak = weakref.ref(q3._op._work)
    q3.Wait()
    q4 = comm.Iallreduce(np.full(1, 3.0), z)
    kept = weak()                          # (None where nothing kept it: the Python way)
    c.true(kept is None or (q4._op._work is not kept and kept.done), "nor one referred to weakly")
    del kept
    q4.Wait()
    c.eq((z[0], held.is_completed()), (3.0 * n, True), "... the result; the held Work still complete")
    del q4
    # ... and one nobody holds is made again, on every CPython (3.12+ keep a class's weak
    # references before the object: until session 43 such a Work was never reused there)
    q5 = comm.Iallreduce(np.ones(1), z)
    first = id(q5._op._work)         # (alive until the next call decides: the fast call's spare)
    q5.Wait()
    del q5
    q6 = comm.Iallreduce(np.ones(1), z)
    again = id(q6._op._work) == first
    q6.Wait()
    if comm._h.g.fast is not None:
        c.true(again, "a finished Work nobody holds is made again for the next call")
    comm.Barrier()


def wait_collective_checks(c: Checker, MPI: Any, comm: Any) -> None:
    """Every part with the C waits and with the Python ones (whose calls the recorders see)."""
    each_wait_way(c, MPI, comm, [_nonblocking, _works_kept, _persistent, _left_to_python])


@pytest.mark.timeout(160)
@pytest.mark.parametrize("n", SIZES)
def test_wait_collective(n):
    check(job(n), "wait_collective")


@pytest.mark.timeout(160)
def test_wait_collective_over_tcp():
    check(job(3, "tcp"), "wait_collective")
