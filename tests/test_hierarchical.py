"""Multi-host jobs on one machine: COLLCOMM_HOST_ID splits the ranks into pretend hosts, so
ranks of one "host" talk through shared memory and the hosts through TCP."""
from __future__ import annotations

import os

import numpy as np
import pytest

import collcomm as dist
import collcomm.core.runtime as rt
from collcomm.algorithms import registry
from tests.harness import run_ranks


def mixed_topology(count):
    world = rt.get_world("t")
    r, n = dist.get_rank(), dist.get_world_size()
    bad: list[str] = []
    kinds = world.transport.kinds()
    for p, kind in kinds.items():
        same = world.hosts[p] == world.hosts[r]
        if kind != ("shm" if same else "tcp"):
            bad.append(f"rank {p} reached over {kind}")
    picked = registry.auto("all_reduce", 8, n, world.can_share_memory, world.n_hosts, world.link)
    if picked != "hierarchical":
        bad.append(f"auto picked {picked}")
    for k in (0, 1, count):
        for algo in ("hierarchical", "ring", "auto"):   # ring: point-to-point over shm + tcp
            os.environ["COLLCOMM_ALGO_ALL_REDUCE"] = algo
            x = np.arange(k, dtype=np.float64) * (r + 1)
            dist.all_reduce(x)
            if not np.array_equal(x, np.arange(k) * n * (n + 1) / 2):
                bad.append(f"all_reduce k={k} {algo}")
        os.environ.pop("COLLCOMM_ALGO_ALL_REDUCE")
        for root in range(n):
            b = np.full(k, r, dtype=np.int64)
            dist.broadcast(b, root)
            if not (b == root).all():
                bad.append(f"broadcast k={k} root={root}")
            red = np.full(k, r + 1, dtype=np.int64)
            keep = red.copy()
            dist.reduce(red, root, op=dist.ReduceOp.SUM)
            want = np.full(k, n * (n + 1) // 2) if r == root else keep
            if not np.array_equal(red, want):
                bad.append(f"reduce k={k} root={root}: {red[:3]}")
        out = np.empty(n * k, dtype=np.float32)
        dist.all_gather_into_tensor(out, np.full(k, r, dtype=np.float32))
        if not np.array_equal(out, np.repeat(np.arange(n, dtype=np.float32), k)):
            bad.append(f"all_gather k={k}")
        dist.barrier()
    return bad


@pytest.mark.timeout(90)
@pytest.mark.parametrize("hosts", ["AABB", "AAAB", "ABB", "AABBB"])
def test_hierarchical_on_pretend_hosts(hosts):
    n = len(hosts)
    rank_env = {r: {"COLLCOMM_HOST_ID": h} for r, h in enumerate(hosts)}
    assert run_ranks(mixed_topology, n, 100_003, rank_env=rank_env) == [[]] * n
