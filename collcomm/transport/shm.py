"""Shared-memory channels between ranks on one host.

Every rank owns an *inbox*: one POSIX shared-memory segment holding a ring per local
sender. A ring is single-producer single-consumer: the sender appends records and
advances ``head``; the receiver reads records and advances ``tail`` (both count bytes
since the start, on separate cache lines). A record is a 32-byte header
(length, kind, tag, nbytes, aux) followed by its body, padded to 64 bytes:

* INLINE: the message itself (messages up to ``EAGER_LIMIT``);
* SEGMENT: the name of a staging segment holding a large message, written there by the
  sender, whose body starts at the same offset within a page as the sender's buffer did
  (copies between buffers with different page offsets run up to 4x slower). The sender
  keeps up to ``POOL_SLOTS`` staging segments per peer (up to ``POOL_MAX`` bytes each,
  prefaulted) and reuses one once the receiver has cleared its busy word; the receiver
  keeps them mapped. A message that finds no free pooled segment gets a one-off segment
  (kind SEGMENT_ONCE) that the receiver unmaps after use;
* PAD: skip to the end of the ring (a record never wraps).

The sender copies eagerly and completes at once, so sends never wait for the receiver,
except when the ring is full: then the sender drains its own inbox while it waits, so two
ranks flooding each other cannot deadlock. Names are unlinked as soon as every user has
mapped them (inboxes after the rendezvous, message segments when the receiver opens them),
so a killed rank leaves nothing in /dev/shm; the few names still linked all start with
``collcomm-<job id>-`` for the launcher to sweep. Peer death is noticed by checking the
peer's pid (same host, same pid namespace).

Ordering relies on x86-64's total store order (the body is written before ``head``).

Locks (see engine.py for the whole order): ``send_lock`` is a leaf held only to stage a
body and write a record (and to mark the channel closed); a sender whose ring is full
waits *without* it (draining its own inbox, checking the peer and the clock) and fails its
request, or reports the peer lost, only after releasing it. ``poll_lock`` makes one thread
at a time the ring's consumer; it is only ever tried, never waited for, so delivering
messages (which completes receives) under it cannot deadlock anybody.
"""
from __future__ import annotations

import mmap
import os
import struct
import threading
import time
from typing import TYPE_CHECKING

import numpy as np

from ..errors import ClosedError, CommTimeoutError, PeerLostError

if TYPE_CHECKING:
    from .engine import Engine, Request

SHM_DIR = "/dev/shm"
HEADER = struct.Struct("<IIQQQQ")  # record length, kind, tag, nbytes, aux, call signature
INLINE, SEGMENT, PAD, SEGMENT_ONCE = 1, 2, 3, 4
_CLOSED, _GONE = "closed", "gone"   # why a sender stopped waiting (resolved without the lock)
POOL_SLOTS = 4
POOL_MAX = 64 << 20
BUSY = struct.Struct("<Q")        # first word of a staging segment: 1 while the receiver owes a copy
ALIGN = 64
CTL_BYTES = 128                   # head at 0, tail at 64: separate cache lines
LEFT = 1                          # control word set by the producer when it leaves cleanly
INBOX_HEADER = 4096
PAGE = 4096


def ring_bytes(local_size: int) -> int:
    """Ring capacity per sender: 1 MiB, less when many ranks share the host."""
    per = (16 << 20) // max(1, local_size)
    return max(64 << 10, min(1 << 20, per)) // ALIGN * ALIGN


