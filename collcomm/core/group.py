"""Process groups: a set of global ranks with a private tag space.

A :class:`ProcessGroup` maps its local ranks ``0..size-1`` to global ranks and owns a
context id (``ctx``) that no other live group shares. Every collective call takes the next
sequence number of its group, so its messages carry ``tag = ctx | seq`` and never mix with
another call's, another group's or user point-to-point traffic (which uses its own tag
space under the same ``ctx``). Calls run in program order: synchronous ones inline in the
caller's thread, ``async_op=True`` ones queued in order and run by whoever needs them
first, the caller waiting for them or the group's worker (:mod:`.async_calls`); a
synchronous call first runs or waits for the group's pending asynchronous ones.

Tag layout: :mod:`.tags`. The comm a call's algorithm runs on: :mod:`.call_comm`;
``call_timeout`` scopes: :mod:`.timeouts`. The group's arena and shared-heap buffers:
:mod:`.group_memory`.
"""
from __future__ import annotations

import itertools
import os
import threading
from typing import Any, Callable, Sequence, TypeVar

import numpy as np

from ..algorithms.shm_stage import settle_early
from ..errors import CollcommError, InvalidArgumentError, with_context
from ..transport.base import ANY_SOURCE, Handle, Transport
from . import fastpath
from .async_calls import AsyncCalls, queued_call
from .async_watch import Watcher
from .call_comm import GroupComm, TimedHandle, as_bytes
from .group_memory import allocate_shared, build_arena
from .plan import CallPlan
from .recorder import _P2PHandle, observer_for
from .tags import CTX_SHIFT, KIND_P2P, MAX_USER_TAG, make_ctx
from .timeouts import current_timeout
from .work import Work

T = TypeVar("T")


class _NonGroupMember:
    """What ``new_group`` returns on a rank that is not in the group (torch behaviour)."""

    fast = None   # no fast call: the front ends take their regular path (which skips)

    def __repr__(self) -> str:
        return "NON_GROUP_MEMBER"


NON_GROUP_MEMBER: Any = _NonGroupMember()


