"""torch.distributed on collcomm: backend ``"collcomm"`` for CPU tensors.

A CPU torch program changes one string::

    import collcomm.torch                      # registers the backend
    import torch.distributed as dist
    dist.init_process_group("collcomm")        # was "gloo" (or "nccl" with .cuda() dropped)

and everything built on torch.distributed runs on collcomm: every collective (with
``async_op=True``, ``Work.wait(timeout)``, ``get_future()``), point to point,
``batch_isend_irecv``, the ``*_object`` functions, ``monitored_barrier``, ``new_group``,
``new_subgroups``, ``DeviceMesh`` and ``DistributedDataParallel``. Launch it with
``torchrun`` (``env://``, also multi-node), ``collcomm run``, or ``init_method="tcp://…"`` /
``"file://…"``; ``"cpu:collcomm"`` works as a device map. Tensors must be on the CPU
(others are refused with an error naming their device). See ``docs/from-torch.md``.

Modules: :mod:`.backend` (registration, group creation), :mod:`.process_group` (the
collectives), :mod:`.p2p` (point to point, ``monitored_barrier``), :mod:`.tensors` (zero-copy tensor views, reduce ops), :mod:`.work` (Work
objects), :mod:`.errors` (torch-style exceptions), :mod:`.compat` (``monitored_barrier``).
"""
from __future__ import annotations

from . import compat as _compat
from .backend import TorchStore, create, register
from .compat import monitored_barrier
from .errors import (
    BackendAuthError, BackendClosedError, BackendError, BackendMismatchError,
    BackendPeerLostError, BackendTimeoutError,
)
from .p2p import MONITORED_BARRIER_TAG
from .process_group import BACKEND_NAME, ProcessGroupCollcomm

__all__ = [
    "BACKEND_NAME", "MONITORED_BARRIER_TAG", "ProcessGroupCollcomm", "TorchStore", "create",
    "monitored_barrier", "register",
    "BackendAuthError", "BackendClosedError", "BackendError", "BackendMismatchError",
    "BackendPeerLostError", "BackendTimeoutError",
]

register()
_compat.install()
