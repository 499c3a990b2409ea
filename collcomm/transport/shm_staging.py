"""The large bodies of shared-memory messages (:class:`StagedBodies`, the staging half of
:class:`collcomm.transport.shm.ShmChannel`).

A message above the eager limit does not travel in its ring record: the sender copies it
into a staging segment at its own page offset (shm_segments.py) and the record names the
segment. Up to ``POOL_SLOTS`` segments of up to ``POOL_MAX`` bytes per peer (one of them
up to ``POOL_BIG``) are kept and reused (once the receiver has acknowledged the id of the
message staged there last in the segment's ``ACK`` word; the record names the segment and
carries the id) while /dev/shm has room for them (a quarter of the budget). A body no pooled
segment takes (past ``POOL_BIG``, /dev/shm short, or every slot still unread) is copied
into private memory (a ``PRIVATE`` record) when the peer can read this process's memory:
the receiver reads it by cross-memory attach, then releases it through the ring's
``RELEASED`` word. Only when it cannot (``COLLCOMM_CMA=0``, no ptrace permission) does a
one-off segment (at most half the budget) carry it, unlinked by the receiver. Private
memory is the faster of the two: 1 GiB went 0.7 s send / 1.1 s receive through a one-off
tmpfs segment (4 KiB pages, each faulted and zeroed) against 0.2 s / 0.3 s private (numpy
asks for transparent huge pages; the reader copies once), measured 2026-11-27. The sender side runs under the channel's ``send_lock``, the receiver
side under its ``poll_lock`` (see shm.py).
"""
from __future__ import annotations

import errno
import mmap
import os
import struct
import threading
from typing import TYPE_CHECKING

import numpy as np

from ..errors import PeerLostError
from .peer_process import buffer_address, pid_alive
from .shm_ring import (ACK, ACK_AT, INBOX_HEADER, LEFT, PRIVATE, READS_YOU, RELEASED, SEGMENT, SEGMENT_ONCE,
                       _Ring)
from .shm_segments import (PAGE, SHM_DIR, ShmSpaceError, create_segment, mib, open_segment, shm_budget,
                           space_text, warn_once)

if TYPE_CHECKING:
    from .engine import Engine

POOL_SLOTS = 4
POOL_MAX = 64 << 20
#: One of the pooled segments may be larger than POOL_MAX, up to POOL_BIG: a body past
#: 64 MiB otherwise went through a one-off segment every time (fallocate, every page
#: faulted in by the sender and freed by the receiver's unmap: 45 ms for a 64 MiB message
#: against ~10 ms through a pooled one, measured 2026-11-26).
POOL_BIG = 256 << 20


