"""Meeting under torchrun's agent store (``TORCHELASTIC_USE_AGENT_STORE=True``).

torchrun's agent serves a store of its own, in torch's protocol, on ``MASTER_ADDR:MASTER_PORT``
and tells its workers to use it as clients. collcomm's store speaks collcomm's protocol, so
rank 0 hosts one on a port the system picks (free by construction) and publishes its address
in the agent's store, under a key of this run, restart and meeting; every other rank reads it
there (torch's ``get`` waits for it) and connects. Until session 14 rank 0 listened on
``MASTER_PORT + 1``, which any other socket of the machine may hold (an outgoing
connection's ephemeral port, for one): the job then failed with "Address already in use".

The key names the run, the restart and the meeting (init, destroy, init again), but torchrun
restarts its workers with the same restart count when nodes join, and its store outlives
the round: so rank 0 deletes the key once every rank has joined collcomm's store, and a
rank that finds an address nobody listens at (a rank 0 that died before it could delete
it) reads the key again until the new rank 0 has written it.

A torchrun job has torch; without it (or with ``COLLCOMM_MASTER_PORT`` set, which names
the port) the ranks meet at ``tcp://MASTER_ADDR:port`` as before.
"""
from __future__ import annotations

import itertools
import os
import socket
import time
import warnings
from datetime import timedelta
from typing import Any

from ..errors import CollcommError, CommTimeoutError
from .base import _WORKERS_READY_KEY, Store
from .netaddr import interface_address
from .tcp_client import TCPStore

__all__ = ["SCHEME", "open_store"]

#: the init_method scheme collcomm uses internally for this way of meeting
SCHEME = "torchagent"

_meetings = itertools.count()   # every rank meets as often as the others (init, destroy, init)


def _key() -> str:
    env = os.environ
    return (f"collcomm/store/{env.get('TORCHELASTIC_RUN_ID', '')}/"
            f"{env.get('TORCHELASTIC_RESTART_COUNT', '0')}/{next(_meetings)}")


def _is_local(host: str) -> bool:
    """Is ``host`` an address of this machine (a socket can be bound to it)?"""
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        addr = socket.getaddrinfo(host, None, family, socket.SOCK_DGRAM)[0][4][0]
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.bind((addr, 0))
        return True
    except (OSError, IndexError, UnicodeError):
        return False


def _own_address(master: str, port: int) -> str:
    """An address of this machine the other ranks reach: ``master`` itself when it is
    this machine's (a one-host job: loopback), else ``COLLCOMM_SOCKET_IFNAME``'s when set,
    else the one the route to ``master`` leaves from."""
    if _is_local(master):
        return master
    ifname = os.environ.get("COLLCOMM_SOCKET_IFNAME", "")
    if ifname and ":" not in master:
        return interface_address(ifname)
    family = socket.AF_INET6 if ":" in master else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect((master, port))        # (a UDP connect sends nothing: it picks the route)
        return str(s.getsockname()[0]).split("%")[0]


def _listening(address: str, deadline: float) -> bool:
    """Does something accept connections at ``address`` (host:port)?"""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)),
                                      timeout=max(0.1, min(2.0, deadline - time.monotonic()))):
            return True
    except OSError:
        return False


def _read_address(agent: Any, key: str, deadline: float) -> str:
    """The address rank 0 published under ``key``, once something listens there
    (TimeoutError if nothing has by ``deadline``)."""
    while True:
        address = agent.get(key).decode()
        if _listening(address, deadline):
            return address
        if time.monotonic() >= deadline:
            raise TimeoutError(f"nothing listens at {address}, the address found there "
                               "(a rank 0 of an earlier round?)")
        time.sleep(0.2)                  # a dead round's rank 0 wrote it: wait for the new one


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
    deadline = time.monotonic() + timeout
    store: TCPStore | None = None
    try:
        agent = AgentStore(master, port, is_master=False, timeout=timedelta(seconds=timeout))
        if rank == 0:
            store = TCPStore(_own_address(master, port), 0, world_size, is_master=True,
                             timeout=timeout, token=token)
            agent.set(key, store.address)
            store.wait([_WORKERS_READY_KEY])   # every rank has joined: the key has done its job
            try:
                agent.delete_key(key)
            except Exception as exc:   # only cleanup: the job has met
                warnings.warn(f"collcomm: could not delete {key!r} from torchrun's agent store "
                              f"({exc}); a restart with the same restart count re-reads it "
                              "until its own rank 0 writes it", RuntimeWarning, stacklevel=2)
            return store
        address = _read_address(agent, key, deadline)
    except BaseException as exc:
        if store is not None:
            store.close()
        if isinstance(exc, CollcommError) or not isinstance(exc, Exception):
            raise
        raise CommTimeoutError(   # torch's store errors (a timeout, a refused connection)
            f"rank {rank}: could not meet through torchrun's agent store at {master}:{port} "
            f"within {timeout:g}s ({'publishing' if rank == 0 else 'reading'} {key!r}, "
            f"where rank 0 publishes the address of collcomm's store): {exc}") from exc
    host, _, p = address.rpartition(":")
    return TCPStore(host.strip("[]"), int(p), world_size, is_master=False, timeout=timeout,
                    token=token)
