"""``new_subgroups``, ``new_subgroups_by_enumeration`` and ``split_group`` (torch's
semantics): which group each rank gets, that the groups work, errors on every rank before
any group is made, and that the world's group count stays in step afterwards. Four ranks,
two of them on a second "host" (``COLLCOMM_HOST_ID``) for the default block size.
"""
from __future__ import annotations

from tests.harness import run_ranks


def subgroups() -> dict:
    import numpy as np

    import collcomm as dist

    r = dist.get_rank()
    out: dict = {}

    def total(g) -> float:
        x = np.array([float(r + 1)])
        dist.all_reduce(x, group=g)
        return float(x[0])

    mine, every = dist.new_subgroups(2)
    out["blocks"] = [len(every), dist.get_process_group_ranks(mine), total(mine)]
    mine, every = dist.new_subgroups()          # a host's ranks
    out["host blocks"] = [len(every), dist.get_process_group_ranks(mine)]
    mine, every = dist.new_subgroups_by_enumeration([[0, 2], [1]])
    out["enumerated"] = [len(every), None if mine is None else dist.get_process_group_ranks(mine),
                         None if mine is None else total(mine)]
    g = dist.split_group(split_ranks=[[0, 3], [1, 2]])
    out["split world"] = [dist.get_process_group_ranks(g), total(g)]
    if r:                                       # a parent other than the world: its members only
        parent = dist.new_group([1, 2, 3], use_local_synchronization=True)
        g = dist.split_group(parent, [[0], [1, 2]])           # ranks of the parent: global 1 | 2, 3
        out["split subgroup"] = [dist.get_process_group_ranks(g), total(g)]
        mine, every = dist.new_subgroups(1, group=parent)
        out["subgroup blocks"] = [len(every), dist.get_process_group_ranks(mine)]
    errors = []
    for bad in (lambda: dist.new_subgroups(3), lambda: dist.new_subgroups(0),
                lambda: dist.new_subgroups_by_enumeration([[0, 1], [1, 2]]),
                lambda: dist.split_group(split_ranks=[[0, 4]])):
        try:
            bad()
            errors.append("no error")
        except dist.InvalidArgumentError as exc:
            errors.append(isinstance(exc, ValueError))
    out["errors"] = errors
    whole = dist.new_group([0, 1, 2, 3])        # every rank: the count agrees after all that
    out["after"] = total(whole)
    return out


def test_subgroups_as_torch() -> None:
    host = {0: {"COLLCOMM_HOST_ID": "a"}, 1: {"COLLCOMM_HOST_ID": "a"},
            2: {"COLLCOMM_HOST_ID": "b"}, 3: {"COLLCOMM_HOST_ID": "b"}}
    rows = run_ranks(subgroups, 4, timeout=90, rank_env=host)
    for r, row in enumerate(rows):
        block = [0, 1] if r < 2 else [2, 3]
        assert row["blocks"] == [2, block, float(sum(b + 1 for b in block))], (r, row)
        assert row["host blocks"] == [2, block], (r, row)
        enum = {0: [0, 2], 2: [0, 2], 1: [1]}.get(r)
        assert row["enumerated"] == [2, enum, None if enum is None else float(sum(b + 1 for b in enum))], (r, row)
        split = [0, 3] if r in (0, 3) else [1, 2]
        assert row["split world"] == [split, float(sum(b + 1 for b in split))], (r, row)
        if r:
            sub = [1] if r == 1 else [2, 3]
            assert row["split subgroup"] == [sub, float(sum(b + 1 for b in sub))], (r, row)
            assert row["subgroup blocks"] == [3, [r]], (r, row)
        assert row["errors"] == [True] * 4, (r, row)
        assert row["after"] == 10.0, (r, row)
