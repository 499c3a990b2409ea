"""The native point-to-point path (native/_p2p.c, core/p2p.py ``native``) keeps every
behaviour of the regular path.

One job of two ranks, rank 1 without the native core (``COLLCOMM_NATIVE=0``), so every
message goes native → Python in one direction and Python → native in the other; on the
native rank each error is also produced with the native path paused (the regular path
in the same process) and the texts compared. A second job kills a rank while its peer
waits in a native receive.
"""
from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

from collcomm import native
from tests.harness import run_ranks

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(native.core is None, reason=f"native core: {native.reason}")]


def _err(fn) -> str:  # type: ignore[no-untyped-def]
    from collcomm.errors import CollcommError
    from collcomm.MPI import Exception as MPIException

    try:
        fn()
    except (CollcommError, MPIException) as exc:
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def _mixed() -> dict:
    import collcomm as dist
    from collcomm import MPI
    from collcomm.core import p2p, runtime

    me = dist.get_rank()
    other = 1 - me
    g = runtime.get_world("test")
    f = p2p.native(g)
    out: dict = {"native": f is not None}
    if f is not None:
        os.environ["COLLCOMM_FAST"] = "0"
        out["fast0"] = p2p._make_native(g) is None
        del os.environ["COLLCOMM_FAST"]
    comm = MPI.COMM_WORLD
    for sender in (0, 1):
        got: list = []
        dist.barrier()
        if me == sender:
            # out of order: tag 2 before tag 1; isend (regular) then send: one order
            dist.send(np.array([2.0], np.float32), other, tag=2)
            dist.send(np.array([1.0], np.float32), other, tag=1)
            w = dist.isend(np.array([5.0], np.float32), other, tag=5)
            dist.send(np.array([6.0], np.float32), other, tag=5)
            w.wait()
            for v in (7.0, 8.0, 9.0):
                dist.send(np.array([v], np.float32), other, tag=6)
            comm.Send(np.arange(3, dtype=np.int64), other, 11)
            comm.Ssend(np.arange(2, dtype=np.int64), other, 12)
            comm.Send(np.arange(4, dtype=np.int64), other, 13)
        else:
            a = np.zeros(1, np.float32)
            for tag in (1, 2, 5, 5):
                dist.recv(a, other, tag=tag)
                got.append(float(a[0]))
            early = np.zeros(1, np.float32)
            w = dist.irecv(early, other, tag=6)           # posted first: gets 7
            dist.recv(a, other, tag=6)
            w.wait()
            got += [float(early[0]), float(a[0])]
            got.append(dist.recv(a, None, tag=6))         # any source: 9, from rank `other`
            got.append(float(a[0]))
            st = MPI.Status()
            big = np.zeros(5, np.int64)
            comm.Recv(big, other, 11, st)                 # a longer buffer: count 3
            got += [st.Get_source(), st.Get_tag(), st.Get_count(MPI.INT64_T), big.tolist()]
            comm.Recv(big, other, 12, st)                 # from Ssend: acked
            got += [st.Get_count(MPI.INT64_T), big[:2].tolist()]
            small = np.zeros(2, np.int64)
            got.append(_err(lambda: comm.Recv(small, other, 13)).split(":")[0])
        out[f"round{sender}"] = got
        dist.barrier()
        # Sendrecv both ways at once (the receive matched natively where it can)
        r = np.zeros(2, np.int32)
        st = MPI.Status()
        comm.Sendrecv(np.array([me, 10 + me], np.int32), other, 20, r, other, 20, st)
        out[f"sendrecv{sender}"] = (r.tolist(), st.Get_source(), st.Get_tag())
    # rank 0 waits natively for tag 40 while a second thread waits for tag 41 (posted
    # later, from the same peer, which sends 41 first): the native wait hands 41 over;
    # then a message above the inline limit (a staged record: left to the regular path)
    dist.barrier()
    if me == 1:
        time.sleep(0.2)
        dist.send(np.array([41], np.int64), 0, tag=41)
        time.sleep(0.1)
        dist.send(np.array([40], np.int64), 0, tag=40)
        dist.send(np.arange(40000, dtype=np.int64), 0, tag=42)
    else:
        import threading

        side = np.zeros(1, np.int64)
        t = threading.Thread(target=lambda: dist.recv(side, 1, tag=41))
        t.start()
        a40 = np.zeros(1, np.int64)
        dist.recv(a40, 1, tag=40)
        t.join(10)
        big = np.zeros(40000, np.int64)
        dist.recv(big, 1, tag=42)
        out["threads"] = (int(side[0]), int(a40[0]), bool((big == np.arange(40000)).all()))
    # errors, native and regular (native paused) on rank 0; rank 1 sends each twice
    errors: list = []
    dist.barrier()
    # and the flight recorder's records of those calls (written in C natively, in Python
    # paused), compared field by field; a send recorded each way at the end
    from collcomm.core.recorder_records import where

    def p2p_records() -> list:
        obs = g.observer
        return [] if obs is None else [r for r in list(obs.rec.ring)
                                       if isinstance(r, list) and r[0] == obs.index]

    def fields(r: list) -> tuple:
        return (type(r).__name__, len(r), r[1], r[2], r[3], r[4], where(r[5], r[6]), r[8],
                r[9], type(r[7]).__name__, type(r[10]).__name__, 0 < r[7] <= r[10])

    if me == 1:
        for _ in range(2):
            dist.send(np.arange(3, dtype=np.float32), 0, tag=30)     # recv into 5: sizes
            dist.send(np.arange(5, dtype=np.float32), 0, tag=31)     # recv into 3: too long
            dist.send(np.arange(2, dtype=np.float32), 0, tag=32)     # recv as int32: dtype
            comm.Send(np.arange(5, dtype=np.int32), 0, 33)           # MPI Recv into 3: truncate
        for _ in range(2):
            dist.recv(np.zeros(2), 0, tag=60)
    else:
        by_path = []
        for paused in (0, 1):
            f.paused = paused
            before = len(p2p_records())
            errors.append([
                _err(lambda: dist.recv(np.zeros(5, np.float32), 1, tag=30)),
                _err(lambda: dist.recv(np.zeros(3, np.float32), 1, tag=31)),
                _err(lambda: dist.recv(np.zeros(2, np.int32), 1, tag=32)),
                _err(lambda: comm.Recv(np.zeros(3, np.int32), 1, 33)),
            ])
            with dist.call_timeout(0.3):
                errors[-1].append(_err(lambda: dist.recv(np.zeros(1), 1, tag=77)))
            dist.send(np.arange(2.0), 1, tag=60)
            by_path.append([fields(r) for r in p2p_records()[before:]])
        f.paused = 0
        out["errors"] = errors
        out["error_records"] = by_path
        out["counts"] = (f.sends, f.recvs)
        recs: list = []
        obs = g.observer
        if obs is not None:
            ring = list(obs.rec.ring)
            mine = [r for r in ring if isinstance(r, list) and r[0] == obs.index]
            recs = [(r[2], r[8], r[9], os.path.basename(r[5].co_filename)) for r in mine]
        out["records"] = recs
    dist.barrier()
    return out


