"""Opening the store an ``init_method`` URL names (tcp://, file://, env://; torchagent://,
which collcomm itself picks under torchrun's agent store: rendezvous/torch_agent.py)."""
from __future__ import annotations

import os
from urllib.parse import urlparse

from ..errors import InvalidArgumentError
from .base import DEFAULT_TIMEOUT, Store
from . import torch_agent
from .file_store import FileStore
from .tcp_client import TCPStore

# --------------------------------------------------------------------------- URLs

def _host_port(text: str, what: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise InvalidArgumentError(f"{what}: expected host:port, got {text!r}")
    return host.strip("[]"), int(port)


def store_from_url(url: str, rank: int, world_size: int, timeout: float = DEFAULT_TIMEOUT,
                   token: bytes | None = None) -> Store:
    """Open the store an ``init_method`` URL names.

    * ``tcp://host:port``: rank 0 hosts the server (as torch does), every rank is a client.
    * ``file:///path``: a :class:`FileStore` removed when all ``world_size`` ranks close it.
    * ``env://``: if ``COLLCOMM_STORE=host:port`` is set the launcher already hosts a server
      and every rank is a plain client; otherwise ``MASTER_ADDR``/``MASTER_PORT`` as
      ``tcp://`` (rank 0 hosts).
    """
    parsed = urlparse(url)
    if parsed.scheme == torch_agent.SCHEME:
        host, port = _host_port(parsed.netloc, url)
        return torch_agent.open_store(host, port, rank, world_size, timeout, token)
    if parsed.scheme == "tcp":
        host, port = _host_port(parsed.netloc, url)
        return TCPStore(host, port, world_size, is_master=(rank == 0), timeout=timeout,
                        token=token)
    if parsed.scheme == "file":
        path = parsed.path if not parsed.netloc else f"//{parsed.netloc}{parsed.path}"
        if not path:
            raise InvalidArgumentError(f"file:// URL without a path: {url!r}")
        return FileStore(path, world_size, timeout=timeout)
    if parsed.scheme == "env":
        hosted = os.environ.get("COLLCOMM_STORE")
        if hosted:
            host, port = _host_port(hosted, "COLLCOMM_STORE")
            return TCPStore(host, port, world_size, is_master=False, timeout=timeout,
                            token=token)
        addr, port_s = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
        if not addr or not port_s or not port_s.isdigit():
            raise InvalidArgumentError(
                "env:// needs COLLCOMM_STORE=host:port or MASTER_ADDR and MASTER_PORT "
                f"(got MASTER_ADDR={addr!r}, MASTER_PORT={port_s!r})")
        return TCPStore(addr, int(port_s), world_size, is_master=(rank == 0),
                        timeout=timeout, token=token)
    raise InvalidArgumentError(f"unsupported store URL {url!r} (tcp://, file://, env://)")