def pool_capacity(need: int) -> int:
    """Bytes of a pooled segment for a body needing ``need``: a power of two of at least
    1 MiB up to 8 MiB; above, the next multiple of an eighth of the next power of two (a
    64 MiB body at a page offset takes 80 MiB, not 128)."""
    top = 1 << (need - 1).bit_length()
    if top <= 8 << 20:
        return max(1 << 20, top)
    grain = top // 8
    return -(-need // grain) * grain


class StagedBodies:
    """Staging large bodies (sender) and reading them (receiver) for one peer's channel."""

    engine: "Engine"
    peer: int
    peer_pid: int
    job: str
    my_slot: int
    out: _Ring
    inp: _Ring
    send_lock: threading.Lock
    closed: bool
    held: dict[int, np.ndarray]
    next_private: int
    n_segments: int
    created: list[str]
    pool: list[tuple[mmap.mmap, int, str]]
    staged_ids: dict[str, int]   # pooled segment name -> id of the message staged there last
    next_staged: int

    def unstage(self, name: str) -> None:
        """Give back a pooled staging segment whose record was never written (caller holds
        ``send_lock``)."""
        if self.closed:
            return
        for mm, _, pooled in self.pool:
            if pooled == name:
                ACK.pack_into(mm, ACK_AT, self.staged_ids[name])

    def peer_reads_me(self) -> bool:
        """Can the peer read this process's memory (it probed us at the rendezvous)?"""
        return bool(self.peer_word() & READS_YOU)

    def peer_word(self) -> int:
        """What the peer wrote about us in its inbox's header (shm_ring.READS_YOU, ...)."""
        if self.my_slot >= INBOX_HEADER // 8:
            return 0
        return int(struct.unpack_from("<Q", self.out.mm, 8 * self.my_slot)[0])

    def _warn_short(self, nbytes: int) -> None:
        """Say once that /dev/shm is too short for staging segments (its text made only then)."""
        warn_once("private", f"{space_text()}: messages that do not fit there (first: {mib(nbytes)} "
                             f"from rank {self.engine.rank} to rank {self.peer}) go through private "
                             "memory the receiver reads directly (cross-memory attach) instead of "
                             "a staging segment")

    def prune_held(self) -> None:
        """Drop the PRIVATE copies the peer has released (caller holds ``send_lock``)."""
        released = int(self.out.ctl[RELEASED])
        for ident in [i for i in self.held if i < released]:
            del self.held[ident]

    def _private(self, buf: memoryview) -> tuple[int, str, int, int, np.ndarray]:
        """Copy a large body into private memory for the peer to read (caller holds
        ``send_lock``): (PRIVATE, "", address, 0, the copy). Its release id is taken, and
        the copy held under it, only when its record is written (ShmChannel.send): ids must
        reach the ring in order, RELEASED being a watermark."""
        self.prune_held()
        copy = np.empty(len(buf), dtype=np.uint8)
        copy[:] = np.frombuffer(buf, dtype=np.uint8)
        return PRIVATE, "", int(copy.ctypes.data), 0, copy

    def _stage(self, buf: memoryview) -> tuple[int, str, int, int, np.ndarray | None]:
        """Stage a large body: into a pooled segment at the sender's page offset while one
        takes it (/dev/shm has room: a quarter of the budget), else into private memory the
        peer reads directly when it may, else into a one-off segment (at most half the
        budget; see the module docstring); ShmSpaceError when none of them can be had.
        Returns (kind, name, offset, id, copy): a pooled segment's message id, which its
        record carries and the receiver acknowledges (0 for the others); a PRIVATE body's
        copy (else None)."""
        offset = PAGE + buffer_address(buf) % PAGE
        need = offset + len(buf)
        for mm, capacity, name in self.pool:
            if capacity >= need and ACK.unpack_from(mm, ACK_AT)[0] == self.staged_ids[name]:
                kind = SEGMENT
                break
        else:
            if self.held:
                self.prune_held()
            budget = shm_budget()
            capacity = pool_capacity(need)
            slot = self._pool_slot(capacity, budget)
            pooled = slot >= 0
            private = self.peer_reads_me()
            if not pooled and private:   # (faster than a one-off segment: see the docstring)
                if need > budget // 2:
                    self._warn_short(len(buf))
                return self._private(buf)
            self.n_segments += 1
            name = f"collcomm-{self.job}-m{self.engine.rank}-{self.peer}-{self.n_segments}"
            if pooled:    # the slot it fills: the receiver drops its mapping of the one replaced
                name += f"-p{slot}"
            try:
                mm = create_segment(
                    name, capacity if pooled else need, populate=pooled,
                    what=f"the staging segment of a {mib(len(buf))} message from rank "
                         f"{self.engine.rank} to rank {self.peer}" + (
                             "" if private else f" (rank {self.peer} cannot read this rank's "
                             "memory directly instead: cross-memory attach is not permitted "
                             "or COLLCOMM_CMA=0)"))
            except ShmSpaceError:
                if not private:
                    raise
                self._warn_short(len(buf))
                return self._private(buf)
            self.created.append(name)
            kind = SEGMENT if pooled else SEGMENT_ONCE
            if pooled and slot < len(self.pool):   # replaces a free one too small for it
                old_mm, _, old_name = self.pool[slot]
                try:
                    old_mm.close()
                except BufferError:
                    pass   # (not ours to read any more: it goes when nothing holds it)
                del self.staged_ids[old_name]
                self.pool[slot] = (mm, capacity, name)
            elif pooled:
                self.pool.append((mm, capacity, name))
        ident = 0
        if kind == SEGMENT:
            ident = self.staged_ids[name] = self.next_staged
            self.next_staged += 1
        with memoryview(mm) as view:
            view[offset:offset + len(buf)] = buf
        if kind == SEGMENT_ONCE:
            mm.close()
            if len(self.created) > 64:
                self.created = [n for n in self.created if os.path.exists(os.path.join(SHM_DIR, n))]
        return kind, name, offset, ident, None

    def _pool_slot(self, capacity: int, budget: int) -> int:
        """Where a new pooled segment of ``capacity`` bytes goes (caller holds ``send_lock``):
        a new slot while the pool has room, else the slot of the smallest free segment too
        small for it (a job whose first large messages were small kept those segments, and
        every later larger message went through a one-off one); -1: not pooled (a one-off
        segment or private memory). At most one pooled segment past POOL_MAX, none past
        POOL_BIG, none past a quarter of what /dev/shm has left."""
        if capacity > budget // 4 or capacity > POOL_BIG:
            return -1
        if len(self.pool) < POOL_SLOTS:
            slot = len(self.pool)
        else:
            free = [i for i, (mm, cap, name) in enumerate(self.pool)
                    if cap < capacity and ACK.unpack_from(mm, ACK_AT)[0] == self.staged_ids[name]]
            if not free:
                return -1
            slot = min(free, key=lambda i: self.pool[i][1])
        if capacity > POOL_MAX and any(cap > POOL_MAX for i, (_, cap, _) in enumerate(self.pool) if i != slot):
            return -1
        return slot

    @staticmethod
    def pool_slot_of(name: str) -> str:
        """The pool slot a pooled segment's name ends with ("-p<slot>"), or ""."""
        head, sep, slot = name.rpartition("-p")
        return slot if sep and slot.isdigit() else ""

    def _open_staged(self, name: str, pooled: bool, nbytes: int) -> mmap.mmap:
        try:
            return open_segment(name, unlink=True, populate=pooled)
        except FileNotFoundError:
            left = bool(self.inp.ctl[LEFT]) or not pid_alive(self.peer_pid)
            raise PeerLostError(
                f"rank {self.engine.rank} cannot read the {mib(nbytes)} message rank {self.peer} "
                f"sent it: its staging segment {SHM_DIR}/{name} is gone"
                + (f" (rank {self.peer} left the job before it was read)" if left else ""),
                peer=self.peer) from None

    def _take_private(self, tag: int, nbytes: int, address: int, ident: int, sig: int) -> None:
        """Read a PRIVATE (or LENT) message out of the sender's memory now (straight into
        the posted receive when there is one: the receives deferred to their wait are posted
        first if the line is free), then release the sender's copy (poll_lock held)."""
        from .cma_move import READV, move

        engine = self.engine
        if engine._deferred:     # read into place: a receive deferred to its wait may be the one
            engine.post_deferred_if_free()
        view, token = engine.arriving(self.peer, tag, nbytes, sig)
        base = buffer_address(view)
        err = 0 if not nbytes else errno.ENOSYS if READV is None else move(self.peer_pid, base, address, nbytes)
        self.inp.ctl[RELEASED] = ident + 1
        if not err:
            engine.landed(self.peer, nbytes, token)
            return
        gone = err == errno.ESRCH or not pid_alive(self.peer_pid)
        what = ("left the job" if self.inp.ctl[LEFT] else "died") if gone else "is alive"
        engine.peer_lost(self.peer, PeerLostError(
            f"rank {engine.rank} could not read the {mib(nbytes)} message rank {self.peer} (pid "
            f"{self.peer_pid}, same host) {what} holds for it in its memory "
            f"({os.strerror(err) if READV is not None else 'cross-memory attach unavailable'})", peer=self.peer),
            crashed=not self.inp.ctl[LEFT])
