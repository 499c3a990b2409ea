"""The fast call's errors (collcomm/core/fastpath.py, collcomm/native/_fastcall.c) are the
regular path's: a timeout naming the missing rank and where it is, bad input refused with
the regular errors (the ranks still agree on their sequence after), a killed peer noticed
by a fast barrier as a PeerLostError. (Mismatches: tests/test_fastpath.py.)
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

from collcomm import native
from tests.fastpath_common import _calls
from tests.harness import line_of, run_ranks

pytestmark = pytest.mark.skipif(native.core is None, reason=f"native core: {native.reason}")


def _one_skips(done: str) -> Any:
    import time

    import collcomm as dist
    from collcomm.errors import CommTimeoutError

    x = np.ones(2)
    dist.all_reduce(x)
    if dist.get_rank() == 1:
        dist.all_reduce(x)   # the last call rank 1 makes
        deadline = time.monotonic() + 8.0   # then it never enters the next one (and stays
        while not os.path.exists(done) and time.monotonic() < deadline:   # for the report
            time.sleep(0.01)                # that asks it, until rank 0 has its error)
        return "slept"
    dist.all_reduce(x)
    try:
        dist.all_reduce(x)   # the waiting call: #3
    except CommTimeoutError as exc:
        return str(exc)
    finally:
        open(done, "w").close()
    return "no error"


@pytest.mark.timeout(120)
def test_a_timeout_names_the_missing_rank_and_its_line(tmp_path: Any) -> None:
    res = run_ranks(_one_skips, 2, str(tmp_path / "done"), transport="shm", timeout=90,
                    env={"COLLCOMM_TIMEOUT": "3"})
    text = res[0]
    assert res[1] == "slept"
    assert "timed out" in text and "all_reduce" in text, text
    assert "rank 1" in text, text
    line = line_of(__file__, "# the last call rank 1 makes")
    assert f"test_fastpath_errors.py:{line}" in text, text


def _bad_input() -> Any:
    import collcomm as dist
    from collcomm.errors import InvalidArgumentError

    dist.all_reduce(np.ones(2))
    texts = []
    for call in (lambda: dist.all_reduce(np.ones(4)[::2]),
                 lambda: dist.all_gather_into_tensor(np.ones(3), np.ones(2)),
                 lambda: dist.broadcast(np.ones(2), src=5),
                 lambda: dist.all_reduce(np.ones(2), op=dist.ReduceOp.BAND)):
        try:
            call()
            texts.append("no error")
        except (InvalidArgumentError, ValueError) as exc:
            texts.append(str(exc))
    x = np.ones(2)
    dist.all_reduce(x)      # the ranks still agree on their sequence
    return texts + [x.tolist()]


@pytest.mark.timeout(120)
def test_bad_input_still_gets_the_regular_errors() -> None:
    res = run_ranks(_bad_input, 2, transport="shm", timeout=60)
    for texts in res:
        assert all(t != "no error" for t in texts[:4]), texts
        assert "contiguous" in texts[0] or "stride" in texts[0], texts[0]
        assert "src" in texts[2] or "rank" in texts[2], texts[2]
        assert "BAND" in texts[3] and "float64" in texts[3], texts[3]
        assert texts[4] == [2.0, 2.0]


def _barrier_peer_killed() -> Any:
    import time

    import collcomm as dist
    from collcomm.errors import CollcommError

    dist.barrier()
    before = _calls()
    dist.barrier()                       # fast on both ranks
    if dist.get_rank() == 1:
        time.sleep(30)                   # killed by the harness meanwhile
        return "not killed"
    start = time.monotonic()
    try:
        dist.barrier()                   # the peer never comes: it was killed
    except CollcommError as exc:
        return type(exc).__name__, str(exc), _calls() - before, time.monotonic() - start
    return "no error"


@pytest.mark.timeout(120)
def test_a_fast_barrier_notices_a_killed_peer() -> None:
    res = run_ranks(_barrier_peer_killed, 2, transport="shm", timeout=60, expect_failure=True,
                    kill={1: 1.5}, env={"COLLCOMM_TIMEOUT": "20"})
    o = res[0]
    assert o.ok, (o.error_type, o.error, o.output)
    kind, text, calls, waited = o.value
    assert calls == 1, o.value           # the first barrier fast; the third failed in it
    assert kind == "PeerLostError" and "barrier" in text and "rank 1" in text, o.value
    assert waited < 10, o.value
