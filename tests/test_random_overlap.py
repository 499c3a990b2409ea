"""Random point-to-point traffic overlapping random collectives (tests/random_overlap.py):
messages posted, then collectives (blocking, or asynchronous ones still pending), then
the waits; through collcomm's functional API, collcomm.MPI and torch.distributed, and
from several threads of a rank at once (tests/random_threads.py). Fixed
seeds (``RANDOM_*`` variables and ``python -m collcomm run -n N tests/random_overlap.py
SEED STEPS`` run one by hand). Seed 2 at n = 2 is the job whose sender blocked in
``isend`` on a full ring while its receiver waited in ``all_to_all`` (now the backlog,
transport/shm_backlog.py); seed 32 through collcomm.MPI the one whose ``Ssend`` waited
for a receiver in a ``Barrier`` that did not progress point to point (now every arena
wait that sleeps does)."""
from __future__ import annotations

from typing import Any

import pytest

from tests import random_overlap, random_threads
from tests.random_jobs import run_case

PY = {"COLLCOMM_NATIVE": "0"}

CASES: dict[str, dict[str, Any]] = {
    "pair-full-ring": {"n": 2, "seed": 2},
    "mpi-pair-ssend-into-barrier": {"n": 2, "seed": 32, "env": {"RANDOM_FRONT": "mpi"}},
    "four-groups-mixed": {"n": 4, "seed": 11, "env": {"RANDOM_GROUPS": "1", "RANDOM_ASYNC_RANKS": "2"},
                          "rank_env": {0: PY, 3: PY}, "count": 30},
    "torch-pair-async-shared": {"n": 2, "seed": 54, "env": {"RANDOM_FRONT": "torch", "RANDOM_SHARED": "1",
                                                            "RANDOM_ASYNC_RANKS": "1"}, "torch": True},
    # tests/random_threads.py: three threads a rank, each on its own communicator
    "mpi-three-threads-groups": {"n": 3, "seed": 1, "threads": True, "count": 15,
                                 "env": {"RANDOM_THREADS": "3", "RANDOM_GROUPS": "1", "RANDOM_ASYNC_RANKS": "1"}},
}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("case", sorted(CASES))
def test_random_overlap_messages_and_calls_arrive_whole(case: str) -> None:
    run = random_threads.run if CASES[case].get("threads") else random_overlap.run
    assert run_case(CASES[case], run, run, run, 40, {"COLLCOMM_TIMEOUT": "60"}) == []
