"""Cross-memory attach (CMA) for the arena: reading and writing a peer rank's memory directly.

When every rank can read every other's memory with ``process_vm_readv`` (probed when the
arena is built; ``COLLCOMM_CMA=0`` turns it off), large chunks need not be staged: a rank
publishes its buffer's address and the others copy straight out of it, one copy instead
of two, as Open MPI does. The probe also says whether every rank can write every other's
memory (``process_vm_writev``: ``Arena.cma_write``) and times a read against a memcpy
(``Arena.cma_cost``), by which shm_direct chooses between the two ways.

Here: libc's ``process_vm_readv`` / ``process_vm_writev`` (cma_move.py moves the bytes;
importing this module also lets a sibling process read us under Yama's ptrace_scope=1:
PR_SET_PTRACER), and
:class:`CrossMemoryAttach`, the arena's part that uses them (a mixin of
:class:`~.arena.Arena`): :meth:`~CrossMemoryAttach.read_remote`,
:meth:`~CrossMemoryAttach.write_remote`, :meth:`~CrossMemoryAttach.cma_failed` (also
called by the native core), the probe and the timing.
"""
from __future__ import annotations

import ctypes
import errno
import os
import time
from typing import TYPE_CHECKING

import numpy as np

from ..errors import CollcommError, PeerLostError
from .arena_layout import LEFT as LEFT_WORD
from .arena_layout import PROBE_MAGIC
from .arena_layout import PROBE as PROBE_WORD
from .cma_move import READV, WRITEV, _IoVec, move
from .peer_process import pid_alive

__all__ = ["CrossMemoryAttach"]

#: the cross-memory-attach timing at arena build (:meth:`CrossMemoryAttach._time_cma`): bytes, tries
PROBE_BYTES, PROBE_REPS = 256 << 10, 4


def _let_peers_read() -> None:
    """Under Yama's ptrace_scope=1 a sibling may read us only if we say so."""
    try:
        ctypes.CDLL(None).prctl(0x59616D61, ctypes.c_ulong(-1), 0, 0, 0)   # PR_SET_PTRACER, ANY
    except (OSError, AttributeError):
        pass


_let_peers_read()
_READV, _WRITEV = READV, WRITEV


#: how long a failed copy (EFAULT) waits for the peer's process to be gone before calling
#: the failure the copy's own: a rank that raised (a lost peer) and exits has unmapped its
#: buffers a moment before its pid disappears (seen in test_faults: 4 ranks, one killed)
EXIT_GRACE = 0.3


def _alive_after(pid: int, grace: float) -> bool:
    """Whether ``pid`` is still alive, looked at for up to ``grace`` seconds."""
    end = time.monotonic() + grace
    while pid_alive(pid):
        if time.monotonic() >= end:
            return True
        time.sleep(0.01)
    return False