class ProcessGroup:
    """A group of ranks (see module docstring). Build them with ``new_group``/``split``."""

    # _pending a plain slot: the native core's calls in two parts set and clear it
    # straight (native/_fastcall_parts_end.c, set_pending); everything else in __dict__
    __slots__ = ("_pending", "__dict__", "__weakref__")

    def __init__(self, transport: Transport | None, ranks: Sequence[int], global_rank: int,
                 ctx: int, name: str, timeout: float, arena_slot: int = 0,
                 watcher: Watcher | None = None) -> None:
        self.transport = transport
        #: the slot size of this group's arena in bytes (0: COLLCOMM_SHM_SLOT's; smaller
        #: for a group made for one known call, e.g. a persistent collective's)
        self.arena_slot = arena_slot
        self.ranks: list[int] = list(ranks)
        self.size = len(self.ranks)
        self.global_rank = global_rank
        self.rank = self.ranks.index(global_rank)
        self.ctx = ctx
        self.name = name
        self.timeout = timeout
        self._description = f"group {name!r} (rank {self.rank} of {self.size}, global rank {global_rank})"
        self._seq = itertools.count(1)
        self._tag_base = ctx << CTX_SHIFT
        self._splits = 0
        self._lock = threading.Lock()
        self.async_calls = AsyncCalls(name, watcher)
        self._watcher: Watcher | None = None     # the one of the groups made by watched_subgroup
        self.async_calls.on_empty = self._settled
        self._pending = False   # async calls were made since the last drain
        self._closed = False
        self._arena: Any = None
        self._allocs = 0
        self._scratch_bufs: list[np.ndarray] = []   # reused temporaries (see GroupComm.scratch)
        self._tiers: Any = None
        hosts = getattr(transport, "hosts", None)
        self.hosts = [hosts[r] for r in self.ranks] if hosts else ["local"] * self.size
        self.n_hosts = len(set(self.hosts))
        self.spans_hosts = self.n_hosts > 1
        kinds = transport.kinds() if transport is not None and hasattr(transport, "kinds") else {}
        all_shm = all(kinds.get(r) == "shm" for r in self.ranks if r != global_rank)
        self.link = "shm" if all_shm else "tcp"
        self.can_share_memory = (
            self.size > 1 and all_shm and os.environ.get("COLLCOMM_ARENA", "1") != "0")
        self.plan = CallPlan(self.size, self.can_share_memory, self.n_hosts, self.link)
        self.observer = observer_for(self)   # flight recorder & co (None: all off)
        # the fast call (core/fastpath.py): a group of one has it now, others with the arena
        self.fast: Any = fastpath.attach(self) if self.size == 1 else None

    def __repr__(self) -> str:
        return f"ProcessGroup({self.name!r}, ranks={self.ranks}, rank={self.rank})"

    # -- rank mapping ------------------------------------------------------------------
    def to_global(self, local: int) -> int:
        return self.ranks[local]

    def to_local(self, global_rank: int) -> int:
        """The local rank of ``global_rank``, or -1 if it is not in this group."""
        try:
            return self.ranks.index(global_rank)
        except ValueError:
            return -1

    def describe(self) -> str:
        return self._description

    # -- collectives ---------------------------------------------------------------------
    def _next_tag(self) -> int:
        # next() on itertools.count is atomic under the GIL: no lock needed
        return self._tag_base | (next(self._seq) & MAX_USER_TAG)

    def call(self, collective: str, family: Callable[..., Any], sig: int, *args: Any) -> Any:
        """``family(comm, *args)`` as one synchronous collective call: :meth:`run` without
        the closure (the small-message fast path; same ordering, timeout and errors)."""
        if self._closed:
            raise CollcommError(f"{collective}: {self.describe()} was destroyed")
        if self._pending:
            self.drain()
        comm = GroupComm(self, self._next_tag(), current_timeout(self.timeout), sig)
        if self.observer is not None:
            return self.observer.call(comm, collective, family, args)
        try:
            return family(comm, *args)
        except CollcommError as exc:
            raise with_context(exc, f"{collective} on {self._description}") from exc

    def run(self, collective: str, body: Callable[[GroupComm], T], async_op: bool = False,
            timeout: float | None = None, sig: int = 0, nbytes: int = -1,
            fast_call: Callable[[Any], Any] | None = None) -> T | Work:
        """Run ``body(comm)`` as one collective call, in program order.

        Errors from the transport are re-raised with the collective, group and rank named.
        Returns ``body``'s result, or a :class:`Work` if ``async_op``: then ``nbytes``, the
        call's size, tells the queue whether to hand it to the worker at once, and
        ``fast_call(fast)``, if given, is the same call through the group's fast call
        (tried first when it runs; it declines what it does not take).
        """
        if self._closed:
            raise CollcommError(f"{collective}: {self.describe()} was destroyed")
        if async_op:
            with self._lock:    # the tag and the place in the queue in one step: same order
                work, call = queued_call(self, collective, body, timeout, sig, fast_call)
                self._pending = True
                if self.fast is not None:
                    self.fast.paused = 1   # until drained: calls keep program order the regular way
                self.async_calls.submit(work, call, nbytes)
            return work
        self.drain()
        return self._bound(collective, body, self._next_tag(),
                           current_timeout(self.timeout) if timeout is None else timeout, sig)()

    def _bound(self, collective: str, body: Callable[[GroupComm], T], tag: int, limit: float,
               sig: int, rec: tuple | None = None) -> Callable[[], T]:
        """``body`` bound to the comm of one call (``tag``, waits bounded by ``limit``),
        recorded (at ``rec`` if it was recorded already), its errors naming the call."""
        comm = GroupComm(self, tag, limit, sig)
        if self.observer is not None:
            body = self.observer.wrap(comm, collective, body, rec)

        def call() -> T:
            try:
                return body(comm)
            except CollcommError as exc:
                raise with_context(exc, f"{collective} on {self._description}") from exc

        return call

    def drain(self) -> None:
        """Run or wait for every asynchronous call submitted so far (errors stay in their Work)."""
        if not self._pending:
            return
        self.async_calls.run_through()
        self._settled()

    def _settled(self) -> None:
        """The queue is empty: blocking calls may take the fast call again (unless another
        thread has queued a call meanwhile). Called by the thread that emptied it."""
        with self._lock:
            if self._pending and not self.async_calls.queued():
                self._pending = False
                if self.fast is not None:
                    self.fast.paused = 0

    # -- the shared-memory arena ---------------------------------------------------------------
    @property
    def arena(self) -> Any:
        """The group's shared-memory arena once its first collective built it (None before,
        and for a group that cannot share memory): read-only facts such as ``cma`` and
        ``cma_cost`` (algorithms/contract.py Arena)."""
        return self._arena

    def _get_arena(self, comm: GroupComm) -> Any:
        """The group's arena, built inside the current call by every rank together
        (:func:`.group_memory.build_arena`)."""
        if self._arena is None and self.can_share_memory:
            self._arena = build_arena(self, comm)
            self.fast = fastpath.attach(self, self._arena)
            if self.fast is not None and self._pending:   # made inside an async call
                self.fast.paused = 1
        return self._arena

    def _scratch(self, nbytes: int, slot: int) -> np.ndarray:
        bufs = self._scratch_bufs
        while len(bufs) <= slot:
            bufs.append(np.empty(0, dtype=np.uint8))
        if bufs[slot].size < nbytes:
            bufs[slot] = np.empty(max(nbytes, 2 * bufs[slot].size), dtype=np.uint8)
        return bufs[slot]

    # -- hosts -------------------------------------------------------------------------------------
    def _hierarchy(self) -> tuple["ProcessGroup", "ProcessGroup | None"]:
        """This host's members, and the group of each host's lowest rank (if we are one)."""
        if self._tiers is None:
            mine = self.hosts[self.rank]
            local = [g for g, h in zip(self.ranks, self.hosts) if h == mine]
            leaders = [self.ranks[self.hosts.index(h)] for h in dict.fromkeys(self.hosts)]
            local_group = ProcessGroup(self.transport if len(local) > 1 else None, local,
                                       self.global_rank, make_ctx("host", self.ctx, mine),
                                       f"{self.name}.host", self.timeout)
            leader_group = None
            if self.global_rank in leaders:
                leader_group = ProcessGroup(self.transport, leaders, self.global_rank,
                                            make_ctx("leaders", self.ctx), f"{self.name}.leaders",
                                            self.timeout)
            self._tiers = (local_group, leader_group)
        return self._tiers

    # -- the shared heap --------------------------------------------------------------------------
    def allocate(self, nbytes: int, collective: str = "empty") -> np.ndarray:
        """``nbytes`` (uint8) of shared memory, allocated by every rank of the group together
        (see transport/heap.py). Groups that cannot share memory get private memory, and so
        does every rank of the group when one of them finds no room in /dev/shm for its
        segment (the ranks agree first; one warning says so)."""
        return allocate_shared(self, nbytes, collective)

    # -- user point-to-point -----------------------------------------------------------
    def _p2p_tag(self, tag: int, op: str) -> int:
        if not isinstance(tag, (int, np.integer)) or not 0 <= int(tag) <= MAX_USER_TAG:
            raise InvalidArgumentError(
                f"{op} on {self.describe()}: tag must be an int in [0, {MAX_USER_TAG}], got {tag!r}")
        return (self.ctx << CTX_SHIFT) | KIND_P2P | int(tag)

    def p2p_isend(self, arr: np.ndarray, dst: int, tag: int = 0, sig: int = 0,
                  rec: list[Any] | None = None, lend: bool = False) -> Handle:
        """Send ``arr`` to local rank ``dst`` in the user tag space. ``sig``: what the message
        is (``signature.p2p(dtype)``); a receive expecting another dtype refuses it.
        ``rec``: the flight recorder's record a native attempt already made (core/p2p.py).
        ``lend``: a non-blocking send (``arr`` untouched until it is done: see Transport.isend)."""
        if self.transport is None:
            raise InvalidArgumentError(f"isend on {self.describe()}: no peer to send to")
        h = self.transport.isend(as_bytes(arr), self.ranks[dst], self._p2p_tag(tag, "isend"),
                                 sig=sig, lend=lend)
        if rec is not None:
            return _P2PHandle(TimedHandle(h, current_timeout(self.timeout)), rec)
        if self.observer is not None:
            return self.observer.p2p("isend", dst, TimedHandle(h, current_timeout(self.timeout)), arr.nbytes)
        return TimedHandle(h, current_timeout(self.timeout))

    def p2p_irecv(self, arr: np.ndarray, src: int | None, tag: int = 0, sig: int = 0,
                  rec: list[Any] | None = None) -> Handle:
        """Receive into ``arr`` from local rank ``src`` (None: any rank of this group).
        ``sig``: the message expected (``signature.p2p(dtype)``; 0 accepts any); ``rec`` as
        for :meth:`p2p_isend`."""
        if self.transport is None:
            raise InvalidArgumentError(f"irecv on {self.describe()}: no peer to receive from")
        gsrc = ANY_SOURCE if src is None else self.ranks[src]
        h = self.transport.irecv(as_bytes(arr), gsrc, self._p2p_tag(tag, "irecv"),
                                 sig=sig)  # type: ignore[call-arg]
        if rec is not None:
            return _P2PHandle(TimedHandle(h, current_timeout(self.timeout)), rec)
        if self.observer is not None:
            return self.observer.p2p("irecv", src, TimedHandle(h, current_timeout(self.timeout)), arr.nbytes)
        return TimedHandle(h, current_timeout(self.timeout))

    # -- sub-groups ----------------------------------------------------------------------
    def subgroup(self, ranks: Sequence[int], ctx: int, name: str) -> "ProcessGroup | Any":
        """A group of the given global ranks (NON_GROUP_MEMBER if this rank is not one)."""
        if self.global_rank not in ranks:
            return NON_GROUP_MEMBER
        return ProcessGroup(self.transport if len(ranks) > 1 else None, ranks,
                            self.global_rank, ctx, name, self.timeout)

    def watched_subgroup(self, ctx: int, name: str, arena_slot: int = 0) -> "ProcessGroup":
        """A group of the same ranks for one kind of call made by the hundred (a persistent
        collective request's): its asynchronous calls are watched by one thread of this
        group's instead of a worker of its own (:mod:`.async_watch`), its arena has slots
        of ``arena_slot`` bytes (0: the default)."""
        with self._lock:
            if self._watcher is None:
                self._watcher = Watcher(self.name)
            watcher = self._watcher
        return ProcessGroup(self.transport if self.size > 1 else None, self.ranks, self.global_rank,
                            ctx, name, self.timeout, arena_slot, watcher)

    def split(self, color: int | None, key: int = 0) -> "ProcessGroup | None":
        """MPI_Comm_split: ranks with the same ``color`` form a group ordered by (key, rank).

        Collective over this group. ``color=None`` (MPI_UNDEFINED) gives None.
        """
        with self._lock:
            self._splits += 1
            n_split = self._splits
        mine = np.array([-1 if color is None else int(color), int(key)], dtype=np.int64)
        if color is not None and int(color) < 0:
            raise InvalidArgumentError(f"split on {self.describe()}: color must be >= 0 or None, got {color}")
        table = np.empty((self.size, 2), dtype=np.int64)

        def exchange(comm: GroupComm) -> None:
            table[comm.rank] = mine
            recvs = [comm.irecv(table[p], p) for p in range(comm.size) if p != comm.rank]
            sends = [comm.isend(mine, p) for p in range(comm.size) if p != comm.rank]
            for h in recvs + sends:
                h.wait()

        self.run("split", exchange)
        if color is None:
            return None
        members = sorted((int(table[p, 1]), p) for p in range(self.size) if table[p, 0] == int(color))
        ranks = [self.ranks[p] for _, p in members]
        ctx = make_ctx("split", self.ctx, n_split, int(color))
        return self.subgroup(ranks, ctx, f"{self.name}.split{n_split}.{color}")

    def close(self) -> None:
        """Stop the worker thread (after pending work). The transport is closed by its owner."""
        if self._closed:
            return
        self.drain()
        self._closed = True
        entry = self.__dict__.get("_p2p_native")
        if entry is not None:
            entry.paused = 1      # (its C starts check this, not _closed: MPI/_p2p.py _entry)
        if self.fast is not None:
            self.fast.close()
            self.fast = None
        self.async_calls.close()
        if self._arena is not None:
            # a rooted call left early (eager): checked if all are there (no wait, no raise)
            settle_early(self._arena, closing=True)
            self._arena.close()
            self._arena = None
        if self._tiers is not None:
            for g in self._tiers:
                if g is not None:
                    g.close()
