"""Ctrl-C in a deferred receive's native wait (core/p2p.py ``Deferred``, native/_p2p_own.c)
after its message came: the message is kept.

The native wait of a deferred ``irecv`` receives the message, then takes the engine's
line mutex again to leave the line. A SIGINT while it waits for that mutex (another thread
holds it) raises KeyboardInterrupt; the receive must still count as done (its buffer
holds the message): a second ``wait()`` returns at once. Before the fix the receive was
posted again and waited for a second message (a timeout here; the next message of that
tag, taken out of order, in a real program).
"""
from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import numpy as np
import pytest

from collcomm import native
from tests.harness import run_ranks


def _interrupted_after_the_message() -> list[Any]:
    import collcomm as dist
    from collcomm.core import runtime

    me, other = dist.get_rank(), 1 - dist.get_rank()
    if me == 1:
        dist.barrier()
        time.sleep(0.3)                  # while rank 0 waits natively
        dist.send(np.full(4, 7, np.float32), other, tag=3)
        with dist.call_timeout(20):
            dist.barrier()
        return []
    eng = runtime._world.transport
    got = np.zeros(4, np.float32)
    dist.barrier()
    w = dist.irecv(got, other, tag=3)

    def hold() -> None:                  # the line's mutex, held when the message comes
        time.sleep(0.1)
        with eng._defer_mutex:
            time.sleep(0.8)

    threading.Thread(target=hold).start()
    threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
    out: list[Any] = [type(w).__name__]
    try:
        w.wait()
        out.append("not interrupted")
    except KeyboardInterrupt:
        out.append("interrupted")
    try:
        with dist.call_timeout(1.0):
            w.wait()
        out.append(("done", got.tolist()))
    except Exception as exc:  # noqa: BLE001 - reported
        out.append((type(exc).__name__, got.tolist()))
    with dist.call_timeout(20):
        dist.barrier()
    return out


@pytest.mark.skipif(native.core is None, reason=f"native core: {native.reason}")
@pytest.mark.timeout(60)
def test_ctrl_c_after_the_message_keeps_it() -> None:
    res = run_ranks(_interrupted_after_the_message, 2, transport="shm", timeout=40,
                    env={"COLLCOMM_TIMEOUT": "3"})
    assert res[0][0] == "RecvWork", res[0]
    assert res[0][2] == ("done", [7.0] * 4), res[0]
