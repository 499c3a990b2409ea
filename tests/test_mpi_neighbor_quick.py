"""collcomm.MPI's blocking neighbourhood collectives in one C call (``P2P.exchange``,
native/_p2p_exchange.c) and their quick path (``Neighborhood.quick_run``,
MPI/_neighbor_exchange.py): a section of the shared MPI job (tests/mpi_checks.py) at 1-5
ranks and over TCP (no native point-to-point there: the regular path, the same checks).

- repeated ``Neighbor_alltoall``/``Neighbor_allgather``/``Neighbor_alltoallv`` on a ring, a
  line (``PROC_NULL`` ends: their receive blocks untouched) and a distributed graph with
  edges to itself, new values every call: the first call of a layout takes the regular
  path, the next ones the quick path (counted: where the group has native point-to-point
  the quick path must have run);
- layouts that alternate (other sizes, dtypes), blocks above the inline limit alone and
  beside small ones (C stops at the first it cannot take: the rest the regular way);
- what must leave the quick path to the regular one, raising there on every rank, the next
  call right: a receive buffer that is read-only or not contiguous in a cached layout, a
  freed datatype in a cached vector spec, a freed communicator;
- persistent and non-blocking neighbourhood calls between quick ones (the call numbers
  stay in step);
- ``P2P.exchange`` itself: a block outside its buffer or a malformed tuple does nothing;
- the object forms with a large object beside a small one.
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

from collcomm.core import p2p
from collcomm.MPI._neighbor_exchange import Neighborhood
from tests.mpi_checks import SIZES, Checker, check, job

BIG = 40_000          # float64 elements: 320 KB, above the native inline limit (256 KiB)


class _Counted:
    """Neighborhood.quick_run and quick_start counted while in a ``with`` (the calls they
    took: ``runs``, ``starts``)."""

    def __enter__(self) -> "_Counted":
        self.run, self.start, self.runs, self.starts = Neighborhood.quick_run, Neighborhood.quick_start, 0, 0

        def run(nbh: Neighborhood, *a: Any) -> bool:
            ok = self.run(nbh, *a)
            self.runs += ok
            return ok

        def start(nbh: Neighborhood, *a: Any) -> Any:
            op = self.start(nbh, *a)
            self.starts += op is not None
            return op
        Neighborhood.quick_run, Neighborhood.quick_start = run, start  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: Any) -> None:
        Neighborhood.quick_run, Neighborhood.quick_start = self.run, self.start  # type: ignore[method-assign]


HOW = ("Wait", "Test", "Waitall", "Testany")


def complete_by(MPI: Any, req: Any, how: int, others: list[Any] | None = None) -> None:
    """Complete ``req`` by HOW[how]: its Wait, Test polling, a Waitall with ``others``, or
    Testany polling."""
    if how == 0:
        req.Wait()
    elif how == 1:
        while not req.Test():
            pass
    elif how == 2:
        MPI.Request.Waitall([req, *(others or [])])
    else:
        while not MPI.Request.Testany([req])[1]:
            pass


def _native(t: Any) -> bool:
    """Whether topology communicator ``t``'s neighbour twin has native point-to-point."""
    nbh = t._neighbor_plan("test")
    return p2p.native(nbh.twin._grp("test")) is not None and bool(nbh.plan.sends or nbh.plan.recvs)


def _ring_checks(c: Checker, MPI: Any, comm: Any, periodic: bool) -> None:
    r, n = comm.rank, comm.size
    t = comm.Create_cart([n], [periodic])
    down, up = t.Shift(0, 1)
    what = f"{'ring' if periodic else 'line'} n={n}"
    with _Counted() as k:
        for it, m in enumerate([1, 1, 3, 1, 3, 3, BIG, BIG, 1]):
            for dtype in (np.float64, np.int32) if m == 3 else (np.float64,):
                send = (np.arange(2 * m) + 100 * r + 1000 * it).astype(dtype)
                recv = np.full(2 * m, -1, dtype)
                t.Neighbor_alltoall(send, recv)
                value = lambda p: (np.arange(2 * m) + 100 * p + 1000 * it).astype(dtype)  # noqa: E731
                c.eq(recv, _a2a_want(MPI, down, up, m, value, dtype),
                     f"{what}: Neighbor_alltoall call {it} m={m} {np.dtype(dtype)}")
                mine = (np.arange(m) + 7 * r + it).astype(dtype)
                got = np.full(2 * m, -1, dtype)
                t.Neighbor_allgather(mine, got)
                want = np.full(2 * m, -1, dtype)
                for slot, p in enumerate((down, up)):
                    if p != MPI.PROC_NULL:
                        want[slot * m:(slot + 1) * m] = (np.arange(m) + 7 * p + it).astype(dtype)
                c.eq(got, want, f"{what}: Neighbor_allgather call {it} m={m} {np.dtype(dtype)}")
    if _native(t):
        c.true(k.runs >= 10, f"{what}: the quick path ran ({k.runs} calls)")
    _refusals(c, MPI, t, what)
    t.Free()


