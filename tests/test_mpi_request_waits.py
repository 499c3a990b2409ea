"""``Request.Wait``, ``wait``, ``Test``, ``Waitall``, ``Testall``, ``Waitany``, ``Waitsome`` in C (native/_mpi_request_wait.c,
_mpi_request_many.c), a section of
the shared MPI job (tests/mpi_checks.py) at 1-5 ranks and over TCP: what the C methods do
themselves and what they hand to the Python methods, each checked against what the Python
methods give (the section runs with both):

- a null request (``Wait``/``Test`` True, ``wait`` None), an object ``irecv``'s and
  ``isend``'s ``wait``, ``Wait``/``wait``/``Test``/``Waitall`` with a status (the
  status filled), ``status=None`` and ``requests=`` by keyword, a generator for
  ``Waitall``, subclasses of ``Request`` (one whose ``_op`` is a property: the Python
  methods'), a ``Prequest`` of a collective (inactive after), a request never made;
- ``Testall`` loops of a list and of a tuple (with statuses), of none, of a null request, by
  keyword, False before a message and True after, of a collective's request; ``Waitany``
  twice on a receive and a send, of null requests (``UNDEFINED``), of a tuple with a
  status, by keyword on a collective's request; ``Waitsome`` until both, of null requests,
  with statuses, by keyword, of a send C completes beside an object irecv it leaves;
- a receive of a truncated message: ``Wait`` and ``Test`` raise ``ERR_TRUNCATE`` (``Testall``
  ``ERR_IN_STATUS``, as MPI's calls on many requests do) as
  ``MPI.Exception`` (the C ``Test`` clears collcomm's error: the Python way raises it
  translated);
- ``Waitall`` where C stops midway (a receive of a derived type with gaps, unpacked by
  Python): every request null, the data right;
- an object ``irecv`` under a program's own serializer (``MPI.pickle.__init__``: not C's);
- orphans pending (``ORPHANS``: freed receives to unpack): the Python method runs and
  reaps them.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tests.mpi_checks import SIZES, Checker, check, job, python_waits


class _Reaped:
    """An orphan as reap_orphans sees one: complete at its first test."""

    def __init__(self) -> None:
        self.tested = 0

    def test(self) -> bool:
        self.tested += 1
        return True


def _plain(c: Checker, MPI: Any, comm: Any, way: str) -> None:
    r, n = comm.rank, comm.size
    nxt, prv = (r + 1) % n, (r - 1) % n
    c.true(MPI.Request().Wait() is True and MPI.Request().Test() is True, f"{way}: a null request")
    x = np.zeros(2)
    q = comm.Irecv(x, prv, 90)
    comm.Send(np.full(2, 1.0 + r), nxt, 90)
    st = MPI.Status()
    c.true(q.Wait(st), f"{way}: Wait with a status")
    c.eq((st.Get_source(), st.Get_tag(), st.Get_count(MPI.DOUBLE), x[0]), (prv, 90, 2, 1.0 + prv),
         f"{way}: ... its status and data")
    q = comm.Irecv(x, prv, 91)
    comm.Send(np.full(2, 2.0 + r), nxt, 91)
    c.true(q.Wait(status=None) and not q and x[0] == 2.0 + prv, f"{way}: Wait(status=None)")
    q = comm.Irecv(x, prv, 92)
    comm.Send(np.full(2, 3.0 + r), nxt, 92)
    st = MPI.Status()
    while not q.Test(st):
        pass
    c.eq((st.Get_tag(), x[0], bool(q)), (92, 3.0 + prv, False), f"{way}: Test with a status")
    qs = [comm.Irecv(x, prv, 93), comm.Isend(np.full(2, 4.0 + r), nxt, 93)]
    sts = [MPI.Status(), MPI.Status()]
    c.true(MPI.Request.Waitall(qs, sts), f"{way}: Waitall with statuses")
    c.eq((sts[0].Get_source(), sts[0].Get_tag(), x[0], any(qs)), (prv, 93, 4.0 + prv, False),
         f"{way}: ... the receive's status, every request null")
    qs = [comm.Irecv(x, prv, 94), comm.Isend(np.full(2, 5.0 + r), nxt, 94)]
    c.true(MPI.Request.Waitall(requests=qs) and not any(qs) and x[0] == 5.0 + prv, f"{way}: Waitall(requests=...)")
    qs = [comm.Irecv(x, prv, 95), comm.Isend(np.full(2, 6.0 + r), nxt, 95)]
    c.true(MPI.Request.Waitall(q for q in qs) and not any(qs) and x[0] == 6.0 + prv, f"{way}: Waitall of a generator")
    _testall(c, MPI, comm, way, x)
    q = comm.irecv(source=prv, tag=97)
    s = comm.isend({"from": r}, nxt, 97)
    c.eq((q.wait(), s.wait(), bool(q), bool(s), MPI.Request().wait()), ({"from": prv}, None, False, False, None),
         f"{way}: wait of an object irecv and isend, and of a null request")
    q = comm.irecv(source=prv, tag=98)
    comm.send([r], nxt, 98)
    st = MPI.Status()
    c.eq((q.wait(st), st.Get_source(), st.Get_tag()), ([prv], prv, 98), f"{way}: wait with a status")
    elsewhere = type("Elsewhere", (MPI.Request,), {      # (a subclass keeping its op elsewhere)
        "__slots__": ("_real",),
        "_op": property(lambda self: self._real, lambda self, v: setattr(self, "_real", v))})
    q = elsewhere(comm.Irecv(x, prv, 89))
    early = q.Test()
    comm.Barrier()                        # (nobody sends before every rank's first look)
    comm.Send(np.full(2, 8.5 + r), nxt, 89)
    done = q.Wait()
    c.eq((early, done, bool(q), x[0]), (False, True, False, 8.5 + prv),
         f"{way}: a subclass whose _op is a property: Test, then Wait waits")
    c.raises(lambda: object.__new__(MPI.Request).Wait(), AttributeError, f"{way}: Wait of a request never made")
    mine = type("MyRequest", (MPI.Request,), {"__slots__": ()})
    q = mine(comm.Irecv(x, prv, 96))
    comm.Send(np.full(2, 7.0 + r), nxt, 96)
    c.true(q.Wait() and not q and x[0] == 7.0 + prv, f"{way}: Wait of a Request subclass's copy")
    y = np.full(3, float(r))
    p = comm.Allreduce_init(np.full(3, float(r)), y)
    for k in range(3):
        p.Start()
        c.true(p.Wait() and bool(p), f"{way}: a persistent collective's Wait leaves it inactive ({k})")
        c.eq(y.tolist(), [float(sum(range(n)))] * 3, f"{way}: ... its result ({k})")
    p.Start()
    while not p.Test():
        pass
    c.true(bool(p), f"{way}: ... and its Test")
    p.Free()


def _testall(c: Checker, MPI: Any, comm: Any, way: str, x: np.ndarray) -> None:
    r, n = comm.rank, comm.size
    nxt, prv = (r + 1) % n, (r - 1) % n
    qs = [comm.Irecv(x, prv, 87), comm.Isend(np.full(2, 9.5 + r), nxt, 87)]
    while not MPI.Request.Testall(qs):
        pass
    c.eq((any(qs), x[0]), (False, 9.5 + prv), f"{way}: a Testall loop, every request null")
    qs = (comm.Irecv(x, prv, 86), comm.Isend(np.full(2, 9.75 + r), nxt, 86))
    sts = [MPI.Status(), MPI.Status()]
    while not MPI.Request.Testall(qs, sts):
        pass
    c.eq((sts[0].Get_source(), sts[0].Get_tag(), x[0], any(qs)), (prv, 86, 9.75 + prv, False),
         f"{way}: Testall of a tuple with statuses")
    c.true(MPI.Request.Testall([]) and MPI.Request.Testall([MPI.Request()]) and MPI.Request.Testall(requests=[]),
           f"{way}: Testall of none, of a null request, by keyword")
    q = comm.Irecv(x, prv, 85)
    early = MPI.Request.Testall([q])
    comm.Barrier()                        # (nobody sends before every rank's first look)
    comm.Send(np.full(2, 1.25 + r), nxt, 85)
    while not MPI.Request.Testall([q]):
        pass
    c.eq((early, bool(q), x[0]), (False, False, 1.25 + prv), f"{way}: Testall False before the message, True after")
    y = np.zeros(1)
    q = comm.Iallreduce(np.full(1, 1.0), y)
    while not MPI.Request.Testall([q]):
        pass
    c.eq((bool(q), y[0]), (False, float(n)), f"{way}: Testall of a collective's request")
    qs = [comm.Irecv(x, prv, 84), comm.Isend(np.full(2, 2.5 + r), nxt, 84)]
    got = sorted([MPI.Request.Waitany(qs), MPI.Request.Waitany(qs)])
    c.eq((got, any(qs), x[0], MPI.Request.Waitany(qs)), ([0, 1], False, 2.5 + prv, MPI.UNDEFINED),
         f"{way}: Waitany twice, then of null requests")
    for tag, st in ((83, None), (82, MPI.Status())):
        q = comm.Irecv(x, prv, tag)
        comm.Barrier()                    # (the message may come after Waitany's first look)
        comm.Send(np.full(2, 3.5 + r), nxt, tag)
        c.eq((MPI.Request.Waitany((MPI.Request(), q), st), x[0], bool(q)), (1, 3.5 + prv, False),
             f"{way}: Waitany of a tuple, status {st}")
        if st is not None:
            c.eq((st.Get_source(), st.Get_tag()), (prv, 82), f"{way}: ... the status")
    q = comm.Iallreduce(np.full(1, 2.0), y)
    c.eq((MPI.Request.Waitany(requests=[q]), y[0], bool(q)), (0, 2.0 * n, False),
         f"{way}: Waitany(requests=...) of a collective's request")
    _waitsome(c, MPI, comm, way, x)


def _waitsome(c: Checker, MPI: Any, comm: Any, way: str, x: np.ndarray) -> None:
    r, n = comm.rank, comm.size
    nxt, prv = (r + 1) % n, (r - 1) % n

    def every(qs: Any, statuses: Any = None) -> list[int]:
        got: list[int] = []
        while len(got) < len(qs):
            got += MPI.Request.Waitsome(qs, statuses) or []
        return sorted(got)
    qs = [comm.Irecv(x, prv, 79), comm.Isend(np.full(2, 4.5 + r), nxt, 79)]
    c.eq((every(qs), any(qs), x[0], MPI.Request.Waitsome(qs)), ([0, 1], False, 4.5 + prv, None),
         f"{way}: Waitsome until both, then of null requests")
    qs = (comm.Irecv(x, prv, 78), comm.Isend(np.full(2, 5.5 + r), nxt, 78))
    sts = [MPI.Status(), MPI.Status()]
    c.eq((every(qs, sts), x[0]), ([0, 1], 5.5 + prv), f"{way}: Waitsome of a tuple with statuses")
    got = MPI.Request.Waitsome(requests=[comm.Isend(np.ones(1), nxt, 77)])
    comm.Recv(np.zeros(1), prv, 77)
    c.eq(got, [0], f"{way}: Waitsome(requests=...)")
    # a send C completes beside an object irecv it leaves to Python (its test is Python's):
    # C's completions handed on, none lost
    qs = [comm.Isend(np.full(1, 6.5 + r), nxt, 76), comm.irecv(source=prv, tag=75)]
    comm.send(("obj", r), nxt, 75)
    comm.Recv(x[:1], prv, 76)
    c.eq((every(qs), any(qs), x[0]), ([0, 1], False, 6.5 + prv), f"{way}: Waitsome of a send and an object irecv")


def _errors(c: Checker, MPI: Any, comm: Any, way: str) -> None:
    r, n = comm.rank, comm.size
    nxt, prv = (r + 1) % n, (r - 1) % n
    small = np.zeros(1)
    q = comm.Irecv(small, prv, 100)
    comm.Send(np.ones(4), nxt, 100)
    c.raises(q.Wait, MPI.Exception, f"{way}: Wait of a truncated message", MPI.ERR_TRUNCATE)
    c.true(not q, f"{way}: ... the request null")
    q = comm.Irecv(small, prv, 101)
    comm.Send(np.ones(4), nxt, 101)

    def test_until() -> None:
        while not q.Test():
            pass
    c.raises(test_until, MPI.Exception, f"{way}: Test of a truncated message", MPI.ERR_TRUNCATE)
    q = comm.Irecv(small, prv, 104)
    comm.Send(np.ones(4), nxt, 104)

    def testall_until() -> None:
        while not MPI.Request.Testall([q]):
            pass
    c.raises(testall_until, MPI.Exception, f"{way}: Testall of a truncated message",  # (MPI: in a status)
             MPI.ERR_IN_STATUS)
    c.true(not q, f"{way}: ... the request null")
    every_other = MPI.DOUBLE.Create_vector(2, 1, 2).Commit()
    spread, x = np.zeros(3), np.zeros(1)
    qs = [comm.Irecv(x, prv, 102), comm.Irecv([spread, 1, every_other], prv, 103),
          comm.Isend(np.full(1, 8.0 + r), nxt, 102), comm.Isend(np.full(2, 9.0 + r), nxt, 103)]
    c.true(MPI.Request.Waitall(qs) and not any(qs), f"{way}: Waitall past a receive with gaps")
    c.eq((x[0], spread.tolist()), (8.0 + prv, [9.0 + prv, 0.0, 9.0 + prv]), f"{way}: ... the data")
    every_other.Free()
    comm.Barrier()


def _serializer_and_orphans(c: Checker, MPI: Any, comm: Any, way: str) -> None:
    import pickle

    from collcomm.MPI._request_ops import ORPHANS
    r, n = comm.rank, comm.size
    nxt, prv = (r + 1) % n, (r - 1) % n
    calls: list[str] = []

    def loads(data: Any, *args: Any) -> Any:
        calls.append("loads")
        return pickle.loads(data)
    MPI.pickle.__init__(pickle.dumps, loads)
    try:
        q = comm.irecv(source=prv, tag=110)
        comm.send({"r": r}, nxt, 110)
        q.Wait()
        c.true("loads" in calls or n == 1 and not calls, f"{way}: an object irecv under the program's loads")
    finally:
        MPI.pickle.__init__()
    orphan = _Reaped()
    try:
        x = np.zeros(1)
        q = comm.Irecv(x, prv, 111)
        comm.Send(np.full(1, 1.0), nxt, 111)
        ORPHANS.append(orphan)        # (after the calls on the communicator, which reap too)
        c.true(q.Wait() and x[0] == 1.0, f"{way}: Wait with an orphan pending")
        c.eq((orphan.tested, orphan in ORPHANS), (1, False), f"{way}: ... the orphan reaped")
    finally:
        if orphan in ORPHANS:
            ORPHANS.remove(orphan)
    comm.Barrier()


def request_waits_checks(c: Checker, MPI: Any, comm: Any) -> None:
    for python in (False, True):
        with python_waits(MPI, python):
            way = "Python" if python else "installed"
            _plain(c, MPI, comm, way)
            _errors(c, MPI, comm, way)
            _serializer_and_orphans(c, MPI, comm, way)
    comm.Barrier()


@pytest.mark.timeout(160)
@pytest.mark.parametrize("n", SIZES)
def test_request_waits(n):
    check(job(n), "request_waits")


@pytest.mark.timeout(160)
def test_request_waits_over_tcp():
    check(job(3, "tcp"), "request_waits")
