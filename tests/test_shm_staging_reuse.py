"""A pooled staging segment is reused only once the receiver has acknowledged the message
staged there last (transport/shm_staging.py), never on a "free" flag alone.

The regression (found by test_families' sequence/alternating at n = 5 under load, CI
2026-11-26): a zero written over a pooled segment's busy flag while its message was still
unread let the sender stage the next message over it; the ring all_reduce then delivered
a neighbour's chunk, shifted by the two buffers' page offsets. Here the sender zeroes the
first words of its pooled segment itself, as that stray write did, before staging more
messages than the pool holds; every message must still arrive intact.
"""
from __future__ import annotations

import numpy as np
import pytest

import collcomm.core.runtime as rt
from tests.harness import run_ranks

SIZE = 200_000          # float64 elements: 1.6 MB, above the eager limit (staged)
MESSAGES = 6            # more than the pool's 4 segments


def _payload(i: int) -> np.ndarray:
    return np.arange(SIZE, dtype=np.float64) + 1000.0 * (i + 1)


def stray_zero_then_more() -> list[int]:
    """Rank 0 sends one staged message, zeroes its segment's first 64 bytes (the words a
    flag or an acknowledgement could live in) and sends more; rank 1 receives them all
    only once all are sent. Returns, on rank 1, the indices of the messages that arrived wrong."""
    w = rt.get_world("test")
    t = w.transport
    if w.rank == 0:
        sends = [t.isend(memoryview(_payload(0)).cast("B"), 1, 7)]
        pool = t.channels[1].pool
        assert pool, "the first large message did not go through a pooled segment"
        mm = pool[0][0]
        mm[:64] = bytes(64)                      # the stray write
        sends += [t.isend(memoryview(_payload(i)).cast("B"), 1, 7) for i in range(1, MESSAGES)]
        for h in sends:
            h.wait()
        t.isend(memoryview(np.zeros(1, np.uint8)), 1, 8).wait()   # all sent: go
        t.irecv(memoryview(np.zeros(1, np.uint8)), 1, 9).wait()   # rank 1 is done
        return []
    t.irecv(memoryview(np.zeros(1, np.uint8)), 0, 8).wait()       # the staged ones wait unread
    got = []
    for i in range(MESSAGES):
        buf = np.zeros(SIZE, dtype=np.float64)
        t.irecv(memoryview(buf).cast("B"), 0, 7).wait()
        got.append(buf)
    t.isend(memoryview(np.zeros(1, np.uint8)), 0, 9).wait()
    return [i for i, b in enumerate(got) if not np.array_equal(b, _payload(i))]


@pytest.mark.timeout(120)
def test_stray_zero_cannot_free_a_pooled_segment():
    results = run_ranks(stray_zero_then_more, 2, transport="shm", timeout=90)
    assert results[1] == [], f"messages {results[1]} arrived overwritten"


def test_pool_capacity():
    from collcomm.transport.shm_staging import POOL_BIG, POOL_MAX, pool_capacity

    mib = 1 << 20
    assert pool_capacity(1) == mib and pool_capacity(mib + 1) == 2 * mib
    assert pool_capacity(8 * mib) == 8 * mib and pool_capacity(5 * mib) == 8 * mib
    assert pool_capacity(8 * mib + 1) == 10 * mib           # eighths of 16 MiB
    assert pool_capacity(64 * mib + 8192) == 80 * mib        # a 64 MiB body at a page offset
    assert POOL_MAX < pool_capacity(64 * mib + 8192) <= POOL_BIG
    for need in (3, 4097, 9 * mib + 17, 200 * mib + 1):
        assert pool_capacity(need) >= need


BIG = 9_000_000   # float64 elements: 72 MB, past POOL_MAX


def big_messages() -> list[int]:
    """Rank 0 sends three bodies past POOL_MAX one after another (each received before the
    next is sent); they share one pooled segment (up to POOL_BIG), not a new one each."""
    w = rt.get_world("test")
    t = w.transport
    if w.rank == 0:
        for i in range(3):
            t.isend(memoryview(np.arange(BIG, dtype=np.float64) + i).cast("B"), 1, 7).wait()
            t.irecv(memoryview(np.zeros(1, np.uint8)), 1, 8).wait()
        ch = t.channels[1]
        return [ch.n_segments, len(ch.pool)]
    bad = []
    for i in range(3):
        buf = np.zeros(BIG, dtype=np.float64)
        t.irecv(memoryview(buf).cast("B"), 0, 7).wait()
        if not np.array_equal(buf, np.arange(BIG, dtype=np.float64) + i):
            bad.append(i)
        t.isend(memoryview(np.zeros(1, np.uint8)), 0, 8).wait()
    return bad


@pytest.mark.timeout(120)
def test_a_body_past_pool_max_reuses_one_pooled_segment():
    from collcomm.transport.shm_segments import shm_budget

    if shm_budget() < 4 * 80 << 20:
        pytest.skip("/dev/shm too small for an 80 MiB pooled segment")
    results = run_ranks(big_messages, 2, transport="shm", timeout=90)
    assert results[1] == []
    assert results[0] == [1, 1], results[0]     # one segment made, and it is pooled


MID = 2_500_000   # float64 elements: 20 MB, more than the small segments hold


def pool_full_of_small_then_larger() -> list:
    """Rank 0 fills its pool with four small segments (four staged messages unread at once),
    then, once all are read, sends a larger body twice: the larger one takes the slot of a
    free small segment (one new segment, reused the second time) rather than a one-off
    segment every time, and the receiver unmaps the segment it replaced."""
    w = rt.get_world("test")
    t = w.transport
    go = lambda: t.isend(memoryview(np.zeros(1, np.uint8)), 1 - w.rank, 8).wait()   # noqa: E731
    wait = lambda: t.irecv(memoryview(np.zeros(1, np.uint8)), 1 - w.rank, 8).wait()  # noqa: E731
    if w.rank == 0:
        for h in [t.isend(memoryview(_payload(i)).cast("B"), 1, 7) for i in range(4)]:
            h.wait()
        go()
        wait()
        ch = t.channels[1]
        before = (ch.n_segments, len(ch.pool))
        for i in range(2):
            t.isend(memoryview(np.arange(MID, dtype=np.float64) - i).cast("B"), 1, 7).wait()
            wait()
        return [before, (ch.n_segments, len(ch.pool)), max(cap for _, cap, _ in ch.pool) >= MID * 8]
    wait()
    bad = [i for i in range(4) if not _recv_equal(t, _payload(i))]
    go()
    for i in range(2):
        if not _recv_equal(t, np.arange(MID, dtype=np.float64) - i):
            bad.append(4 + i)
        go()
    return [bad, len(t.channels[0].mapped)]


def _recv_equal(t, want: np.ndarray) -> bool:
    buf = np.zeros(want.size, dtype=want.dtype)
    t.irecv(memoryview(buf).cast("B"), 0, 7).wait()
    return bool(np.array_equal(buf, want))


@pytest.mark.timeout(120)
def test_a_larger_body_replaces_a_free_small_pooled_segment():
    res = run_ranks(pool_full_of_small_then_larger, 2, transport="shm", timeout=90)
    assert res[1] == [[], 4], res[1]                      # all intact; four mappings, not five
    assert res[0] == [(4, 4), (5, 4), True], res[0]      # one new segment, in a replaced slot
