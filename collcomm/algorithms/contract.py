"""The algorithms' contract: exactly what a family function may use of the ``comm`` it gets.

Every family needs only :class:`Comm` (``rank``, ``size``, ``isend``, ``irecv``: see
:mod:`.base` for the matching rules). The rest are capabilities a process group's comm
(:class:`collcomm.core.call_comm.GroupComm`, and the tracing wrapper around it) offers and a
bare point-to-point comm (the in-process test double, a user's own) may lack:

* :class:`Scratch` — reusable temporaries; *optional*: :func:`.base.scratch` allocates
  when a comm has none.
* :class:`Topology` — shared memory, hosts, link; *optional*: :func:`.registry.topology`
  reads one host over TCP without shared memory when a comm has none.
* :class:`Hierarchy` — the per-host and leader sub-comms; *required* by ``hierarchical``
  (:class:`HierarchicalComm`).
* :class:`SharedMemory` — the call's signature, the group's :class:`Arena` and the shared
  heap; *required* by ``shm_direct`` (:class:`ShmComm`).

:class:`Arena` and :class:`NativeCore` list what ``shm_direct`` uses of
:class:`collcomm.transport.arena.Arena` and of its native core. :class:`FullComm` is all
of it: what ``GroupComm`` provides and what its ``hierarchy()`` hands out.
tests/test_contract.py checks that every class passed to the algorithms has each member
its protocols name, with compatible parameters, so the contract cannot drift silently.
Nothing here is checked at run time (no ``isinstance`` on the per-call path).
"""
from __future__ import annotations

from typing import Protocol, Sequence

import numpy as np

from ..transport.base import Handle


class Comm(Protocol):
    """Point-to-point among the ranks ``0..size-1`` of one collective call (see .base)."""

    rank: int
    size: int

    def isend(self, arr: np.ndarray, peer: int) -> Handle: ...

    def irecv(self, arr: np.ndarray, peer: int) -> Handle: ...


class Scratch(Protocol):
    def scratch(self, nbytes: int, slot: int = 0) -> np.ndarray:
        """At least ``nbytes`` (uint8) reused across calls; distinct slots never overlap."""
        ...


class Topology(Protocol):
    """The same on every rank of the group; the automatic rule picks families from it."""

    can_share_memory: bool   # every rank is on this host with shared memory (arena possible)
    spans_hosts: bool        # n_hosts > 1
    n_hosts: int
    link: str                # "shm" (every peer over shared-memory channels) or "tcp"


class Hierarchy(Protocol):
    hosts: Sequence[str]     # the host of each rank, in rank order (equal names: one host)

    def hierarchy(self) -> tuple[FullComm, FullComm | None]:
        """(this host's ranks, the hosts' leaders or None if this rank is not one) as comms
        for one step each inside this call; a leader is its host's lowest rank."""
        ...


class NativeCore(Protocol):
    """The native core of an arena (collcomm/native/_shmcore.c); each returns a status
    (see shm_stage: done, mismatch, finish in Python, split sizes differ, refuse).
    (Its writable member ``all_reduce_extra``, the group's all_reduce one-step bound, is
    the arena's business: Arena.check_settings sets it; no algorithm reads it.)"""

    def all_reduce(self, arena: Arena, buf: np.ndarray, code: int, sig: int, /) -> int: ...

    def reduce(self, arena: Arena, send: np.ndarray, recv: np.ndarray | None, code: int, root: int,
               sig: int, /) -> int: ...

    # (reduce: between two ranks of Core.reduce_cma_min..reduce_cma_max bytes the root reads
    # the other's buffer by cross-memory attach; PYTHON: the root hands back, reduce_cma_after)

    def broadcast(self, arena: Arena, buf: np.ndarray, root: int, sig: int, step: int = ...,
                  cma_key: int = ..., pids: Sequence[int] = ..., /) -> int: ...
    # (with step: staged in steps of that many bytes; with cma_key and pids too, split by
    # cross-memory attach, step then the itemsize: shm_large.rooted_split)

    def gather(self, arena: Arena, send: np.ndarray, recv: np.ndarray | None, root: int, sig: int,
               itemsize: int = ..., cma_key: int = ..., pids: Sequence[int] = ..., /) -> int: ...
    # (with itemsize, cma_key and pids: a gather split by cross-memory attach)

    def reduce_scatter(self, arena: Arena, send: np.ndarray, recv: np.ndarray, code: int, sig: int,
                       /) -> int: ...

    def scatter(self, arena: Arena, send: np.ndarray | None, recv: np.ndarray, root: int, sig: int,
                step_or_itemsize: int = ..., cma_key: int = ..., pids: Sequence[int] = ..., /) -> int: ...
    # (with a step: staged in steps of that many bytes of each block; with an itemsize,
    # cma_key and pids: split by cross-memory attach)

    def all_to_all(self, arena: Arena, send: np.ndarray, send_counts: Sequence[int], recv: np.ndarray,
                   recv_counts: Sequence[int], itemsize: int, sig: int, cma_limit: int, /) -> int: ...

    def barrier(self, arena: Arena, sig: int, /) -> int: ...

    #: nonzero while a rooted call it left early (eager) is not settled yet; its phase
    lag_target: int
    lag_phase: int

    def settle(self, arena: Arena, block: bool = ..., /) -> int | None: ...
    # (waits for everybody's arrival at the call left early, or with block False only
    # looks; its signature when some rank's differs, else None: shm_stage.settle_early;
    # the writable ``eager`` is the arena's)


