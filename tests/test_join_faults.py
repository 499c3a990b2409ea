"""A rank that dies while the job is joining (issue 12's last gap): the others stop waiting
at once with PeerLostError naming it, instead of waiting for the job's timeout.

(When the rank hosting the store, rank 0 of an env:// job, dies before the others reached
it, they cannot tell it from one that has not started yet: the init timeout names it, as
with torch's own TCPStore.)"""
from __future__ import annotations

import os
import time

import pytest

from tests.harness import run_ranks


def die_while_joining(victim: int) -> tuple[str, int | None, float]:
    import collcomm
    import collcomm.core.bootstrap as bootstrap

    if int(os.environ["RANK"]) == victim:
        # it has published itself (JoinWatch) and dies before writing its connection info
        bootstrap.connect_transport = lambda *a, **k: os._exit(3)  # type: ignore[assignment]
    start = time.monotonic()
    try:
        collcomm.init_process_group(timeout=60)
    except collcomm.PeerLostError as exc:
        return type(exc).__name__, exc.peer, time.monotonic() - start
    return "joined", None, time.monotonic() - start


@pytest.mark.parametrize("transport", ["shm", "tcp"])
@pytest.mark.parametrize("victim", [1, 2])   # (rank 0 hosts the store: see below)
def test_rank_dying_while_joining_is_named_at_once(transport: str, victim: int) -> None:
    outcomes = run_ranks(die_while_joining, 3, victim, init=False, expect_failure=True,
                         transport=transport, timeout=45)
    assert outcomes[victim].exitcode == 3
    for o in outcomes:
        if o.rank == victim:
            continue
        assert o.ok, o.error + o.output
        kind, peer, took = o.value
        assert (kind, peer) == ("PeerLostError", victim), o.value
        assert took < 10, took
