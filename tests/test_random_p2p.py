"""Random point-to-point traffic (tests/random_p2p.py, tests/random_p2p_mpi.py,
tests/random_p2p_torch.py): rounds of
messages between random pairs, blocking and not, batched or one by one, any-source
receives, synchronous sends (collcomm.MPI), subgroups, peers by global or group rank,
shared memory and TCP, native and pure-Python ranks; every message checked, a send's
array overwritten once its own wait returns. Fixed seeds (``RANDOM_*`` variables and
``python -m collcomm run -n N tests/random_p2p.py SEED ROUNDS`` run one by hand).
Seed 1 at n = 2 and seed 101 at n = 5 through collcomm.MPI are the jobs that hung before
synchronous sends were acknowledged when matched (core/p2p_sync.py)."""
from __future__ import annotations

from typing import Any

import pytest

from tests import random_p2p, random_p2p_mpi, random_p2p_torch
from tests.random_jobs import run_case

PY = {"COLLCOMM_NATIVE": "0"}

CASES: dict[str, dict[str, Any]] = {
    "pair": {"n": 2, "seed": 5},
    "three-groups": {"n": 3, "seed": 7, "env": {"RANDOM_GROUPS": "1"}},
    "four-groups-python": {"n": 4, "seed": 9, "env": {"RANDOM_GROUPS": "1"}, "rank_env": {0: PY, 3: PY}},
    "three-tcp": {"n": 3, "seed": 4, "transport": "tcp"},
    "mpi-pair-ssend": {"n": 2, "seed": 1, "mpi": True},
    "mpi-five-groups-cycle": {"n": 5, "seed": 101, "env": {"RANDOM_GROUPS": "1"}, "mpi": True, "count": 45},
    "mpi-three-python": {"n": 3, "seed": 13, "env": {"RANDOM_GROUPS": "1"}, "rank_env": {1: PY}, "mpi": True},
    "torch-three-groups-python": {"n": 3, "seed": 403, "env": {"RANDOM_GROUPS": "1"}, "rank_env": {1: PY},
                                  "torch": True, "count": 40},
}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("case", sorted(CASES))
def test_random_p2p_messages_arrive_whole(case: str) -> None:
    assert run_case(CASES[case], random_p2p.run, random_p2p_mpi.run, random_p2p_torch.run, 60,
                    {"COLLCOMM_TIMEOUT": "60"}) == []
