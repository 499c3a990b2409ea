"""The rings of a shared-memory inbox, and the records they carry.

Every rank owns an *inbox* (:class:`Inbox`): one POSIX shared-memory segment holding a
ring per local sender, after a header page (word s: whether the owner can read local slot
s's memory). A ring (:class:`_Ring`) is single-producer single-consumer: the sender
appends records and advances ``head``; the receiver reads records and advances ``tail``
(both count bytes since the start, on separate cache lines of the ring's control block). A
record is a 32-byte header (length, kind, tag, nbytes, aux) followed by its body, padded
to 64 bytes:

* INLINE: the message itself (messages up to ``EAGER_LIMIT``);
* SEGMENT: the name of a staging segment holding a large message, written there by the
  sender, whose body starts at the same offset within a page as the sender's buffer did
  (copies between buffers with different page offsets run up to 4x slower). The sender
  keeps up to ``POOL_SLOTS`` staging segments per peer (up to ``POOL_MAX`` bytes each,
  one up to ``POOL_BIG``, prefaulted; shm_staging.py) and reuses one once the receiver has acknowledged, in the segment's
  ``ACK`` word, the id of the message staged there last (the record carries that id after
  the name); the receiver
  keeps them mapped. A message that finds no free pooled segment gets a one-off segment
  (kind SEGMENT_ONCE) that the receiver unmaps after use;
* PRIVATE: a large message the sender copied into its own private memory, read by the
  receiver with ``process_vm_readv`` (cross-memory attach) and released through a
  watermark word in the ring's control line: the fallback when /dev/shm has no room for
  a staging segment (see shm_segments.py);
* LENT: a large message of a non-blocking send, left in the sender's own buffer (no copy)
  for the receiver to read by cross-memory attach; its body holds the release id, a state
  word the two sides hand over with a compare-and-swap (the sender may withdraw it into a
  private copy while the receiver has not claimed it) and that copy's address (shm_lent.py);
* PAD: skip to the end of the ring (a record never wraps).

The receiver hands a body to the engine as a payload: :class:`_RingBody` (inline, still in
the ring), :class:`_SegmentBody` (in a staging segment). Writing and reading records is
the channel's work (shm.ShmChannel).
"""
from __future__ import annotations

import mmap
import struct

from .shm_segments import (SHM_DIR, ShmSpaceError, create_segment, mib, shm_budget, space_text, unlink_quietly,
                           warn_once)

HEADER = struct.Struct("<IIQQQQ")  # record length, kind, tag, nbytes, aux, call signature
INLINE, SEGMENT, PAD, SEGMENT_ONCE, PRIVATE, LENT = 1, 2, 3, 4, 5, 6
#: Word ``ACK_AT`` of a pooled staging segment: the id of the last message the receiver took
#: out of it. The sender reuses the segment only when it holds the id it staged there last
#: (shm_staging.py): a "free" flag, which any zero written at the wrong time sets (which
#: write did was never pinned down), once let a sender overwrite a body the receiver had yet
#: to copy (a ring all_reduce then got a neighbour's chunk, 2026-11-26); an id that does
#: not match only keeps the segment busy.
ACK = struct.Struct("<Q")
ACK_AT = 8
ALIGN = 64
CTL_BYTES = 128                   # head at 0, tail at 64: separate cache lines
LEFT = 1                          # control word set by the producer when it leaves cleanly
RELEASED = 9                      # control word set by the consumer: PRIVATE ids below it are released
INBOX_HEADER = 4096               # word s: READS_YOU(|TAKES_LENT) or CANNOT_READ, for local slot s
READS_YOU = 1                     # the inbox's owner can read slot s's memory (cross-memory attach)
CANNOT_READ = 2                   # ... it cannot
TAKES_LENT = 4                    # ... and takes LENT records (it has the native core: shm_lent.py)
MIN_RING = 32 << 10
PRIVATE_ID = struct.Struct("<Q")


def ring_bytes(local_size: int) -> int:
    """Ring capacity per sender: 1 MiB, less when many ranks share the host."""
    per = (16 << 20) // max(1, local_size)
    return max(64 << 10, min(1 << 20, per)) // ALIGN * ALIGN


