"""Rendezvous: find out who we are, meet the other ranks, build the transport.

Identity comes from explicit arguments, else the first launcher environment found:
collcomm run / torchrun (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``,
``MASTER_PORT``), Open MPI (``OMPI_COMM_WORLD_*``), MPICH/Hydra (``PMI_RANK``/``PMI_SIZE``)
and Slurm (``SLURM_PROCID``/``SLURM_NTASKS``/``SLURM_LOCALID``). None → a world of one.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from .errors import InvalidArgumentError


@dataclass
class Identity:
    rank: int
    size: int
    local_rank: int
    launcher: str


def _int(env: Mapping[str, str], *names: str) -> int | None:
    for name in names:
        value = env.get(name)
        if value not in (None, ""):
            return int(value)  # type: ignore[arg-type]
    return None


def identify(env: Mapping[str, str] = os.environ, rank: int = -1, world_size: int = -1) -> Identity:
    """This process's rank, world size and local rank, and which launcher said so."""
    sources = [
        ("collcomm/torchrun", ("RANK",), ("WORLD_SIZE",), ("LOCAL_RANK",)),
        ("openmpi", ("OMPI_COMM_WORLD_RANK",), ("OMPI_COMM_WORLD_SIZE",), ("OMPI_COMM_WORLD_LOCAL_RANK",)),
        ("mpich", ("PMI_RANK",), ("PMI_SIZE",), ("MPI_LOCALRANKID", "PMI_LOCAL_RANK")),
        ("slurm", ("SLURM_PROCID",), ("SLURM_NTASKS", "SLURM_NPROCS"), ("SLURM_LOCALID",)),
    ]
    found = Identity(0, 1, 0, "none")
    for launcher, r, s, lr in sources:
        env_rank, env_size = _int(env, *r), _int(env, *s)
        if env_rank is not None and env_size is not None:
            local = _int(env, *lr)
            found = Identity(env_rank, env_size, env_rank if local is None else local, launcher)
            break
    if rank >= 0:
        found.rank = rank
    if world_size > 0:
        found.size = world_size
    if not 0 <= found.rank < found.size:
        raise InvalidArgumentError(
            f"init_process_group: rank must be in [0, world_size={found.size}), got {found.rank} "
            f"(from {found.launcher if rank < 0 else 'the rank argument'})")
    return found


@dataclass
class Job:
    """What a rank holds while it is part of a job."""

    rank: int
    size: int
    identity: Identity
    transport: Any = None
    store: Any = None
    extras: list[Any] = field(default_factory=list)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
            self.transport = None
        for x in self.extras:
            x.close()
        self.extras.clear()
        if self.store is not None:
            self.store.close()
            self.store = None


def join(init_method: str | None, world_size: int, rank: int, store: Any, timeout: float) -> Job:
    ident = identify(os.environ, rank, world_size)
    if ident.size == 1 and store is None and init_method is None:
        return Job(0, 1, ident)
    raise NotImplementedError("multi-rank rendezvous lands with the transport")
