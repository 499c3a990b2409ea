"""The seed-002 parallel grid: tensor, context, pipeline and data parallel groups.

``ProcessGroupManager(tp_size, cp_size, pp_size, dp_size)`` lays the ranks of a job on a
4-D grid, built once as ``arange(world).reshape(dp, pp, cp, tp)`` (tp varies fastest, so
a TP group is consecutive ranks), and gives this rank its coordinates and groups. Each
group keeps the other coordinates fixed (seed 002's table)::

    group  keeps fixed   for
    TP     DP, PP, CP    tensor-parallel communication
    CP     DP, PP, TP    the context-parallel ring
    PP     DP, CP, TP    pipeline send/recv
    DP     PP, CP, TP    data-parallel gradient sync
    CP-DP  PP, TP        CP and DP together (gradient sync when CP shards the sequence)
    PP-DP  CP, TP        PP and DP together

Example, 8 ranks as ``tp=2, cp=2, pp=2, dp=1``: rank 5 is at (dp 0, pp 1, cp 0, tp 1);
its TP group is [4, 5], CP group [5, 7], PP group [1, 5], DP group [5]; its CP ring
neighbours are 7 and 7, its previous pipeline stage is rank 1 and it is the last stage.

Two layers:

* :class:`Grid` — the arithmetic only (coordinates, every group of a dimension,
  neighbours); no processes, no communication, testable anywhere.
* :class:`ProcessGroupManager` — a grid plus real groups for this rank, made with
  ``torch.distributed.new_group`` (either backend) or collcomm's ``new_group`` (numpy).
  Every rank must construct it at the same point of the program (group creation is
  collective). It is an explicit object; :meth:`ProcessGroupManager.install` makes it the
  process default returned by :func:`current`, if a program wants one.

``python -m collcomm.mesh --world 8 --tp 2 --cp 2 --pp 2`` prints the table and the groups;
``collcomm run -n 8 -m collcomm.mesh --tp 2 --cp 2 --pp 2`` also builds them on real ranks
and checks each with an all_reduce.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import InvalidArgumentError

__all__ = ["DIMENSIONS", "Grid", "ProcessGroupManager", "current", "table"]

#: Group name -> the grid axes (of dp, pp, cp, tp) its members vary along.
DIMENSIONS: dict[str, tuple[str, ...]] = {
    "tp": ("tp",), "cp": ("cp",), "pp": ("pp",), "dp": ("dp",),
    "cp_dp": ("dp", "cp"), "pp_dp": ("dp", "pp"),
}
_AXES = ("dp", "pp", "cp", "tp")
_USES = {"tp": "tensor-parallel communication", "cp": "the context-parallel ring",
         "pp": "pipeline send/recv", "dp": "data-parallel gradient sync",
         "cp_dp": "CP and DP together", "pp_dp": "PP and DP together"}


@dataclass(frozen=True)
class Grid:
    """``arange(world).reshape(dp, pp, cp, tp)`` and what follows from it."""

    tp: int = 1
    cp: int = 1
    pp: int = 1
    dp: int = 1

    def __post_init__(self) -> None:
        bad = {a: getattr(self, a) for a in _AXES
               if not isinstance(getattr(self, a), (int, np.integer)) or getattr(self, a) < 1}
        if bad:
            raise InvalidArgumentError(f"Grid: sizes must be positive integers, got {bad}")

    @classmethod
    def for_world(cls, world: int, tp: int = 1, cp: int = 1, pp: int = 1,
                  dp: int | None = None) -> "Grid":
        """The grid of ``world`` ranks; ``dp=None`` takes what tp × cp × pp leaves."""
        if dp is None:
            if world % (tp * cp * pp):
                raise InvalidArgumentError(
                    f"Grid: world size {world} is not a multiple of tp {tp} × cp {cp} × pp {pp}")
            dp = world // (tp * cp * pp)
        grid = cls(tp, cp, pp, dp)
        if grid.world != world:
            raise InvalidArgumentError(
                f"Grid: tp {tp} × cp {cp} × pp {pp} × dp {dp} = {grid.world} ranks, but the "
                f"world has {world}")
        return grid

    @property
    def world(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    @property
    def ranks(self) -> np.ndarray:
        """The grid itself: ``ranks[d, p, c, t]`` is the global rank at those coordinates."""
        return np.arange(self.world).reshape(self.dp, self.pp, self.cp, self.tp)

    def size(self, dim: str) -> int:
        return int(np.prod([getattr(self, a) for a in DIMENSIONS[dim]]))

    def coords(self, rank: int) -> dict[str, int]:
        """{"dp", "pp", "cp", "tp"} coordinates of ``rank``."""
        if not 0 <= rank < self.world:
            raise InvalidArgumentError(f"Grid: rank must be in [0, {self.world}), got {rank}")
        d, p, c, t = (int(x) for x in np.unravel_index(rank, (self.dp, self.pp, self.cp, self.tp)))
        return {"dp": d, "pp": p, "cp": c, "tp": t}

    def group(self, dim: str, rank: int) -> list[int]:
        """The members (global ranks, in group-rank order) of ``rank``'s ``dim`` group."""
        at = self.coords(rank)
        index = tuple(slice(None) if a in DIMENSIONS[dim] else at[a] for a in _AXES)
        return [int(r) for r in self.ranks[index].reshape(-1)]

    def groups(self, dim: str) -> list[list[int]]:
        """Every ``dim`` group, in the order of their lowest rank (they partition the world)."""
        seen: dict[int, list[int]] = {}
        for r in range(self.world):
            members = self.group(dim, r)
            seen.setdefault(members[0], members)
        return list(seen.values())

    def neighbours(self, rank: int) -> dict[str, Any]:
        """CP ring (send to next, receive from previous) and pipeline neighbours of ``rank``;
        pipeline neighbours are None past the first/last stage."""
        cp, pp = self.group("cp", rank), self.group("pp", rank)
        c, p = self.coords(rank)["cp"], self.coords(rank)["pp"]
        return {
            "cp_next_rank": cp[(c + 1) % len(cp)], "cp_prev_rank": cp[(c - 1) % len(cp)],
            "pp_next_rank": pp[p + 1] if p + 1 < len(pp) else None,
            "pp_prev_rank": pp[p - 1] if p > 0 else None,
            "pp_is_first_stage": p == 0, "pp_is_last_stage": p == len(pp) - 1,
        }


