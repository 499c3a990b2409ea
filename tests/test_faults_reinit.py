"""Fault behaviour at the API level, on both transports: destroy_process_group then
init_process_group again in the same process (the rendezvous store's host leaving first
or last).
"""
from __future__ import annotations

import time

import numpy as np
import pytest

import collcomm as dist
from collcomm.errors import InvalidArgumentError
from tests.faults_common import TRANSPORTS
from tests.harness import run_ranks


# -- rank bodies (module level: the ranks import them) ------------------------------------
def reinit(rounds: int, skew: str):
    """destroy_process_group, then init_process_group again, ``rounds`` times.

    ``skew``: "host_first" — rank 0 (which hosts the rendezvous store on MASTER_PORT)
    leaves first and the others 0.5 s later; "host_last" — rank 0 leaves 1 s after the
    others (they re-join while the previous job's store is still up)."""
    out = []
    for i in range(rounds):
        rank, n = dist.get_rank(), dist.get_world_size()
        a = np.full(3, rank + i, dtype=np.int64)
        dist.all_reduce(a)
        out.append(int(a[0]))
        g = dist.new_group([0, 1])
        b = np.array([rank + 1.0])
        if g is not dist.GroupMember.NON_GROUP_MEMBER:
            dist.all_reduce(b, group=g)
        out.append(float(b[0]))
        dist.barrier()
        if (rank == 0) == (skew == "host_last"):
            time.sleep(0.5 if skew == "host_first" else 1.0)
        dist.destroy_process_group()
        assert not dist.is_initialized()
        try:
            dist.all_reduce(a)
        except InvalidArgumentError:
            pass
        else:
            raise AssertionError("all_reduce after destroy did not fail")
        with dist.call_timeout(10):
            dist.init_process_group(timeout=15)
        assert dist.get_world_size() == n and dist.get_rank() == rank
    return out


# -- the tests -------------------------------------------------------------------------------
@pytest.mark.timeout(90)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_destroy_then_init_again(transport):
    res = run_ranks(reinit, 3, 3, "host_first", transport=transport, timeout=60)
    for i in range(3):
        assert [r[2 * i] for r in res] == [3 + 3 * i] * 3
        assert [r[2 * i + 1] for r in res] == [3.0, 3.0, 3.0]  # rank 2 (not in the group) keeps 3.0


@pytest.mark.timeout(90)
def test_destroy_then_init_again_store_host_last():
    run_ranks(reinit, 3, 1, "host_last", transport="shm", timeout=30)
