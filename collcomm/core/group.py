"""Process groups: a set of global ranks with a private tag space.

A :class:`ProcessGroup` maps its local ranks ``0..size-1`` to global ranks and owns a
context id (``ctx``) that no other live group shares. Every collective call takes the next
sequence number of its group, so its messages carry ``tag = ctx | seq`` and never mix with
another call's, another group's or user point-to-point traffic (which uses its own tag
space under the same ``ctx``). Calls run in program order: synchronous ones inline in the
caller's thread, ``async_op=True`` ones on the group's worker thread; a synchronous call
first waits for the group's pending asynchronous ones.

Tag layout (64 bits): ``ctx`` (28 bits) | kind (1 bit: 0 collective, 1 point-to-point) |
sequence number or user tag (35 bits).
"""
from __future__ import annotations

import hashlib
import itertools
import mmap
import os
import queue
import struct
import threading
from typing import Any, Callable, Sequence, TypeVar

import numpy as np

from ..algorithms import signature
from ..errors import (CollcommError, InvalidArgumentError, MismatchError, SignatureMismatchError,
                      with_context)
from ..transport.base import ABORT_SIG, ANY_SOURCE, Handle, Status, Transport
from . import fastpath
from .plan import CallPlan
from .recorder import _P2PHandle, observer_for
from .work import Work

T = TypeVar("T")

class _Local(threading.local):
    timeout: float | None = None   # the innermost call_timeout of this thread (a class default:
                                   # reading it never raises, which getattr(..., None) pays for)


_local = _Local()
_POPULATE = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)


class call_timeout:
    """``with collcomm.call_timeout(5.0): ...`` bounds every wait of the collectives and
    point-to-point calls started in the block (this thread), overriding the group's and
    the job's timeout."""

    def __init__(self, seconds: float) -> None:
        if not seconds > 0:
            raise InvalidArgumentError(f"call_timeout: seconds must be > 0, got {seconds!r}")
        self.seconds = float(seconds)

    def __enter__(self) -> "call_timeout":
        self._saved = _local.timeout
        _local.timeout = self.seconds
        fastpath.timeout_scope(1)   # fast calls cannot see this thread's timeout: off meanwhile
        return self

    def __exit__(self, *exc: object) -> None:
        _local.timeout = self._saved
        fastpath.timeout_scope(-1)


def current_timeout(default: float) -> float:
    """The innermost ``call_timeout`` of this thread, else ``default``."""
    value = _local.timeout
    return default if value is None else value


_SEQ_BITS = 35
_KIND_P2P = 1 << _SEQ_BITS
_CTX_SHIFT = _SEQ_BITS + 1
MAX_USER_TAG = (1 << _SEQ_BITS) - 1


