"""Checks of collcomm.MPI's neighbourhood requests around the end of their buffers and
communicators, run by the section ``neighbor_quick`` (tests/test_mpi_neighbor_quick.py)
on every rank: lent (large) sends read before the senders' ``Wait`` returns, a request
pending when its communicator is freed, a free beside a wait in C in another thread, a
wait timing out under a freed communicator, a request waited for under another
``call_timeout`` than its start's.
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np

from collcomm.core import p2p
from tests.mpi_checks import Checker

BIG = 40_000          # float64 elements: 320 KB, above the native inline limit (256 KiB)


def _a2a_want(MPI: Any, down: int, up: int, m: int, value: Any, dtype: Any) -> np.ndarray:
    """A ring's Neighbor_alltoall result: slot 0 (from down) the block down sent up (its
    block 1), slot 1 (from up) up's block 0; -1 from PROC_NULL. value(rank) is a rank's send."""
    want = np.full(2 * m, -1, dtype)
    if down != MPI.PROC_NULL:
        want[:m] = value(down)[m:]
    if up != MPI.PROC_NULL:
        want[m:] = value(up)[:m]
    return want


def _native(t: Any) -> bool:
    """Whether topology communicator ``t``'s neighbour twin has native point-to-point."""
    nbh = t._neighbor_plan("test")
    return p2p.native(nbh.twin._grp("test")) is not None and bool(nbh.plan.sends or nbh.plan.recvs)


def lent_and_freed_checks(c: Checker, MPI: Any, comm: Any) -> None:
    """A non-blocking call's large sends are lent (the peer reads them from this rank's
    memory): its Wait must last until they are read, so the program may reuse the buffer
    at once (odd ranks wait late; even ranks overwrite their send buffer right after
    their Wait). A request pending when its communicator is freed still completes."""
    r, n = comm.rank, comm.size
    t = comm.Create_cart([n], [True])
    down, up = t.Shift(0, 1)
    value = lambda p: np.full(2 * BIG, float(p))     # noqa: E731
    for form in ("Ineighbor_alltoall", "Neighbor_alltoall_init"):
        for it in range(3):       # (the first call the regular way, the next ones quick)
            send, recv = value(r), np.zeros(2 * BIG)
            req = t.Ineighbor_alltoall(send, recv) if form[0] == "I" else t.Neighbor_alltoall_init(send, recv)
            if form[0] == "N":
                req.Start()
            if r % 2:
                time.sleep(0.05)
            req.Wait()
            send[:] = -999.0
            c.eq(recv, _a2a_want(MPI, down, up, BIG, value, np.float64), f"{form} n={n} call {it}: lent sends "
                 "read before the senders' Wait returned")
            if form[0] == "N":
                req.Free()
    free_while_waited(c, MPI, comm)
    free_while_timing_out(c, MPI, comm)
    for it in range(2):
        f = comm.Create_cart([n], [True])
        f.Neighbor_alltoall(np.arange(2.0), np.zeros(2))     # (the layout kept: the second request quick)
        recv = np.full(2, -1.0)
        req = f.Ineighbor_alltoall(np.arange(2.0) + 10 * r, recv)
        f.Free()
        while not req.Test():
            pass
        c.eq(recv, _a2a_want(MPI, down, up, 1, lambda p: np.arange(2.0) + 10 * p, np.float64),
             f"n={n}: an Ineighbor_alltoall pending when its communicator was freed ({it})")
    t.Free()


