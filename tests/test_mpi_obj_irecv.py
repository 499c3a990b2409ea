"""collcomm.MPI's object ``irecv`` and its ``wait`` in C (native/_p2p_obj_irecv.c:
``P2P.obj_irecv`` makes the deferred receive, its op and its Request; ``obj_wait`` takes
the first part, unpickles a small object and reuses the buffer), a section of the shared
MPI job (tests/mpi_checks.py) at 1-5 ranks and over TCP (there the Python way: the same
checks, the results must not differ).

- value and status (source, tag, byte count) of a small object, a specific tag and
  ``ANY_TAG``; ``test`` until done; one native receive each where the group has the entry;
  ``sendrecv``'s one C call (``P2P.obj_sendrecv``);
- the first-part buffer reused by the next receive once its wait read it (and not while
  the receive is pending);
- what C leaves to the Python code, each right: a large object (its body asked for by
  id), a message sent with ``Send`` (``ERR_OTHER``), a pickle the receiver's ``loads``
  refuses (raised by every wait, not lost), a cancelled receive;
- a program's own ``loads`` given a memoryview on every way (C and Python);
- receives freed while active (``Request.Free``) complete at later calls: a large
  object's body is asked for and taken (it stayed behind before).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from collcomm.MPI._p2p_ops import EXACT
from tests.mpi_checks import SIZES, Checker, check, job


def _refused_on_load() -> Any:
    raise ValueError("this receiver refuses the object")


class _BadOnLoad:
    """Pickles fine; unpickling it raises (the receiver's loads fails)."""

    def __reduce__(self) -> Any:
        return (_refused_on_load, ())


#: tokens of the _Tracked objects unpickled in this process
_LOADED: list[int] = []


def _note_loaded(token: int, payload: bytes) -> int:
    _LOADED.append(token)
    return token


class _Tracked:
    """Notes its unpickling in _LOADED; ``size`` bytes of payload (a large object past 65528)."""

    def __init__(self, token: int, size: int) -> None:
        self.token, self.size = token, size

    def __reduce__(self) -> Any:
        return (_note_loaded, (self.token, b"x" * self.size))


def _values(c: Checker, MPI: Any, comm: Any, f: Any) -> None:
    r, n = comm.rank, comm.size
    nxt, prv = (r + 1) % n, (r - 1) % n
    recvs = f.recvs if f is not None else 0
    q = comm.irecv(source=prv, tag=5)
    comm.send({"from": r, "list": [1.5, "x"]}, nxt, 5)
    st = MPI.Status()
    c.eq(q.wait(st), {"from": prv, "list": [1.5, "x"]}, "irecv value")
    import pickle
    size = len(pickle.dumps({"from": prv, "list": [1.5, "x"]}, pickle.HIGHEST_PROTOCOL))
    c.eq((st.Get_source(), st.Get_tag(), st.Get_count(MPI.BYTE)), (prv, 5, size), "irecv status")
    if f is not None:
        c.eq(f.recvs - recvs, 1, "irecv: one native receive")
    if f is not None:         # sendrecv's one C call (P2P.obj_sendrecv): sent, then received
        got = f.obj_sendrecv(("sr", r), nxt, 9, prv, 9, EXACT, MPI.pickle.native)
        c.eq(got[:3], (True, ("sr", prv), 9), "P2P.obj_sendrecv")
    q = comm.irecv(source=prv, tag=MPI.ANY_TAG)
    comm.send(("any", r), nxt, 77)
    st = MPI.Status()
    c.eq(q.wait(st), ("any", prv), "irecv ANY_TAG value")
    c.eq((st.Get_source(), st.Get_tag()), (prv, 77), "irecv ANY_TAG status")
    q = comm.irecv(source=prv, tag=6)
    c.eq(q.test(), (False, None), "test before the message")    # (sent after the barrier)
    comm.barrier()
    comm.send(r * 10, nxt, 6)
    for _ in range(200000):
        done, value = q.test()
        if done:
            break
    c.eq((done, value), (True, prv * 10), "test until done")


def _buffer_reuse(c: Checker, MPI: Any, comm: Any, f: Any) -> None:
    from collcomm.MPI import _pobj
    r, n = comm.rank, comm.size
    nxt, prv = (r + 1) % n, (r - 1) % n
    q1 = comm.irecv(source=prv, tag=8)
    q2 = comm.irecv(source=prv, tag=9)
    b1, b2 = q1._op._buf, q2._op._buf
    c.true(b1 is not b2, "two pending receives: two first-part buffers")
    comm.send("one", nxt, 8)
    comm.send("two", nxt, 9)
    c.eq((q1.wait(), q2.wait()), ("one", "two"), "two pending receives")
    q3 = comm.irecv(source=prv, tag=10)
    c.true(q3._op._buf is b2, "the next receive reuses the buffer its last wait read")
    comm.send(bytes(range(256)) * 4, nxt, 10)
    c.eq(q3.wait(), bytes(range(256)) * 4, "a 1 KiB object into the reused buffer")
    c.true(any(b is b2 for b in _pobj._SPARE), "the buffer back for the next receive")


def _left_to_python(c: Checker, MPI: Any, comm: Any) -> None:
    r, n = comm.rank, comm.size
    nxt, prv = (r + 1) % n, (r - 1) % n
    big = np.arange(20000, dtype=np.float64)            # a 160 KB pickle: first part + body
    q = comm.irecv(source=prv, tag=11)
    comm.send((r, big), nxt, 11)
    got = q.wait()
    c.true(got[0] == prv and np.array_equal(got[1], big), "irecv of a large object")
    q = comm.irecv(source=prv, tag=12)
    comm.Send(np.zeros(3, dtype=np.uint8), nxt, 12)
    c.raises(q.wait, MPI.Exception, "irecv of a message sent with Send", MPI.ERR_OTHER)
    q = comm.irecv(source=prv, tag=13)
    comm.send(_BadOnLoad(), nxt, 13)
    c.raises(q.wait, ValueError, "irecv of an object its loads refuses")
    c.raises(q.wait, ValueError, "... and waited for again")
    q = comm.irecv(source=prv, tag=14)
    q.Cancel()
    st = MPI.Status()
    q.Wait(st)
    c.true(st.Is_cancelled(), "a cancelled irecv")
    comm.barrier()
    comm.send("after", nxt, 14)
    c.eq(comm.irecv(source=prv, tag=14).wait(), "after", "the receive after the cancelled one")
    comm.barrier()


def _own_loads(c: Checker, MPI: Any, comm: Any) -> None:
    """A program's own loads gets the same kind of buffer (a memoryview, as mpi4py's gets
    a buffer object) on every way: irecv's wait (C) and test (Python), recv, bcast."""
    import pickle
    r, n = comm.rank, comm.size
    nxt, prv = (r + 1) % n, (r - 1) % n
    seen: list[str] = []

    def loads(data: Any) -> Any:
        seen.append(type(data).__name__)
        return pickle.loads(data)

    try:
        MPI.pickle.__init__(pickle.dumps, loads)
        q = comm.irecv(source=prv, tag=25)
        comm.send("w", nxt, 25)
        c.eq(q.wait(), "w", "irecv wait, own loads")
        q = comm.irecv(source=prv, tag=26)
        comm.send("t", nxt, 26)
        for _ in range(200000):
            done, value = q.test()
            if done:
                break
        c.eq(value, "t", "irecv test, own loads")
        comm.send("r", nxt, 27)
        c.eq(comm.recv(source=prv, tag=27), "r", "recv, own loads")
        c.eq(comm.bcast("b" if r == 0 else None, 0), "b", "bcast, own loads")
    finally:
        MPI.pickle.__init__()
    c.eq(set(seen), {"memoryview"}, "what the program's loads is given")


def _freed(c: Checker, MPI: Any, comm: Any) -> None:
    """Receives freed while active still complete (a large object's body asked for and
    taken, not left behind), at this rank's later calls."""
    r, n = comm.rank, comm.size
    if n == 1:
        return
    if r == 1:
        q1, q2 = comm.irecv(source=0, tag=23), comm.irecv(source=0, tag=24)
        q1.Free()
        q2.Free()
    comm.barrier()
    sends = [comm.isend(_Tracked(101, 100000), 1, 23), comm.isend(_Tracked(102, 10), 1, 24)] if r == 0 else []
    for _ in range(2000):
        missing = r == 1 and not {101, 102} <= set(_LOADED)
        if not comm.allreduce(int(missing)):
            break
    MPI.Request.Waitall(sends)
    if r == 1:
        c.true({101, 102} <= set(_LOADED), f"freed irecvs completed (unpickled: {_LOADED})")
    if r == 0:
        comm.send(_Tracked(103, 100000), 1, 23)
    if r == 1:
        c.eq(comm.recv(source=0, tag=23), 103, "a large object after a freed irecv of that tag")
    comm.barrier()


def obj_irecv_checks(c: Checker, MPI: Any, comm: Any) -> None:
    from collcomm.core import p2p
    g = comm._h.g
    f = p2p.native(g) if g is not None else None
    _values(c, MPI, comm, f)
    _buffer_reuse(c, MPI, comm, f)
    _left_to_python(c, MPI, comm)
    _freed(c, MPI, comm)
    _own_loads(c, MPI, comm)
    comm.barrier()


@pytest.mark.timeout(160)
@pytest.mark.parametrize("n", SIZES)
def test_obj_irecv(n):
    check(job(n), "obj_irecv")


@pytest.mark.timeout(160)
def test_obj_irecv_over_tcp():
    check(job(3, "tcp"), "obj_irecv")
