"""Small asynchronous collectives in two parts (native/_fastcall_parts.c): their errors.

A mismatch raised by ``wait`` (and by the blocking call of a rank that made it
synchronously), the group usable after it; a lost peer raised by ``wait``. (How they
progress: tests/test_async_two_part.py.)
"""
from __future__ import annotations

import os

import numpy as np
import pytest

from tests.harness import run_ranks


def _mismatch() -> list[str]:
    """Rank 1 calls with another dtype (the same bytes): asynchronously on every rank,
    then with rank 1 synchronous and the others asynchronous; the group stays usable."""
    import collcomm as dist

    me, n = dist.get_rank(), dist.get_world_size()
    dist.all_reduce(np.ones(1))
    seen = []
    for rank1_sync in (False, True):
        x = np.ones(4, np.int32 if me == 1 else np.float32)
        try:
            if me == 1 and rank1_sync:
                dist.all_reduce(x)
            else:
                dist.all_reduce(x, async_op=True).wait()
            seen.append("no error")
        except dist.MismatchError as exc:
            seen.append("MismatchError" if "float32" in str(exc) and "int32" in str(exc) else str(exc))
        t = np.full(2, me + 1.0)
        dist.all_reduce(t, async_op=True).wait()
        seen.append("usable" if t.tolist() == [n * (n + 1) / 2] * 2 else str(t))
    try:                                   # a barrier against an all_reduce
        (dist.barrier(async_op=True) if me == 1 else dist.all_reduce(np.ones(2), async_op=True)).wait()
        seen.append("no error")
    except dist.MismatchError as exc:
        seen.append("MismatchError" if "barrier" in str(exc) else str(exc))
    return seen


@pytest.mark.timeout(120)
def test_a_mismatch_is_raised_by_wait() -> None:
    for seen in run_ranks(_mismatch, 3, transport="shm", timeout=90):
        assert seen == ["MismatchError", "usable"] * 2 + ["MismatchError"], seen


def _lost_peer() -> str:
    import collcomm as dist

    me = dist.get_rank()
    dist.all_reduce(np.ones(1))
    if me == 1:
        os._exit(3)                                     # dies without entering the call
    w = dist.all_reduce(np.ones(2), async_op=True)
    try:
        w.wait()
    except dist.PeerLostError as exc:
        return f"PeerLostError: {exc}"
    return "no error"


@pytest.mark.timeout(120)
def test_a_lost_peer_is_raised_by_wait() -> None:
    got = run_ranks(_lost_peer, 2, transport="shm", timeout=60, expect_failure=True)[0]
    assert got.ok and got.value.startswith("PeerLostError") and "rank 1" in got.value, got
