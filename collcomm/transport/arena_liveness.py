"""What a long wait in the arena checks, every 100 ms (:class:`Liveness`, a base class of
:class:`~.arena.Arena`; the native core's waits call :meth:`Liveness._check` too).

A member that died without leaving cleanly dooms the group; one that left cleanly
(destroy_process_group: its LEFT word) is only missed if it never reached the sync waited
on; one whose process stays stopped (SIGSTOP, a debugger) as long as TCP tolerates a
silent peer is given up on; past the arena's timeout the wait names the ranks that never
arrived and where they were (not a rank that holds its arrival back until every other
rank is there: rank 0 in a barrier when ranks outnumber CPUs, see :meth:`_holding`).
"""
from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from ..errors import CommTimeoutError, PeerLostError
from .arena_layout import HOLD, PHASES, SIZE, WORDS
from .arena_layout import LEFT as LEFT_WORD
from .peer_process import pid_alive, pid_stopped


class Liveness:
    """A mixin of Arena, which sets these attributes in its ``__init__`` and has ``get``."""

    n: int
    rank: int
    pids: list[int]
    global_ranks: list[int]
    timeout: float
    words: memoryview
    _stopped_since: dict[int, float]

    if TYPE_CHECKING:   # Arena's
        def get(self, rank: int, word: int) -> int: ...

    def _check(self, late: list[int], target: int, waited: float) -> None:
        """A member that died without leaving cleanly dooms the group (even if it passed this
        sync: it cannot finish its part, and the ranks that waited on it gave up); one that
        left cleanly is only missed if it never reached this sync."""
        me = self.global_ranks[self.rank]
        late = [r for r in late if not self._holding(r, target)] or late
        for r in range(self.n):
            if r == self.rank or pid_alive(self.pids[r]):
                continue
            g = self.global_ranks[r]
            if not self.get(r, LEFT_WORD):
                raise PeerLostError(f"rank {g} (pid {self.pids[r]}, same host) died; rank {me} "
                                    "was waiting in shared memory", peer=g)
            if self.words[r * WORDS] < target:
                raise PeerLostError(f"rank {g} left the job (destroy_process_group) before this "
                                    f"call; rank {me} was waiting for it in shared memory", peer=g)
        self._check_stopped(late, me)
        if waited > self.timeout:
            who = ", ".join(f"rank {self.global_ranks[r]} (at step {self.get(r, 0)})" for r in late)
            raise CommTimeoutError(
                f"rank {self.global_ranks[self.rank]} timed out after {self.timeout:g} s in shared "
                f"memory at step {target}: still waiting for {who} (did it skip this call?)",
                peer=self.global_ranks[late[0]])

    def _holding(self, r: int, target: int) -> bool:
        """Is rank ``r`` in the barrier, holding its arrival at ``target`` back until every
        other rank is there (arena_layout.HOLD: rank 0 when ranks outnumber CPUs)? It is
        not the one missing then."""
        mark = HOLD | target
        return any(self.get(r, SIZE + p) == mark for p in range(PHASES))

    def _check_stopped(self, late: list[int], me: int) -> None:
        """Shared memory's heartbeat: a late rank whose process stays stopped (SIGSTOP, a
        debugger) as long as TCP tolerates a silent peer (COLLCOMM_HEARTBEAT_TIMEOUT, 15 s)
        is given up on, as TCP gives up on missed heartbeats."""
        now = time.monotonic()
        for r in late:
            if not pid_stopped(self.pids[r]):
                self._stopped_since.pop(r, None)
                continue
            since = self._stopped_since.setdefault(r, now)
            bound = float(os.environ.get("COLLCOMM_HEARTBEAT_TIMEOUT", "15"))
            if now - since > bound:
                g = self.global_ranks[r]
                raise PeerLostError(
                    f"rank {g} (pid {self.pids[r]}, same host) has been stopped (state T: SIGSTOP "
                    f"or a debugger) for {now - since:.0f} s (COLLCOMM_HEARTBEAT_TIMEOUT={bound:g}); "
                    f"rank {me} was waiting for it in shared memory ('kill -CONT "
                    f"{self.pids[r]}' would have resumed it)", peer=g)
