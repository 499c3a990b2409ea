"""Who this rank is: its rank, world size and local rank, where to meet, its host.

Identity comes from explicit arguments, else the first launcher environment found:
collcomm run / torchrun (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``,
``MASTER_PORT``), Open MPI (``OMPI_COMM_WORLD_*``), MPICH/Hydra (``PMI_RANK``/``PMI_SIZE``)
and Slurm (``SLURM_PROCID``/``SLURM_NTASKS``/``SLURM_LOCALID``). None → a world of one.
:func:`default_url` says where the ranks meet when ``init_method`` is not given, and
:func:`host_id` which ranks can share memory.
"""
from __future__ import annotations

import importlib.util
import os
import socket
from dataclasses import dataclass
from typing import Mapping

from ..errors import InvalidArgumentError
from ..rendezvous.auth import job_id
from ..transport.shm_segments import SHM_DIR


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



def default_url(ident: Identity, env: Mapping[str, str]) -> str:
    """Where to meet when init_method is not given."""
    if env.get("COLLCOMM_STORE"):
        return "env://"
    addr, port = env.get("MASTER_ADDR"), env.get("MASTER_PORT")
    if addr and port:
        if env.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
            # torchrun's agent serves its own store on MASTER_PORT: rank 0 hosts collcomm's
            # on a free port and publishes it there (rendezvous/torch_agent.py), or on
            # COLLCOMM_MASTER_PORT when set, or on the next port without torch
            if env.get("COLLCOMM_MASTER_PORT"):
                return f"tcp://{addr}:{int(env['COLLCOMM_MASTER_PORT'])}"
            if importlib.util.find_spec("torch") is not None:
                return f"torchagent://{addr}:{port}"
            return f"tcp://{addr}:{int(port) + 1}"
        return "env://"
    if ident.launcher in ("openmpi", "mpich", "slurm"):
        # one host (or a shared file system): meet in a file named after the job
        return f"file:///tmp/collcomm-rdzv-{job_id(env)}"
    raise InvalidArgumentError(
        f"init_process_group: world size {ident.size} from {ident.launcher} but no way to meet: "
        "set MASTER_ADDR/MASTER_PORT, pass init_method='tcp://host:port' or 'file:///path', "
        "or start the job with 'collcomm run'")


def host_id() -> str:
    """Ranks with equal host ids can share memory: same host, boot, pid namespace and /dev/shm.

    ``COLLCOMM_HOST_ID`` overrides it (ranks with different values talk TCP even on one
    machine: how the tests build multi-host jobs on one host).
    """
    forced = os.environ.get("COLLCOMM_HOST_ID")
    if forced:
        return f"forced:{forced}"
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = "?"
    try:
        pidns = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        pidns = 0
    try:
        st = os.stat(SHM_DIR)
        shm = f"{st.st_dev}:{st.st_ino}"
    except OSError:
        shm = "none"
    return f"{socket.gethostname()}|{boot}|{pidns}|{shm}"
