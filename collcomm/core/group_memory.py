"""A process group's shared memory: its arena, and the buffers of its shared heap.

:func:`build_arena` makes a group's arena (:mod:`collcomm.transport.arena`) inside one of
its calls, every rank together: rank 0 creates it and tells the others over a handshake
of the library's own. :func:`allocate_shared` makes the shared buffers of ``collcomm.empty``
(:mod:`collcomm.transport.heap`): a segment per rank, mapped by every other rank of the
group, or private memory on every rank when one of them finds no room in /dev/shm.
:class:`.group.ProcessGroup` calls them (``_get_arena``, ``allocate``).
"""
from __future__ import annotations

import mmap
import os
from typing import TYPE_CHECKING, Any

import numpy as np

from ..algorithms import signature
from .call_comm import GroupComm

if TYPE_CHECKING:
    from .group import ProcessGroup

_POPULATE = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)


def build_arena(group: ProcessGroup, comm: GroupComm) -> Any:
    """The arena of ``group`` (:mod:`collcomm.transport.arena`), built inside the call
    ``comm`` belongs to by every rank of the group together."""
    from ..transport.arena_setup import build

    engine: Any = group.transport
    pids = [os.getpid() if r == group.global_rank else engine.channels[r].peer_pid
            for r in group.ranks]
    name = f"collcomm-{engine.job}-arena-{group.ctx:x}"
    token = np.zeros(1, dtype=np.uint8)
    # the handshake is the library's own, not part of the user's call: it carries
    # the "internal" signature, so a call that mismatches cannot break the arena
    setup = GroupComm(group, comm._tag, comm._timeout, signature.make("internal"))

    def announce() -> None:
        for h in [setup.isend(token, p) for p in range(1, group.size)]:
            h.wait()

    def wait_created() -> None:
        setup.irecv(token, 0).wait()

    arena = build(group.size, group.rank, name, pids, group.ranks,
                  comm._timeout or group.timeout, group.rank == 0, announce, wait_created,
                  group.arena_slot)
    arena.set_progress(engine.collective_progress())
    return arena


def allocate_shared(group: ProcessGroup, nbytes: int, collective: str) -> np.ndarray:
    """What :meth:`.group.ProcessGroup.allocate` gives: ``nbytes`` (uint8) of the shared
    heap, made in one call (named ``collective``) of ``group``, or private memory."""
    if not group.can_share_memory:
        return np.empty(nbytes, dtype=np.uint8)
    from ..transport import heap as heap_mod
    from ..transport.shm_segments import (PAGE, SHM_DIR, ShmSpaceError, create_segment, mib, space_text,
                                          unlink_quietly, warn_once)

    engine: Any = group.transport
    with group._lock:
        group._allocs += 1
        key = (group.ctx << 32) | group._allocs
    size = max(PAGE, (nbytes + PAGE - 1) // PAGE * PAGE)

    def name(g: int) -> str:
        return f"collcomm-{engine.job}-heap-{g}-{key:x}"

    def body(comm: GroupComm) -> np.ndarray:
        arena = comm.arena(settle=False)   # (its syncs carry no signature)
        try:
            own = create_segment(name(group.global_rank), size, populate=True,
                                 what=f"{collective}: rank {group.global_rank}'s shared buffer")
            room = np.ones(1, dtype=np.uint8)
        except ShmSpaceError:
            own, room = None, np.zeros(1, dtype=np.uint8)
        others = np.zeros(group.size, dtype=np.uint8)
        recvs = [comm.irecv(others[p:p + 1], p) for p in range(group.size) if p != group.rank]
        for h in [comm.isend(room, p) for p in range(group.size) if p != group.rank] + recvs:
            h.wait()
        others[group.rank] = room[0]
        if not others.all():
            if own is not None:
                unlink_quietly(name(group.global_rank))
                own.close()
            short = [group.ranks[p] for p in range(group.size) if not others[p]]
            warn_once("heap", f"{collective}: ranks {short} found no room in {SHM_DIR} for "
                              f"{mib(size)} ({space_text()} here): shared buffers of group "
                              f"{group.name!r} are private memory (collectives copy them)")
            return np.empty(nbytes, dtype=np.uint8)
        assert own is not None
        alloc = heap_mod.Allocation(key, frozenset(group.ranks))
        try:
            arena.sync()                      # every segment exists
            for g in group.ranks:
                if g != group.global_rank:
                    with open(os.path.join(SHM_DIR, name(g)), "r+b") as f:
                        alloc.peers[g] = np.frombuffer(
                            mmap.mmap(f.fileno(), size, flags=_POPULATE), dtype=np.uint8)
            arena.sync()                      # every rank mapped every segment
        finally:
            unlink_quietly(name(group.global_rank))
        arr = np.frombuffer(own, dtype=np.uint8, count=nbytes)
        alloc.start = np.frombuffer(own, dtype=np.uint8).ctypes.data
        alloc.end = alloc.start + size
        engine.heap.add(alloc, own)
        return arr

    return group.run(collective, body)  # type: ignore[return-value]