class CrossMemoryAttach:
    """A mixin of Arena, which sets these attributes in its ``__init__`` and has ``put``,
    ``get`` and ``sync``."""

    n: int
    rank: int
    pids: list[int]
    global_ranks: list[int]
    cma_write: bool
    cma_cost: float
    _probe_buf: np.ndarray

    if TYPE_CHECKING:   # Arena's
        def put(self, word: int, value: int) -> None: ...

        def get(self, rank: int, word: int) -> int: ...

        def sync(self) -> None: ...

    def read_remote(self, r: int, address: int, out: np.ndarray) -> None:
        """Copy ``out.nbytes`` bytes at ``address`` in rank ``r``'s memory into ``out``."""
        self._transfer(False, r, address, out, "read")

    def write_remote(self, r: int, address: int, src: np.ndarray) -> None:
        """Copy ``src`` (contiguous) to ``address`` in rank ``r``'s memory (only where
        :attr:`cma_write`)."""
        self._transfer(True, r, address, src, "write")

    def _transfer(self, write: bool, r: int, address: int, local_arr: np.ndarray, what: str) -> None:
        """(cma_move.move: through a bounce buffer where the CPU is slow at the distance)"""
        if local_arr.nbytes:
            err = move(self.pids[r], local_arr.__array_interface__["data"][0], address,
                       local_arr.nbytes, write)
            if err:
                self.cma_failed(r, what, err)

    def cma_failed(self, r: int, what: str, err: int) -> None:
        """Raise what a failed cross-memory ``what`` ("read" / "write") of rank ``r``'s
        memory means (errno ``err``); also called by the native core. Rank ``r`` gone, or
        going within :data:`EXIT_GRACE` (a rank leaving after an error unmaps its buffers
        before its pid is gone: ``EFAULT``), or another member dead without leaving cleanly
        (``r`` then most likely left the call because of it): PeerLostError naming that rank.
        Otherwise the copy itself failed: the error names ``COLLCOMM_CMA=0``."""
        me, g = self.global_ranks[self.rank], self.global_ranks[r]
        if err == errno.ESRCH or not _alive_after(self.pids[r], EXIT_GRACE if err == errno.EFAULT else 0.0):
            raise PeerLostError(f"rank {g} (pid {self.pids[r]}, same host) died; rank {me} was "
                                f"{what.rstrip('e')}ing its memory", peer=g)
        dead = next((q for q in range(self.n) if q != self.rank and not pid_alive(self.pids[q])
                     and not self.get(q, LEFT_WORD)), None)
        if dead is not None:
            d = self.global_ranks[dead]
            raise PeerLostError(f"rank {d} (pid {self.pids[dead]}, same host) died; rank {me} "
                                f"could then not {what} rank {g}'s memory ({os.strerror(err)}): "
                                "it left the call too", peer=d)
        raise CollcommError(f"rank {me} could not {what} rank {g}'s memory ({os.strerror(err)}) "
                            "although the arena's probe could (or that rank left the call with "
                            "an error of its own); COLLCOMM_CMA=0 stages such copies through the "
                            "arena's slots instead (already reserved: it needs no more /dev/shm)")

    def _probe_cma(self) -> bool:
        """Can every rank read every other's memory? (All ranks reach the same answer;
        :attr:`cma_write` says whether every rank can also write every other's.)"""
        if _READV is None or os.environ.get("COLLCOMM_CMA", "1") == "0":
            ok = False
            self.put(PROBE_WORD, 0)
        else:
            self.put(PROBE_WORD, self._probe_buf.__array_interface__["data"][0])
        self.sync()
        ok = write = True
        for r in range(self.n):
            addr = self.get(r, PROBE_WORD)
            if not addr:
                ok = False
            elif r != self.rank:
                got = np.zeros(1, dtype=np.uint64)
                local = _IoVec(got.__array_interface__["data"][0], 8)
                remote = _IoVec(addr, 8)
                if _READV(self.pids[r], ctypes.byref(local), 1, ctypes.byref(remote), 1, 0) != 8 \
                        or int(got[0]) != PROBE_MAGIC:
                    ok = False
                elif write and (_WRITEV is None or _WRITEV(self.pids[r], ctypes.byref(local), 1,
                                                           ctypes.byref(remote), 1, 0) != 8):
                    write = False     # (it wrote back the magic word it read)
        self.put(PROBE_WORD + 1, (1 if write else 3) if ok else 2)
        self.sync()
        verdicts = [self.get(r, PROBE_WORD + 1) for r in range(self.n)]
        if 2 in verdicts:
            return False
        self.cma_write = 3 not in verdicts
        self.cma_cost = self._time_cma()
        return True

    def _time_cma(self) -> float:
        """What a byte read from a peer's memory (``process_vm_readv``) costs, in bytes
        copied by ``memcpy`` in the same time: the largest of every rank's measurement
        (all ranks reach the same value). Each rank times reading :data:`PROBE_BYTES` of
        its next peer's memory, all at once, against a local copy of the same size (best
        of a few each). ``COLLCOMM_CMA_COST`` (a number) sets it instead of measuring.

        It is ~1 on most hosts but ~3 on some virtual machines (each page pinned and
        copied on its own), where staging a copy through the arena (two memcpys, split
        between the sender and the receiver) beats one cross-memory read: the
        one-to-many collectives of shm_direct decide by it."""
        given: float | None = None
        text = os.environ.get("COLLCOMM_CMA_COST", "").strip()
        if text:
            try:
                given = float(text)
            except ValueError:
                from .shm import warn_once
                warn_once("cma_cost", f"COLLCOMM_CMA_COST={text!r} is not a number; measuring "
                                      "the cost of cross-memory reads instead")
        src = np.ones(PROBE_BYTES // 8, dtype=np.uint64)
        dst = np.zeros_like(src)
        # every rank read the probe's addresses before the last sync, its verdicts before
        # this one: the words are free (a fast rank must not reuse one that a slow one
        # may still read, so the address goes in the first, the cost in the second)
        self.put(PROBE_WORD, src.__array_interface__["data"][0])
        self.sync()
        if given is not None and given > 0:
            cost = given
        else:
            peer = (self.rank + 1) % self.n
            addr = self.get(peer, PROBE_WORD)
            read = copy = float("inf")
            for _ in range(PROBE_REPS):
                t0 = time.perf_counter()
                self.read_remote(peer, addr, dst)
                t1 = time.perf_counter()
                np.copyto(dst, src)
                t2 = time.perf_counter()
                read, copy = min(read, t1 - t0), min(copy, t2 - t1)
            cost = read / max(copy, 1e-9)
        self.put(PROBE_WORD + 1, max(1, min(int(cost * 100), 1 << 32)))
        self.sync()   # nobody reads our src any more; everybody's cost is up
        return max(self.get(r, PROBE_WORD + 1) for r in range(self.n)) / 100