def make_ctx(*parts: object) -> int:
    """A 28-bit context id derived from ``parts`` (the same on every rank that agrees on them)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return (struct.unpack("<Q", digest)[0] & ((1 << 28) - 1)) or 1


class _NonGroupMember:
    """What ``new_group`` returns on a rank that is not in the group (torch behaviour)."""

    fast = None   # no fast call: the front ends take their regular path (which skips)

    def __repr__(self) -> str:
        return "NON_GROUP_MEMBER"


NON_GROUP_MEMBER: Any = _NonGroupMember()


def as_bytes(arr: np.ndarray) -> memoryview:
    """The bytes of a C-contiguous array as a flat memoryview (no copy)."""
    try:
        return memoryview(arr).cast("B")
    except (TypeError, ValueError):   # a format memoryview cannot cast: numpy's own view
        return memoryview(arr.reshape(-1).view(np.uint8))


class _TimedHandle(Handle):
    """A transport handle whose ``wait()`` defaults to the call's timeout.

    For a collective's messages it also watches the other members of the group (a lost
    member fails the wait) and insists that a receive gets exactly the bytes it posted for
    (anything else means the ranks are not in the same collective).
    """

    __slots__ = ("_h", "_timeout", "_watch", "_expect", "_peer", "_comm")

    def __init__(self, h: Handle, timeout: float | None, watch: Sequence[int] = (),
                 expect: int | None = None, peer: int = -1, comm: "GroupComm | None" = None) -> None:
        self._h, self._timeout, self._watch, self._expect, self._peer = h, timeout, watch, expect, peer
        self._comm = comm   # the collective call it belongs to (told when it must be abandoned)

    def wait(self, timeout: float | None = None) -> Status:
        t = self._timeout if timeout is None else timeout
        try:
            st = self._h.wait(t, self._watch) if self._watch else self._h.wait(t)  # type: ignore[call-arg]
        except SignatureMismatchError as exc:
            if self._comm is not None:
                self._comm.abandon()
            raise signature_mismatch(exc) from None
        if self._expect is not None and st.nbytes != self._expect:
            if self._comm is not None:
                self._comm.abandon()
            raise MismatchError(
                f"received {st.nbytes} bytes from rank {st.source} where {self._expect} were "
                "expected: the ranks are not in the same collective call (or disagree on its "
                "sizes)")
        return st

    def test(self) -> bool:
        try:
            return self._h.test()
        except SignatureMismatchError as exc:
            if self._comm is not None:
                self._comm.abandon()
            raise signature_mismatch(exc) from None


def signature_mismatch(exc: SignatureMismatchError) -> MismatchError:
    """The transport's raw signature mismatch in words: both calls and what differs."""
    if (exc.mine >> 60) == (exc.theirs >> 60) == signature.make("p2p") >> 60:
        return MismatchError(
            f"rank {exc.rank} expected {signature.describe(exc.mine)} but rank {exc.peer} sent "
            f"{signature.describe(exc.theirs)}: a receive must use the sender's dtype (its bytes "
            "are never reinterpreted)")
    if exc.abandoned and exc.theirs == exc.mine:
        return MismatchError(
            f"rank {exc.peer} abandoned {signature.describe(exc.mine)}, which rank {exc.rank} is "
            "in too: it found a rank in a different call (its own error names both sides)")
    return MismatchError(
        f"rank {exc.rank} called {signature.describe(exc.mine)} but rank {exc.peer} called "
        f"{signature.describe(exc.theirs)} (differs in {signature.differences(exc.mine, exc.theirs)}): "
        "every rank must make the same collective calls in the same order, with the same "
        "dtype, count, root and op")