def test_mixed_native_and_python_ranks() -> None:
    t0 = time.monotonic()
    res = run_ranks(_mixed, 2, transport="shm", rank_env={1: {"COLLCOMM_NATIVE": "0"}})
    n, py = res
    assert n["native"] and n["fast0"] and not py["native"]
    for r in (n, py):
        for sender in (0, 1):
            if f"round{sender}" in r and r[f"round{sender}"]:
                got = r[f"round{sender}"]
                assert got[:6] == [1.0, 2.0, 5.0, 6.0, 7.0, 8.0], got
                assert got[6:8] == [1 - (r is py), 9.0], got
                assert got[8:12] == [1 - (r is py), 11, 3, [0, 1, 2, 0, 0]], got
                assert got[12:14] == [2, [0, 1]], got
                assert got[14] == "MismatchError", got      # ERR_TRUNCATE
            rr, src, tag = r[f"sendrecv{sender}"]
            me = 0 if r is n else 1
            assert rr == [1 - me, 11 - me] and src == 1 - me and tag == 20
    assert n["threads"] == (41, 40, True)
    native_errs, regular_errs = n["errors"]
    assert native_errs[:4] == regular_errs[:4]
    assert "sizes must match" in native_errs[0]
    assert "larger than the posted receive buffer" in native_errs[1]
    assert "a receive must use the sender's dtype" in native_errs[2]
    # the timeout: the same words, naming rank 1 (the time waited aside)
    for e in (native_errs[4], regular_errs[4]):
        assert e.startswith("CommTimeoutError: irecv from global rank 1 on"), e
        assert "timed out after 0.3 s" in e and "rank 1 did not send it" in e, e
    sends, recvs = n["counts"]
    assert sends >= 9 and recvs >= 4, n["counts"]
    native_recs, regular_recs = n["error_records"]
    assert native_recs == regular_recs, (native_recs, regular_recs)
    assert [(r[3], r[8]) for r in native_recs] == [
        ("irecv", "completed"), ("irecv", "failed"), ("irecv", "failed"), ("irecv", "failed"),
        ("isend", "completed")], native_recs
    ops = [(op, peer) for op, peer, _, _ in n["records"]]
    assert ("isend", 1) in ops and ("irecv", 1) in ops
    assert all(state != "entered" for _, _, state, _ in n["records"]), n["records"]
    assert {where for _, _, _, where in n["records"]} == {"test_p2p_native.py"}, n["records"]
    assert time.monotonic() - t0 < 60