def table(grid: Grid) -> str:
    """Seed 002's group table for ``grid``, with the groups of each dimension."""
    head = (f"world {grid.world} = dp {grid.dp} × pp {grid.pp} × cp {grid.cp} × tp {grid.tp}"
            "  (ranks = arange(world).reshape(dp, pp, cp, tp))")
    rows = [head, f"{'group':<6} {'keeps fixed':<13} {'for':<30} groups"]
    for dim, axes in DIMENSIONS.items():
        fixed = ", ".join(a.upper() for a in _AXES if a not in axes)
        groups = " ".join(str(g) for g in grid.groups(dim))
        rows.append(f"{dim.upper().replace('_', '-'):<6} {fixed:<13} {_USES[dim]:<30} {groups}")
    return "\n".join(rows)


_default: "ProcessGroupManager | None" = None


def current() -> "ProcessGroupManager":
    """The manager a program installed with :meth:`ProcessGroupManager.install`."""
    if _default is None:
        raise InvalidArgumentError("collcomm.mesh.current(): no ProcessGroupManager was installed "
                                   "(call pgm.install() after building it)")
    return _default


def _torch_dist() -> Any:
    """torch.distributed if it is imported and initialized (never imports torch itself)."""
    mod = sys.modules.get("torch.distributed")
    return mod if mod is not None and mod.is_available() and mod.is_initialized() else None