def _a2a_want(MPI: Any, down: int, up: int, m: int, value: Any, dtype: Any) -> np.ndarray:
    """A ring's Neighbor_alltoall result: slot 0 (from down) the block down sent up (its
    block 1), slot 1 (from up) up's block 0; -1 from PROC_NULL. value(rank) is a rank's send."""
    want = np.full(2 * m, -1, dtype)
    if down != MPI.PROC_NULL:
        want[:m] = value(down)[m:]
    if up != MPI.PROC_NULL:
        want[m:] = value(up)[:m]
    return want


def _refusals(c: Checker, MPI: Any, t: Any, what: str) -> None:
    """Calls in a cached layout that the quick path must leave to the regular one: refused
    on every rank (no call number taken), the next call right."""
    down, up = t.Shift(0, 1)
    value = lambda p, k=0: np.arange(2.0) + 10 * p + k     # noqa: E731 - rank p's send
    recv = np.zeros(2)
    t.Neighbor_alltoall(value(t.rank), recv)        # (the layout cached)
    ro = np.zeros(2)
    ro.flags.writeable = False
    c.raises(lambda: t.Neighbor_alltoall(value(t.rank), ro), BufferError, f"{what}: a read-only receive buffer")
    strided = np.zeros(4)[::2]
    c.raises(lambda: t.Neighbor_alltoall(value(t.rank), strided), BufferError, f"{what}: a strided receive buffer")
    out = np.full(2, -1.0)
    t.Neighbor_alltoall(value(t.rank, 5), out)
    c.eq(out, _a2a_want(MPI, down, up, 1, lambda p: value(p, 5), np.float64), f"{what}: the call after the refusals")


