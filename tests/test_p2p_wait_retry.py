"""A point-to-point work's ``wait(timeout)`` that times out leaves the operation pending:
waited again, it completes (the receive stays posted), over shared memory (where an
``irecv`` is deferred to its wait) and over TCP alike, in the functional API and in the
torch backend. The call timeout (``call_timeout`` / the group's), by contrast, withdraws
and fails the receive."""
from __future__ import annotations

import numpy as np
import pytest

from tests.harness import TORCH, run_ranks, wait_errors


def _retry() -> dict:
    import collcomm as dist
    from collcomm.errors import CollcommError, CommTimeoutError

    me = dist.get_rank()
    out: dict = {}
    if me == 0:
        got = np.zeros(4, np.float64)
        w = dist.irecv(got, 1, tag=3)
        for _ in range(2):                       # two looks, both too early
            try:
                w.wait(timeout=0.2)
            except CommTimeoutError:
                out.setdefault("timeouts", 0)
                out["timeouts"] += 1
        out["pending"] = (w.is_completed(), w.exception())
        dist.barrier()                           # rank 1 sends now
        out["waited"] = (w.wait(), got.tolist(), w.is_success())
        with dist.call_timeout(0.3):             # the call timeout fails it for good
            late = dist.irecv(np.zeros(1), 1, tag=4)
            errors = wait_errors(late, CollcommError)
        out["call timeout"] = (len(errors), type(errors[0]).__name__, errors[0] is errors[1])
        dist.barrier()
    else:
        dist.barrier()
        dist.send(np.arange(4, dtype=np.float64) + 0.5, 0, tag=3)
        dist.barrier()
    return out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_timed_out_wait_can_be_waited_again(transport):
    r0 = run_ranks(_retry, 2, transport=transport, timeout=90)[0]
    assert r0["timeouts"] == 2, r0
    assert r0["pending"] == (False, None), r0
    assert r0["waited"] == (True, [0.5, 1.5, 2.5, 3.5], True), r0
    assert r0["call timeout"] == (2, "CommTimeoutError", True), r0


def _torch_retry() -> dict:
    import torch
    import torch.distributed as dist

    import collcomm.torch  # noqa: F401 - registers the backend

    dist.init_process_group("collcomm")
    out: dict = {}
    if dist.get_rank() == 0:
        got = torch.zeros(3)
        w = dist.irecv(got, 1, tag=5)
        try:
            w.wait(timeout=__import__("datetime").timedelta(seconds=0.2))
        except Exception as exc:  # noqa: BLE001 - its type is checked below
            out["timeout"] = type(exc).__name__
        out["pending"] = (w.is_completed(), w.exception())
        dist.barrier()
        out["waited"] = (w.wait(), got.tolist(), w.is_success(), w.exception())
    else:
        dist.barrier()
        dist.send(torch.tensor([1.0, 2.0, 3.0]), 0, tag=5)
    dist.barrier()
    # a monitored_barrier rank 1 skips fails on rank 0; its timed-out receive is withdrawn,
    # so the next monitored_barrier's token is not swallowed by it
    if dist.get_rank() == 0:
        try:
            dist.monitored_barrier(timeout=__import__("datetime").timedelta(seconds=0.3))
        except Exception as exc:  # noqa: BLE001 - its text is checked below
            out["skipped"] = str(exc)
    dist.barrier()
    dist.monitored_barrier(timeout=__import__("datetime").timedelta(seconds=10))
    out["monitored again"] = True
    dist.destroy_process_group()
    return out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_torch_timed_out_wait_can_be_waited_again(transport):
    pytest.importorskip("torch")
    r0 = run_ranks(_torch_retry, 2, transport=transport, timeout=90, init=False, preload=TORCH)[0]
    assert r0["timeout"].endswith("TimeoutError") or "Timeout" in r0["timeout"], r0
    assert r0["pending"] == (False, None), r0
    assert r0["waited"] == (True, [1.0, 2.0, 3.0], True, None), r0
    assert "Rank 1 failed to pass monitoredBarrier" in r0["skipped"], r0
    assert r0["monitored again"], r0
