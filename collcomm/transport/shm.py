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
* PRIVATE: a large message the sender copied into its own private memory, read by the
  receiver with ``process_vm_readv`` (cross-memory attach) and released through a
  watermark word in the ring's control line: the fallback when /dev/shm has no room for
  a staging segment (see "Space" below);
* PAD: skip to the end of the ring (a record never wraps).

Space: a tmpfs page that cannot be backed when first touched kills the process with
SIGBUS, so every segment is backed when it is created (``posix_fallocate`` of every byte
it will use, after a ``statvfs`` check), never on first touch. When /dev/shm is short
(``shm_budget``: free space less a margin, ``COLLCOMM_SHM_MARGIN``), each user takes a
smaller share and says so once (a RuntimeWarning): inbox rings shrink (down to 32 KiB;
without even that, the rank's local peers talk to it over TCP), the arena's slots shrink
(arena.py), staging segments are used only while they fit, else the message goes through
private memory read by cross-memory attach, and shared allocations (``collcomm.empty``)
fall back to private memory. What fits nowhere is a :class:`ShmSpaceError` naming the
bytes needed and the bytes free.

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

The native point-to-point path (native/_p2p.c, through :meth:`ShmChannel.pipe`) keeps
both rules: its send tries ``send_lock`` and writes one INLINE record as
:meth:`ShmChannel._try_append` does (``head`` in the ring and on the channel); its receive
tries ``poll_lock``, and while it holds it (waiting with the GIL released, for at most its
timeout) every record that is not its message goes to :meth:`ShmChannel._take_one`, the
same consumer step :meth:`ShmChannel.poll` runs, so other receivers still get theirs.
"""
from __future__ import annotations

import ctypes
import errno
import mmap
import os
import struct
import sys
import threading
import time
import warnings
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import ClosedError, CollcommError, CommTimeoutError, PeerLostError

if TYPE_CHECKING:
    from .engine import Engine, Request

SHM_DIR = "/dev/shm"
HEADER = struct.Struct("<IIQQQQ")  # record length, kind, tag, nbytes, aux, call signature
INLINE, SEGMENT, PAD, SEGMENT_ONCE, PRIVATE = 1, 2, 3, 4, 5
_CLOSED, _GONE = "closed", "gone"   # why a sender stopped waiting (resolved without the lock)
POOL_SLOTS = 4
POOL_MAX = 64 << 20
BUSY = struct.Struct("<Q")        # first word of a staging segment: 1 while the receiver owes a copy
ALIGN = 64
CTL_BYTES = 128                   # head at 0, tail at 64: separate cache lines
LEFT = 1                          # control word set by the producer when it leaves cleanly
RELEASED = 9                      # control word set by the consumer: PRIVATE ids below it are released
INBOX_HEADER = 4096               # word s: 1 if the inbox's owner can read local slot s's memory, 2 if not
PAGE = 4096
MiB = 1 << 20
MIN_RING = 32 << 10
PRIVATE_ID = struct.Struct("<Q")
_PROBE_MAGIC = 0x636F6C6C2D70726F
_PROBE = np.full(1, _PROBE_MAGIC, dtype=np.uint64)   # read by local peers to test cross-memory attach


class ShmSpaceError(CollcommError):
    """/dev/shm has no room for a segment: ``needed`` and ``free`` bytes."""

    def __init__(self, message: str, needed: int = 0, free: int = 0) -> None:
        super().__init__(message)
        self.needed, self.free = needed, free


def shm_space() -> tuple[int, int]:
    """(free, total) bytes of the file system under /dev/shm."""
    try:
        st = os.statvfs(SHM_DIR)
    except OSError:
        return 0, 0
    return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize


def shm_margin(total: int) -> int:
    """Bytes of /dev/shm collcomm leaves free: ``COLLCOMM_SHM_MARGIN``, else 1/32 of the
    file system, between 1 and 64 MiB."""
    env = os.environ.get("COLLCOMM_SHM_MARGIN", "")
    if env.strip():
        return max(0, int(float(env)))
    return min(64 * MiB, max(MiB, total // 32))


def shm_budget() -> int:
    """Bytes collcomm may still take from /dev/shm (free space less the margin)."""
    free, total = shm_space()
    return max(0, free - shm_margin(total))


def mib(n: int) -> str:
    return f"{n / MiB:.1f} MiB" if n >= MiB // 10 else f"{n / 1024:.0f} KiB"


def space_text() -> str:
    free, total = shm_space()
    return f"{mib(free)} free of {mib(total)} in {SHM_DIR}"


_warned: set[str] = set()


def warn_once(key: str, message: str) -> None:
    """One RuntimeWarning per process and ``key``: what collcomm chose instead, and why."""
    if key in _warned:
        return
    _warned.add(key)
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
    frame = sys._getframe(1)
    while frame.f_back is not None and (frame.f_code.co_filename.startswith(package)
                                        or frame.f_code.co_filename.startswith("<frozen ")):
        frame = frame.f_back      # attribute it to the user's line that led here
    warnings.warn_explicit(f"collcomm: {message}", RuntimeWarning, frame.f_code.co_filename,
                           frame.f_lineno, module=frame.f_globals.get("__name__", "collcomm"),
                           registry=frame.f_globals.setdefault("__warningregistry__", {}))


def reserve(fd: int, size: int, what: str, ranges: "list[tuple[int, int]] | None" = None) -> None:
    """Back ``ranges`` (default: all ``size`` bytes) of the file ``fd`` with memory now
    (``posix_fallocate``), so touching them later can never SIGBUS. ShmSpaceError when
    the file system is full; where it cannot reserve (no fallocate), a statvfs check."""
    for off, length in ranges or [(0, size)]:
        if length <= 0:
            continue
        try:
            os.posix_fallocate(fd, off, length)
        except OSError as exc:
            free, total = shm_space()
            if exc.errno in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS) and free >= size:
                return
            if exc.errno not in (errno.ENOSPC, errno.EFBIG, errno.ENOMEM, errno.EOPNOTSUPP,
                                 errno.EINVAL, errno.ENOSYS):
                raise
            raise ShmSpaceError(f"{what} needs {mib(size)} of shared memory but {SHM_DIR} has "
                                f"{mib(free)} free (of {mib(total)}); give it more room (e.g. "
                                "docker run --shm-size=1g) or use COLLCOMM_TRANSPORT=tcp",
                                needed=size, free=free) from exc


def ring_bytes(local_size: int) -> int:
    """Ring capacity per sender: 1 MiB, less when many ranks share the host."""
    per = (16 << 20) // max(1, local_size)
    return max(64 << 10, min(1 << 20, per)) // ALIGN * ALIGN


def eager_limit(ring: int) -> int:
    return min(64 << 10, ring // 4)


def _round(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def create_segment(name: str, size: int, populate: bool = False, what: str = "",
                   ranges: "list[tuple[int, int]] | None" = None) -> mmap.mmap:
    """Create segment ``name`` of ``size`` bytes, its memory reserved (``ranges`` of it, by
    default all: see :func:`reserve`); ShmSpaceError, and no file left, when it does not fit."""
    path = os.path.join(SHM_DIR, name)
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
        free, _ = shm_space()
        raise ShmSpaceError(f"{what or 'segment ' + name}: {SHM_DIR} is full ({exc})",
                            needed=size, free=free) from exc
    try:
        os.ftruncate(fd, size)
        try:
            reserve(fd, size, what or f"segment {name}", ranges)
        except BaseException:
            unlink_quietly(name)
            raise
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


def pid_stopped(pid: int) -> bool:
    """True while ``pid`` is stopped (SIGSTOP, a debugger: /proc state T or t)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2:][:1] in (b"T", b"t")


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

    def set_can_read(self, slot: int, ok: bool) -> None:
        """Record whether this rank can read local slot ``slot``'s memory directly."""
        if 0 <= slot < INBOX_HEADER // 8:
            struct.pack_into("<Q", self.mm, 8 * slot, 1 if ok else 2)

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


