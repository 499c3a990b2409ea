"""The lighter point-to-point path (docs/p2p-latency.md) keeps its behaviour.

* A request makes its event only when a waiter blocks: a completion from another thread
  still wakes a blocked waiter, and a request completed before its event was made hands
  out a set event (no lost wake-up).
* ``collcomm.send`` / ``recv`` no longer build a P2PWork: their errors carry the same
  context and words as ``isend(...).wait()`` / ``irecv(...).source_rank()``.
"""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from collcomm import native
from collcomm.transport.engine import Engine
from tests.harness import run_ranks, wait_errors

pytestmark = pytest.mark.timeout(120)


def _mv(a: np.ndarray) -> memoryview:
    return memoryview(a.reshape(-1).view(np.uint8))


def test_blocked_waiter_is_woken_by_another_thread() -> None:
    eng = Engine(0, 1, 10.0)       # loopback: no channel polls, so the waiter blocks
    try:
        got = np.zeros(4, np.int32)
        req = eng.irecv(_mv(got), 0, 7)
        assert req.event is None          # nothing made until somebody blocks
        sent = np.arange(4, dtype=np.int32)

        def later() -> None:
            time.sleep(0.05)
            eng.isend(_mv(sent), 0, 7).wait()

        t = threading.Thread(target=later)
        t.start()
        st = req.wait(5.0)
        t.join()
        assert (st.source, st.nbytes, st.tag) == (0, 16, 7)
        assert list(got) == [0, 1, 2, 3]
        assert req.event is not None and req.event.is_set()
    finally:
        eng.close()


def test_event_made_after_completion_is_set() -> None:
    eng = Engine(0, 1, 10.0)
    try:
        got = np.zeros(1, np.int64)
        req = eng.irecv(_mv(got), 0, 3)
        eng.isend(_mv(np.array([5], np.int64)), 0, 3)
        assert req.done and req.event is None
        assert req._event().is_set()
        failed = eng.irecv(_mv(got), 0, 4)
        failed.fail(RuntimeError("x"))
        assert failed._event().is_set()
    finally:
        eng.close()


def _errors() -> list[str]:
    import collcomm as dist
    from collcomm.errors import CollcommError

    r = dist.get_rank()
    out: list[str] = []
    if r == 0:
        for _ in range(2):
            dist.send(np.arange(3, dtype=np.float32), 1)
    else:
        for how in ("recv", "work"):
            small = np.zeros(5, np.float32)
            try:
                if how == "recv":
                    dist.recv(small, 0)
                else:
                    dist.irecv(small, 0).source_rank()
            except CollcommError as exc:
                out.append(f"{type(exc).__name__}: {exc}")
        for how in ("recv", "work"):
            with dist.call_timeout(0.3):
                try:
                    if how == "recv":
                        dist.recv(np.zeros(1), 0, tag=77)
                    else:
                        dist.irecv(np.zeros(1), 0, tag=77).wait()
                except CollcommError as exc:
                    out.append(f"{type(exc).__name__}: {str(exc).split(';')[0]}")
    dist.barrier()
    return out


def test_send_recv_errors_read_as_the_work_handles_do() -> None:
    res = run_ranks(_errors, 2, transport="shm")
    size_recv, size_work, time_recv, time_work = res[1]
    assert size_recv == size_work
    assert "irecv from global rank 0 on" in size_recv and "sizes must match" in size_recv
    assert time_recv == time_work
    assert time_recv.startswith("CommTimeoutError: irecv from global rank 0 on")