class GroupComm:
    """The :class:`~collcomm.algorithms.base.Comm` of one collective call on one group.

    ``can_share_memory`` says whether every rank of the group is on this host with shared
    memory (the same answer on every rank); ``arena()`` then gives the group's arena
    (created collectively by the first call that asks, inside that call).
    """

    __slots__ = ("rank", "size", "_ranks", "_transport", "_tag", "_timeout", "_group",
                 "can_share_memory", "spans_hosts", "n_hosts", "link", "sig", "_abandoned")

    def __init__(self, group: "ProcessGroup", tag: int, timeout: float | None, sig: int = 0) -> None:
        self.sig = sig   # the call's signature word (see algorithms/signature.py); 0: unknown
        self._abandoned = False
        self.rank, self.size = group.rank, group.size
        self._ranks, self._transport = group.ranks, group.transport
        self._tag, self._timeout = tag, timeout
        self._group = group
        self.can_share_memory = group.can_share_memory
        self.spans_hosts, self.n_hosts, self.link = group.spans_hosts, group.n_hosts, group.link

    @property
    def hosts(self) -> list[str]:
        """The host of each rank of the group, in rank order."""
        return self._group.hosts

    def hierarchy(self) -> tuple["GroupComm", "GroupComm | None"]:
        """(this host's ranks of the group, the hosts' leaders or None if this rank is not
        one): comms for one step each of a hierarchical algorithm inside this call."""
        local, leaders = self._group._hierarchy()
        timeout = self._timeout
        lc = GroupComm(local, local._next_tag(), timeout, self.sig)
        return lc, (GroupComm(leaders, leaders._next_tag(), timeout, self.sig)
                    if leaders is not None else None)

    def scratch(self, nbytes: int, slot: int = 0) -> np.ndarray:
        """At least ``nbytes`` of temporary space, reused by the group's later calls (one
        buffer per slot; a group runs one call at a time, so nothing else uses it)."""
        return self._group._scratch(nbytes, slot)

    def shared(self, arr: np.ndarray) -> tuple[int, int] | None:
        """(heap key, byte offset) if ``arr`` lies in a shared allocation that every rank of
        this group has mapped; else None."""
        heap = getattr(self._transport, "heap", None)
        if heap is None or not len(heap):
            return None
        found = heap.lookup(arr)
        if found is None or not found[0].members.issuperset(self._ranks):
            return None
        return found[0].key, found[1]

    def peer_bytes(self, key: int, peer: int) -> np.ndarray:
        """Local rank ``peer``'s segment of shared allocation ``key`` (uint8)."""
        return self._transport.heap.peer(key, self._ranks[peer])  # type: ignore[union-attr]

    def arena(self) -> Any:
        arena = self._group._get_arena(self)
        if arena is not None:
            arena.timeout = self._timeout if self._timeout is not None else self._group.timeout
        return arena

    def isend(self, arr: np.ndarray, peer: int) -> Handle:
        assert self._transport is not None, "a group of one never sends"
        h = self._transport.isend(as_bytes(arr), self._ranks[peer], self._tag, sig=self.sig)  # type: ignore[call-arg]
        return _TimedHandle(h, self._timeout, self._ranks, comm=self)

    def irecv(self, arr: np.ndarray, peer: int) -> Handle:
        assert self._transport is not None, "a group of one never receives"
        h = self._transport.irecv(as_bytes(arr), self._ranks[peer], self._tag, sig=self.sig)  # type: ignore[call-arg]
        return _TimedHandle(h, self._timeout, self._ranks, arr.nbytes, comm=self)

    def abandon(self) -> None:
        """This rank leaves the call after a signature mismatch: every other member is told
        (an ABORT message on the call's tag carrying our signature), so a rank waiting for
        us in this call fails at once instead of at its timeout. Sent once, not waited for."""
        if self._abandoned or self._transport is None or not self.sig:
            return
        self._abandoned = True
        body = memoryview(self.sig.to_bytes(8, "little"))
        for r in self._ranks:
            if r != self._ranks[self.rank]:
                try:
                    self._transport.isend(body, r, self._tag, sig=ABORT_SIG)  # type: ignore[call-arg]
                except CollcommError:
                    pass   # a lost peer: nothing to tell