def _lost_while_waiting(stamp: str) -> tuple:
    import collcomm as dist
    from collcomm import MPI
    from collcomm.core import p2p, runtime

    f = p2p.native(runtime.get_world("test"))
    a = np.zeros(2, np.float64)
    if dist.get_rank() == 1:
        dist.send(a, 0, tag=1)
        dist.barrier()
        time.sleep(0.3)
        with open(stamp, "w") as fh:
            fh.write(repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)
    dist.recv(a, 1, tag=1)
    dist.barrier()
    before = f.recvs
    try:
        MPI.COMM_WORLD.Recv(a, 1, 2)
    except Exception as exc:  # noqa: BLE001 - reported
        return type(exc).__name__, str(exc), time.time(), before
    return "no error", "", time.time(), before


def test_peer_death_while_waiting_natively(tmp_path) -> None:
    stamp = str(tmp_path / "killed")
    outcomes = run_ranks(_lost_while_waiting, 2, stamp, transport="shm", timeout=60,
                         expect_failure=True)
    assert outcomes[1].exitcode == -9
    assert outcomes[0].ok, outcomes[0].error
    kind, text, when, before = outcomes[0].value
    assert before == 1                      # the first receive was native
    assert text.startswith("MPI_ERR_PROC_FAILED") and "rank 1" in text and "died" in text, (kind, text)
    assert when - float(open(stamp).read()) < 5.0


