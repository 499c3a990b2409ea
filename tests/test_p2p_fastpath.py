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

from collcomm.transport.engine import Engine
from tests.harness import run_ranks

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