def eager_limit(ring: int) -> int:
    """The largest message always sent inline (in the ring itself, no staging; a full ring:
    its record waits in the channel's backlog, shm_backlog.py): a quarter of the ring, at most 256 KiB. Measured (sendrecv, n = 2, this
    VM): 128 KiB inline 15.8 µs against 79 staged, 256 KiB 24 against 95 (Open MPI: 19 and
    28); it was 64 KiB."""
    return min(256 << 10, ring // 4)


def inline_limit(ring: int) -> int:
    """The largest message sent inline when the ring has room for it at once (else it is
    staged, not waited for): half the ring, at most 512 KiB. Measured 2026-11-28 (n = 2,
    this VM, medians of 5 blocks, three alternating jobs each): a 512 KiB exchange inline
    56-67 µs against 74-114 staged; a stream of eight 512 KiB isends, which only one at a
    time fits inline, staged as before (always inline, waiting for room: 204-217 µs a
    message against 59-60)."""
    return min(512 << 10, ring // 2)    # (never below eager_limit: a quarter, 256 KiB at most)


def _round(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN

class Inbox:
    """This rank's receiving segment: one ring per local sender (``own``: this rank's own
    slot, never written, so never backed)."""

    def __init__(self, name: str, n_slots: int, ring: int, own: int = -1) -> None:
        self.name, self.ring = name, ring
        self.size = INBOX_HEADER + n_slots * (CTL_BYTES + ring)
        ranges = [(0, INBOX_HEADER)] + [(slot_offset(s, ring), CTL_BYTES + ring)
                                        for s in range(n_slots) if s != own]
        self.mm = create_segment(name, self.size, what=f"the shared-memory inbox {name}",
                                 ranges=ranges)
        self.linked = True

    def set_can_read(self, slot: int, ok: bool, takes_lent: bool = False) -> None:
        """Record whether this rank can read local slot ``slot``'s memory directly, and
        whether it then takes LENT records from it."""
        if 0 <= slot < INBOX_HEADER // 8:
            word = (READS_YOU | (TAKES_LENT if takes_lent else 0)) if ok else CANNOT_READ
            struct.pack_into("<Q", self.mm, 8 * slot, word)

    def unlink(self) -> None:
        if self.linked:
            unlink_quietly(self.name)
            self.linked = False

    def close(self) -> None:
        self.unlink()


def slot_offset(slot: int, ring: int) -> int:
    return INBOX_HEADER + slot * (CTL_BYTES + ring)


def make_inbox(name: str, local_size: int, own: int) -> "Inbox | None":
    """This rank's inbox with the largest rings /dev/shm has room for (every rank of the
    host makes one at the same time: each takes at most 1/(2 x ranks) of the budget), down
    to ``MIN_RING``; None when not even that fits (the caller then talks TCP)."""
    want = ring = ring_bytes(local_size)
    peers = max(1, local_size - 1)
    share = shm_budget() // (2 * max(1, local_size))
    while ring > MIN_RING and INBOX_HEADER + peers * (CTL_BYTES + ring) > share:
        ring //= 2
    while True:
        try:
            inbox = Inbox(name, local_size, ring, own)
            break
        except ShmSpaceError as exc:
            if ring <= MIN_RING:
                warn_once("inbox", f"no room in {SHM_DIR} for this rank's shared-memory inbox "
                                   f"({exc.needed and mib(exc.needed)} needed, {space_text()}): the "
                                   "ranks of this host talk to it over TCP (loopback)")
                return None
            ring //= 2
    if ring < want:
        warn_once("inbox", f"{space_text()}: shared-memory rings of {mib(ring)} instead of "
                           f"{mib(want)} per peer (messages above {mib(eager_limit(ring))} are "
                           "staged); give /dev/shm more room for full speed")
    return inbox


class _Ring:
    """One side of an SPSC ring living at ``base`` in ``mm``."""

    def __init__(self, mm: mmap.mmap, base: int, ring: int) -> None:
        self.mm, self.ring, self.base = mm, ring, base
        self.view = memoryview(mm)
        self.ctl = self.view[base:base + CTL_BYTES].cast("Q")   # ctl[0] head, ctl[8] tail
        self.data = self.view[base + CTL_BYTES:base + CTL_BYTES + ring]


class _RingBody:
    """An inline body still in the ring (valid until the consumer moves on)."""

    __slots__ = ("view",)

    def __init__(self, view: memoryview) -> None:
        self.view = view

    def copy_into(self, dst: memoryview) -> None:
        dst[:] = self.view

    def detach(self) -> "_Detached":
        return _Detached(bytes(self.view))

    def release(self) -> None:
        pass


class _Detached:
    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def copy_into(self, dst: memoryview) -> None:
        dst[:] = self.data

    def detach(self) -> "_Detached":
        return self

    def release(self) -> None:
        self.data = b""


class _SegmentBody:
    """A large body in a staging segment: on release a pooled one is handed back to the
    sender (message ``ident`` acknowledged in its ACK word), a one-off one is unmapped."""

    __slots__ = ("mm", "offset", "nbytes", "pooled", "ident")

    def __init__(self, mm: mmap.mmap, offset: int, nbytes: int, pooled: bool, ident: int = 0) -> None:
        self.mm, self.offset, self.nbytes, self.pooled = mm, offset, nbytes, pooled
        self.ident = ident

    def copy_into(self, dst: memoryview) -> None:
        with memoryview(self.mm) as view:
            dst[:] = view[self.offset:self.offset + self.nbytes]

    def detach(self) -> "_SegmentBody":
        return self

    def release(self) -> None:
        if self.mm is None:
            return
        if self.pooled:
            ACK.pack_into(self.mm, ACK_AT, self.ident)
        else:
            self.mm.close()
        self.mm = None  # type: ignore[assignment]
