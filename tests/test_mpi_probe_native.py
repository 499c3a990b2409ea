"""collcomm.MPI's ``Probe`` / ``Iprobe`` of a message from a rank of this host in one C call
(native/_p2p_probe.c: the message stays in the ring for the receive that follows), a
section of the shared MPI job (tests/mpi_checks.py) at 1-5 ranks and over TCP (there, and
at one rank, the Python way: the same checks, the results must not differ).

- source, tag and byte count of a probed message (a given tag, ``ANY_TAG``, an object's:
  its pickle and the 8-byte length header), the first of two in order; the receives that
  follow get the probed messages, in order; where C probes, the messages stay in the
  ring (the engine's queue of early messages stays empty);
- ``Iprobe`` before the message: False;
- a blocking ``Probe`` in another thread while this thread posts a receive for the first
  message: the probe must not report the message that receive takes (MPI: the receive
  posted first gets it);
- a ``Probe`` that times out says it was probing.
"""
from __future__ import annotations

import pickle
import threading
import time
from typing import Any

import numpy as np
import pytest

from tests.mpi_checks import SIZES, Checker, check, job


def _in_order(c: Checker, MPI: Any, comm: Any) -> None:
    from collcomm import native
    from collcomm.core import p2p
    r, n = comm.rank, comm.size
    nxt, prv = (r + 1) % n, (r - 1) % n
    g = comm._h.g
    eng = p2p.transport(g)
    st = MPI.Status()
    c.eq(comm.Iprobe(prv, 7, st), False, "Iprobe before the message")
    comm.Barrier()
    # where C can probe (shared memory, nothing outstanding that would drain the rings),
    # a probed message must stay in the ring: the engine's early messages from prv none
    in_c = (native.core is not None and n > 1 and g.link == "shm" and p2p.native(g) is not None
            and not eng.outstanding())
    source = g.ranks[prv]

    def early() -> int:
        return sum(1 for inc in list(eng._unexpected) if inc.source == source)

    before = early()                     # (an earlier section's may wait there)

    comm.Send(np.full(3, 1.0 + r), nxt, 7)
    comm.Send(np.full(5, 2.0 + r, dtype=np.int32), nxt, 9)
    comm.send({"from": r}, nxt, 12)
    comm.Probe(prv, MPI.ANY_TAG, st)
    c.eq((st.Get_source(), st.Get_tag(), st.Get_count(MPI.DOUBLE)), (prv, 7, 3), "Probe(ANY_TAG): the first")
    if in_c:
        c.eq(early() - before, 0, "a probed message stays in the ring (C)")
    x, y = np.zeros(3), np.zeros(5, dtype=np.int32)
    comm.Recv(x, prv, MPI.ANY_TAG, st)
    c.eq((x.tolist(), st.Get_tag()), ([1.0 + prv] * 3, 7), "the ANY_TAG receive after Probe")
    for _ in range(1000000):
        if comm.Iprobe(prv, 9, st):
            break
    c.eq((st.Get_source(), st.Get_tag(), st.Get_count(MPI.INT)), (prv, 9, 5), "Iprobe's status")
    if in_c:
        c.eq(early() - before, 0, "an Iprobed message stays in the ring (C)")
    comm.Recv(y, prv, 9, st)
    c.eq((y.tolist(), st.Get_tag()), ([2 + prv] * 5, 9), "the receive after Iprobe")
    comm.probe(prv, 12, st)
    size = len(pickle.dumps({"from": prv}, MPI.pickle.PROTOCOL or pickle.HIGHEST_PROTOCOL))
    c.eq((st.Get_tag(), st.Get_count()), (12, size + 8), "probe of an object: its pickle and header")
    c.eq(comm.recv(None, prv, 12), {"from": prv}, "the object after its probe")
    comm.Barrier()


def _probe_beside_a_receive(c: Checker, MPI: Any, comm: Any) -> None:
    """Rank 1 probes (any tag, from rank 0) in a thread while its main thread posts a
    receive for tag 6; only then does rank 0 send tag 6, then tag 4."""
    r, n = comm.rank, comm.size
    side = comm.Dup()                    # (the go signal, apart from the probed messages;
    if n < 2 or r > 1:                   # Dup is collective: every rank makes it)
        side.Free()
        comm.Barrier()
        return
    if r == 0:
        side.Recv(np.zeros(1), 1, 0)
        comm.Send(np.full(4, 6.0), 1, 6)
        comm.Send(np.full(1, 4.0), 1, 4)
    else:
        st, seen = MPI.Status(), []

        def prober() -> None:
            comm.Probe(0, MPI.ANY_TAG, st)
            seen.append((st.Get_tag(), st.Get_count(MPI.BYTE)))

        t = threading.Thread(target=prober)
        t.start()
        time.sleep(0.3)                  # (the probe waits first)
        buf = np.zeros(4)
        q = comm.Irecv(buf, 0, 6)
        side.Send(np.zeros(1), 0, 0)
        q.Wait()
        t.join(30)
        c.eq(buf.tolist(), [6.0] * 4, "the receive posted first gets its message")
        c.eq(seen, [(4, 8)], "the probe reports the next message, not that one")
        x = np.zeros(1)
        comm.Recv(x, 0, 4)
        c.eq(x[0], 4.0, "the probed message, received")
    side.Free()
    comm.Barrier()


def _probe_timeout(c: Checker, MPI: Any, comm: Any) -> None:
    from collcomm.core.timeouts import call_timeout
    r, n = comm.rank, comm.size
    if n > 1 and r == 0:
        try:
            with call_timeout(0.5):
                comm.Probe(1, 99)
            c.true(False, "a Probe of a message nobody sends returned")
        except MPI.Exception as exc:
            c.true("probing for a message" in str(exc), f"a Probe's timeout says so: {exc}")
    comm.Barrier()


def probe_native_checks(c: Checker, MPI: Any, comm: Any) -> None:
    _in_order(c, MPI, comm)
    _probe_beside_a_receive(c, MPI, comm)
    _probe_timeout(c, MPI, comm)


@pytest.mark.timeout(160)
@pytest.mark.parametrize("n", SIZES)
def test_probe_native(n):
    check(job(n), "probe_native")


@pytest.mark.timeout(160)
def test_probe_native_over_tcp():
    check(job(3, "tcp"), "probe_native")
