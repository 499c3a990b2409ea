"""A rank that sends a large message and leaves at once must not take the body with it.

A body staged outside the ring (a one-off tmpfs segment, or PRIVATE memory the receiver
reads by cross-memory attach) lives only as long as the sender keeps it: ``ShmChannel.close``
waits while the peer is alive and has yet to read such a record, bounded by the job timeout,
not only by the short linger that covers ring records, and says once that it waits. The tests shrink that linger to 0.3 s
and make the receiver start reading 2 s after the sender left: a close that stops waiting
after the linger loses the message (PeerLostError naming the segment or "Bad address").
"""
from __future__ import annotations

import os
import time
import warnings

import numpy as np
import pytest

from tests.harness import run_ranks

NBYTES = 20 << 20        # past the pool under a 64 MiB budget: PRIVATE, or (no CMA) a one-off segment


def _send_then_leave() -> str:
    import collcomm
    import collcomm.transport.shm_staging as staging
    from collcomm.transport.shm import ShmChannel

    ShmChannel.close.__defaults__ = (0.3,)   # the linger for ring records, made short
    if collcomm.get_rank() == 0:
        staging.shm_budget = lambda: 64 << 20
        channel = collcomm.core.runtime._job.transport.channels[1]
        if not channel.peer_reads_me() and os.environ.get("COLLCOMM_CMA") != "0":
            return "no cma"
        payload = np.arange(NBYTES // 4, dtype=np.int32)
        collcomm.send(payload, dst=1)
        kind = "private" if channel.held else "segment" if channel.created else "other"
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            collcomm.destroy_process_group()     # leaves before rank 1 has read the message
        assert any("waits (up to" in str(w.message) for w in said), [str(w.message) for w in said]
        return kind
    time.sleep(2.0)                          # the sender has closed by now (linger 0.3 s)
    got = np.empty(NBYTES // 4, dtype=np.int32)
    collcomm.recv(got, src=0)
    assert np.array_equal(got, np.arange(NBYTES // 4, dtype=np.int32))
    return "read"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("cma,kind", [("0", "segment"), ("1", "private")])
def test_a_sender_that_left_still_delivers_its_staged_message(cma: str, kind: str) -> None:
    sent, read = run_ranks(_send_then_leave, 2, transport="shm", timeout=45, env={"COLLCOMM_CMA": cma})
    if sent == "no cma":
        pytest.skip("cross-memory attach is not permitted here (no PRIVATE path)")
    assert (sent, read) == (kind, "read")


def _unread_then_both_leave() -> float:
    import collcomm
    import collcomm.transport.shm_staging as staging

    if collcomm.get_rank() == 0:
        staging.shm_budget = lambda: 64 << 20        # past the pool: PRIVATE (or one-off)
        collcomm.send(np.ones(NBYTES // 4, dtype=np.int32), dst=1)
        collcomm.barrier()                           # rank 1 leaves after this, unread
        time.sleep(0.5)
        t0 = time.monotonic()
        collcomm.destroy_process_group()
        return time.monotonic() - t0
    collcomm.barrier()
    collcomm.destroy_process_group()                 # leaves without reading it, stays alive
    time.sleep(6.0)
    return 0.0


@pytest.mark.timeout(60)
def test_a_sender_does_not_wait_for_a_peer_that_left() -> None:
    # the peer closed its side (it reads no more) but its process lives on: waiting for it
    # to read would last until the job timeout (or its exit)
    took, _ = run_ranks(_unread_then_both_leave, 2, transport="shm", timeout=45)
    assert took < 3.0, took


def _released_copies_go() -> list[int]:
    import collcomm
    import collcomm.transport.shm_staging as staging

    channel = collcomm.core.runtime._job.transport.channels[1 - collcomm.get_rank()]
    if collcomm.get_rank() == 0:
        if not channel.peer_reads_me():
            return [-1, -1]
        staging.shm_budget = lambda: 64 << 20
        collcomm.send(np.ones(NBYTES // 4, dtype=np.int32), dst=1)
        held = len(channel.held)
        collcomm.barrier()                           # rank 1 has read (and released) it
        collcomm.send(np.ones(4, dtype=np.int32), dst=1)
        channel.engine.progress()                    # the next poll (any wait's first step) drops it
        return [held, len(channel.held)]
    got = np.empty(NBYTES // 4, dtype=np.int32)
    collcomm.recv(got, src=0)
    collcomm.barrier()
    collcomm.recv(np.empty(4, dtype=np.int32), src=0)
    return [int(got.sum() == NBYTES // 4), 0]


@pytest.mark.timeout(60)
def test_a_released_private_copy_is_freed_by_the_next_poll() -> None:
    held, after = run_ranks(_released_copies_go, 2, transport="shm", timeout=45)[0]
    if held == -1:
        pytest.skip("cross-memory attach is not permitted here (no PRIVATE path)")
    assert (held, after) == (1, 0)


def _sender_fails_while_peer_waits() -> tuple[str, float]:
    import collcomm
    import collcomm.transport.shm_staging as staging

    if collcomm.get_rank() == 0:
        staging.shm_budget = lambda: 64 << 20
        collcomm.send(np.ones(NBYTES // 4, dtype=np.int32), dst=1)
        collcomm.destroy_process_group()             # (as a `finally:` after an error would)
        return "left", 0.0
    t0 = time.monotonic()
    try:
        collcomm.barrier()                           # rank 0 never comes
    except collcomm.CollcommError as exc:
        return type(exc).__name__ + ": " + str(exc), time.monotonic() - t0
    return "no error", time.monotonic() - t0


@pytest.mark.timeout(60)
def test_a_peer_waiting_in_a_collective_hears_at_once_that_the_sender_left() -> None:
    # rank 0 waits in close for rank 1 to read its message (rank 1 lives); rank 1, waiting
    # for rank 0 in a barrier, must not wait out the job timeout for a rank that left (the
    # transport's health word says rank 0 is closing as soon as its close begins)
    _, (what, took) = run_ranks(_sender_fails_while_peer_waits, 2, transport="shm", timeout=45,
                                env={"COLLCOMM_TIMEOUT": "30"})
    assert what.startswith("PeerLostError") and "left the job" in what and took < 5.0, (what, took)
