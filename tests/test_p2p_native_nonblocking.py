"""The native point-to-point path's non-blocking calls (isend/irecv, batch_isend_irecv,
MPI Isend/Irecv: a send done at once, a receive deferred to its wait, core/p2p.py) keep
every behaviour of the regular path, with a pure-Python peer or a native one; and a rank
killed while its peer's deferred receive waits is reported, not hung on. (The blocking
calls: tests/test_p2p_native.py, whose ``_err`` these share.)
"""
from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

from collcomm import native
from tests.harness import run_ranks
from tests.test_p2p_native import _err

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(native.core is None, reason=f"native core: {native.reason}")]

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
                                       if len(r) == 11 and r[0] == obs.index]   # (p2p)

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


def _as_started(recs: list) -> list:
    """Records taken right after the ops started, an irecv whose message was there already
    (taken at once by the native start, _p2p_batch.c batch_take_now: "completed", its end
    time set) read as one still waiting: which of the two it is depends on timing."""
    return [(op, peer, "entered", where, False) if op == "irecv" and state == "completed"
            else (op, peer, state, where, ended) for op, peer, state, where, ended in recs]


def _check_nonblocking(res: list) -> None:
    for rank, r in enumerate(res):
        for paused in (0, 1):
            rr, src, dst, r2, kinds = r[f"exchange{paused}"]
            assert rr == [1 - rank, 11 - rank] and src == dst == 1 - rank and r2 == rr, r
            entered, done, b_entered, b_done = r[f"records{paused}"]
            entered, b_entered = _as_started(entered), _as_started(b_entered)
            r[f"records{paused}"] = (entered, done, b_entered, b_done)
            for a, b in ((b_entered, entered), (b_done, done)):   # a batch: the same records
                assert [x[:3] for x in a] == [x[:3] for x in b], (a, b)
                assert all(x[3].split(":")[0].endswith("test_p2p_native_nonblocking.py") for x in a), a
            assert all(x[4] for x in b_done), b_done
            if entered:
                assert [e[:3] for e in entered] == [("isend", 1 - rank, "entered"),
                                                    ("irecv", 1 - rank, "entered")], entered
                assert [e[:3] for e in done] == [("isend", 1 - rank, "completed"),
                                                 ("irecv", 1 - rank, "completed")], done
                assert all(e[3].split(":")[0].endswith("test_p2p_native_nonblocking.py") for e in done), done
                assert all(e[4] for e in done), done
        if rank == 0:
            for paused in (0, 1):
                seen, value, before = r[f"got{paused}"][3]
                r[f"got{paused}"][3] = (seen, value, _as_started(before))
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
    # the burst went native until the ring was full (about 960 records of 1 KiB), the rest
    # queued behind them (transport/shm_backlog.py: no native send overtakes the backlog)
    assert sends >= 900, res[1]["counts"]


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