# ----------------------------------------------------------------------------- non-blocking
def _nonblocking() -> dict:
    """isend/irecv, batch_isend_irecv and MPI Isend/Irecv on the native path (a send done
    at once, a receive deferred to its wait, core/p2p.py): the order MPI matches in, the
    results, test(), the records; on rank 0 each case also runs with the native path paused
    (the regular path) and the two compared. Rank 1 may be a pure-Python rank."""
    import collcomm as dist
    from collcomm import MPI
    from collcomm.core import p2p, runtime
    from collcomm.core.recorder_records import where

    me = dist.get_rank()
    other = 1 - me
    g = runtime.get_world("test")
    f = p2p.native(g)
    comm = MPI.COMM_WORLD
    out: dict = {"native": f is not None}

    def one(v: float, tag: int) -> None:
        dist.send(np.array([v], np.float32), other, tag=tag)

    def records() -> list:
        obs = g.observer
        return [] if obs is None else [r for r in list(obs.rec.ring)
                                       if isinstance(r, list) and r[0] == obs.index]

    def fields(r: list) -> tuple:
        return (r[2], r[8], r[9], where(r[5], r[6]), 0 < r[7] <= r[10])

    for paused in (0, 1):
        if f is not None:
            f.paused = paused
        got: list = []
        dist.barrier()
        if me == 1:
            one(1.0, 3)                      # irecv then recv, one source and tag
            one(2.0, 3)
            one(5.0, 5)                      # two tags: 5 before 4
            one(4.0, 4)
            for v in (6.0, 7.0):             # two irecvs of one tag, waited in reverse
                one(v, 6)
            one(8.0, 7)                      # an irecv, then a probe that must not see it
            dist.barrier()
            n = 1100                         # a burst of isends that fills the 1 MiB ring
            ws = [dist.isend(np.full(250, i, np.float32), 0, tag=9) for i in range(n)]
            for w in ws:
                w.wait()
            dist.barrier()
            dist.barrier()
            one(10.0, 10)                    # for test(): after the receiver's polls begin
            comm.Ssend(np.array([11], np.int64), 0, 11)
            comm.Send(np.array([12], np.int64), 0, 12)
            comm.Send(np.array([13], np.int64), 0, 13)
            time.sleep(0.3)                  # while rank 0 waits in a thread (below)
            one(1.0, 50)
            one(2.0, 50)
        else:
            a, b = np.zeros(1, np.float32), np.zeros(1, np.float32)
            w = dist.irecv(a, other, tag=3)
            dist.recv(b, other, tag=3)
            w.wait()
            got.append((float(a[0]), float(b[0]), w.source_rank()))
            w4, w5 = dist.irecv(a, other, tag=4), dist.irecv(b, other, tag=5)
            w5.wait()
            w4.wait()
            got.append((float(a[0]), float(b[0])))
            w1, w2 = dist.irecv(a, other, tag=6), dist.irecv(b, other, tag=6)
            w2.wait()
            w1.wait()
            got.append((float(a[0]), float(b[0])))
            c = np.zeros(1, np.float32)
            w = dist.irecv(c, other, tag=7)
            before = [fields(r) for r in records()[-1:]]
            time.sleep(0.05)
            seen = comm.Iprobe(other, 7)     # the message is the irecv's: not seen
            w.wait()
            got.append((seen, float(c[0]), before))
            dist.barrier()
            time.sleep(0.1)                  # the sender is held by a full ring meanwhile
            bufs = [np.zeros(250, np.float32) for _ in range(1100)]
            ws = dist.batch_isend_irecv([dist.P2POp(dist.irecv, x, other, tag=9) for x in bufs])
            for w in ws:
                w.wait()
            got.append(all((x == i).all() for i, x in enumerate(bufs)))
            dist.barrier()
            d = np.zeros(1, np.float32)
            w = dist.irecv(d, other, tag=10)
            polls = 0 if w.is_completed() else 1
            dist.barrier()
            t0 = time.monotonic()
            while not w.is_completed() and time.monotonic() - t0 < 10:
                polls += 1
            w.wait()
            got.append((float(d[0]), polls > 0))
            if not paused and f is not None:     # completed by a native test(), never posted
                out["test_native"] = getattr(w._handle, "h", "posted") is None
            x = np.zeros(1, np.int64)
            st = MPI.Status()
            r11 = comm.Irecv(x, other, 11)           # from Ssend: acked when matched
            r11.Wait(st)
            got.append((int(x[0]), st.Get_source(), st.Get_tag(), st.Get_count(MPI.INT64_T)))
            r13 = comm.Irecv(x, other, 13)
            rc = comm.Irecv(np.zeros(1, np.int64), other, 99)
            rc.Cancel()
            rc.Wait(st)
            got.append(st.Is_cancelled())
            y = np.zeros(1, np.int64)
            r12 = comm.Irecv(y, other, MPI.ANY_TAG)  # wildcard: gets 12 (sent before 13)
            MPI.Request.Waitall([r13, r12])
            got.append((int(x[0]), int(y[0])))
            # a thread waits on a deferred irecv (natively) while this thread receives from
            # the same peer and tag: the irecv, posted first, gets the first message
            import threading

            a50, b50 = np.zeros(1, np.float32), np.zeros(1, np.float32)
            w = dist.irecv(a50, other, tag=50)
            t = threading.Thread(target=w.wait)
            t.start()
            time.sleep(0.1)
            dist.recv(b50, other, tag=50)
            t.join(10)
            w.wait()
            got.append((float(a50[0]), float(b50[0])))
            # a timeout of a deferred receive, the regular path's words
            with dist.call_timeout(0.2):
                w = dist.irecv(np.zeros(1), other, tag=77)
            got.append(_err(w.wait).split(" on ")[0] + " | " + _err(w.wait).split(": ", 2)[-1])
        out[f"got{paused}"] = got
        dist.barrier()
        # an exchange both ways at once, batch and MPI
        s = np.array([me, 10 + me], np.int32)
        r = np.zeros(2, np.int32)
        ws = dist.batch_isend_irecv([dist.P2POp(dist.isend, s, other, tag=20),
                                     dist.P2POp(dist.irecv, r, other, tag=20)])
        for w in ws:
            w.wait()
        r2 = np.zeros(2, np.int32)
        MPI.Request.Waitall([comm.Irecv(r2, other, 21), comm.Isend(s, other, 21)])
        out[f"exchange{paused}"] = (r.tolist(), ws[1].source_rank(), ws[0].source_rank(), r2.tolist(),
                                    [type(w._handle).__name__ for w in ws])
        # the records of an isend and an irecv: entered until waited, then completed
        dist.barrier()
        w_s = dist.isend(s, other, tag=22)
        w_r = dist.irecv(r, other, tag=22)
        entered = [fields(x) for x in records()[-2:]]
        w_s.wait()
        w_r.wait()
        done = [fields(x) for x in records()[-2:]]
        ws = dist.batch_isend_irecv([dist.P2POp(dist.isend, s, other, tag=23),
                                     dist.P2POp(dist.irecv, r, other, tag=23)])
        b_entered = [fields(x) for x in records()[-2:]]
        for w in ws:
            w.wait()
        out[f"records{paused}"] = (entered, done, b_entered, [fields(x) for x in records()[-2:]])
    if f is not None:
        f.paused = 0
        out["counts"] = (f.sends, f.recvs)
    dist.barrier()
    return out


