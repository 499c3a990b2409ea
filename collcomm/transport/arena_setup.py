"""Setting an arena up (arena.py has what it is): rank 0 creates the segment, with
smaller slots when /dev/shm is short (:func:`_create`); the others open it once rank 0
announces it, and find out why when it is gone (:func:`_arena_gone`: a member died, or
rank 0 gave up); everyone syncs once it is mapped, checks the settings every rank must
share, and the segment is unlinked (:func:`build`), also when the setup fails.
"""
from __future__ import annotations

import mmap
import os
from typing import Callable, Sequence

from ..errors import ClosedError, MismatchError, PeerLostError
from .arena import Arena, arena_size, slot_bytes
from .arena_layout import PHASES, REDUCE_CMA_MAX, REDUCE_CMA_MIN, ag_vote_min
from .peer_process import pid_alive
from .shm import PAGE


def _create(name: str, n: int, slot: int, ranks: Sequence[int]) -> tuple[mmap.mmap, int]:
    """Create the arena with slots of ``slot`` bytes if /dev/shm has room for it (3/4 of
    :func:`~.shm.shm_budget`), else with the largest slots that fit (one warning), down
    to a page; its memory is reserved up front (never a SIGBUS). ShmSpaceError below that."""
    from .shm import ShmSpaceError, create_segment, mib, shm_budget, space_text, warn_once

    want, before = slot, space_text()
    budget = shm_budget() * 3 // 4
    header = arena_size(n, 0) - PHASES * n * PAGE
    if arena_size(n, slot) > budget:
        slot = max(PAGE, ((budget - header) // (PHASES * n) - PAGE) // PAGE * PAGE)
    while True:
        try:
            mm = create_segment(name, arena_size(n, slot), populate=True,
                                what=f"the shared-memory arena of ranks {list(ranks)} (slots of "
                                     f"{mib(slot)}; COLLCOMM_ARENA=0 does without it)")
            break
        except ShmSpaceError:
            if slot <= PAGE:
                raise
            slot = max(PAGE, slot // 2 // PAGE * PAGE)
    if slot < want:
        warn_once("arena", f"{before}: the shared-memory arena of ranks {list(ranks)} has "
                           f"slots of {mib(slot)} instead of {mib(want)} (COLLCOMM_SHM_SLOT), so "
                           "large collectives take more steps; give /dev/shm more room for full speed")
    return mm, slot


def _arena_gone(rank: int, path: str, pids: Sequence[int], ranks: Sequence[int]) -> BaseException:
    """Why the arena ``path`` was gone when this rank came to open it: a member died (the
    group's first rank gave it up when its sync found the death: PeerLostError naming the
    dead rank, as that rank raised), else ClosedError with the other causes. Not the first
    rank itself: it is the one that gave the arena up (and may have exited since, having
    raised), so its being gone tells nothing."""
    dead = [r for r, pid in enumerate(pids) if r not in (0, rank) and not pid_alive(pid)]
    if dead:
        g = ranks[dead[0]]
        return PeerLostError(
            f"rank {g} (pid {pids[dead[0]]}, same host) died while the group's shared-memory "
            f"arena was being set up; rank {ranks[rank]} found the arena {path} gone (rank "
            f"{ranks[0]}, the group's first, gave it up)", peer=g)
    return ClosedError(
        f"rank {ranks[rank]} cannot open the group's shared-memory arena {path}: it is "
        f"gone. Rank {ranks[0]} (the group's first) either could not create it (no room "
        "in /dev/shm: see its error) or gave up waiting for the group's other ranks "
        "(it timed out: this rank came too late)")


def build(n: int, rank: int, name: str, pids: Sequence[int], ranks: Sequence[int], timeout: float,
          create: bool, announce: Callable[[], None], wait_created: Callable[[], None],
          slot: int = 0) -> Arena:
    """Create (rank 0) or open the arena segment ``name``; unlink once everyone mapped it.

    Rank 0 picks the slot size: ``slot`` bytes (rounded up to a page) when given and below
    ``COLLCOMM_SHM_SLOT``, else that; smaller when /dev/shm is short (see :func:`_create`).
    The others read it off the segment's size."""
    from .shm import SHM_DIR, ShmSpaceError, unlink_quietly

    slot = min(slot_bytes(), (slot + PAGE - 1) // PAGE * PAGE) if slot > 0 else slot_bytes()
    path = os.path.join(SHM_DIR, name)
    flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
    try:
        if create:
            try:
                mm, slot = _create(name, n, slot, ranks)
            except ShmSpaceError:
                announce()        # the others find no segment and say so, instead of waiting
                raise
            announce()
        else:
            wait_created()
            try:
                fd = os.open(path, os.O_RDWR)
            except FileNotFoundError:
                raise _arena_gone(rank, path, pids, ranks) from None
            try:
                size = os.fstat(fd).st_size
                header = arena_size(n, 0) - PHASES * n * PAGE
                slot = (size - header) // (PHASES * n) - PAGE
                mm = mmap.mmap(fd, size, flags=flags)
            finally:
                os.close(fd)
        arena = Arena(mm, n, rank, slot, pids, ranks, timeout)
        arena.sync()              # everyone has it mapped
        try:
            arena.check_settings()
        except MismatchError:
            arena.close()
            raise
        arena.cma = arena._probe_cma()
        # all_gathers from this many bytes take the voted way: the same on every rank, as
        # ``cma`` is (rank 0 votes only from arena_layout.vote_min: below, the fixed rule)
        arena.ag_vote_min = ag_vote_min(n, arena.cma)
        if arena.native_core is not None:
            arena.native_core.ag_vote_min = arena.ag_vote_min
            if arena.cma and n == 2:    # (shm_reduce.reduce_by_cma: the same rule)
                arena.native_core.pids = tuple(arena.pids)
                arena.native_core.reduce_cma_min = REDUCE_CMA_MIN
                arena.native_core.reduce_cma_max = min(REDUCE_CMA_MAX, arena.slot)
    except PeerLostError:
        if not create and not pid_alive(pids[0]):
            unlink_quietly(name)  # its creator died before it could: nobody else will
        raise
    finally:
        if create:                # also when a rank never came: nothing may stay behind
            unlink_quietly(name)
    return arena