def eager_limit(ring: int) -> int:
    return min(64 << 10, ring // 4)


def _round(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def create_segment(name: str, size: int, populate: bool = False) -> mmap.mmap:
    fd = os.open(os.path.join(SHM_DIR, name), os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, size)
        flags = mmap.MAP_SHARED | (getattr(mmap, "MAP_POPULATE", 0) if populate else 0)
        return mmap.mmap(fd, size, flags=flags)
    finally:
        os.close(fd)


def open_segment(name: str, unlink: bool = False, populate: bool = False) -> mmap.mmap:
    path = os.path.join(SHM_DIR, name)
    fd = os.open(path, os.O_RDWR)
    try:
        if unlink:
            os.unlink(path)
        flags = mmap.MAP_SHARED | (getattr(mmap, "MAP_POPULATE", 0) if populate else 0)
        return mmap.mmap(fd, os.fstat(fd).st_size, flags=flags)
    finally:
        os.close(fd)


def unlink_quietly(name: str) -> None:
    try:
        os.unlink(os.path.join(SHM_DIR, name))
    except FileNotFoundError:
        pass


def buffer_address(buf: memoryview) -> int:
    return np.frombuffer(buf, dtype=np.uint8).ctypes.data if len(buf) else 0


def pid_alive(pid: int) -> bool:
    """False once ``pid`` has exited (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    state = stat[stat.rfind(b")") + 2:][:1]
    return state not in (b"Z", b"X")


class Inbox:
    """This rank's receiving segment: one ring per local sender."""

    def __init__(self, name: str, n_slots: int, ring: int) -> None:
        self.name, self.ring = name, ring
        self.size = INBOX_HEADER + n_slots * (CTL_BYTES + ring)
        self.mm = create_segment(name, self.size)
        self.linked = True

    def unlink(self) -> None:
        if self.linked:
            unlink_quietly(self.name)
            self.linked = False

    def close(self) -> None:
        self.unlink()


def slot_offset(slot: int, ring: int) -> int:
    return INBOX_HEADER + slot * (CTL_BYTES + ring)


class _Ring:
    """One side of an SPSC ring living at ``base`` in ``mm``."""

    def __init__(self, mm: mmap.mmap, base: int, ring: int) -> None:
        self.mm, self.ring = mm, ring
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
    sender (busy word cleared), a one-off one is unmapped."""

    __slots__ = ("mm", "offset", "nbytes", "pooled")

    def __init__(self, mm: mmap.mmap, offset: int, nbytes: int, pooled: bool) -> None:
        self.mm, self.offset, self.nbytes, self.pooled = mm, offset, nbytes, pooled

    def copy_into(self, dst: memoryview) -> None:
        with memoryview(self.mm) as view:
            dst[:] = view[self.offset:self.offset + self.nbytes]

    def detach(self) -> "_SegmentBody":
        return self

    def release(self) -> None:
        if self.mm is None:
            return
        if self.pooled:
            BUSY.pack_into(self.mm, 0, 0)
        else:
            self.mm.close()
        self.mm = None  # type: ignore[assignment]


class ShmChannel:
    """Messages to and from one peer on this host."""

    kind = "shm"

    def __init__(self, engine: "Engine", peer: int, peer_pid: int, job: str,
                 inbox: Inbox, peer_inbox: mmap.mmap, my_slot: int, peer_slot: int) -> None:
        self.engine, self.peer, self.peer_pid, self.job = engine, peer, peer_pid, job
        ring = inbox.ring
        self.out = _Ring(peer_inbox, slot_offset(my_slot, ring), ring)   # I produce
        self.inp = _Ring(inbox.mm, slot_offset(peer_slot, ring), ring)   # I consume
        self.eager = eager_limit(ring)
        self.head = int(self.out.ctl[0])
        self.tail = int(self.inp.ctl[8])
        self.send_lock = threading.Lock()   # a leaf: staging and writing records, ``closed``
        self.poll_lock = threading.Lock()   # the consumer's; only tried (acquire(blocking=False))
        self.n_segments = 0
        self.created: list[str] = []
        self.pool: list[tuple[mmap.mmap, int, str]] = []   # (mapping, capacity, name), sender side
        self.mapped: dict[str, mmap.mmap] = {}              # pooled segments of the peer, receiver side
        self.closed = False

    # -- sending ---------------------------------------------------------------------------
    def send(self, req: "Request") -> None:
        """Append the message to the peer's ring (a large body staged first), then complete.

        ``send_lock`` is held only to stage and write; a full ring is waited for without it,
        and a failure (peer gone, transport closed, timeout) fails ``req`` after releasing it.
        """
        buf, nbytes = req.buf, len(req.buf)
        record: tuple[int, int, memoryview | bytes] | None = None   # kind, aux, body
        staged = ""
        engine = self.engine
        start = time.monotonic()
        next_check = start + 0.1
        sleep = 20e-6
        while True:
            with self.send_lock:
                if self.closed:
                    problem: BaseException | str | None = _CLOSED
                    break
                if record is None:
                    if nbytes <= self.eager:
                        record = (INLINE, 0, buf)
                    else:
                        kind, staged, offset = self._stage(buf)
                        record = (kind, offset, staged.encode())
                if self._try_append(record[0], req.tag, nbytes, record[1], record[2], req.sig):
                    problem = None
                    break
            # the ring is full: wait for the peer to read, without the lock
            engine.progress()   # drain our own inbox, so two flooding ranks cannot deadlock
            time.sleep(sleep)
            sleep = min(sleep * 2, 1e-3)
            if engine._aborted is not None:
                problem = _CLOSED
                break
            now = time.monotonic()
            if now >= next_check:
                next_check = now + 0.1
                if self.peer in engine.lost or not pid_alive(self.peer_pid):
                    problem = _GONE
                    break
                if now - start > engine.timeout:
                    problem = CommTimeoutError(
                        f"rank {engine.rank} timed out after {engine.timeout:g} s: its ring to "
                        f"rank {self.peer} stayed full ({req.describe()})", peer=self.peer)
                    break
        if problem is None:
            req.complete(self.peer, nbytes)
            return
        if staged:
            self._unstage(staged)
        req.fail(self._send_error(problem, req))

    def _send_error(self, problem: BaseException | str, req: "Request") -> BaseException:
        """Why a send gave up (no lock held): tells the engine when the peer is gone."""
        if isinstance(problem, BaseException):
            return problem
        engine = self.engine
        if self.peer in engine.lost or not pid_alive(self.peer_pid):
            self.check_alive()
            return engine.lost.get(self.peer) or self._death_error()
        return engine._aborted or ClosedError(
            f"rank {engine.rank}: transport closed; the {req.describe()} was not sent")

    def _unstage(self, name: str) -> None:
        """Give back a pooled staging segment whose record was never written."""
        with self.send_lock:
            if self.closed:
                return
            for mm, _, pooled in self.pool:
                if pooled == name:
                    BUSY.pack_into(mm, 0, 0)

    def _stage(self, buf: memoryview) -> tuple[int, str, int]:
        """Copy a large body into a staging segment at the sender's page offset."""
        offset = PAGE + buffer_address(buf) % PAGE
        need = offset + len(buf)
        for mm, capacity, name in self.pool:
            if capacity >= need and BUSY.unpack_from(mm, 0)[0] == 0:
                kind = SEGMENT
                break
        else:
            self.n_segments += 1
            name = f"collcomm-{self.job}-m{self.engine.rank}-{self.peer}-{self.n_segments}"
            capacity = max(1 << 20, 1 << (need - 1).bit_length())
            pooled = capacity <= POOL_MAX and len(self.pool) < POOL_SLOTS
            mm = create_segment(name, capacity if pooled else need, populate=pooled)
            self.created.append(name)
            kind = SEGMENT if pooled else SEGMENT_ONCE
            if pooled:
                self.pool.append((mm, capacity, name))
        BUSY.pack_into(mm, 0, 1)
        with memoryview(mm) as view:
            view[offset:offset + len(buf)] = buf
        if kind == SEGMENT_ONCE:
            mm.close()
            if len(self.created) > 64:
                self.created = [n for n in self.created if os.path.exists(os.path.join(SHM_DIR, n))]
        return kind, name, offset

    def _try_append(self, kind: int, tag: int, nbytes: int, aux: int, body: memoryview | bytes,
                    sig: int = 0) -> bool:
        """Write one record if the ring has room for it (caller holds ``send_lock``)."""
        need = _round(HEADER.size + len(body))
        ring = self.out.ring
        off = self.head % ring
        pad = ring - off if ring - off < need else 0
        if need + pad > ring:
            raise AssertionError("record larger than the ring")
        if ring - (self.head - self.out.ctl[8]) < need + pad:
            return False
        data = self.out.data
        if pad:
            HEADER.pack_into(data, off, pad, PAD, 0, 0, 0, 0)
            off = 0
        data[off + HEADER.size:off + HEADER.size + len(body)] = body
        HEADER.pack_into(data, off, need, kind, tag, nbytes, aux, sig)
        self.head += need + pad
        self.out.ctl[0] = self.head
        return True

    # -- receiving ---------------------------------------------------------------------------
    def poll(self) -> None:
        inp = self.inp
        if inp.ctl[0] == self.tail or not self.poll_lock.acquire(blocking=False):
            return
        try:
            head = inp.ctl[0]
            ring, data = inp.ring, inp.data
            while self.tail != head:
                off = self.tail % ring
                length, kind, tag, nbytes, aux, sig = HEADER.unpack_from(data, off)
                if kind == INLINE:
                    body = data[off + HEADER.size:off + HEADER.size + nbytes]
                    self.engine.arrived(self.peer, tag, nbytes, _RingBody(body), sig)
                elif kind in (SEGMENT, SEGMENT_ONCE):
                    name = bytes(data[off + HEADER.size:off + length]).rstrip(b"\0").decode()
                    pooled = kind == SEGMENT
                    mm = self.mapped.get(name) if pooled else None
                    if mm is None:
                        mm = open_segment(name, unlink=True, populate=pooled)
                        if pooled:
                            self.mapped[name] = mm
                    self.engine.arrived(self.peer, tag, nbytes, _SegmentBody(mm, aux, nbytes, pooled), sig)
                self.tail += length
                inp.ctl[8] = self.tail
        finally:
            self.poll_lock.release()

    # -- health ------------------------------------------------------------------------------
    def check_alive(self) -> None:
        """Report the peer lost if its process is gone (called with no lock held)."""
        if self.closed or pid_alive(self.peer_pid):
            return
        self.poll()  # what it sent before dying is still ours
        self.engine.peer_lost(self.peer, self._death_error(), crashed=not self.inp.ctl[LEFT])

    def _death_error(self) -> PeerLostError:
        left = bool(self.inp.ctl[LEFT])
        what = "left the job" if left else "died"
        return PeerLostError(
            f"rank {self.peer} (pid {self.peer_pid}, same host) {what}; rank {self.engine.rank} "
            f"lost its shared-memory peer", peer=self.peer)

    def close(self, linger: float = 10.0) -> None:
        """Wait (up to ``linger`` s, while the peer lives) until it has read what we sent,
        so the segments it has yet to open still exist; then remove what is left."""
        if self.closed:
            return
        deadline = time.monotonic() + linger
        while (self.out.ctl[8] < self.head and time.monotonic() < deadline
               and self.peer not in self.engine.lost and pid_alive(self.peer_pid)):
            self.poll()
            time.sleep(0.001)
        with self.send_lock:   # a sender is never mid-write when the pool goes
            self.closed = True
        self.out.ctl[LEFT] = 1   # tell the peer we left cleanly (not a crash)
        for name in self.created:
            unlink_quietly(name)
        self.created.clear()
        for mm in [p[0] for p in self.pool] + list(self.mapped.values()):
            try:
                mm.close()
            except BufferError:
                pass  # a message still being read holds it; it goes with the process
        self.pool.clear()
        self.mapped.clear()