def _graph_checks(c: Checker, MPI: Any, comm: Any) -> None:
    """r -> r+1, r+2 (at n = 1 both to itself, at n = 2 one): Neighbor_alltoallv with spec
    lists, blocks of different sizes, one above the inline limit beside a small one."""
    r, n = comm.rank, comm.size
    g = comm.Create_dist_graph_adjacent([(r - 1) % n, (r - 2) % n], [(r + 1) % n, (r + 2) % n])
    with _Counted() as k:
        for it, (m0, m1) in enumerate([(1, 2), (1, 2), (1, 2), (3, BIG), (3, BIG), (1, 2), (BIG, 1)]):
            send = np.arange(m0 + m1, dtype=np.float64) + 1000 * r + 10 * it
            recv = np.full(m0 + m1 + 4, -1.0)
            # source (r-1) sent me its block 0 (m0), source (r-2) its block 1 (m1)
            g.Neighbor_alltoallv([send, [m0, m1], [0, m0], MPI.DOUBLE], [recv, [m0, m1], [2, m0 + 4], MPI.DOUBLE])
            want = np.full(m0 + m1 + 4, -1.0)
            want[2:2 + m0] = np.arange(m0) + 1000 * ((r - 1) % n) + 10 * it
            want[m0 + 4:m0 + 4 + m1] = np.arange(m0, m0 + m1) + 1000 * ((r - 2) % n) + 10 * it
            c.eq(recv, want, f"graph n={n}: Neighbor_alltoallv call {it} blocks {m0}, {m1}")
    if _native(g):
        c.true(k.runs >= 3, f"graph n={n}: the quick path ran ({k.runs} calls)")
    # counts given as 0-d numpy arrays (valid, read with int()): no layout kept, every form right
    a0, a1 = np.array(1), np.array(1)
    for it in range(2):
        for form in ("blocking", "I", "init"):
            send, recv = np.arange(2.0) + 10 * r + it, np.full(2, -1.0)
            specs = ([send, [a0, a1], [0, 1], MPI.DOUBLE], [recv, [a0, a1], [0, 1], MPI.DOUBLE])
            if form == "blocking":
                g.Neighbor_alltoallv(*specs)
                g.Neighbor_allgatherv(send[:1], [recv, [a0, a1], [0, 1], MPI.DOUBLE])
                recv[:] = -1
                g.Neighbor_alltoallv(*specs)
            elif form == "I":
                g.Ineighbor_alltoallv(*specs).Wait()
            else:
                q = g.Neighbor_alltoallv_init(*specs)
                q.Start()
                q.Wait()
                q.Free()
            c.eq(recv, [10 * ((r - 1) % n) + it, 10 * ((r - 2) % n) + it + 1],
                 f"graph n={n}: Neighbor_alltoallv ({form}) with 0-d array counts, call {it}")
    # a freed datatype in a cached spec: refused on every rank; the next call right
    dt = MPI.DOUBLE.Create_contiguous(1).Commit()
    send, recv = np.arange(2.0) + r, np.zeros(2)
    for _ in range(2):
        g.Neighbor_alltoallv([send, [1, 1], [0, 1], dt], [recv, [1, 1], [0, 1], dt])
    dt.Free()
    c.raises(lambda: g.Neighbor_alltoallv([send, [1, 1], [0, 1], dt], [recv, [1, 1], [0, 1], dt]),
             MPI.Exception, f"graph n={n}: a freed datatype in a cached layout", MPI.ERR_TYPE)
    recv[:] = -1
    g.Neighbor_alltoallv([send, [1, 1], [0, 1], MPI.DOUBLE], [recv, [1, 1], [0, 1], MPI.DOUBLE])
    c.eq(recv, [(r - 1) % n, (r - 2) % n + 1.0], f"graph n={n}: the call after the freed datatype")
    # persistent and non-blocking calls between quick ones: the numbers in step
    ps, pr = np.arange(3.0) + r, np.zeros(3)
    req = g.Neighbor_alltoallv_init([ps, [1, 2], [0, 1], MPI.DOUBLE], [pr, [1, 2], [0, 1], MPI.DOUBLE])
    for it in range(3):
        req.Start()
        qs, qr = np.arange(3.0) + 10 * r + it, np.zeros(3)
        g.Neighbor_alltoallv([qs, [1, 2], [0, 1], MPI.DOUBLE], [qr, [1, 2], [0, 1], MPI.DOUBLE])
        ir = np.zeros(3)
        ireq = g.Ineighbor_alltoallv([qs * 2, [1, 2], [0, 1], MPI.DOUBLE], [ir, [1, 2], [0, 1], MPI.DOUBLE])
        req.Wait()
        ireq.Wait()
        a, b = (r - 1) % n, (r - 2) % n
        c.eq(pr, [a, b + 1, b + 2], f"graph n={n}: persistent start {it}")
        c.eq(qr, [10 * a + it, 10 * b + it + 1, 10 * b + it + 2], f"graph n={n}: quick call {it}")
        c.eq(ir, [2 * (10 * a + it), 2 * (10 * b + it + 1), 2 * (10 * b + it + 2)], f"graph n={n}: Ineighbor {it}")
    req.Free()
    g.Free()
    c.raises(lambda: g.Neighbor_alltoallv([send, [1, 1], [0, 1], MPI.DOUBLE], [recv, [1, 1], [0, 1], MPI.DOUBLE]),
             MPI.Exception, f"graph n={n}: a freed communicator", MPI.ERR_COMM)


