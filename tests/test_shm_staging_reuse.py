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