def free_while_waited(c: Checker, MPI: Any, comm: Any) -> None:
    """Rank 0 waits for an Ineighbor_alltoall in a thread (its peers send late) while its
    main thread frees the communicator: the wait goes on in C and completes, and the free
    posts no receive beside it (one would stay posted in the engine for good)."""
    r, n = comm.rank, comm.size
    if n < 2:
        return
    t = comm.Create_cart([n], [True])
    down, up = t.Shift(0, 1)
    t.Neighbor_alltoall(np.arange(2.0), np.zeros(2))          # (the layout kept)
    engine = p2p.transport(t._neighbor_plan("test").twin._grp("test"))
    before = (len(engine._deferred), len(engine._posted))
    comm.Barrier()
    recv = np.full(2, -1.0)
    if r != 0:
        time.sleep(0.3)
    req = t.Ineighbor_alltoall(np.arange(2.0) + 10 * r, recv)
    if r == 0:
        import threading
        waiter = threading.Thread(target=req.Wait)
        waiter.start()
        time.sleep(0.1)
        t.Free()
        waiter.join(60)
        c.eq((len(engine._deferred), len(engine._posted)), before, "no receive left posted by a free beside a wait")
    else:
        req.Wait()
        t.Free()
    c.eq(recv, _a2a_want(MPI, down, up, 1, lambda p: np.arange(2.0) + 10 * p, np.float64),
         "an Ineighbor_alltoall waited for while its communicator was freed")
    comm.Barrier()


def free_while_timing_out(c: Checker, MPI: Any, comm: Any) -> None:
    """Rank 0's thread starts an Ineighbor_alltoall under a 0.8 s call_timeout and times out
    in C waiting for it (its peers send 1.2 s in) after its main thread freed the
    communicator: the receives C leaves are posted on the twin (bounded by the request's
    scope: 0.8 s more), which the last claimer frees (freed under the waiter, posting raised
    ERR_COMM and failed the request); waited for again, it completes. (A machine so loaded
    that the timeout fires only after the peers sent completes the first wait: also right.) Then a request
    started outside any scope and waited for under a short one is bounded by its start's
    timeout, as an Irecv is: it completes."""
    import threading

    import collcomm
    r, n = comm.rank, comm.size
    t = comm.Create_cart([n], [True])
    if n < 2 or not _native(t):
        t.Free()
        return
    down, up = t.Shift(0, 1)
    want = _a2a_want(MPI, down, up, 1, lambda p: np.arange(2.0) + 10 * p, np.float64)
    t.Neighbor_alltoall(np.arange(2.0), np.zeros(2))          # (the layout kept)
    t2 = comm.Create_cart([n], [True])
    t2.Neighbor_alltoall(np.arange(2.0), np.zeros(2))
    comm.Barrier()
    recv, held = np.full(2, -1.0), []
    if r == 0:
        seen: list[Any] = []

        def waiter() -> None:
            with collcomm.call_timeout(0.8):
                held.append(t.Ineighbor_alltoall(np.arange(2.0) + 10 * r, recv))
                try:
                    held[0].Wait()
                    seen.append("completed")
                except MPI.Exception as exc:
                    seen.append("timed out" if isinstance(exc, collcomm.CommTimeoutError) else repr(exc))
        thread = threading.Thread(target=waiter)
        thread.start()
        time.sleep(0.1)
        t.Free()
        thread.join(60)
        c.true(seen in (["timed out"], ["completed"]),
               f"a wait timed out under a freed communicator (its timeout, not ERR_COMM): {seen}")
        try:
            held[0].Wait()
        except MPI.Exception as exc:
            c.true(False, f"the request waited for again after its timeout raised {exc!r}: {exc}")
    else:
        time.sleep(1.2)
        t.Ineighbor_alltoall(np.arange(2.0) + 10 * r, recv).Wait()
        t.Free()
    c.eq(recv, want, "the request waited for again after its timeout under a freed communicator")
    comm.Barrier()
    recv = np.full(2, -1.0)
    if r != 0:
        time.sleep(0.3)
    req = t2.Ineighbor_alltoall(np.arange(2.0) + 10 * r, recv)
    try:
        with collcomm.call_timeout(0.05):
            req.Wait()
    except MPI.Exception as exc:
        c.true(False, f"a request started outside any call_timeout, waited for under a short one, raised {exc}")
    c.eq(recv, want, "a request waited for under another call_timeout than its start's")
    t2.Free()
    comm.Barrier()