class ProcessGroup:
    """A group of ranks (see module docstring). Build them with ``new_group``/``split``."""

    def __init__(self, transport: Transport | None, ranks: Sequence[int], global_rank: int,
                 ctx: int, name: str, timeout: float) -> None:
        self.transport = transport
        self.ranks: list[int] = list(ranks)
        self.size = len(self.ranks)
        self.global_rank = global_rank
        self.rank = self.ranks.index(global_rank)
        self.ctx = ctx
        self.name = name
        self.timeout = timeout
        self._description = f"group {name!r} (rank {self.rank} of {self.size}, global rank {global_rank})"
        self._seq = itertools.count(1)
        self._tag_base = ctx << _CTX_SHIFT
        self._splits = 0
        self._lock = threading.Lock()
        self._queue: "queue.Queue[tuple[Work, Callable[[], Any]] | None]" = queue.Queue()
        self._worker: threading.Thread | None = None
        self._pending: list[Work] = []
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
            timeout: float | None = None, sig: int = 0) -> T | Work:
        """Run ``body(comm)`` as one collective call, in program order.

        Errors from the transport are re-raised with the collective, group and rank named.
        Returns ``body``'s result, or a :class:`Work` if ``async_op``.
        """
        if self._closed:
            raise CollcommError(f"{collective}: {self.describe()} was destroyed")
        comm = GroupComm(self, self._next_tag(),
                         current_timeout(self.timeout) if timeout is None else timeout, sig)
        if self.observer is not None:
            body = self.observer.wrap(comm, collective, body)

        def call() -> T:
            try:
                return body(comm)
            except CollcommError as exc:
                raise with_context(exc, f"{collective} on {self._description}") from exc

        if async_op:
            work = Work(collective, self, comm._tag)
            self._submit(work, call)
            return work
        self.drain()
        return call()

    def _submit(self, work: Work, fn: Callable[[], Any]) -> None:
        with self._lock:
            self._pending = [w for w in self._pending if not w.is_completed()]
            self._pending.append(work)
            if self.fast is not None:
                self.fast.paused = 1   # until drained: calls keep program order the regular way
            if self._worker is None:
                self._worker = threading.Thread(target=self._work_loop, daemon=True,
                                                name=f"collcomm-{self.name}")
                self._worker.start()
        self._queue.put((work, fn))

    def _work_loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            work, fn = item
            work._run(fn)

    def drain(self) -> None:
        """Wait until every asynchronous call submitted so far has finished (errors stay in their Work)."""
        if not self._pending:
            return
        with self._lock:
            pending, self._pending = self._pending, []
        for w in pending:
            w._done.wait()
        fast = self.fast
        if fast is not None and not self._pending:
            fast.paused = 0

    # -- the shared-memory arena ---------------------------------------------------------------
    def _get_arena(self, comm: GroupComm) -> Any:
        """The group's arena, built inside the current call by every rank together."""
        if self._arena is None and self.can_share_memory:
            from ..transport import arena as arena_mod

            engine: Any = self.transport
            pids = [os.getpid() if r == self.global_rank else engine.channels[r].peer_pid
                    for r in self.ranks]
            name = f"collcomm-{engine.job}-arena-{self.ctx:x}"
            token = np.zeros(1, dtype=np.uint8)
            # the handshake is the library's own, not part of the user's call: it carries
            # the "internal" signature, so a call that mismatches cannot break the arena
            setup = GroupComm(self, comm._tag, comm._timeout, signature.make("internal"))

            def announce() -> None:
                for h in [setup.isend(token, p) for p in range(1, self.size)]:
                    h.wait()

            def wait_created() -> None:
                setup.irecv(token, 0).wait()

            self._arena = arena_mod.build(self.size, self.rank, name, pids, self.ranks,
                                          comm._timeout or self.timeout, self.rank == 0,
                                          announce, wait_created)
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
        if not self.can_share_memory:
            return np.empty(nbytes, dtype=np.uint8)
        from ..transport import heap as heap_mod
        from ..transport.shm_segments import (PAGE, SHM_DIR, ShmSpaceError, create_segment, mib, space_text,
                                              unlink_quietly, warn_once)

        engine: Any = self.transport
        with self._lock:
            self._allocs += 1
            key = (self.ctx << 32) | self._allocs
        size = max(PAGE, (nbytes + PAGE - 1) // PAGE * PAGE)

        def name(g: int) -> str:
            return f"collcomm-{engine.job}-heap-{g}-{key:x}"

        def body(comm: GroupComm) -> np.ndarray:
            arena = comm.arena()
            try:
                own = create_segment(name(self.global_rank), size, populate=True,
                                     what=f"{collective}: rank {self.global_rank}'s shared buffer")
                room = np.ones(1, dtype=np.uint8)
            except ShmSpaceError:
                own, room = None, np.zeros(1, dtype=np.uint8)
            others = np.zeros(self.size, dtype=np.uint8)
            recvs = [comm.irecv(others[p:p + 1], p) for p in range(self.size) if p != self.rank]
            for h in [comm.isend(room, p) for p in range(self.size) if p != self.rank] + recvs:
                h.wait()
            others[self.rank] = room[0]
            if not others.all():
                if own is not None:
                    unlink_quietly(name(self.global_rank))
                    own.close()
                short = [self.ranks[p] for p in range(self.size) if not others[p]]
                warn_once("heap", f"{collective}: ranks {short} found no room in {SHM_DIR} for "
                                  f"{mib(size)} ({space_text()} here): shared buffers of group "
                                  f"{self.name!r} are private memory (collectives copy them)")
                return np.empty(nbytes, dtype=np.uint8)
            assert own is not None
            alloc = heap_mod.Allocation(key, frozenset(self.ranks))
            try:
                arena.sync()                      # every segment exists
                for g in self.ranks:
                    if g != self.global_rank:
                        with open(os.path.join(SHM_DIR, name(g)), "r+b") as f:
                            alloc.peers[g] = np.frombuffer(
                                mmap.mmap(f.fileno(), size, flags=_POPULATE), dtype=np.uint8)
                arena.sync()                      # every rank mapped every segment
            finally:
                unlink_quietly(name(self.global_rank))
            arr = np.frombuffer(own, dtype=np.uint8, count=nbytes)
            alloc.start = np.frombuffer(own, dtype=np.uint8).ctypes.data
            alloc.end = alloc.start + size
            engine.heap.add(alloc, own)
            return arr

        return self.run(collective, body)  # type: ignore[return-value]

    # -- user point-to-point -----------------------------------------------------------
    def _p2p_tag(self, tag: int, op: str) -> int:
        if not isinstance(tag, (int, np.integer)) or not 0 <= int(tag) <= MAX_USER_TAG:
            raise InvalidArgumentError(
                f"{op} on {self.describe()}: tag must be an int in [0, {MAX_USER_TAG}], got {tag!r}")
        return (self.ctx << _CTX_SHIFT) | _KIND_P2P | int(tag)

    def p2p_isend(self, arr: np.ndarray, dst: int, tag: int = 0, sig: int = 0,
                  rec: list[Any] | None = None) -> Handle:
        """Send ``arr`` to local rank ``dst`` in the user tag space. ``sig``: what the message
        is (``signature.p2p(dtype)``); a receive expecting another dtype refuses it.
        ``rec``: the flight recorder's record a native attempt already made (core/p2p.py)."""
        if self.transport is None:
            raise InvalidArgumentError(f"isend on {self.describe()}: no peer to send to")
        h = self.transport.isend(as_bytes(arr), self.ranks[dst], self._p2p_tag(tag, "isend"),
                                 sig=sig)  # type: ignore[call-arg]
        if rec is not None:
            return _P2PHandle(_TimedHandle(h, current_timeout(self.timeout)), rec)
        if self.observer is not None:
            return self.observer.p2p("isend", dst, _TimedHandle(h, current_timeout(self.timeout)), arr.nbytes)
        return _TimedHandle(h, current_timeout(self.timeout))

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
            return _P2PHandle(_TimedHandle(h, current_timeout(self.timeout)), rec)
        if self.observer is not None:
            return self.observer.p2p("irecv", src, _TimedHandle(h, current_timeout(self.timeout)), arr.nbytes)
        return _TimedHandle(h, current_timeout(self.timeout))

    # -- sub-groups ----------------------------------------------------------------------
    def subgroup(self, ranks: Sequence[int], ctx: int, name: str) -> "ProcessGroup | Any":
        """A group of the given global ranks (NON_GROUP_MEMBER if this rank is not one)."""
        if self.global_rank not in ranks:
            return NON_GROUP_MEMBER
        return ProcessGroup(self.transport if len(ranks) > 1 else None, ranks,
                            self.global_rank, ctx, name, self.timeout)

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
        if self.fast is not None:
            self.fast.close()
            self.fast = None
        if self._worker is not None:
            self._queue.put(None)
            self._worker.join(timeout=5)
        if self._arena is not None:
            self._arena.close()
            self._arena = None
        if self._tiers is not None:
            for g in self._tiers:
                if g is not None:
                    g.close()