def _nonblocking_checks(c: Checker, MPI: Any, comm: Any) -> None:
    """Ineighbor_… and persistent requests begun natively (Started), completed by Wait,
    Test or Testany polling, Waitall, or freed; small and large blocks; a line's PROC_NULL ends."""
    r, n = comm.rank, comm.size
    for periodic in (True, False):
        t = comm.Create_cart([n], [periodic])
        down, up = t.Shift(0, 1)
        what = f"{'ring' if periodic else 'line'} n={n}"
        native = _native(t)
        k = _Counted().__enter__()
        for it, m in enumerate([1, 1, 2, BIG, 1, BIG, 2]):
            value = lambda p, k=it: np.arange(2.0 * m) + 100 * p + 1000 * k    # noqa: E731
            recv = np.full(2 * m, -1.0)
            req = t.Ineighbor_alltoall(value(r), recv)
            how = it % 4
            if how != 2:
                complete_by(MPI, req, how)
            else:
                other = t.Ineighbor_allgather(value(r)[:m], got := np.full(2 * m, -1.0))
                complete_by(MPI, req, how, [other])
                want = np.full(2 * m, -1.0)
                for slot, p in enumerate((down, up)):
                    if p != MPI.PROC_NULL:
                        want[slot * m:(slot + 1) * m] = value(p)[:m]
                c.eq(got, want, f"{what}: Ineighbor_allgather in a Waitall, call {it}")
            c.eq(recv, _a2a_want(MPI, down, up, m, value, np.float64), f"{what}: Ineighbor_alltoall call {it} "
                 f"completed by {HOW[how]}")
        k.__exit__()
        if native:
            c.true(k.starts >= 3, f"{what}: Ineighbor_… took the quick path ({k.starts} calls)")
        # persistent: started again and again, blocking and non-blocking calls between
        ps, pr = np.arange(4.0) + r, np.full(4, -1.0)
        k = _Counted().__enter__()     # (before the request: its Start keeps the bound quick_start)
        pq = t.Neighbor_alltoall_init(ps, pr)
        for it in range(4):
            ps[:] = np.arange(4.0) + r + 10 * it
            pq.Start()
            mid = np.full(2, -1.0)
            t.Neighbor_alltoall(np.arange(2.0) + 50 * r, mid)
            pq.Wait()
            c.eq(pr, _a2a_want(MPI, down, up, 2, lambda p: np.arange(4.0) + p + 10 * it, np.float64),
                 f"{what}: persistent Neighbor_alltoall start {it}")
            c.eq(mid, _a2a_want(MPI, down, up, 1, lambda p: np.arange(2.0) + 50 * p, np.float64),
                 f"{what}: a blocking call inside persistent start {it}")
        k.__exit__()
        if native:
            c.true(k.starts >= 3, f"{what}: persistent starts took the quick path ({k.starts} starts)")
        pq.Free()
        # a freed request completes in the background: filled once a later call read past it
        recv = np.full(2, -1.0)
        t.Ineighbor_alltoall(np.arange(2.0) + 7 * r, recv).Free()
        after = np.full(2, -1.0)
        t.Neighbor_alltoall(np.arange(2.0) + 9 * r, after)
        c.eq(after, _a2a_want(MPI, down, up, 1, lambda p: np.arange(2.0) + 9 * p, np.float64),
             f"{what}: the call after a freed Ineighbor_alltoall")
        t.Barrier()
        t.Neighbor_alltoall(np.arange(2.0), np.zeros(2))     # (reads past anything still in a ring)
        c.eq(recv, _a2a_want(MPI, down, up, 1, lambda p: np.arange(2.0) + 7 * p, np.float64),
             f"{what}: a freed Ineighbor_alltoall's receive buffer")
        t.Free()


def _lent_and_freed_checks(c: Checker, MPI: Any, comm: Any) -> None:
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
    _free_while_waited(c, MPI, comm)
    _free_while_timing_out(c, MPI, comm)
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


def _object_checks(c: Checker, MPI: Any, comm: Any) -> None:
    """The object forms: small objects written in C, a large one (above a ring's inline
    limit) beside a small one the regular way, with that pickle."""
    r, n = comm.rank, comm.size
    t = comm.Create_cart([n], [True])
    down, up = t.Shift(0, 1)
    for it in range(3):
        c.eq(t.neighbor_allgather((r, it)), [(down, it), (up, it)], f"n={n}: neighbor_allgather {it}")
        big = b"x" * 600_000 + bytes([r])
        got = t.neighbor_alltoall([(r, "small", it), big])
        # slot 0 (from down) is what down sent up (its item 1), slot 1 what up sent down (its item 0)
        c.eq(got, [b"x" * 600_000 + bytes([down]), (up, "small", it)], f"n={n}: neighbor_alltoall with a large object {it}")
    t.Free()


def _free_while_waited(c: Checker, MPI: Any, comm: Any) -> None:
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


def _free_while_timing_out(c: Checker, MPI: Any, comm: Any) -> None:
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


