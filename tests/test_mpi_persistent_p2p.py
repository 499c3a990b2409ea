"""collcomm.MPI's persistent point to point (``Send_init``/``Recv_init``, ``Start``,
``Startall``) started in one C call where it can (native/_mpi_pstart.c: written into the
peer's ring at once; Irecv's native start, its op made without a Request) and completed by the
native waits and tests (Prequests registered with native/_mpi_wait.c), a section of the
shared MPI job (tests/mpi_checks.py) at 1-5 ranks and over TCP (there, and at one rank,
the general way: the same checks, the results must not differ).

- rounds of a ring exchange (``Startall`` + ``Waitall``, ``Start`` + ``Wait``, a
  ``Testall`` loop, ``Waitany``), the data read from the send buffer at each ``Start``
  (changed after it: the receiver still gets the value it had then), statuses
  (``ANY_TAG``, counts), the requests inactive (not null) after each completion;
- where the quick ways run (shared memory, the core built): the ops they make;
- a receive from ``PROC_NULL``, a send above the inline limit (lent: the general start);
  errors at ``Start`` (a bad rank, a bad tag), a cancelled receive started again,
  ``Startall`` beside a ``Bcast_init``; ``Free`` of inactive requests;
- a ``Start`` after the communicator's ``Free``, or after its group closed under it: an
  error (the C start checks the handle's group and the entry's pause).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tests.mpi_checks import SIZES, Checker, check, job


def _rounds(c: Checker, MPI: Any, comm: Any) -> None:
    from collcomm import native
    r, n = comm.rank, comm.size
    nxt, prv = (r + 1) % n, (r - 1) % n
    g = comm._h.g
    out, inb = np.zeros(3), np.zeros(3)
    reqs = [comm.Recv_init(inb, prv, 40), comm.Send_init(out, nxt, 40)]
    any_req = [comm.Recv_init(inb, prv, MPI.ANY_TAG), comm.Send_init(out, nxt, 41)]
    from collcomm.core import p2p
    in_c = native.core is not None and n > 1 and g.link == "shm" and p2p.native(g) is not None
    started: list[str] = []              # (where the quick ways run: what each Start took)
    if in_c:
        quick_fns = [q._persist.quick[0] for q in reqs]
        c.eq([(f.func, f.args[:3]) for f in quick_fns],
             [(native.core.mpi_quick_recv, (comm._h, g, p2p.native(g))),
              (native.core.mpi_quick_send, (comm._h, g, p2p.native(g)))],
             "the C starts, given the handle, its group and the group's P2P")
    for q in reqs:
        quick = q._persist.quick if in_c else None
        if quick is not None and quick[0] is not None:
            fn = quick[0]
            quick[0] = lambda fn=fn: started.append(type(got := fn()).__name__) or got
    for k in range(6):
        out[:] = 100 * k + r
        how = k % 4
        if how == 0:
            MPI.Prequest.Startall(reqs)
            out[:] = -1.0                # (read at Start: the peer still gets 100 k + r)
            MPI.Request.Waitall(reqs)
        elif how == 1:
            for q in reqs:
                q.Start()
            st = MPI.Status()
            reqs[0].Wait(st)
            reqs[1].Wait()
            c.eq((st.Get_source(), st.Get_tag(), st.Get_count(MPI.DOUBLE)), (prv, 40, 3), "Start+Wait: status")
        elif how == 2:
            MPI.Prequest.Startall(reqs)
            while not MPI.Request.Testall(reqs):
                pass
        else:
            MPI.Prequest.Startall(reqs)
            got = {MPI.Request.Waitany(reqs), MPI.Request.Waitany(reqs)}
            c.eq(got, {0, 1}, "Waitany on persistent requests: each once")
        c.eq(inb.tolist(), [100.0 * k + prv] * 3, f"round {k} ({how}): the data")
        c.true(all(bool(q) for q in reqs), f"round {k}: the requests inactive, not null")
    out[:] = 7.0 + r
    MPI.Prequest.Startall(any_req)
    sts = [MPI.Status(), MPI.Status()]
    MPI.Request.Waitall(any_req, sts)
    c.eq((inb.tolist(), sts[0].Get_tag(), sts[0].Get_count(MPI.DOUBLE)), ([7.0 + prv] * 3, 41, 3),
         "Recv_init(ANY_TAG): data and status")
    if in_c:
        c.eq(sorted(set(started)), ["Done", "_NativeRecv"], "the quick starts ran")
        c.eq(len(started), 12, "... at every Start (6 rounds, 2 requests)")
    for q in reqs + any_req:
        q.Free()
    c.true(not any(reqs + any_req), "Free: null")
    comm.Barrier()


def _general_starts(c: Checker, MPI: Any, comm: Any) -> None:
    r, n = comm.rank, comm.size
    nxt, prv = (r + 1) % n, (r - 1) % n
    nothing = comm.Recv_init(np.zeros(2), MPI.PROC_NULL, 0)
    nothing.Start()
    st = MPI.Status()
    nothing.Wait(st)
    c.eq((st.Get_source(), st.Get_count(MPI.DOUBLE)), (MPI.PROC_NULL, 0), "Recv_init from PROC_NULL")
    big_out, big_in = np.arange(1 << 17, dtype=np.float64) + r, np.zeros(1 << 17)
    reqs = [comm.Recv_init(big_in, prv, 42), comm.Send_init(big_out, nxt, 42)]
    for k in range(2):
        big_out[0] = 1000.0 * k + r
        MPI.Prequest.Startall(reqs)
        MPI.Request.Waitall(reqs)
        c.eq((big_in[0], big_in[-1]), (1000.0 * k + prv, float((1 << 17) - 1 + prv)), f"1 MiB, round {k}")
    for q in reqs + [nothing]:
        q.Free()
    # errors at Start, as before the quick ways; a cancelled receive started again; a
    # persistent collective started beside them
    bad = [comm.Recv_init(np.zeros(1), n + 3, 0), comm.Send_init(np.zeros(1), nxt, -3)]
    c.raises(bad[0].Start, MPI.Exception, "Recv_init from a rank out of range: at Start", MPI.ERR_RANK)
    c.raises(bad[1].Start, MPI.Exception, "Send_init with a negative tag: at Start", MPI.ERR_TAG)
    x = np.zeros(1)
    q = comm.Recv_init(x, prv, 43)
    q.Start()
    q.Cancel()
    st = MPI.Status()
    q.Wait(st)
    c.true(st.Is_cancelled() and bool(q), "a cancelled persistent receive: inactive")
    comm.Barrier()                       # (nobody sends tag 43 before every rank cancelled)
    b = np.full(2, 9.0) if r == 0 else np.zeros(2)
    mix = [q, comm.Send_init(np.full(1, 5.0 + r), nxt, 43), comm.Bcast_init(b, 0)]
    MPI.Prequest.Startall(mix)
    MPI.Request.Waitall(mix)
    c.eq((x[0], b.tolist()), (5.0 + prv, [9.0, 9.0]), "Startall beside a Bcast_init, then Waitall")
    for q in mix + bad:
        q.Free()
    comm.Barrier()


def _ended_communicator(c: Checker, MPI: Any, comm: Any) -> None:
    """A Start after the communicator's Free, or after its group was closed under it (the
    C start checks the handle's group and its entry's pause, not ``_closed``): an error,
    nothing sent."""
    from collcomm.core import p2p
    r, n = comm.rank, comm.size
    nxt, prv = (r + 1) % n, (r - 1) % n
    for how in ("Free", "close"):
        d = comm.Dup()
        x, y = np.zeros(2), np.full(2, 1.0 + r)
        reqs = [d.Recv_init(x, prv, 44), d.Send_init(y, nxt, 44)]
        MPI.Prequest.Startall(reqs)
        MPI.Request.Waitall(reqs)
        c.eq(x.tolist(), [1.0 + prv] * 2, f"{how}: a round before")
        g = d._h.g
        entry = p2p.native(g)
        comm.Barrier()
        d.Free() if how == "Free" else g.close()
        c.true(entry is None or entry.paused == 1, f"{how}: the group's native entry paused")
        for q, what in zip(reqs, ("Recv_init", "Send_init")):
            c.raises(q.Start, MPI.Exception, f"{what}'s Start after {how}", MPI.ERR_COMM)
        comm.Barrier()


def persistent_p2p_checks(c: Checker, MPI: Any, comm: Any) -> None:
    _rounds(c, MPI, comm)
    _general_starts(c, MPI, comm)
    _ended_communicator(c, MPI, comm)


@pytest.mark.timeout(160)
@pytest.mark.parametrize("n", SIZES)
def test_persistent_p2p(n):
    check(job(n), "persistent_p2p")


@pytest.mark.timeout(160)
def test_persistent_p2p_over_tcp():
    check(job(3, "tcp"), "persistent_p2p")