def probe_address() -> int:
    """Address of this process's cross-memory-attach probe word (see :func:`can_read`).
    Peers may read us from now on (arena's import sets PR_SET_PTRACER under Yama)."""
    from . import arena  # noqa: F401

    return int(_PROBE.ctypes.data)


def can_read(pid: int, address: int) -> bool:
    """Can this process read process ``pid``'s memory (``process_vm_readv``)? Tried on the
    peer's probe word (``COLLCOMM_CMA=0``: no)."""
    from .arena import _IoVec, _READV   # arena sets PR_SET_PTRACER so peers may read us

    if _READV is None or not address or os.environ.get("COLLCOMM_CMA", "1") == "0":
        return False
    got = np.zeros(1, dtype=np.uint64)
    local, remote = _IoVec(got.ctypes.data, 8), _IoVec(address, 8)
    return (_READV(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0) == 8
            and int(got[0]) == _PROBE_MAGIC)


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
                 inbox: Inbox, peer_inbox: mmap.mmap, my_slot: int, peer_slot: int,
                 peer_ring: int = 0) -> None:
        self.engine, self.peer, self.peer_pid, self.job = engine, peer, peer_pid, job
        out_ring = peer_ring or inbox.ring        # the peer's inbox has its own ring size
        self.out = _Ring(peer_inbox, slot_offset(my_slot, out_ring), out_ring)   # I produce
        self.inp = _Ring(inbox.mm, slot_offset(peer_slot, inbox.ring), inbox.ring)   # I consume
        self.eager = eager_limit(out_ring)
        self.my_slot = my_slot
        self.held: dict[int, np.ndarray] = {}    # PRIVATE messages the peer has yet to read
        self.next_private = 1
        self.head = int(self.out.ctl[0])
        self.tail = int(self.inp.ctl[8])
        self.send_lock = threading.Lock()   # a leaf: staging and writing records, ``closed``
        self.poll_lock = threading.Lock()   # the consumer's; only tried (acquire(blocking=False))
        self.n_segments = 0
        self.created: list[str] = []
        self.pool: list[tuple[mmap.mmap, int, str]] = []   # (mapping, capacity, name), sender side
        self.mapped: dict[str, mmap.mmap] = {}              # pooled segments of the peer, receiver side
        self.closed = False
        self._pipe: Any = None

    def pipe(self) -> Any:
        """This channel's rings seen from C (``collcomm.native``'s ``Pipe``, see
        native/_p2p.c), made on first use; None without the native core."""
        if self._pipe is None:
            from .. import native

            if native.core is None:
                return None
            self._pipe = native.core.Pipe(self, self.out.view, self.out.base, self.out.ring,
                                          self.inp.view, self.inp.base, self.inp.ring,
                                          self.eager, self.peer)
        return self._pipe

    # -- sending ---------------------------------------------------------------------------
    def send(self, req: "Request") -> None:
        """Append the message to the peer's ring (a large body staged first), then complete.

        ``send_lock`` is held only to stage and write; a full ring is waited for without it,
        and a failure (peer gone, transport closed, timeout) fails ``req`` after releasing it.
        """
        buf, nbytes = req.buf, len(req.buf)
        if nbytes <= self.eager:     # the common case: inline, the ring has room
            with self.send_lock:
                appended = not self.closed and self._try_append(INLINE, req.tag, nbytes, 0, buf, req.sig)
            if appended:
                req.complete(self.peer, nbytes)
                return
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
                        try:
                            kind, staged, offset = self._stage(buf)
                        except ShmSpaceError as exc:
                            problem = exc
                            break
                        record = (kind, offset, PRIVATE_ID.pack(int(staged)) if kind == PRIVATE
                                  else staged.encode() + b"\0")   # the rest of the record is stale
                        if kind == PRIVATE:
                            staged = ""   # nothing to give back: the copy goes when released
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
        if isinstance(problem, ShmSpaceError):
            raise problem     # refused before anything was sent: the caller of isend hears at once
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

    def peer_reads_me(self) -> bool:
        """Can the peer read this process's memory (it probed us at the rendezvous)?"""
        return self.my_slot < INBOX_HEADER // 8 and \
            struct.unpack_from("<Q", self.out.mm, 8 * self.my_slot)[0] == 1

    def _private(self, buf: memoryview) -> tuple[int, str, int]:
        """Copy a large body into private memory for the peer to read (caller holds
        ``send_lock``): (PRIVATE, id, address)."""
        released = int(self.out.ctl[RELEASED])
        for ident in [i for i in self.held if i < released]:
            del self.held[ident]
        copy = np.empty(len(buf), dtype=np.uint8)
        copy[:] = np.frombuffer(buf, dtype=np.uint8)
        ident = self.next_private
        self.next_private += 1
        self.held[ident] = copy
        return PRIVATE, str(ident), int(copy.ctypes.data)

    def _stage(self, buf: memoryview) -> tuple[int, str, int]:
        """Copy a large body into a staging segment at the sender's page offset: a pooled
        one while /dev/shm has room for it (a quarter of the budget), else a one-off one
        (half the budget), else private memory the peer reads directly (see the module
        docstring); ShmSpaceError when none of them can be had."""
        offset = PAGE + buffer_address(buf) % PAGE
        need = offset + len(buf)
        for mm, capacity, name in self.pool:
            if capacity >= need and BUSY.unpack_from(mm, 0)[0] == 0:
                kind = SEGMENT
                break
        else:
            if self.held:
                released = int(self.out.ctl[RELEASED])
                for ident in [i for i in self.held if i < released]:
                    del self.held[ident]
            budget = shm_budget()
            capacity = max(1 << 20, 1 << (need - 1).bit_length())
            pooled = capacity <= POOL_MAX and len(self.pool) < POOL_SLOTS and capacity <= budget // 4
            private = self.peer_reads_me()
            why = (f"{space_text()}: messages that do not fit there (first: {mib(len(buf))} from "
                   f"rank {self.engine.rank} to rank {self.peer}) go through private memory the "
                   "receiver reads directly (cross-memory attach) instead of a staging segment")
            if not pooled and private and need > budget // 2:
                warn_once("private", why)
                return self._private(buf)
            self.n_segments += 1
            name = f"collcomm-{self.job}-m{self.engine.rank}-{self.peer}-{self.n_segments}"
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
                warn_once("private", why)
                return self._private(buf)
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
                if kind != INLINE:
                    self._take_one()      # the general step (staged, private, pad)
                    continue
                body = data[off + HEADER.size:off + HEADER.size + nbytes]   # the common case, inline
                self.engine.arrived(self.peer, tag, nbytes, _RingBody(body), sig)
                self.tail += length
                inp.ctl[8] = self.tail
        finally:
            self.poll_lock.release()

    def _take_one(self) -> None:
        """Hand the record at the ring's tail to the engine and move past it (the caller is
        the consumer: it holds ``poll_lock``; the native receive calls this for a record
        that is not the one it waits for)."""
        inp = self.inp
        ring, data = inp.ring, inp.data
        off = self.tail % ring
        length, kind, tag, nbytes, aux, sig = HEADER.unpack_from(data, off)
        if kind == INLINE:
            body = data[off + HEADER.size:off + HEADER.size + nbytes]
            self.engine.arrived(self.peer, tag, nbytes, _RingBody(body), sig)
        elif kind in (SEGMENT, SEGMENT_ONCE):
            # the name ends at its NUL: the record's padding holds stale ring bytes
            name = bytes(data[off + HEADER.size:off + length]).split(b"\0", 1)[0].decode()
            pooled = kind == SEGMENT
            mm = self.mapped.get(name) if pooled else None
            if mm is None:
                mm = self._open_staged(name, pooled, nbytes)
                if pooled:
                    self.mapped[name] = mm
            self.engine.arrived(self.peer, tag, nbytes, _SegmentBody(mm, aux, nbytes, pooled), sig)
        elif kind == PRIVATE:
            self._take_private(tag, nbytes, aux, PRIVATE_ID.unpack_from(data, off + HEADER.size)[0], sig)
        self.tail += length
        inp.ctl[8] = self.tail

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
        """Read a PRIVATE message out of the sender's memory now (straight into the posted
        receive when there is one), then release the sender's copy (poll_lock held)."""
        from .arena import _IoVec, _READV

        engine = self.engine
        view, token = engine.arriving(self.peer, tag, nbytes, sig)
        base = buffer_address(view)
        done, err = 0, 0
        while done < nbytes and _READV is not None:
            local, remote = _IoVec(base + done, nbytes - done), _IoVec(address + done, nbytes - done)
            got = _READV(self.peer_pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
            if got <= 0:
                err = ctypes.get_errno() or errno.EFAULT
                break
            done += got
        self.inp.ctl[RELEASED] = ident + 1
        if done == nbytes:
            engine.landed(self.peer, nbytes, token)
            return
        gone = err == errno.ESRCH or not pid_alive(self.peer_pid)
        what = ("left the job" if self.inp.ctl[LEFT] else "died") if gone else "is alive"
        engine.peer_lost(self.peer, PeerLostError(
            f"rank {engine.rank} could not read the {mib(nbytes)} message rank {self.peer} (pid "
            f"{self.peer_pid}, same host) {what} holds for it in its memory "
            f"({os.strerror(err) if err else 'cross-memory attach unavailable'})", peer=self.peer),
            crashed=not self.inp.ctl[LEFT])

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
        self.held.clear()
