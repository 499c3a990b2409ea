"""Meeting under torchrun's agent store (``TORCHELASTIC_USE_AGENT_STORE=True``).

torchrun's agent serves a store of its own, in torch's protocol, on ``MASTER_ADDR:MASTER_PORT``
and tells its workers to use it as clients. collcomm's store speaks collcomm's protocol, so
rank 0 hosts one on a port the system picks (free by construction) and publishes its address
in the agent's store, under a key of this run, restart and meeting; every other rank reads it
there (torch's ``get`` waits for it) and connects. Until session 14 rank 0 listened on
``MASTER_PORT + 1``, which any other socket of the machine may hold (an outgoing
connection's ephemeral port, for one): the job then failed with "Address already in use".

A torchrun job has torch; without it (or with ``COLLCOMM_MASTER_PORT`` set, which names
the port) the ranks meet at ``tcp://MASTER_ADDR:port`` as before.
"""
from __future__ import annotations

import itertools
import os
import socket
from datetime import timedelta

from .netaddr import bind_address_for
from ..errors import CollcommError, CommTimeoutError
from .base import Store
from .tcp_client import TCPStore

__all__ = ["SCHEME", "open_store"]

#: the init_method scheme collcomm uses internally for this way of meeting
SCHEME = "torchagent"

_meetings = itertools.count()   # every rank meets as often as the others (init, destroy, init)


def _key() -> str:
    env = os.environ
    return (f"collcomm/store/{env.get('TORCHELASTIC_RUN_ID', '')}/"
            f"{env.get('TORCHELASTIC_RESTART_COUNT', '0')}/{next(_meetings)}")


def _own_address(master: str, port: int) -> str:
    """An address of this machine the other ranks reach: ``master`` itself when it is
    this machine's (a one-host job: loopback), else the one the route to it leaves from."""
    if bind_address_for(master) not in ("0.0.0.0", "::"):
        return master
    family = socket.AF_INET6 if ":" in master else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect((master, port))        # (a UDP connect sends nothing: it picks the route)
        return str(s.getsockname()[0])


def open_store(master: str, port: int, rank: int, world_size: int, timeout: float,
               token: bytes | None) -> Store:
    """The job's collcomm store, met through torchrun's agent store at ``master:port``
    (``tcp://master:port+1`` where torch has no ``torch.distributed``)."""
    try:
        from torch.distributed import TCPStore as AgentStore   # noqa: PLC0415 - torchrun only
    except ImportError:
        return TCPStore(master, port + 1, world_size, is_master=rank == 0, timeout=timeout,
                        token=token)
    key = _key()
    try:
        agent = AgentStore(master, port, is_master=False, timeout=timedelta(seconds=timeout))
        if rank == 0:
            store = TCPStore(_own_address(master, port), 0, world_size, is_master=True,
                             timeout=timeout, token=token)
            agent.set(key, store.address)
            return store
        address = agent.get(key).decode()
    except CollcommError:
        raise
    except Exception as exc:   # torch's store errors (a timeout, a refused connection)
        raise CommTimeoutError(
            f"rank {rank}: could not meet through torchrun's agent store at {master}:{port} "
            f"within {timeout:g}s ({'publishing' if rank == 0 else 'reading'} {key!r}, "
            f"where rank 0 publishes the address of collcomm's store): {exc}") from exc
    host, _, p = address.rpartition(":")
    return TCPStore(host.strip("[]"), int(p), world_size, is_master=False, timeout=timeout,
                    token=token)
