"""Joining a job: the process-wide world group and the groups made from it.

``init_process_group`` reads the launcher's environment (collcomm run, torchrun, Open MPI,
MPICH/Hydra, Slurm; explicit arguments win), meets the other ranks through a rendezvous
store, builds the transport (shared memory to ranks on this host, TCP to the others) and
creates the world group. A process started by no launcher is a world of size 1.
"""
from __future__ import annotations

import atexit
import os
import threading
from typing import Any, Sequence

from ..errors import InvalidArgumentError
from .group import NON_GROUP_MEMBER, ProcessGroup
from .tags import make_ctx

DEFAULT_TIMEOUT = 300.0

# Locks. ``_lock`` (a leaf) guards the module state below: it is held to check and set it,
# and while joining a job (so two threads cannot both join), but never while closing groups
# or the transport, whose worker threads may run user callbacks (``Work.then``) that call
# back in here. ``_close_lock`` is held while destroy_process_group closes what it took out
# of the state, so that a new init_process_group starts after the old job is gone; the two
# are never held together.
_lock = threading.Lock()
_close_lock = threading.Lock()
_world: ProcessGroup | None = None
_groups: list[ProcessGroup] = []
_new_groups = 0
_local_groups: dict[tuple[int, ...], int] = {}   # use_local_synchronization groups per ranks
_job: Any = None  # the rendezvous/transport bundle of the current job (see _join)


def default_timeout() -> float:
    return float(os.environ.get("COLLCOMM_TIMEOUT", DEFAULT_TIMEOUT))


def _timeout_seconds(timeout: Any) -> float:
    if timeout is None:
        return default_timeout()
    if hasattr(timeout, "total_seconds"):
        return float(timeout.total_seconds())
    return float(timeout)


def init_process_group(backend: str | None = None, init_method: str | None = None,
                       timeout: Any = None, world_size: int = -1, rank: int = -1,
                       store: Any = None, group_name: str = "", pg_options: Any = None,
                       device_id: Any = None) -> None:
    """Join the job (torch.distributed signature; ``backend`` is accepted and ignored)."""
    global _world
    with _close_lock:   # a destroy still closing the previous job finishes first
        pass
    with _lock:
        if _world is not None:
            raise InvalidArgumentError("init_process_group: this process is already initialized "
                                       "(call destroy_process_group first)")
        from .bootstrap import join  # late import: the transport stack loads only when needed
        job = join(init_method=init_method, world_size=world_size, rank=rank, store=store,
                   timeout=_timeout_seconds(timeout))
        _set_world(job, _timeout_seconds(timeout))


def _leave_at_exit() -> None:
    """A program that never called destroy_process_group still leaves cleanly (its peers
    then see a departure, not a crash)."""
    if _world is not None:
        try:
            destroy_process_group()
        except Exception:  # noqa: BLE001 - exiting anyway
            pass


atexit.register(_leave_at_exit)


def _set_world(job: Any, timeout: float) -> None:
    global _world, _job, _new_groups
    _job = job
    _new_groups = 0
    _local_groups.clear()
    transport = job.transport if job.size > 1 else None
    _world = ProcessGroup(transport, range(job.size), job.rank, make_ctx("world"), "WORLD", timeout)
    _groups.append(_world)


def is_initialized() -> bool:
    return _world is not None


_warned_world_of_one = False


def world_of_one(what: str) -> None:
    """Call where ``what`` stands in a world of one for a job never joined: warns once when
    the launcher's ``WORLD_SIZE`` says the job has more ranks."""
    global _warned_world_of_one
    size = os.environ.get("WORLD_SIZE", "1")
    if _world is None and not _warned_world_of_one and size.isdigit() and int(size) > 1:
        _warned_world_of_one = True
        import warnings
        warnings.warn(f"{what}: init_process_group() was never called, so this rank runs as a "
                      f"world of one while WORLD_SIZE={size}", RuntimeWarning, stacklevel=3)


def get_world(collective: str) -> ProcessGroup:
    """The world group, or InvalidArgumentError naming ``collective`` before init."""
    world = _world
    if world is None:
        raise InvalidArgumentError(
            f"{collective}: the default process group is not initialized; "
            "call collcomm.init_process_group() first")
    return world


def resolve_group(group: Any, collective: str) -> Any:
    """``None`` → the world; a ProcessGroup or NON_GROUP_MEMBER passes through."""
    world = get_world(collective)
    if group is None:
        return world
    if group is NON_GROUP_MEMBER or isinstance(group, ProcessGroup):
        if isinstance(group, ProcessGroup) and group._closed:
            raise InvalidArgumentError(f"{collective}: {group.describe()} was destroyed")
        return group
    raise InvalidArgumentError(f"{collective}: group must be a ProcessGroup or None, got {group!r}")


def new_group(ranks: Sequence[int] | None = None, timeout: Any = None, backend: str | None = None,
              pg_options: Any = None, use_local_synchronization: bool = False,
              group_desc: str | None = None) -> Any:
    """A group of the given global ranks; every rank of the world must call it, in the same
    order, unless ``use_local_synchronization`` (torch's meaning): then only the members need
    to, in the same order among themselves for the same ranks (the group is named by its
    ranks and the count of such groups, not by the world's count, which the ranks that skip
    the call would not advance).

    Returns NON_GROUP_MEMBER on ranks outside the group (torch behaviour).
    """
    global _new_groups
    world = get_world("new_group")
    members = list(range(world.size)) if ranks is None else sorted(int(r) for r in ranks)
    bad = [r for r in members if not 0 <= r < world.size]
    if bad or len(set(members)) != len(members) or not members:
        raise InvalidArgumentError(
            f"new_group: ranks must be distinct, non-empty and in [0, {world.size}), got {ranks!r}")
    key = tuple(members)
    with _lock:
        if use_local_synchronization:
            n = _local_groups[key] = _local_groups.get(key, 0) + 1
            ctx, name = make_ctx("new_group_local", n, key), f"local_group{n}{list(key)}"
        else:
            _new_groups += 1
            n = _new_groups
            ctx, name = make_ctx("new_group", n, key), f"group{n}"
    group = world.subgroup(members, ctx, group_desc or name)
    if timeout is not None and isinstance(group, ProcessGroup):
        group.timeout = _timeout_seconds(timeout)
    if isinstance(group, ProcessGroup):
        with _lock:
            _groups.append(group)
    return group


def destroy_process_group(group: Any = None) -> None:
    """Destroy ``group``, or (None) every group and leave the job.

    The state is taken out under ``_lock``; the groups and the job are closed after it is
    released (see the lock comment at the top)."""
    global _world, _job
    with _lock:
        if group is not None and group is not _world:
            if not isinstance(group, ProcessGroup):
                return
            if group in _groups:
                _groups.remove(group)
            closing, job = [group], None
        else:
            closing, job = list(reversed(_groups)), _job
            _groups.clear()
            _world, _job = None, None
    if not closing and job is None:
        return
    with _close_lock:
        for g in closing:
            g.close()
        if job is not None:
            job.close()