class Arena(Protocol):
    """What shm_direct uses of a group's arena (collcomm.transport.arena.Arena)."""

    n: int                        # ranks
    rank: int                     # this rank
    slot: int                     # bytes per slot
    phase: int                    # the current slot phase (0 or 1)
    cma: bool                     # every rank can read every other's memory (read_remote)
    cma_write: bool               # ... and write it (write_remote)
    cma_cost: float               # a byte read by CMA costs this many memcpy'd bytes (agreed)
    ag_vote_min: int              # all_gathers of this many bytes up go the voted way (0: none)
    cores: int                    # the fewest CPUs any rank may run on (agreed)
    all_reduce_extra: int         # the group's all_reduce one-step bound (arena_layout; agreed)
    global_ranks: Sequence[int]   # global rank of each rank (for error messages)
    native_core: NativeCore | None

    def put(self, word: int, value: int) -> None:
        """Set header word ``word`` of this rank."""
        ...

    def get(self, rank: int, word: int) -> int:
        """Header word ``word`` of ``rank``."""
        ...

    def next_phase(self) -> int: ...

    def sync(self) -> None:
        """The counter barrier of every rank of the arena."""
        ...

    def slot_array(self, phase: int, rank: int, dtype: np.dtype, count: int,
                   offset: int = 0) -> np.ndarray: ...

    def read_remote(self, r: int, address: int, out: np.ndarray) -> None:
        """Copy ``out.nbytes`` at ``address`` in rank ``r``'s memory into ``out`` (CMA)."""
        ...

    def write_remote(self, r: int, address: int, src: np.ndarray) -> None:
        """Copy ``src`` to ``address`` in rank ``r``'s memory (CMA; only where ``cma_write``)."""
        ...


class SharedMemory(Protocol):
    sig: int   # the call's signature word (see .signature); 0: unknown

    def arena(self) -> Arena | None:
        """The group's arena (built collectively by the first call that asks), or None when
        the group cannot share memory."""
        ...

    def shared(self, arr: np.ndarray) -> tuple[int, int] | None:
        """(heap key, byte offset) if ``arr`` lies in a shared allocation every rank mapped."""
        ...

    def peer_bytes(self, key: int, peer: int) -> np.ndarray:
        """Rank ``peer``'s segment of shared allocation ``key`` (uint8)."""
        ...


class HierarchicalComm(Comm, Topology, Hierarchy, Protocol):
    """What the ``hierarchical`` family needs."""


class ShmComm(Comm, SharedMemory, Protocol):
    """What the ``shm_direct`` family needs."""


class FullComm(Comm, Scratch, Topology, Hierarchy, SharedMemory, Protocol):
    """Everything above: a process group's comm (GroupComm) and its hierarchy's comms."""


#: Every protocol of the contract (tests/test_contract.py checks implementations of each).
PROTOCOLS: tuple[type, ...] = (Comm, Scratch, Topology, Hierarchy, SharedMemory, Arena, NativeCore,
                               HierarchicalComm, ShmComm, FullComm)
