"""What the fault tests (tests/test_faults*.py) share: the transports they run on and
:func:`hold`, which their rank bodies call to stay in the job until every rank has its
outcome.
"""
from __future__ import annotations

import os
import time

import collcomm as dist

TRANSPORTS = ["shm", "tcp"]


def hold(meet: str | None, count: int, limit: float) -> None:
    """Say this rank is done (a file in the folder ``meet``), then stay until ``count``
    ranks said so, ``limit`` seconds at most: no rank leaves (which its peers could see as a
    lost peer) before every rank it waits for has its own outcome. Polls, so it costs no
    more than the slowest rank, however loaded the machine."""
    if meet is None:
        return
    open(os.path.join(meet, f"done-{dist.get_rank()}"), "w").close()
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if sum(name.startswith("done-") for name in os.listdir(meet)) >= count:
            return
        time.sleep(0.01)
