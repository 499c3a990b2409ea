"""collcomm.mesh: the seed-002 grid as arithmetic, then as real groups (numpy and torch).

The arithmetic is checked for every way of writing 8 and 16 ranks as tp × cp × pp × dp:
each group keeps the other coordinates fixed, the groups of a dimension partition the
world, group order follows the varying coordinate, and the neighbours are right. Real
groups: 8 processes on collcomm's numpy API (all_reduce on every group, the CP ring and the
pipeline with point-to-point), and 4 processes on torch.distributed with groups of each
backend, plus ``init_device_mesh``, functional collectives and DTensor on collcomm, then collcomm groups under a gloo default
group re-created in the same processes.
"""
from __future__ import annotations

import itertools
import subprocess
import sys

import numpy as np
import pytest

from collcomm.errors import InvalidArgumentError
from collcomm.mesh import DIMENSIONS, Grid, ProcessGroupManager, table
from tests.harness import TORCH, run_ranks

AXES = ("dp", "pp", "cp", "tp")


def layouts(world: int) -> list[Grid]:
    out = []
    for tp, cp, pp in itertools.product([1, 2, 4, 8, 16], repeat=3):
        if world % (tp * cp * pp) == 0:
            out.append(Grid(tp, cp, pp, world // (tp * cp * pp)))
    return out


@pytest.mark.parametrize("world", [8, 16])
def test_every_layout_keeps_other_coordinates_fixed_and_partitions(world: int) -> None:
    grids = layouts(world)
    assert len(grids) == (20 if world == 8 else 35)   # ordered factorizations into 4 factors
    for grid in grids:
        for r in range(world):
            at = grid.coords(r)
            d, p, c, t = at["dp"], at["pp"], at["cp"], at["tp"]
            assert r == ((d * grid.pp + p) * grid.cp + c) * grid.tp + t   # arange(world).reshape
        for dim, varying in DIMENSIONS.items():
            groups = grid.groups(dim)
            flat = sorted(x for g in groups for x in g)
            assert flat == list(range(world)), (grid, dim)            # a partition
            assert all(len(g) == grid.size(dim) for g in groups), (grid, dim)
            for g in groups:
                coords = [grid.coords(x) for x in g]
                for a in AXES:
                    values = {cc[a] for cc in coords}
                    if a in varying:
                        assert len(values) == getattr(grid, a), (grid, dim, a, g)
                    else:
                        assert len(values) == 1, (grid, dim, a, g)    # kept fixed
                for x in g:
                    assert grid.group(dim, x) == g                    # same group from every member
            if len(varying) == 1:
                for g in groups:   # group rank = the coordinate that varies
                    assert [grid.coords(x)[varying[0]] for x in g] == list(range(len(g)))


@pytest.mark.parametrize("world", [8, 16])
def test_neighbours(world: int) -> None:
    for grid in layouts(world):
        for r in range(world):
            nb, at = grid.neighbours(r), grid.coords(r)
            assert grid.neighbours(nb["cp_next_rank"])["cp_prev_rank"] == r
            assert grid.coords(nb["cp_next_rank"])["cp"] == (at["cp"] + 1) % grid.cp
            assert nb["pp_is_first_stage"] == (at["pp"] == 0)
            assert nb["pp_is_last_stage"] == (at["pp"] == grid.pp - 1)
            if nb["pp_next_rank"] is None:
                assert nb["pp_is_last_stage"]
            else:
                nxt = grid.coords(nb["pp_next_rank"])
                assert nxt["pp"] == at["pp"] + 1 and grid.neighbours(nb["pp_next_rank"])["pp_prev_rank"] == r
                assert {a: nxt[a] for a in ("dp", "cp", "tp")} == {a: at[a] for a in ("dp", "cp", "tp")}
            if nb["pp_prev_rank"] is None:
                assert nb["pp_is_first_stage"]


def test_documented_example_and_seed002_table() -> None:
    grid = Grid(tp=2, cp=2, pp=2, dp=1)
    assert grid.coords(5) == {"dp": 0, "pp": 1, "cp": 0, "tp": 1}
    assert [grid.group(d, 5) for d in ("tp", "cp", "pp", "dp")] == [[4, 5], [5, 7], [1, 5], [5]]
    nb = grid.neighbours(5)
    assert (nb["cp_next_rank"], nb["cp_prev_rank"], nb["pp_prev_rank"], nb["pp_next_rank"]) == (7, 7, 1, None)
    assert nb["pp_is_last_stage"] and not nb["pp_is_first_stage"]
    # seed 002: ProcessGroupManager(tp_size=4, cp_size=2, pp_size=2, dp_size=1) on 16 ranks
    text = table(Grid.for_world(16, tp=4, cp=2, pp=2))
    lines = text.splitlines()
    assert lines[0].startswith("world 16 = dp 1 × pp 2 × cp 2 × tp 4")
    fixed = {ln.split()[0]: ln[7:20].strip() for ln in lines[2:]}
    assert fixed == {"TP": "DP, PP, CP", "CP": "DP, PP, TP", "PP": "DP, CP, TP", "DP": "PP, CP, TP",
                     "CP-DP": "PP, TP", "PP-DP": "CP, TP"}
    assert "[0, 1, 2, 3] [4, 5, 6, 7]" in lines[2] and "[0, 8] [1, 9]" in lines[4]
    out = subprocess.run([sys.executable, "-m", "collcomm.mesh", "--world", "16", "--tp", "4",
                          "--cp", "2", "--pp", "2"], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == text, out.stderr


def test_bad_sizes_are_refused_naming_them() -> None:
    with pytest.raises(InvalidArgumentError, match="tp 4 × cp 2 × pp 2 × dp 2 = 32 ranks, but the world has 16"):
        Grid.for_world(16, tp=4, cp=2, pp=2, dp=2)
    with pytest.raises(InvalidArgumentError, match="not a multiple"):
        Grid.for_world(12, tp=8)
    with pytest.raises(InvalidArgumentError, match="positive"):
        Grid(tp=0)


# ----------------------------------------------------------------------------- real groups

def numpy_rank(tp: int, cp: int, pp: int) -> list[str]:
    """On collcomm's numpy API: every group by all_reduce, CP ring and pipeline by p2p."""
    import collcomm as dist
    from collcomm import mesh

    pgm = ProcessGroupManager(tp, cp, pp).install()
    bad = []
    if mesh.current() is not pgm or pgm.api != "collcomm":
        bad.append("install/current or api")
    for dim, g in pgm.groups.items():
        x = np.array([pgm.global_rank], dtype=np.int64)
        dist.all_reduce(x, group=g)
        if int(x[0]) != sum(pgm.group_ranks[dim]) or dist.get_world_size(g) != pgm.grid.size(dim):
            bad.append(f"{dim}: {int(x[0])} over {pgm.group_ranks[dim]}")
    # CP ring: send my rank forward, receive from behind
    got = np.empty(1, dtype=np.int64)
    if pgm.cp_world_size > 1:
        w = dist.isend(np.array([pgm.global_rank]), dst=pgm.cp_send_rank)
        dist.recv(got, src=pgm.cp_recv_rank)
        w.wait()
        if int(got[0]) != pgm.cp_recv_rank:
            bad.append(f"cp ring got {int(got[0])} from {pgm.cp_recv_rank}")
    # pipeline: the activation flows stage by stage
    act = np.array([0], dtype=np.int64)
    if not pgm.pp_is_first_stage:
        dist.recv(act, src=pgm.pp_prev_rank)
    act += 1
    if not pgm.pp_is_last_stage:
        dist.send(act, dst=pgm.pp_next_rank)
    elif int(act[0]) != pgm.pp_world_size:
        bad.append(f"pipeline ended with {int(act[0])}")
    return bad


@pytest.mark.timeout(90)
def test_numpy_groups_on_eight_ranks() -> None:
    res = run_ranks(numpy_rank, 8, 2, 2, 2, timeout=80)
    assert not [b for r in res for b in r], res


def torch_rank() -> dict:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    import collcomm.torch  # noqa: F401

    dist.init_process_group("collcomm")
    r = dist.get_rank()
    out: dict = {}
    for backend in ("collcomm", "gloo"):
        pgm = ProcessGroupManager(tp_size=2, pp_size=2, backend=backend)
        for dim in ("tp", "pp", "dp", "pp_dp"):
            t = torch.tensor([float(r)])
            dist.all_reduce(t, group=pgm.groups[dim])
            out[(backend, dim)] = (dist.get_process_group_ranks(pgm.groups[dim]), float(t),
                                   dist.get_backend(pgm.groups[dim]))
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    for dim in ("dp", "tp"):
        g = mesh[dim].get_group()
        t = torch.tensor([float(r)])
        dist.all_reduce(t, group=g)
        out[("mesh", dim)] = (dist.get_process_group_ranks(g), float(t), dist.get_backend(g))
    # functional collectives and DTensor (what FSDP2 / tensor parallel build on)
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.tensor import DTensor, Shard

    summed = funcol.all_reduce(torch.tensor([float(r)]), "sum", mesh["dp"].get_group())
    full = DTensor.from_local(torch.full((2,), float(r)), mesh["tp"], [Shard(0)]).full_tensor()
    out["funcol"], out["dtensor"] = float(summed), full.tolist()
    dist.destroy_process_group()
    # again in the same processes, now under a gloo default group: collcomm groups then get
    # a transport of their own (through the store of the re-created default group)
    dist.init_process_group("gloo")
    pgm = ProcessGroupManager(tp_size=2, backend="collcomm")
    t = torch.tensor([float(r)])
    dist.all_reduce(t, group=pgm.tp_group)
    out["under gloo"] = (pgm.tp_group_ids, float(t), dist.get_backend(pgm.tp_group),
                         dist.get_backend())
    dist.destroy_process_group()
    return out


@pytest.mark.timeout(90)
def test_torch_groups_either_backend_and_device_mesh() -> None:
    pytest.importorskip("torch.distributed")
    res = run_ranks(torch_rank, 4, init=False, timeout=80, preload=TORCH)
    grid = Grid(tp=2, pp=2)
    for r, got in enumerate(res):
        for backend in ("collcomm", "gloo"):
            for dim in ("tp", "pp", "dp", "pp_dp"):
                members = grid.group(dim, r)
                assert got[(backend, dim)] == (members, float(sum(members)), backend), (r, dim, got)
        dp, tp = [r % 2, r % 2 + 2], [r - r % 2, r - r % 2 + 1]
        assert got[("mesh", "dp")] == (dp, float(sum(dp)), "collcomm"), got
        assert got[("mesh", "tp")] == (tp, float(sum(tp)), "collcomm"), got
        assert got["under gloo"] == (tp, float(sum(tp)), "collcomm", "gloo"), got
        assert got["funcol"] == float(sum(dp)), got
        assert got["dtensor"] == [float(tp[0])] * 2 + [float(tp[1])] * 2, got