def _check_nonblocking(res: list) -> None:
    for rank, r in enumerate(res):
        for paused in (0, 1):
            rr, src, dst, r2, kinds = r[f"exchange{paused}"]
            assert rr == [1 - rank, 11 - rank] and src == dst == 1 - rank and r2 == rr, r
            entered, done, b_entered, b_done = r[f"records{paused}"]
            for a, b in ((b_entered, entered), (b_done, done)):   # a batch: the same records
                assert [x[:3] for x in a] == [x[:3] for x in b], (a, b)
                assert all(x[3].split(":")[0].endswith("test_p2p_native.py") for x in a), a
            assert all(x[4] for x in b_done), b_done
            if entered:
                assert [e[:3] for e in entered] == [("isend", 1 - rank, "entered"),
                                                    ("irecv", 1 - rank, "entered")], entered
                assert [e[:3] for e in done] == [("isend", 1 - rank, "completed"),
                                                 ("irecv", 1 - rank, "completed")], done
                assert all(e[3].split(":")[0].endswith("test_p2p_native.py") for e in done), done
                assert all(e[4] for e in done), done
        if rank == 0:
            assert r["got0"] == r["got1"], (r["got0"], r["got1"])
            got = r["got0"]
            assert got[0] == (1.0, 2.0, 1) and got[1] == (4.0, 5.0) and got[2] == (6.0, 7.0), got
            assert got[3][:2] == (False, 8.0), got
            assert got[4] is True and got[5] == (10.0, True), got
            assert got[6] == (11, 1, 11, 1) and got[7] is True and got[8] == (13, 12), got
            assert got[9] == (1.0, 2.0), got
            assert got[10].startswith("CommTimeoutError: irecv from global rank 1 | rank 0 timed out "
                                      "after 0.2 s"), got
            assert r["records0"] == r["records1"]


@pytest.mark.timeout(60)
def test_nonblocking_native_with_python_rank() -> None:
    res = run_ranks(_nonblocking, 2, transport="shm", timeout=50, rank_env={1: {"COLLCOMM_NATIVE": "0"}})
    assert res[0]["native"] and not res[1]["native"]
    _check_nonblocking(res)
    assert res[0]["test_native"] is True
    sends, recvs = res[0]["counts"]
    assert sends >= 3 and recvs >= 10, res[0]["counts"]


@pytest.mark.timeout(60)
def test_nonblocking_both_native() -> None:
    res = run_ranks(_nonblocking, 2, transport="shm", timeout=50)
    assert res[0]["native"] and res[1]["native"]
    _check_nonblocking(res)
    assert res[0]["exchange0"][4] == ["SentWork", "RecvWork"], res[0]["exchange0"]
    sends, recvs = res[1]["counts"]
    assert sends >= 1000, res[1]["counts"]     # the burst went native until the ring was full


def _lost_while_deferred(stamp: str) -> tuple:
    import collcomm as dist

    a = np.zeros(2, np.float64)
    if dist.get_rank() == 1:
        dist.barrier()
        time.sleep(0.3)
        with open(stamp, "w") as fh:
            fh.write(repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)
    w = dist.irecv(a, 1, tag=2)
    kind = type(w._handle).__name__
    dist.barrier()
    try:
        w.wait()
    except Exception as exc:  # noqa: BLE001 - reported
        return kind, type(exc).__name__, str(exc), time.time()
    return kind, "no error", "", time.time()


@pytest.mark.timeout(60)
def test_peer_death_while_deferred_irecv_waits(tmp_path) -> None:
    stamp = str(tmp_path / "killed")
    outcomes = run_ranks(_lost_while_deferred, 2, stamp, transport="shm", timeout=40,
                         expect_failure=True)
    assert outcomes[1].exitcode == -9
    assert outcomes[0].ok, outcomes[0].error
    kind, name, text, when = outcomes[0].value
    assert kind == "RecvWork"
    assert name == "PeerLostError" and text.startswith("irecv from global rank 1 on"), (name, text)
    assert "died" in text, text
    assert when - float(open(stamp).read()) < 5.0
