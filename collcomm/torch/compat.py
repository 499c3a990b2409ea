"""Two places where torch.distributed needs a nudge to run on collcomm unchanged.

1. **``env://`` under ``collcomm run``.** The launcher's rendezvous store listens on
   ``MASTER_PORT`` (it is also ``COLLCOMM_STORE``), so torch's ``env://`` rank 0 could not
   host its own TCPStore there. When that is the case, and only then, ``env://`` is served
   by :func:`_env_handler`: rank 0 hosts torch's store on a free port (bound race-free,
   port 0) and publishes the port through the launcher's store (authenticated with the
   job's ``COLLCOMM_TOKEN``); the other ranks read it and connect. Every other ``env://``
   (torchrun, a plain environment) goes to torch's own handler untouched. Works for any
   backend, so ``collcomm run`` launches gloo programs too.
2. **``monitored_barrier``.** torch refuses it for every backend but gloo by name;
   :func:`monitored_barrier` (installed as ``torch.distributed.monitored_barrier``) calls
   the collcomm group's own implementation for collcomm groups and torch's for the others.

:func:`install` applies both once (``import collcomm.torch`` calls it).
"""
from __future__ import annotations

import datetime
import functools
import importlib
import os
from typing import Any, Iterator
from urllib.parse import parse_qs, urlparse

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from ..rendezvous import PrefixStore, store_from_url
from ..rendezvous.auth import job_token

__all__ = ["install", "monitored_barrier"]

_installed = False


def _under_collcomm_run() -> bool:
    """True when MASTER_PORT is the port of ``collcomm run``'s own store."""
    hosted = os.environ.get("COLLCOMM_STORE", "")
    port = os.environ.get("MASTER_PORT", "")
    return bool(hosted and port) and hosted.rpartition(":")[2] == port


def _env_handler(original: Any, url: str, timeout: datetime.timedelta = c10d.default_pg_timeout,
                 **kwargs: Any) -> Iterator[tuple[Any, int, int]]:
    if not _under_collcomm_run():
        yield from original(url, timeout=timeout, **kwargs)
        return
    query = {k: v[-1] for k, v in parse_qs(urlparse(url).query).items()}
    rank = int(query.get("rank", os.environ["RANK"]))
    size = int(query.get("world_size", os.environ["WORLD_SIZE"]))
    seconds = timeout.total_seconds()
    ours = store_from_url("env://", rank, size, seconds, job_token())
    try:
        generation = (ours.add("torch/env/joined", 1) - 1) // size
        kv = PrefixStore(f"torch/env/{generation}", ours)
        addr = os.environ["MASTER_ADDR"]
        if rank == 0:
            store = dist.TCPStore(addr, 0, size, True, timeout, wait_for_workers=False)
            kv.set("port", str(store.port))
        else:
            port = int(kv.get("port", timeout=seconds))
            store = dist.TCPStore(addr, port, size, False, timeout)
    finally:
        ours.close()
    yield (store, rank, size)
    raise RuntimeError("Unable to perform re-rendezvous using env:// method")


def monitored_barrier(group: Any = None, timeout: Any = None, wait_all_ranks: bool = False) -> None:
    """torch's ``monitored_barrier``, for collcomm groups as well as gloo ones."""
    from .process_group import ProcessGroupCollcomm

    pg = c10d._group_or_default_group(group)
    if isinstance(pg, ProcessGroupCollcomm):
        if c10d._rank_not_in_group(group):
            return None
        pg.monitored_barrier(timeout, wait_all_ranks)
        return None
    return _torch_monitored_barrier(group, timeout, wait_all_ranks)


_torch_monitored_barrier = c10d.monitored_barrier


def install() -> None:
    """Apply both adjustments (idempotent)."""
    global _installed
    if _installed:
        return
    # torch.distributed.rendezvous the module (the package exports a function of that name)
    handlers = importlib.import_module("torch.distributed.rendezvous")._rendezvous_handlers
    original = handlers.get("env")
    if original is not None:
        handlers["env"] = functools.partial(_env_handler, original)
    dist.monitored_barrier = monitored_barrier
    c10d.monitored_barrier = monitored_barrier
    _installed = True