def _exchange_entry(c: Checker, MPI: Any, comm: Any) -> None:
    """P2P.exchange declines what it cannot read, having done nothing."""
    t = comm.Create_cart([comm.size], [True])
    nbh = t._neighbor_plan("test")
    f = p2p.native(nbh.twin._grp("test"))
    if f is not None and comm.size > 1:
        peer = t.Shift(0, 1)[1]      # (the twin's local rank: the same)
        send, recv = np.zeros(2), np.zeros(2)
        for sends in ((8, 16, peer, 0), (0, 8, peer), (0, 8, peer, -1), (0, 8.0, peer, 0), (0, 8, 99, 0)):
            c.eq(f.exchange(send, recv, sends, (), 0, 0), (0, 0), f"exchange of {sends}: nothing done")
        c.eq(f.exchange(send, recv, (), (), 0, 0, (0, 8, 16)), (0, 0), "a copy past its buffer: nothing done")
        ro = np.zeros(2)
        ro.flags.writeable = False
        c.eq(f.exchange(send, ro, (0, 8, peer, 0), (), 0, 0), (0, 0), "a read-only receive buffer: nothing done")
        c.raises(lambda: f.exchange(send, recv, [0, 8, peer, 0], (), 0, 0), TypeError, "a list of blocks")
    t.Free()


def neighbor_quick_checks(c: Checker, MPI: Any, comm: Any) -> None:
    _exchange_entry(c, MPI, comm)
    _ring_checks(c, MPI, comm, True)
    _ring_checks(c, MPI, comm, False)
    _graph_checks(c, MPI, comm)
    _nonblocking_checks(c, MPI, comm)
    _lent_and_freed_checks(c, MPI, comm)
    _object_checks(c, MPI, comm)


# ----------------------------------------------------------------- Started, in one process


class _Req:
    """A request of the fake twin: complete once waited for (or at once: ``done``)."""

    def __init__(self, log: list[Any], what: Any, done: bool = False) -> None:
        self.log, self.what, self.done = log, what, done

    def Wait(self) -> None:  # noqa: N802
        self.log.append(("wait", self.what))
        self.done = True

    def Test(self) -> bool:  # noqa: N802
        return self.done

    def _settled(self) -> bool:
        return self.done

    def Cancel(self) -> None:  # noqa: N802
        self.log.append(("cancel", self.what))

    def __bool__(self) -> bool:
        return not self.done


class _Twin:
    def __init__(self) -> None:
        self.log: list[Any] = []

    def Free(self) -> None:  # noqa: N802
        self.log.append(("free",))

    def Irecv(self, buf: Any, source: int, tag: int) -> _Req:  # noqa: N802
        self.log.append(("irecv", source, tag, buf.nbytes))
        return _Req(self.log, ("irecv", source, tag))

    def Isend(self, buf: Any, dest: int, tag: int) -> _Req:  # noqa: N802
        self.log.append(("isend", dest, tag, buf.nbytes))
        return _Req(self.log, ("isend", dest, tag))


