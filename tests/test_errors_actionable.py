"""Errors a user can act on (issue 9, item 5): collcomm errors that name the call, the
group, the rank and the late or lost peer, where internals used to leak raw OS errors."""
from __future__ import annotations

import os
import time

import numpy as np
import pytest

from tests.harness import run_ranks


def said(meet: str, what: str) -> None:
    """This rank says ``what`` happened (a file in the folder ``meet``)."""
    open(os.path.join(meet, what), "w").close()


def await_said(meet: str, whats: list[str], limit: float) -> None:
    """Until every one of ``whats`` was said, ``limit`` seconds at most (polled)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline and not all(
            os.path.exists(os.path.join(meet, w)) for w in whats):
        time.sleep(0.01)


def work_wait_names_the_late_rank(meet):
    import collcomm as dist

    rank, n = dist.get_rank(), dist.get_world_size()
    x = np.ones(4)
    if rank == n - 1:
        # late: comes once the others' Work.wait(1.5) timed out (4 s at most)
        await_said(meet, [f"timed-out-{r}" for r in range(n - 1)], 4.0)
        dist.all_reduce(x)
        return "late", None, x.tolist()
    work = dist.all_reduce(x, async_op=True)
    try:
        work.wait(timeout=1.5)
        return "no timeout", None, None
    except dist.CommTimeoutError as exc:
        msg, peer = str(exc), exc.peer
    said(meet, f"timed-out-{rank}")
    work.wait()                         # the call went on and completes once the late rank comes
    return msg, peer, x.tolist()


@pytest.mark.timeout(90)
def test_work_wait_timeout_names_group_and_late_rank(tmp_path):
    out = run_ranks(work_wait_names_the_late_rank, 3, str(tmp_path), timeout=60)
    for msg, peer, x in out[:2]:
        assert "Work.wait timed out after 1.5 s" in msg, msg
        assert "group 'WORLD'" in msg and "rank" in msg, msg
        assert "ranks [2] never entered it" in msg, msg
        assert peer == 2, (peer, msg)
        assert x == [3.0] * 4
    assert out[2][2] == [3.0] * 4


def late_for_the_arena(delay, meet):
    import collcomm as dist

    rank = dist.get_rank()
    if rank == 1:   # comes once rank 0 gave up (``delay`` at most)
        await_said(meet, ["gave-up-0"], delay)
    x = np.ones(4)
    try:
        with dist.call_timeout(1.5):
            dist.all_reduce(x)
        result = ("ok", "")
    except Exception as exc:  # noqa: BLE001 - the test looks at what it was
        result = (type(exc).__name__, str(exc), isinstance(exc, dist.CollcommError))
    said(meet, f"gave-up-{rank}")
    if rank == 0:                       # still here when rank 1 comes, until it is done
        await_said(meet, ["gave-up-1"], delay + 2)
    return result


@pytest.mark.timeout(90)
def test_a_rank_late_for_the_arena_gets_a_collcomm_error(tmp_path):
    # rank 0 creates the group's arena, times out waiting for rank 1 and removes it; rank 1
    # then finds no segment: it used to get a raw FileNotFoundError on /dev/shm/...-arena-...
    out = run_ranks(late_for_the_arena, 2, 4.0, str(tmp_path), transport="shm", timeout=60)
    assert out[0][0] == "CommTimeoutError" and "rank 1" in out[0][1], out[0]
    kind, msg, is_collcomm = out[1]
    assert is_collcomm and kind != "FileNotFoundError", out[1]
    assert "all_reduce on group 'WORLD'" in msg and "rank 0" in msg.lower(), msg


def uneven_all_to_all_single():
    import collcomm as dist

    r, n = dist.get_rank(), dist.get_world_size()
    inp = np.arange(n * (r + 1), dtype=np.float64)       # rank r sends r+1 elements to each
    out = np.empty(n * (r + 1))
    try:
        dist.all_to_all_single(out, inp)
        return "ok", ""
    except Exception as exc:  # noqa: BLE001 - the test looks at what it was
        return type(exc).__name__, str(exc)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_uneven_all_to_all_chunks_are_a_mismatch_not_a_numpy_error(transport):
    for kind, msg in run_ranks(uneven_all_to_all_single, 2, transport=transport, timeout=40,
                               env={"COLLCOMM_TIMEOUT": "20"}):
        assert kind == "MismatchError", (kind, msg)
        assert "all_to_all_single on group 'WORLD'" in msg, msg
