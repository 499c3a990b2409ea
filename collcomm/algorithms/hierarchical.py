"""Hierarchical collectives for groups that span hosts: shared memory inside each host,
TCP only between one *leader* per host (the host's lowest rank).

* all_reduce: reduce to the leader inside each host (shared memory), all_reduce among the
  leaders (a point-to-point family over TCP, chosen by the cost model), broadcast from the
  leader inside each host. Only ``hosts`` ranks cross the network instead of all ``n``.
* broadcast(root): inside root's host from root; among the leaders from root's host
  leader; inside every other host from its leader.
* reduce(root): reduce to the leader inside each host, reduce among the leaders to root's
  host leader, which hands the result to root if root is not the leader.
* barrier: barrier inside each host, among the leaders, inside each host again.

Each step runs the best family for its tier (``shm_direct`` inside a host when it can,
else the automatic point-to-point choice), so the per-step costs are those families'.
That choice is the registry's automatic rule, handed in by the registry
(:func:`use_chooser`): this module never imports the registry (imports go one way,
registry → families). The comm is a :class:`.contract.HierarchicalComm`.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from ..errors import InvalidArgumentError
from .base import ReduceFn
from .contract import FullComm, HierarchicalComm

#: ``choose(collective, nbytes, comm)``: the family to run one step on ``comm`` (a tier).
Chooser = Callable[[str, int, FullComm], Callable[..., None]]


def _no_chooser(collective: str, nbytes: int, comm: FullComm) -> Callable[..., None]:
    raise RuntimeError("collcomm.algorithms.hierarchical: no step chooser installed (importing "
                       "collcomm.algorithms.registry installs its automatic rule)")


_best: Chooser = _no_chooser


def use_chooser(choose: Chooser) -> None:
    """Pick each step's family with ``choose`` (the registry passes :func:`.registry.best`)."""
    global _best
    _best = choose


def _tiers(comm: HierarchicalComm, collective: str) -> tuple[FullComm, FullComm | None]:
    try:
        spans = comm.spans_hosts
    except AttributeError:   # a bare point-to-point Comm (no Topology): not several hosts
        spans = False
    if not spans:
        raise InvalidArgumentError(
            f"{collective}: algorithm hierarchical needs a group whose ranks span several hosts")
    return comm.hierarchy()


def _hosts(comm: HierarchicalComm) -> Sequence[str]:
    """The host of each rank (contract.Hierarchy.hosts)."""
    return comm.hosts


def all_reduce(comm: HierarchicalComm, buf: np.ndarray, fn: ReduceFn) -> None:
    local, leaders = _tiers(comm, "all_reduce")
    if local.size > 1:
        _best("reduce", buf.nbytes, local)(local, buf, buf if local.rank == 0 else None, fn, 0)
    if leaders is not None:
        _best("all_reduce", buf.nbytes, leaders)(leaders, buf, fn)
    if local.size > 1:
        _best("broadcast", buf.nbytes, local)(local, buf, 0)


def _root_tiers(hosts: Sequence[str], root: int) -> tuple[int, int]:
    """(root's index among the leaders, root's local rank on its own host)."""
    root_host = hosts[root]
    leader_hosts = list(dict.fromkeys(hosts))
    return leader_hosts.index(root_host), [i for i, h in enumerate(hosts) if h == root_host].index(root)


def broadcast(comm: HierarchicalComm, buf: np.ndarray, root: int) -> None:
    local, leaders = _tiers(comm, "broadcast")
    hosts = _hosts(comm)
    root_leader, root_local = _root_tiers(hosts, root)
    on_root_host = hosts[comm.rank] == hosts[root]
    if on_root_host and local.size > 1:
        _best("broadcast", buf.nbytes, local)(local, buf, root_local)
    if leaders is not None:
        _best("broadcast", buf.nbytes, leaders)(leaders, buf, root_leader)
    if not on_root_host and local.size > 1:
        _best("broadcast", buf.nbytes, local)(local, buf, 0)


def reduce(comm: HierarchicalComm, send: np.ndarray, recv: np.ndarray | None, fn: ReduceFn,
           root: int) -> None:
    local, leaders = _tiers(comm, "reduce")
    hosts = _hosts(comm)
    root_leader, root_local = _root_tiers(hosts, root)
    on_root_host = hosts[comm.rank] == hosts[root]
    partial = np.empty_like(send) if local.rank == 0 else None
    if local.size > 1:
        _best("reduce", send.nbytes, local)(local, send, partial, fn, 0)
    elif partial is not None:
        np.copyto(partial, send)
    if leaders is not None:
        assert partial is not None
        target = partial if leaders.rank == root_leader else None
        _best("reduce", send.nbytes, leaders)(leaders, partial, target, fn, root_leader)
    if on_root_host and root_local != 0:
        if local.rank == 0:
            assert partial is not None
            local.isend(partial, root_local).wait()
        elif local.rank == root_local:
            assert recv is not None
            local.irecv(recv, 0).wait()
    elif on_root_host and local.rank == 0 and recv is not None:
        assert partial is not None
        np.copyto(recv, partial)


def barrier(comm: HierarchicalComm) -> None:
    local, leaders = _tiers(comm, "barrier")
    if local.size > 1:
        _best("barrier", 0, local)(local)
    if leaders is not None:
        _best("barrier", 0, leaders)(leaders)
    if local.size > 1:
        _best("barrier", 0, local)(local)