class _F:
    """P2P.exchange's stand-in: every send written; the receive call raises ``exc`` having
    received ``received`` blocks (``exchanged`` says so), or receives them all."""

    def __init__(self, exc: BaseException | None, received: int) -> None:
        self.exc, self.received, self.exchanged = exc, received, (0, 0)

    def exchange(self, send: Any, recv: Any, sends: tuple, recvs: tuple, base: int, mask: int, *local: Any):
        if recvs and self.exc is not None:
            self.exchanged = (0, self.received)
            raise self.exc
        self.exchanged = (len(sends) // 4, len(recvs) // 4)
        return self.exchanged

    def send(self, *a: Any) -> bool:
        return False


class _G:
    _closed = False


def _Owner(twin: Any) -> Any:       # noqa: N802 - a Started op's owner, over a fake twin
    from collcomm.MPI._neighbor_exchange import Neighborhood, Neighbors, Plan
    return Neighborhood(twin, Plan(Neighbors([1, 2], [1, 2]), 0, "t"), _G())


OWNERS: list[Any] = []


def _started(exc: BaseException | None, received: int, sent: int = 2) -> tuple[Any, _Twin, list[int]]:
    from collcomm.MPI._neighbor_ops import Started
    twin, after = _Twin(), []
    owner = _Owner(twin)
    OWNERS.append(owner)
    flat = ((0, 8, 1, 0, 8, 8, 2, 1), (0, 8, 1, 1, 8, 16, 2, 0), 2, 2, ())
    op = Started(_F(exc, received), owner, 40, np.zeros(2), np.zeros(3), flat, lambda: after.append(1), sent)
    assert op in owner.started
    return op, twin, after


def test_started_hands_over_after_an_error_in_its_wait():
    from collcomm import MPI
    from collcomm.errors import CommTimeoutError, PeerLostError
    op, twin, after = _started(CommTimeoutError("timed out"), 1)
    with pytest.raises(MPI.Exception):
        op.wait()
    # the receive after the one C took posted as an Irecv (source 2, tag 40, 16 bytes), nothing else
    assert twin.log == [("irecv", 2, 40, 16)] and not after
    op.wait()                     # waited for again: the Irecv's wait, then `after` once
    assert twin.log[1:] == [("wait", ("irecv", 2, 40))] and after == [1]
    op.wait()
    assert after == [1] and op.test()
    op, twin, after = _started(KeyboardInterrupt(), 0, sent=1)
    assert twin.log == [("isend", 2, 41, 8)]     # (the send C did not write: an Isend)
    with pytest.raises(KeyboardInterrupt):
        op.wait()
    assert twin.log[1:] == [("irecv", 1, 41, 8), ("irecv", 2, 40, 16)]
    op.wait()
    assert [e[0] for e in twin.log[3:]] == ["wait"] * 3 and after == [1]
    op, twin, after = _started(PeerLostError("rank 1 is gone"), 2)
    with pytest.raises(MPI.Exception):
        op.wait()
    assert twin.log == [] and after == []        # (both received: nothing to post)
    op, twin, after = _started(PeerLostError("rank 2 is gone"), 1)
    with pytest.raises(MPI.Exception):
        op.wait()
    # failed: the receive it posted ended (no receive left to catch a later message), and
    # every later wait raises again
    assert twin.log == [("irecv", 2, 40, 16), ("cancel", ("irecv", 2, 40))] and after == []
    with pytest.raises(MPI.Exception):
        op.wait()
    assert not any(o.started or o.claimed for o in OWNERS)


class _LateInterrupt(tuple):
    """A result whose reading raises KeyboardInterrupt: a signal landing just after the C
    call returned (Python checks signals there), before the wait handed anything over."""

    def __getitem__(self, i: Any) -> Any:
        raise KeyboardInterrupt


def test_an_interruption_just_after_the_c_receive_hands_over_the_rest():
    op, twin, after = _started(None, 0)
    f = op._f

    def exchange(send: Any, recv: Any, sends: tuple, recvs: tuple, *a: Any) -> Any:
        f.exchanged = (0, 1) if recvs else (len(sends) // 4, 0)
        return _LateInterrupt((0, 1)) if recvs else f.exchanged
    f.exchange = exchange
    with pytest.raises(KeyboardInterrupt):
        op.wait()
    assert twin.log == [("irecv", 2, 40, 16)] and op._ex is not None   # (the receive C left, posted)
    op.wait()
    assert after == [1] and not any(o.started or o.claimed for o in OWNERS)


def test_started_waits_for_its_sends_before_it_completes():
    op, twin, after = _started(None, 0, sent=1)     # (C took both receives; one send an Isend)
    assert twin.log == [("isend", 2, 41, 8)]
    op.wait()
    assert twin.log[1:] == [("wait", ("isend", 2, 41))] and after == [1]
    assert not any(o.started or o.claimed for o in OWNERS)


class _Interrupted:
    """P2P.exchange interrupted having moved ``exchanged`` (sends, receives)."""

    def __init__(self, exchanged: tuple[int, int]) -> None:
        self.exchanged = exchanged

    def exchange(self, *a: Any) -> Any:
        raise KeyboardInterrupt

    def send(self, *a: Any) -> bool:
        return False


def test_quick_paths_take_the_number_once_a_message_moved():
    """An interruption or error inside P2P.exchange: the call's number counted where C moved
    a message (its peers count it), not where it moved nothing."""
    from collcomm.MPI._neighbor_exchange import Neighborhood, Plan, Neighbors

    class G:
        _closed = False

    for exchanged, sends_phase in (((2, 0), False), ((0, 0), False), ((1, 0), True), ((0, 0), True)):
        nbh = Neighborhood(_Twin(), Plan(Neighbors([1, 2], [1, 2]), 0, "t"), G())
        nbh.f = _Interrupted(exchanged)
        send, recv = np.zeros(2), np.zeros(2)
        nbh.quick[(0, send.dtype, send.shape, recv.dtype, recv.shape)] = ((0, 8, 1, 0, 8, 8, 2, 1),
                                                                          (0, 8, 1, 1, 8, 8, 2, 0), 2, 2, ())
        with pytest.raises(KeyboardInterrupt):
            (nbh.quick_start if sends_phase else nbh.quick_run)(0, send, recv)
        assert nbh.calls == (1 if any(exchanged) else 0), (exchanged, sends_phase)
        if sends_phase:         # started all the same: its receives posted (no request to hold it)
            log = nbh.twin.log
            assert [e[0] for e in log] == (["isend", "irecv", "irecv"] if exchanged[0] else []), log


def test_an_interrupted_persistent_start_leaves_its_request_active():
    """A persistent Start interrupted once its sends were written has started: its request
    is active (a second Start is refused, its Wait completes it), not inactive (a second
    Start would send that round again: its peers a round behind for good)."""
    from collcomm.MPI._neighbor_exchange import Neighborhood, Neighbors, Plan
    from collcomm.MPI._neighbor_ops import Started
    from collcomm.MPI._prequest import persistent

    class G:
        _closed = False

    nbh = Neighborhood(_Twin(), Plan(Neighbors([1, 2], [1, 2]), 0, "t"), G())
    nbh.f = _Interrupted((1, 0))
    send, recv = np.zeros(2), np.zeros(2)
    nbh.quick[(0, send.dtype, send.shape, recv.dtype, recv.shape)] = ((0, 8, 1, 0, 8, 8, 2, 1),
                                                                      (0, 8, 1, 1, 8, 8, 2, 0), 2, 2, ())
    req = persistent(lambda: None)
    req._persist.quick = [lambda: nbh.quick_start(0, send, recv, None, 6, req)]
    with pytest.raises(KeyboardInterrupt):
        req.Start()
    assert isinstance(req._op, Started) and nbh.calls == 0      # (a persistent request keeps its number)
    from collcomm import MPI
    with pytest.raises(MPI.Exception):
        req.Start()
    # the same through the regular way (a request's first Start: no layout kept yet)
    from collcomm.MPI._neighbor_exchange import exchange

    class Twin(_Twin):
        def _grp(self, call: str) -> Any:
            return grp

    class Grp:
        _p2p_native = _Interrupted((1, 0))

    grp = Grp()
    nbh = Neighborhood(Twin(), Plan(Neighbors([1, 2], [1, 2]), 0, "t"), G())
    req = persistent(lambda: None)
    nbh.starting = req
    with pytest.raises(KeyboardInterrupt):
        exchange(nbh, 6, [(0, 1), (1, 1)], send, [(0, 1), (1, 1)], recv, True, "t", [])
    assert isinstance(req._op, Started) and nbh.twin.log == [("isend", 2, 6, 8)]   # (the send C did not write)


def test_started_test_and_free_post_its_receives():
    op, twin, after = _started(None, 0)
    assert op.test() is False           # (a test never blocks: the receives posted)
    assert twin.log == [("irecv", 1, 41, 8), ("irecv", 2, 40, 16)]
    op, twin, after = _started(None, 0)
    op.orphan()
    assert [e[0] for e in twin.log] == ["irecv", "irecv"]
    op, twin, after = _started(None, 0)
    op.wait()                           # all in C: nothing posted, `after` run
    assert twin.log == [] and after == [1] and op.test()
    op, twin, after = _started(None, 0)
    owner = OWNERS[-1]
    token = owner.claim(op)                        # (as another thread's wait takes it)
    assert token is not None and owner.claim(op) is None
    op.orphan()
    assert op.test() is False and twin.log == []   # (neither posts what that thread takes)
    owner.free()                                   # (freed meanwhile: the twin kept for it)
    assert owner.freeing and twin.log == []
    owner.settle(token)
    assert not owner.freeing and twin.log == [("free",)]    # (by the last to settle, once)
    owner.settle(token)
    assert twin.log == [("free",)]
    OWNERS.clear()


@pytest.mark.timeout(160)
@pytest.mark.parametrize("n", SIZES)
def test_neighbor_quick(n):
    check(job(n), "neighbor_quick")


@pytest.mark.timeout(160)
def test_neighbor_quick_over_tcp():
    check(job(3, "tcp"), "neighbor_quick")
