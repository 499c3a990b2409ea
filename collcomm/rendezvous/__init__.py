"""The rendezvous key-value store: how the ranks of a job find each other.

The API follows ``torch.distributed``'s stores. Keys are ``str``; values are ``bytes``
(``str`` values are encoded as UTF-8). ``get`` and ``wait`` block until the keys exist or
the timeout passes (:class:`~collcomm.errors.CommTimeoutError` naming the missing keys).
``add`` keeps an atomic counter stored as decimal bytes; ``compare_set`` has torch's
semantics (a missing key is set only when ``expected == b""``; the current value is
returned).

Implementations:

* :class:`TCPStore` talks to a :class:`TCPStoreServer` (hosted by rank 0 or by the
  launcher). The server is one thread around ``selectors``: non-blocking sockets, many
  clients, blocking ``get``/``wait`` requests are parked server-side and answered when
  their keys appear or their deadline passes, so a connection never gets out of step.
  Every accepted connection must pass :func:`collcomm.rendezvous.auth.authenticate` (in a short-lived
  helper thread) before a single request byte is parsed.
* :class:`FileStore`: an append-only record log guarded by ``fcntl.flock``, for processes
  on one host or a shared file system.
* :class:`PrefixStore`: a namespace inside another store.

Wire protocol (no pickle), both directions: ``!BI`` (op or status, field count), then per
field ``!I`` length + bytes. Timeouts travel as an 8-byte ``!d`` field.
"""
from __future__ import annotations

from .base import DEFAULT_TIMEOUT, Store
from .file_store import FileStore
from .prefix_store import PrefixStore
from .tcp_client import TCPStore
from .tcp_server import TCPStoreServer
from .url import store_from_url

__all__ = ["Store", "TCPStore", "TCPStoreServer", "FileStore", "PrefixStore",
           "store_from_url", "DEFAULT_TIMEOUT"]
