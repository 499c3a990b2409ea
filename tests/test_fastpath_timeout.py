"""The fast call's timeout is its group's, whatever the arena held before.

The arena's ``timeout`` (what ``Arena._check`` compares a long wait with) is set per call
by the regular path (``GroupComm.arena()``: the call_timeout scope's value, else the
group's). The fast call sets it only when one of its waits gets long enough to be
checked (native/_arena_sync.c, ``Core.timeout_of``). Here a regular call under a 30 s
``call_timeout`` leaves 30 s in the arena; the fast barrier that follows must still give up
after the group's 3 s.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from collcomm import native
from tests.harness import run_ranks

pytestmark = pytest.mark.skipif(native.core is None, reason=f"native core: {native.reason}")


def _late_after_scope(done: str) -> Any:
    import os
    import time

    import collcomm as dist
    from collcomm.core import runtime
    from collcomm.errors import CommTimeoutError

    g = runtime.get_world("test")
    x = np.ones(2)
    dist.all_reduce(x)                 # the arena and the fast call exist from here
    with dist.call_timeout(30):
        dist.all_reduce(x)             # the regular path: the arena's timeout is 30 s now
    if dist.get_rank() == 1:           # never enters the barrier while rank 0 waits
        deadline = time.monotonic() + 8.0
        while not os.path.exists(done) and time.monotonic() < deadline:
            time.sleep(0.01)
        return "slept"
    assert g.fast is not None and g.fast.paused == 0
    before = g.fast.calls
    t0 = time.monotonic()
    try:
        dist.barrier()
    except CommTimeoutError as exc:
        return {"waited": time.monotonic() - t0, "text": str(exc), "fast": g.fast.calls - before}
    finally:
        open(done, "w").close()
    return "no error"


@pytest.mark.timeout(120)
def test_a_fast_call_times_out_after_its_groups_timeout(tmp_path: Any) -> None:
    res = run_ranks(_late_after_scope, 2, str(tmp_path / "done"), transport="shm", timeout=90,
                    env={"COLLCOMM_TIMEOUT": "3"})
    assert res[1] == "slept"
    out = res[0]
    assert isinstance(out, dict), out
    assert "timed out after 3 s" in out["text"] and "barrier" in out["text"], out
    assert 2.9 < out["waited"] < 8, out       # the group's 3 s, not the scope's 30
    assert out["fast"] == 0, out              # (a failed call does not count as run)
