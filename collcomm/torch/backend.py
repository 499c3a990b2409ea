"""Registering backend ``"collcomm"`` with torch.distributed, and creating its groups.

torch calls :func:`create` (registered with ``extended_api=True``) for every process
group on this backend, on the members only, with the group's store (a ``PrefixStore``
unique to the group), this process's rank in the group, the group's size, its timeout, its
name and its members' global ranks (empty for the default group):

* the default group (``init_process_group("collcomm")``) attaches a new collcomm transport
  to the members through torch's store (:func:`collcomm.core.attach.attach`): whatever
  torch rendezvoused with (torchrun's ``env://``, ``tcp://``, ``file://``, a ``store=``)
  is what collcomm meets through;
* a later group (``new_group``, ``new_subgroups``, a ``DeviceMesh`` dimension) whose
  default group is also collcomm is a sub-group of that transport: no new connections;
* a collcomm group under a default group of another backend (gloo) gets a transport of
  its own among its members.

Every group's timeout is the one torch passes (``init_process_group(timeout=)``,
``new_group(timeout=)``).
"""
from __future__ import annotations

import datetime
from typing import Any

import torch.distributed as dist
from torch.distributed import DistStoreError

from ..core import attach
from ..errors import CollcommError, CommTimeoutError
from ..rendezvous.base import Store, Value, _value_bytes
from .errors import translate
from .process_group import BACKEND_NAME, ProcessGroupCollcomm

__all__ = ["TorchStore", "create", "register"]


class TorchStore(Store):
    """A torch.distributed store seen through collcomm's :class:`~collcomm.rendezvous.Store`."""

    def __init__(self, store: Any, timeout: float) -> None:
        super().__init__(timeout)
        self.store = store

    def _wait(self, keys: list[str], timeout: float | None) -> None:
        limit = self._resolve(timeout)
        try:
            self.store.wait(keys, datetime.timedelta(seconds=limit))
        except DistStoreError as exc:
            raise CommTimeoutError(f"store: keys {keys} did not appear within {limit:g} s "
                                   f"({exc})") from exc

    def set(self, key: str, value: Value) -> None:
        self.store.set(key, _value_bytes(value))

    def get(self, key: str, timeout: float | None = None) -> bytes:
        self._wait([key], timeout)
        return bytes(self.store.get(key))

    def wait(self, keys: list[str], timeout: float | None = None) -> None:
        self._wait(list(keys), timeout)

    def add(self, key: str, amount: int) -> int:
        return int(self.store.add(key, int(amount)))

    def compare_set(self, key: str, expected: Value, desired: Value) -> bytes:
        return bytes(self.store.compare_set(key, _value_bytes(expected), _value_bytes(desired)))

    def delete_key(self, key: str) -> bool:
        return bool(self.store.delete_key(key))

    def check(self, keys: list[str]) -> bool:
        return bool(self.store.check(list(keys)))

    def num_keys(self) -> int:
        return int(self.store.num_keys())

    def close(self) -> None:
        """torch owns the store."""


def _collcomm_default_group() -> ProcessGroupCollcomm | None:
    """torch's default group, if it is a live collcomm group."""
    if not dist.is_initialized():
        return None
    default = dist.distributed_c10d._get_default_group()
    if isinstance(default, ProcessGroupCollcomm) and not default.core_group._closed:
        return default
    return None


def create(opts: Any, backend_options: Any = None) -> ProcessGroupCollcomm:
    """The backend's creator (torch's ``extended_api`` form; see the module docstring)."""
    rank, size = int(opts.group_rank), int(opts.group_size)
    timeout = opts.timeout.total_seconds()
    members = [int(r) for r in opts.global_ranks_in_group]
    name = str(opts.group_id)
    parent = _collcomm_default_group() if members else None
    try:
        if parent is not None:
            group = attach.subgroup(parent.core_group, members, key=name, name=f"pg{name}",
                                    timeout=timeout)
        else:
            group = attach.attach(TorchStore(opts.store, timeout), rank, size, timeout,
                                  name="WORLD" if not members else f"pg{name}")
    except CollcommError as exc:
        raise translate(exc) from None
    return ProcessGroupCollcomm(group, rank, size)


def register() -> None:
    """Make ``"collcomm"`` a torch.distributed backend for CPU tensors (idempotent)."""
    if BACKEND_NAME.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND_NAME, create, extended_api=True, devices=["cpu"])
