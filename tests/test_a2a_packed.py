"""A staged all_to_all packs its blocks in a slot at the largest block's size rounded up to
a cache line (shm_a2a.a2a_piece; the native core computes the same number): every rank
must agree on where each block lies, the ranks on the Python path and those in C alike.

Uneven blocks whose largest is no multiple of a cache line, over dtypes of 1, 4 and 16
bytes, with rank 1 on the Python path: a rank that placed or looked for a block elsewhere
reads another block's data. Most cases are one staged round (the CMA cost set high so
that reads by address wait for larger blocks); the smallest int8 case fits the eager form
and the largest complex128 one may read by address where cross-memory attach is allowed.
"""
from __future__ import annotations

import numpy as np
import pytest

from tests.harness import run_ranks


def _uneven_rounds() -> list[str]:
    import collcomm as dist

    me, n = dist.get_rank(), dist.get_world_size()
    done = []
    for dt in (np.int8, np.float32, np.complex128):
        for q in (40_001, 3_333):            # the largest block: (2n - 1) q elements, odd
            ssplit = [(me + j + 1) * q for j in range(n)]
            rsplit = [(i + me + 1) * q for i in range(n)]
            send = ((np.arange(sum(ssplit)) + 1000 * me) % 127).astype(dt)
            recv = np.zeros(sum(rsplit), dt)
            dist.all_to_all_single(recv, send, output_split_sizes=rsplit, input_split_sizes=ssplit)
            want = []
            for i in range(n):
                start = sum((i + j + 1) * q for j in range(me))
                want.append(((np.arange(start, start + rsplit[i]) + 1000 * i) % 127).astype(dt))
            assert np.array_equal(recv, np.concatenate(want)), (np.dtype(dt).name, q)
            done.append(f"{np.dtype(dt).name}:{q}")
    return done


@pytest.mark.timeout(120)
@pytest.mark.parametrize("python_ranks", [[], [1]])
def test_uneven_blocks_land_where_every_rank_looks(python_ranks: list[int]) -> None:
    env = {"COLLCOMM_CMA_COST": "9"}      # staged, whatever cross-memory reads cost here
    res = run_ranks(_uneven_rounds, 3, transport="shm", timeout=100, env=env,
                    rank_env={r: {"COLLCOMM_NATIVE": "0"} for r in python_ranks})
    assert res == [res[0]] * 3 and len(res[0]) == 6
