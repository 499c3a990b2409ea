"""A point-to-point work's ``wait(timeout)`` that times out leaves the operation pending:
waited again, it completes (the receive stays posted), over shared memory (where an
``irecv`` is deferred to its wait) and over TCP alike. The call timeout
(``call_timeout`` / the group's), by contrast, withdraws and fails the receive."""
from __future__ import annotations

import numpy as np
import pytest

from tests.harness import run_ranks


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
            errors = []
            for _ in range(2):
                try:
                    late.wait()
                except CollcommError as exc:
                    errors.append(exc)
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
