"""Attaching collcomm to ranks that another library brought together.

A front end that lives inside another framework (the torch.distributed backend,
:mod:`collcomm.torch`) does not run collcomm's own rendezvous: the framework already knows
each process's rank and size and hands over a key-value store every member can reach.
:func:`attach` turns that into a collcomm :class:`ProcessGroup`:

1. Every member counts itself in (``add("collcomm/attach", 1)``); the count divided by
   the group size is the *generation*, so a group re-created over the same store (destroy,
   then init again) never reads keys of an earlier incarnation. All of this attach's keys
   live under ``collcomm/<generation>/``.
2. Member 0 publishes the job's secret (``COLLCOMM_TOKEN`` if set, else a fresh random
   one; the framework's store is as trusted as the framework) and the name of its
   shared-memory segments (``<job id>-<random>``, so ``/dev/shm/collcomm-<job id>-*``
   still finds them); rank 0's cost model is shared as in a normal join.
3. The transport is built exactly as ``init_process_group`` builds it (shared memory to
   members on this host, TCP to the others; ``COLLCOMM_TRANSPORT`` applies), and the
   group spans the members ``0..size-1``.

Groups made later from an attached group (:func:`subgroup`) reuse its transport, with a
context id derived from a name every member agrees on. An :class:`Attachment` counts the
groups using its transport and closes it (a clean departure, seen by peers as such) when
the last one is released, or at interpreter exit.

The store only needs ``set``, ``get(key, timeout)``, ``add`` (the
:class:`~collcomm.rendezvous.Store` contract); nothing here imports the framework.
"""
from __future__ import annotations

import atexit
import os
import secrets
import threading
from typing import Any, Sequence

from ..errors import InvalidArgumentError
from ..rendezvous import PrefixStore
from ..rendezvous.auth import job_id, job_token
from .bootstrap import Identity, Job
from .connect import connect_transport, share_cost_model
from .group import NON_GROUP_MEMBER, ProcessGroup
from .tags import make_ctx

__all__ = ["Attachment", "attach", "release", "subgroup"]

_lock = threading.Lock()
_live: dict[int, "Attachment"] = {}      # id(group) -> the attachment whose transport it uses


class Attachment:
    """A transport built by :func:`attach` and the groups that use it."""

    def __init__(self, job: Job | None) -> None:
        self.job = job
        self.groups: list[ProcessGroup] = []   # strong references: ids in _live stay unique

    def retain(self, group: ProcessGroup) -> ProcessGroup:
        with _lock:
            self.groups.append(group)
            _live[id(group)] = self
        return group

    def release(self, group: ProcessGroup) -> None:
        with _lock:
            if _live.get(id(group)) is not self:
                return
            del _live[id(group)]
            self.groups.remove(group)
            last = not self.groups
        group.close()
        if last and self.job is not None:
            job, self.job = self.job, None
            job.close()


def attach(store: Any, rank: int, size: int, timeout: float, name: str = "attached") -> ProcessGroup:
    """A group of ``size`` processes (this one is ``rank``) meeting through ``store``.

    Every member must call it with the same ``size`` and a store they share. Raises
    :class:`~collcomm.errors.CommTimeoutError` if the members do not all arrive within
    ``timeout`` seconds.
    """
    if not 0 <= rank < size:
        raise InvalidArgumentError(f"attach: rank must be in [0, {size}), got {rank}")
    if size == 1:
        group = ProcessGroup(None, [0], 0, make_ctx("attach", name), name, timeout)
        return Attachment(None).retain(group)
    generation = (int(store.add("collcomm/attach", 1)) - 1) // size
    kv = PrefixStore(f"collcomm/{generation}", store)
    if rank == 0:
        token = job_token() if os.environ.get("COLLCOMM_TOKEN") else secrets.token_bytes(32)
        kv.set("token", token)
        kv.set("job", f"{job_id()}-{secrets.token_hex(3)}")
    token = kv.get("token", timeout=timeout)
    jid = kv.get("job", timeout=timeout).decode()
    job = Job(rank, size, Identity(rank, size, rank, "attached"))
    try:
        share_cost_model(kv, rank, timeout)
        job.transport = connect_transport(job, kv, token, jid, timeout)
    except BaseException:
        job.close()
        raise
    group = ProcessGroup(job.transport, range(size), rank, make_ctx("attach", jid), name, timeout)
    return Attachment(job).retain(group)


def subgroup(parent: ProcessGroup, ranks: Sequence[int], key: str, name: str,
             timeout: float | None = None) -> ProcessGroup | Any:
    """The members ``ranks`` (ranks of ``parent``'s transport, i.e. ``parent.ranks`` values)
    as a group on ``parent``'s transport; NON_GROUP_MEMBER if this process is not one.

    ``key`` names the group identically on every member (e.g. the framework's group name);
    it and ``ranks`` give the group its context id. No traffic.
    """
    members = [int(r) for r in ranks]
    if len(set(members)) != len(members) or not set(members) <= set(parent.ranks):
        raise InvalidArgumentError(
            f"subgroup {name!r}: ranks must be distinct members of {parent.describe()}, got {members}")
    group = parent.subgroup(members, make_ctx("attach-sub", parent.ctx, key, tuple(members)), name)
    if group is NON_GROUP_MEMBER:
        return group
    if timeout is not None:
        group.timeout = timeout
    with _lock:
        owner = _live.get(id(parent))
    if owner is None:
        raise InvalidArgumentError(f"subgroup {name!r}: {parent.describe()} is not attached "
                                   "(or was already released)")
    return owner.retain(group)


def release(group: ProcessGroup) -> None:
    """Close ``group``; close its transport when no other group uses it. Idempotent."""
    with _lock:
        owner = _live.get(id(group))
    if owner is None:
        group.close()
        return
    owner.release(group)


def _release_all() -> None:
    """At exit: leave cleanly (peers see a departure, not a crash)."""
    with _lock:
        owners = {id(a): a for a in _live.values()}
        _live.clear()
    for a in owners.values():
        if a.job is not None:
            try:
                a.job.close()
            except Exception:  # noqa: BLE001 - exiting anyway
                pass
            a.job = None


atexit.register(_release_all)
