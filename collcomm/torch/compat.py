"""``monitored_barrier`` for collcomm groups.

torch refuses ``torch.distributed.monitored_barrier`` for every backend but gloo, by name.
:func:`monitored_barrier` (installed in its place by :func:`install`, which ``import
collcomm.torch`` calls) runs the collcomm group's own implementation for collcomm groups
and hands every other group to torch's function unchanged, so gloo groups behave as before.
"""
from __future__ import annotations

from typing import Any

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

__all__ = ["install", "monitored_barrier"]

_torch_monitored_barrier = c10d.monitored_barrier


def monitored_barrier(group: Any = None, timeout: Any = None, wait_all_ranks: bool = False) -> None:
    """torch's ``monitored_barrier``, for collcomm groups as well as gloo ones."""
    from .process_group import ProcessGroupCollcomm

    if c10d._rank_not_in_group(group):
        return _torch_monitored_barrier(group, timeout, wait_all_ranks)
    pg = c10d._group_or_default_group(group)
    if isinstance(pg, ProcessGroupCollcomm):
        pg.monitored_barrier(timeout, wait_all_ranks)
        return None
    return _torch_monitored_barrier(group, timeout, wait_all_ranks)


def install() -> None:
    """Install :func:`monitored_barrier` as torch's (idempotent)."""
    dist.monitored_barrier = monitored_barrier
    c10d.monitored_barrier = monitored_barrier
