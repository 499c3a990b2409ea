"""Random calls (tests/random_calls.py) with ranks that differ in how they make them:
asynchronous against blocking, native against pure Python, numpy against shared-memory
buffers, the world and subgroups, shared memory and TCP. Fixed seeds, so a failure
reruns the same calls (``RANDOM_*`` variables and ``python -m collcomm run -n N
tests/random_calls.py SEED CALLS`` run one by hand); the same through collcomm.MPI
(tests/random_calls_mpi.py) and torch.distributed (tests/random_calls_torch.py)."""
from __future__ import annotations

from typing import Any

import pytest

from tests import random_calls, random_calls_mpi, random_calls_torch
from tests.random_jobs import run_case

PY = {"COLLCOMM_NATIVE": "0"}

CASES: dict[str, dict[str, Any]] = {
    # one rank asynchronous, its peer blocking: the mix that broke the reduce by CMA
    "pair-one-async": {"n": 2, "seed": 52, "env": {"RANDOM_ASYNC_RANKS": "1"}},
    "pair-async-python": {"n": 2, "seed": 44, "env": {"RANDOM_ASYNC_RANKS": "0,1"},
                          "rank_env": {1: PY}},
    "three-groups-shared": {"n": 3, "seed": 61, "env": {"RANDOM_GROUPS": "1", "RANDOM_SHARED": "1",
                                                         "RANDOM_ASYNC_RANKS": "0"}},
    "four-groups-mixed": {"n": 4, "seed": 63, "env": {"RANDOM_GROUPS": "1", "RANDOM_ASYNC_RANKS": "0,1"},
                          "rank_env": {1: PY, 3: PY}},
    "pair-tcp-one-async": {"n": 2, "seed": 21, "env": {"RANDOM_ASYNC_RANKS": "0"}, "transport": "tcp",
                           "count": 60},
    # collcomm.MPI: I-calls against blocking ones, a pure-Python rank
    "mpi-pair-one-async": {"n": 2, "seed": 71, "env": {"RANDOM_ASYNC_RANKS": "1"}, "mpi": True},
    "mpi-three-mixed": {"n": 3, "seed": 73, "env": {"RANDOM_ASYNC_RANKS": "0,2"}, "rank_env": {1: PY},
                        "mpi": True},
    # torch.distributed: async Works (the group's worker) against fast blocking calls,
    # strided tensors (a stand-in copied back), a pure-Python rank, subgroups
    "torch-pair-one-async-strided": {"n": 2, "seed": 81, "env": {"RANDOM_ASYNC_RANKS": "1",
                                                                 "RANDOM_STRIDED_RANKS": "0"}, "torch": True},
    "torch-three-groups-mixed": {"n": 3, "seed": 83, "env": {"RANDOM_GROUPS": "1", "RANDOM_ASYNC_RANKS": "0",
                                                             "RANDOM_STRIDED_RANKS": "2"},
                                 "rank_env": {1: PY}, "torch": True},
}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("case", sorted(CASES))
def test_random_calls_agree_with_numpy(case: str) -> None:
    assert run_case(CASES[case], random_calls.run, random_calls_mpi.run, random_calls_torch.run, 120, {}) == []
