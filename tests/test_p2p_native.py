"""The native point-to-point path (native/_p2p.c, core/p2p.py ``native``) keeps every
behaviour of the regular path.

One job of two ranks, rank 1 without the native core (``COLLCOMM_NATIVE=0``), so every
message goes native → Python in one direction and Python → native in the other; on the
native rank each error is also produced with the native path paused (the regular path
in the same process) and the texts compared. A second job kills a rank while its peer
waits in a native receive. The non-blocking calls: tests/test_p2p_native_nonblocking.py.
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
                                       if len(r) == 11 and r[0] == obs.index]   # (p2p)

    def fields(r: list) -> tuple:    # (C's records are Record objects that read as the list)
        return (len(r), r[1], r[2], r[3], r[4], where(r[5], r[6]), r[8],
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
            mine = [r for r in ring if len(r) == 11 and r[0] == obs.index]
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
    assert [(r[2], r[7]) for r in native_recs] == [
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


def _c_record() -> dict:
    """A point-to-point record made in C (P2P.note: a Record, native/_record_rec.c) read,
    ended and refused as the list Observer.p2p appends would be."""
    import collcomm as dist
    import collcomm.core.runtime as rt
    from collcomm.core import p2p
    from collcomm.core.recorder_records import COMPLETED, ENTERED, R_PEER, R_PSTATE, R_PT1, R_T0

    me = dist.get_rank()
    dist.batch_isend_irecv([dist.P2POp(dist.isend, np.zeros(1), 1 - me),    # (the pipes made)
                            dist.P2POp(dist.irecv, np.zeros(1), 1 - me)])[1].wait()
    g = rt.get_world("test")
    rec = p2p.native(g).note(False, 1 - me)
    out = {"type": type(rec).__name__, "len": len(rec), "list": list(rec)[:5] + list(rec)[8:10],
           "peer": (rec[R_PEER], rec[-3]), "entered": rec[R_PSTATE] == ENTERED,
           "t": (type(rec[R_T0]).__name__, rec[R_T0] > 0, rec[R_PT1]),
           "in_ring": any(r is rec for r in g.observer.rec.ring),
           "repr": repr(rec) == repr(list(rec))}
    p2p.finished(rec, True)                # (core/p2p.py: rec[R_PSTATE], rec[R_PT1] = ...)
    out["ended"] = (rec[R_PSTATE] == COMPLETED, rec[R_PT1] >= rec[R_T0])
    refused = []
    for key, value in ((R_PEER, 3), (R_PSTATE, "lost"), (11, 0.0)):
        try:
            rec[key] = value
        except (TypeError, ValueError, IndexError) as exc:
            refused.append(type(exc).__name__)
    out["refused"] = refused
    dist.barrier()
    return out


@pytest.mark.timeout(60)
def test_a_record_made_in_c_reads_as_the_list() -> None:
    for me, out in enumerate(run_ranks(_c_record, 2, transport="shm", timeout=45)):
        assert out == {"type": "Record", "len": 11, "list": [out["list"][0], 0, "isend", 0, 0,
                                                             1 - me, "entered"],
                       "peer": (1 - me, 1 - me), "entered": True, "t": ("float", True, 0.0),
                       "in_ring": True, "repr": True, "ended": (True, True),
                       "refused": ["TypeError", "ValueError", "IndexError"]}, out


def test_locks_are_taken_directly_where_the_layout_allows():
    """CPython 3.10-3.13.0 (not free-threaded): the channels' threading.Locks are tried in C
    without their methods (native/_thread_locks.c, thread_locks_init's probe on a fresh lock); from
    3.13.1 a lock is another struct (a PyMutex: 24 bytes, not 40), and 3.14 and
    free-threaded builds take the methods."""
    import sys
    import sysconfig
    import threading

    native = pytest.importorskip("collcomm.native._shmcore")
    direct = (sys.version_info < (3, 14) and not sysconfig.get_config_var("Py_GIL_DISABLED")
              and type(threading.Lock()).__basicsize__ == 40)
    assert native.P2P_DIRECT_LOCKS == int(direct)
