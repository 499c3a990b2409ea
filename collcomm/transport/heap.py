"""The shared heap: user buffers that live in shared memory (``collcomm.empty`` & co).

An allocation is made by every rank of a one-host group together: each rank creates one
segment of the requested size (mapped with MAP_POPULATE, so it is never page-faulted on
the hot path), the ranks meet, each maps every other rank's segment, they meet again and
each unlinks its own name — nothing is left in /dev/shm even if a rank is killed later.
An allocation is known by a 64-bit key (the group's context id and the group's allocation
count, identical on every rank).

Collectives find out with :meth:`Heap.lookup` whether an array lies in one of this rank's
own segments (key and byte offset), and read a peer's copy through :meth:`Heap.peer`.
When the last array viewing a rank's own segment is garbage collected, the rank stops
offering it (``lookup`` no longer finds it), but keeps its mappings of the peers' segments
until the job ends: a peer may still hold, and publish, its own array of that allocation.
So allocate zero-copy buffers once and reuse them; each allocation's memory is returned
when every rank has dropped its array and left the job.
"""
from __future__ import annotations

import bisect
import mmap
import threading
import weakref
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Allocation:
    key: int
    members: frozenset[int]                       # global ranks that mapped it
    start: int = 0                                # address range of this rank's own segment
    end: int = 0
    peers: dict[int, np.ndarray] = field(default_factory=dict)   # global rank -> uint8 view


class Heap:
    """This process's table of shared allocations."""

    def __init__(self) -> None:
        self._allocs: dict[int, Allocation] = {}
        self._starts: list[int] = []
        self._by_start: dict[int, Allocation] = {}
        # A leaf lock. ``_forget`` runs from a garbage-collection finalizer, which may fire
        # inside any allocation, even on a thread that holds ``_lock`` here: it only records
        # the key (``list.append`` is atomic) and applies it when the lock is free.
        self._lock = threading.Lock()
        self._gone: list[int] = []

    def add(self, alloc: Allocation, own: mmap.mmap) -> None:
        with self._lock:
            self._apply_forgets()
            self._allocs[alloc.key] = alloc
            bisect.insort(self._starts, alloc.start)
            self._by_start[alloc.start] = alloc
        weakref.finalize(own, self._forget, alloc.key)

    def _forget(self, key: int) -> None:
        """Our own array of ``key`` is gone: stop offering it (peers' mappings stay).

        A finalizer: records the key and applies it only if the lock is free at once (it
        may be held by the very thread the collector interrupted); else the next call does.
        """
        self._gone.append(key)
        if self._lock.acquire(blocking=False):
            try:
                self._apply_forgets()
            finally:
                self._lock.release()

    def _apply_forgets(self) -> None:
        """Stop offering the allocations recorded by ``_forget`` (caller holds ``_lock``)."""
        while self._gone:
            alloc = self._allocs.get(self._gone.pop())
            if alloc is not None and self._by_start.get(alloc.start) is alloc:
                self._starts.remove(alloc.start)
                del self._by_start[alloc.start]
                alloc.start = alloc.end = 0

    def clear(self) -> None:
        """Drop every mapping (the job is over)."""
        with self._lock:
            self._allocs.clear()
            self._starts.clear()
            self._by_start.clear()
            self._gone.clear()

    def lookup(self, arr: np.ndarray) -> tuple[Allocation, int] | None:
        """(allocation, byte offset) if ``arr``'s bytes lie in one of our own segments."""
        if not self._starts or arr.size == 0:
            return None
        addr = arr.ctypes.data
        with self._lock:
            self._apply_forgets()
            i = bisect.bisect_right(self._starts, addr) - 1
            if i < 0:
                return None
            alloc = self._by_start[self._starts[i]]
        if addr + arr.nbytes <= alloc.end:
            return alloc, addr - alloc.start
        return None

    def peer(self, key: int, rank: int) -> np.ndarray:
        """Rank ``rank``'s segment of allocation ``key`` (uint8), as mapped here."""
        return self._allocs[key].peers[rank]

    def __len__(self) -> int:
        """How many of our own allocations are alive (offered to collectives)."""
        if not self._starts:      # none (forgets only remove): no lock, as in lookup()
            return 0
        with self._lock:
            self._apply_forgets()
            return len(self._starts)
