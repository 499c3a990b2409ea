"""The :class:`~collcomm.algorithms.base.Comm` one collective call of a group runs on.

:class:`GroupComm` is what a family function gets: the group's ranks and transport, the
call's tag and timeout, its signature word, and what the families may use beyond
point-to-point (scratch space, the arena, shared allocations, the hierarchy) — every
member of :class:`~collcomm.algorithms.contract.FullComm`. Its handles
(:class:`TimedHandle`) wait with the call's timeout, watch the other members (a lost
member fails the wait) and turn a signature mismatch into a
:class:`~collcomm.errors.MismatchError` in words; a rank that leaves a call after a
mismatch tells the others (:meth:`GroupComm.abandon`).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from ..algorithms import signature
from ..algorithms.shm_stage import settle_early
from ..errors import CollcommError, MismatchError, SignatureMismatchError
from ..transport.base import ABORT_SIG, Handle, Status
from ..transport.request import Request

if TYPE_CHECKING:
    from .group import ProcessGroup

__all__ = ["GroupComm", "TimedHandle", "as_bytes", "signature_mismatch"]


def as_bytes(arr: np.ndarray) -> memoryview:
    """The bytes of a C-contiguous array as a flat memoryview (no copy)."""
    try:
        return memoryview(arr).cast("B")
    except (TypeError, ValueError):   # a format memoryview cannot cast: numpy's own view
        return memoryview(arr.reshape(-1).view(np.uint8))


class TimedHandle(Handle):
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
        """Wait under the call's timeout (which fails the operation), or under the caller's
        own ``timeout``: a shorter look after which the operation stays pending (a later
        wait may still complete it)."""
        t = self._timeout if timeout is None else timeout
        h = self._h
        try:
            if timeout is not None and type(h) is Request:
                st = h.wait(t, self._watch, False)
            else:
                st = h.wait(t, self._watch) if self._watch else h.wait(t)  # type: ignore[call-arg]
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

    def arena(self, settle: bool = True) -> Any:
        """The group's arena for this call. A rooted call the native core left early is
        settled first (shm_stage.settle_early), unless ``settle`` is False: a caller whose
        steps carry no signature (the shared heap's allocation) leaves it to the next
        collective, where a late mismatch can be met by every rank."""
        arena = self._group._get_arena(self)
        if arena is not None:
            arena.timeout = self._timeout if self._timeout is not None else self._group.timeout
            core = arena.native_core
            if settle and core is not None and core.lag_target:
                settle_early(arena)
        return arena

    def isend(self, arr: np.ndarray, peer: int) -> Handle:
        assert self._transport is not None, "a group of one never sends"
        h = self._transport.isend(as_bytes(arr), self._ranks[peer], self._tag, sig=self.sig)  # type: ignore[call-arg]
        return TimedHandle(h, self._timeout, self._ranks, comm=self)

    def irecv(self, arr: np.ndarray, peer: int) -> Handle:
        assert self._transport is not None, "a group of one never receives"
        h = self._transport.irecv(as_bytes(arr), self._ranks[peer], self._tag, sig=self.sig)  # type: ignore[call-arg]
        return TimedHandle(h, self._timeout, self._ranks, arr.nbytes, comm=self)

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