def _native_works() -> dict:
    import collcomm as dist
    from collcomm.core import p2p, runtime
    from collcomm.errors import CollcommError

    me, other = dist.get_rank(), 1 - dist.get_rank()
    g = runtime.get_world("test")
    f, eng = p2p.native(g), g.transport
    ch = eng.channels[other]
    out: dict = {}
    s, r = np.array([me, 10 + me], np.int32), np.zeros(2, np.int32)
    recvs = f.recvs     # (the receive may be taken by the batch: its message there already)
    ws = dist.batch_isend_irecv([dist.P2POp(dist.isend, s, other, tag=3),
                                 dist.P2POp(dist.irecv, r, other, tag=3)])
    before = [(w.is_success(), w.exception()) for w in ws]
    for w in ws:
        w.wait()
    out["batch"] = (before, [(w.is_success(), w.is_completed(), w.source_rank()) for w in ws],
                    r.tolist(), f.recvs - recvs, list(eng._deferred),
                    [type(w).__name__ for w in ws])
    # every lock the native calls took is free again; a held one makes them decline
    out["locks"] = [lk.locked() for lk in (ch.send_lock, ch.poll_lock, eng._defer_mutex)]
    ch.send_lock.acquire()
    out["busy send"] = f.send(s, other, 9, 0)
    ch.send_lock.release()
    dist.barrier()
    if me == 0:
        d = dist.irecv(np.zeros(1, np.int64), other, tag=4)
        eng._defer_mutex.acquire()       # another thread posting: own() leaves it alone
        out["own busy"] = (f.own(d), d.waiting, list(eng._deferred) == [d])
        eng._defer_mutex.release()
        dist.barrier()
        d.wait()
        # a wait under its own timeout (posted, the regular path) leaves the receive
        # pending: waited again, it gets the message sent meanwhile; a size error is kept
        got5 = np.zeros(1, np.float64)
        w = dist.irecv(got5, other, tag=5)
        try:
            w.wait(timeout=0.2)
        except CollcommError as exc:
            out["timeout"] = f"{type(exc).__name__}: {str(exc).split(';')[0]}"
        out["pending after timeout"] = (w.is_completed(), w.exception())
        dist.barrier()
        out["retried"] = (w.wait(timeout=30), got5.tolist(), w.is_success())
        w = dist.irecv(np.zeros(3, np.float64), other, tag=6)
        errs = wait_errors(w, CollcommError)
        out["size"] = (len(errs), errs[0] is errs[1], type(errs[0]).__name__, str(errs[0]),
                       w.exception() is errs[0], w.is_success())
    else:
        dist.barrier()
        dist.send(np.array([4], np.int64), other, tag=4)
        dist.barrier()
        dist.send(np.array([5.0]), other, tag=5)
        dist.send(np.array([6.0]), other, tag=6)
    # a batch of sends larger than the ring: C writes what fits, the rest goes op by op
    # (the regular path waits for room), all in order
    dist.barrier()
    if me == 0:
        sends = [np.full(8192, float(i), np.float32) for i in range(40)]
        ws = dist.batch_isend_irecv([dist.P2POp(dist.isend, x, other, tag=12) for x in sends])
        for w in ws:
            w.wait()
        kinds = [type(w).__name__ for w in ws]
        out["overflow"] = (len(ws), kinds[0], "P2PWork" in kinds)
    else:
        time.sleep(0.2)
        x = np.zeros(8192, np.float32)
        ok = []
        for i in range(40):
            dist.recv(x, other, tag=12)
            ok.append(bool((x == i).all()))
        out["overflow"] = all(ok)
    dist.barrier()
    return out


@pytest.mark.skipif(native.core is None, reason=f"native core: {native.reason}")
def test_native_works_behave_as_the_regular_ones() -> None:
    """batch_isend_irecv / irecv on the native path: a SentWork and a RecvWork (one object
    per op), the receive done by one C call (``P2P.own``) that frees every lock it took."""
    res = run_ranks(_native_works, 2, transport="shm", timeout=60)
    for rank, out in enumerate(res):
        before, after, got, native_recvs, held, kinds = out["batch"]
        assert before == [(False, None), (False, None)], before
        assert after == [(True, True, 1 - rank), (True, True, 1 - rank)], after
        assert got == [1 - rank, 11 - rank] and native_recvs == 1 and held == [], out
        assert kinds == ["SentWork", "RecvWork"], kinds
        assert out["locks"] == [False, False, False] and out["busy send"] is None, out
    r0 = res[0]
    assert r0["own busy"] == (False, False, True), r0
    assert r0["timeout"].startswith("CommTimeoutError: irecv from global rank 1 on"), r0
    assert r0["pending after timeout"] == (False, None), r0
    assert r0["retried"] == (True, [5.0], True), r0
    n, same, name, text, kept, ok = r0["size"]
    assert (n, same, name, kept, ok) == (2, True, "MismatchError", True, False), r0
    assert text.startswith("irecv from global rank 1 on") and "received 8 bytes, expected 24" in text
    assert r0["overflow"] == (40, "SentWork", True) and res[1]["overflow"] is True, res