class ProcessGroupManager:
    """This rank's place on the grid and its groups (see the module docstring).

    ``api``: ``"torch"`` (``torch.distributed.new_group``, with ``backend`` if given, e.g.
    ``"gloo"`` or ``"collcomm"``), ``"collcomm"`` (collcomm's numpy API) or ``"auto"``
    (torch if torch.distributed is initialized, else collcomm). ``dp_size=None`` takes what
    the other sizes leave of the world.
    """

    def __init__(self, tp_size: int = 1, cp_size: int = 1, pp_size: int = 1,
                 dp_size: int | None = None, *, api: str = "auto", backend: str | None = None,
                 timeout: Any = None) -> None:
        self.api = self._pick_api(api)
        self.global_rank, world = self._rank_and_world()
        self.grid = Grid.for_world(world, tp_size, cp_size, pp_size, dp_size)
        at = self.grid.coords(self.global_rank)
        self.dp_rank, self.pp_rank, self.cp_rank, self.tp_rank = at["dp"], at["pp"], at["cp"], at["tp"]
        self.world_size = world
        self.tp_world_size, self.cp_world_size = self.grid.tp, self.grid.cp
        self.pp_world_size, self.dp_world_size = self.grid.pp, self.grid.dp
        self.cp_dp_world_size = self.grid.size("cp_dp")
        self.pp_dp_world_size = self.grid.size("pp_dp")
        for key, value in self.grid.neighbours(self.global_rank).items():
            setattr(self, key, value)
        # every rank creates every group of every dimension, in the same order
        self.group_ranks: dict[str, list[int]] = {}
        self.groups: dict[str, Any] = {}
        for dim in DIMENSIONS:
            for members in self.grid.groups(dim):
                g = self._new_group(members, backend, timeout)
                if self.global_rank in members:
                    self.group_ranks[dim], self.groups[dim] = members, g
        self.tp_group, self.cp_group = self.groups["tp"], self.groups["cp"]
        self.pp_group, self.dp_group = self.groups["pp"], self.groups["dp"]
        self.cp_dp_group, self.pp_dp_group = self.groups["cp_dp"], self.groups["pp_dp"]
        self.tp_group_ids, self.cp_group_ids = self.group_ranks["tp"], self.group_ranks["cp"]
        self.pp_group_ids, self.dp_group_ids = self.group_ranks["pp"], self.group_ranks["dp"]
        self.cp_dp_group_ids = self.group_ranks["cp_dp"]
        self.pp_dp_group_ids = self.group_ranks["pp_dp"]

    # seed 002 / picotron spell the CP ring neighbours as send/recv ranks
    @property
    def cp_send_rank(self) -> int:
        return self.cp_next_rank  # type: ignore[attr-defined]

    @property
    def cp_recv_rank(self) -> int:
        return self.cp_prev_rank  # type: ignore[attr-defined]

    def __repr__(self) -> str:
        return (f"ProcessGroupManager(rank {self.global_rank}: tp {self.tp_rank}/{self.tp_world_size}, "
                f"cp {self.cp_rank}/{self.cp_world_size}, pp {self.pp_rank}/{self.pp_world_size}, "
                f"dp {self.dp_rank}/{self.dp_world_size}, api {self.api})")

    def install(self) -> "ProcessGroupManager":
        """Make this the process default (:func:`current`); returns self."""
        global _default
        _default = self
        return self

    # -- the two APIs ----------------------------------------------------------------------
    @staticmethod
    def _pick_api(api: str) -> str:
        if api not in ("auto", "torch", "collcomm"):
            raise InvalidArgumentError(f"ProcessGroupManager: api must be 'auto', 'torch' or "
                                       f"'collcomm', got {api!r}")
        if api == "auto":
            return "torch" if _torch_dist() is not None else "collcomm"
        return api

    def _rank_and_world(self) -> tuple[int, int]:
        if self.api == "torch":
            dist = _torch_dist()
            if dist is None:
                raise InvalidArgumentError("ProcessGroupManager(api='torch'): call "
                                           "torch.distributed.init_process_group first")
            return dist.get_rank(), dist.get_world_size()
        from .core import runtime

        world = runtime.get_world("ProcessGroupManager")
        return world.global_rank, world.size

    def _new_group(self, members: list[int], backend: str | None, timeout: Any) -> Any:
        if self.api == "torch":
            kwargs: dict[str, Any] = {"backend": backend}
            if timeout is not None:
                kwargs["timeout"] = timeout
            return _torch_dist().new_group(members, **kwargs)
        from .core import runtime

        return runtime.new_group(members, timeout=timeout)


def _tour(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m collcomm.mesh", description=__doc__.split("\n")[0])
    ap.add_argument("--world", type=int, default=None,
                    help="world size for the table (default: the job's, under collcomm run)")
    for a in ("tp", "cp", "pp"):
        ap.add_argument(f"--{a}", type=int, default=1)
    ap.add_argument("--dp", type=int, default=None)
    args = ap.parse_args(argv)
    import os

    from .core import runtime

    launched = args.world is None and "WORLD_SIZE" in os.environ
    if not launched:
        grid = Grid.for_world(args.world or 8, args.tp, args.cp, args.pp, args.dp)
        print(table(grid))
        return 0
    runtime.init_process_group()
    pgm = ProcessGroupManager(args.tp, args.cp, args.pp, args.dp, api="collcomm")
    if pgm.global_rank == 0:
        print(table(pgm.grid))
    from .core import collectives

    checks = []
    for dim, g in pgm.groups.items():
        x = np.array([pgm.global_rank], dtype=np.int64)
        collectives.all_reduce(g, x)
        checks.append(int(x[0]) == sum(pgm.group_ranks[dim]))
    collectives.barrier(runtime.get_world("mesh"))
    print(f"rank {pgm.global_rank}: dp {pgm.dp_rank} pp {pgm.pp_rank} cp {pgm.cp_rank} tp {pgm.tp_rank}"
          f" | cp ring prev {pgm.cp_prev_rank} next {pgm.cp_next_rank}"  # type: ignore[attr-defined]
          f" | pp prev {pgm.pp_prev_rank} next {pgm.pp_next_rank}"  # type: ignore[attr-defined]
          f" | all_reduce over each group: {'OK' if all(checks) else 'WRONG'}")
    runtime.destroy_process_group()
    return 0 if all(checks) else 1


if __name__ == "__main__":
    sys.exit(_tour())
