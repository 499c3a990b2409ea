"""Shared-memory channels between ranks on one host (:class:`ShmChannel`).

Every rank owns an *inbox*: one POSIX shared-memory segment holding a ring per local
sender. The sender appends records to its ring in the peer's inbox and the peer reads
them (shm_ring.py: the inbox, the ring and the record format). A message up to the eager
limit travels inline in its record (queued behind a full ring), one up to the inline
limit (half the ring) too when the ring has room for it at once; a larger one of a
non-blocking send is lent (read by the receiver straight out of the sender's buffer,
shm_lent.py); any other is staged:
written into a shared-memory segment the record names (pooled, up to ``POOL_SLOTS`` per
peer of up to ``POOL_MAX`` bytes each, one of them up to ``POOL_BIG``), or, past the
pool, copied into the sender's private memory for the receiver to read by cross-memory attach (peer_process.py; a one-off
segment where the peer may not read us); the staging of large bodies, both sides, is
shm_staging.py.
shm_segments.py creates the segments, backing each one when it is created so that a full
/dev/shm is an error (ShmSpaceError) or a smaller share (a warning), never a SIGBUS.

The sender copies eagerly and completes at once, so sends never wait for the receiver,
even when the ring is full: the record then waits in the channel's backlog, written as
room appears by later sends, every progress and the engine's writer thread
(shm_backlog.py), the message copied unless the caller lent it; a large non-blocking
send lends its buffer (a LENT record: no copy) and completes once the receiver has read
it or the loan was withdrawn into a copy (shm_lent.py). Names are unlinked as soon as every user has
mapped them (inboxes after the rendezvous, message segments when the receiver opens them),
so a killed rank leaves nothing in /dev/shm; the few names still linked all start with
``collcomm-<job id>-`` for the launcher to sweep. Peer death is noticed by checking the
peer's pid (same host, same pid namespace).

Ordering relies on x86-64's total store order (the body is written before ``head``).

Locks (see engine.py for the whole order): ``send_lock`` is a leaf held only to stage a
body and write a record (and to mark the channel closed) and guards the backlog; a
request is completed or failed only after releasing it. ``poll_lock`` makes one thread
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

import mmap
import sys
import threading
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import ClosedError
from .peer_process import buffer_address, pid_alive, pid_stopped
from .shm_backlog import SendBacklog, SendJob
from .shm_end import ChannelEnd
from .shm_lent import LentBodies
from .shm_ring import (CTL_BYTES, HEADER, INLINE, LENT, PAD, PRIVATE, PRIVATE_ID, SEGMENT,
                       SEGMENT_ONCE, Inbox, _RingBody, _SegmentBody, _Ring, _round, eager_limit,
                       inline_limit, slot_offset)
from .shm_staging import StagedBodies
from .shm_segments import (PAGE, SHM_DIR, ShmSpaceError, create_segment, mib, populate,
                           shm_budget, space_text, unlink_quietly, warn_once)

if TYPE_CHECKING:
    from .engine import Engine, Request

#: What other modules take from here: ShmChannel, and (until their import lines name
#: shm_segments / peer_process) the helpers arena.py and algorithms/shm_stage.py use.
__all__ = ["PAGE", "SHM_DIR", "ShmChannel", "ShmSpaceError", "create_segment", "mib", "pid_alive",
           "pid_stopped", "shm_budget", "space_text", "unlink_quietly", "warn_once"]

_CLOSED = "closed"   # why a send failed (resolved without the lock: _send_error)


def _lock() -> Any:
    """A channel lock: the native core's GilLock (taken and released with a plain load and
    store under the GIL; see native/_gil_lock.c) where there is a core and a GIL, else a
    _thread lock. Either way one object both the Python and the native sides take."""
    from .. import native

    if native.core is not None and getattr(sys, "_is_gil_enabled", lambda: True)():
        return native.core.GilLock()
    return threading.Lock()


class ShmChannel(LentBodies, StagedBodies, SendBacklog, ChannelEnd):
    """Messages to and from one peer on this host (large bodies: :class:`StagedBodies`;
    those of non-blocking sends lent: :class:`LentBodies`; sends waiting for ring room:
    :class:`SendBacklog`; its peer's death and its own close: :class:`ChannelEnd`)."""

    kind = "shm"

    def __init__(self, engine: "Engine", peer: int, peer_pid: int, job: str,
                 inbox: Inbox, peer_inbox: mmap.mmap, my_slot: int, peer_slot: int,
                 peer_ring: int = 0) -> None:
        self.engine, self.peer, self.peer_pid, self.job = engine, peer, peer_pid, job
        out_ring = peer_ring or inbox.ring        # the peer's inbox has its own ring size
        self.out = _Ring(peer_inbox, slot_offset(my_slot, out_ring), out_ring)   # I produce
        self.inp = _Ring(inbox.mm, slot_offset(peer_slot, inbox.ring), inbox.ring)   # I consume
        populate(peer_inbox, self.out.base, CTL_BYTES + out_ring, True)    # no page faults on
        populate(inbox.mm, self.inp.base, CTL_BYTES + inbox.ring, False)  # a ring's first pass
        self.eager = eager_limit(out_ring)       # inline always (behind a full ring: queued)
        self.inline = inline_limit(out_ring)     # inline if the ring has room now, else staged
        self.my_slot = my_slot
        self.held: dict[int, np.ndarray] = {}    # PRIVATE messages the peer has yet to read
        self.outside_until = 0   # ring position past the last record whose body is not in the ring
        self.next_private = 1                    # release ids: PRIVATE and LENT records
        self.lent: dict[int, Any] = {}           # LENT sends the peer has yet to release
        self.lent_due = float("inf")
        self.send_lock = _lock()   # a leaf: staging and writing records, ``closed``
        self.poll_lock = _lock()   # the consumer's; only tried (acquire(blocking=False))
        self.n_segments = 0
        self.created: list[str] = []
        self.pool: list[tuple[mmap.mmap, int, str]] = []   # (mapping, capacity, name), sender side
        self.staged_ids: dict[str, int] = {}                # pooled name -> its last message's id
        self.next_staged = 1
        self.mapped: dict[str, mmap.mmap] = {}              # pooled segments of the peer, receiver side
        self._closed = False
        self._pipe: Any = None
        self.init_backlog()

    # The producer's head and the consumer's tail are the rings' own control words (only
    # this side writes each): the native calls move them without touching this object.
    @property
    def head(self) -> int:
        return int(self.out.ctl[0])

    @head.setter
    def head(self, value: int) -> None:
        self.out.ctl[0] = value

    @property
    def tail(self) -> int:
        return int(self.inp.ctl[8])

    @tail.setter
    def tail(self, value: int) -> None:
        self.inp.ctl[8] = value

    @property
    def closed(self) -> bool:
        """Set once, under ``send_lock`` (close): no record is written after it; the
        native Pipe keeps a copy it reads instead."""
        return self._closed

    @closed.setter
    def closed(self, value: bool) -> None:
        self._closed = value
        if self._pipe is not None:
            self._pipe.closed = int(value)

    def pipe(self) -> Any:
        """This channel's rings seen from C (``collcomm.native``'s ``Pipe``, see
        native/_p2p.c), made on first use; None without the native core."""
        if self._pipe is None:
            from .. import native

            if native.core is None:
                return None
            pipe = native.core.Pipe(self, self.out.view, self.out.base, self.out.ring,
                                    self.inp.view, self.inp.base, self.inp.ring, self.inline,
                                    self.peer)
            # a native receive reads LENT records from the peer's memory (the peer lends only
            # where this rank said it reads them); P2P.lend lends where the peer said so
            pipe.peer_pid = self.peer_pid
            pipe.lends = int(self.lends())
            with self.send_lock:   # (close sets the flag under it: no close can slip between)
                pipe.closed = int(self._closed)
                pipe.backlog = int(bool(self.backlog))
                self._pipe = pipe
        return self._pipe

    # -- sending ---------------------------------------------------------------------------
    def send(self, req: "Request", lend: bool = False) -> None:
        """Append the message to the peer's ring (a large body staged first), then complete.
        ``lend``: the caller keeps its buffer untouched until the request is done, so a
        large body may be lent (shm_lent.py): the request completes once the peer read it.
        Never waits for the peer: a record the ring has no room for, or one behind such a
        record, joins the backlog (shm_backlog.py). ``send_lock`` is held only to stage and
        write; a closed channel fails ``req`` after releasing it."""
        buf, nbytes = req.buf, len(req.buf)
        if nbytes <= self.inline:    # the common case: inline, the ring has room
            with self.send_lock:
                if self.held:        # PRIVATE copies the peer has released go now
                    self.prune_held()
                appended = (not self.closed and not self.backlog
                            and self._try_append(INLINE, req.tag, nbytes, 0, buf, req.sig))
            if appended:
                req.complete(self.peer, nbytes)
                return
        if not lend and self.backlog_full(nbytes):
            problem = self.wait_for_room(req, nbytes)
            if problem is not None:
                req.fail(self._send_error(problem, req))
                return
        queued = False
        done: list[SendJob] = []
        with self.send_lock:
            closed = self.closed
            if not closed:
                job = self._job(req, buf, nbytes, lend)    # (ShmSpaceError: raised, nothing sent)
                done = self.write_backlog() if self.backlog else []
                if not self.backlog and self.write_job(job):
                    if job.kind != LENT:
                        done.append(job)
                else:
                    self.queue(job, lend)
                    queued = True
                    if job.completed:
                        done.append(job)
        if closed:
            req.fail(self._send_error(_CLOSED, req))
            return
        if queued:
            self.engine.backlog_writer.add(self)
        for j in done:
            j.req.complete(self.peer, len(j.req.buf))

    def _job(self, req: "Request", buf: memoryview, nbytes: int, lend: bool) -> SendJob:
        """``req``'s record as it will be written (caller holds ``send_lock``): inline up to
        the eager limit, lent where the caller lends a larger body and the peer takes
        loans, else staged now (ShmSpaceError when no room can be had)."""
        if nbytes <= self.eager:
            return SendJob(req, INLINE, 0, buf, "", None)
        if lend and self.python_loans and self.lends():
            return SendJob(req, LENT, buffer_address(buf), None, "", None)
        kind, staged, offset, ident, copy = self._stage(buf)
        # a segment's name ends at its NUL (the rest of the record is stale ring bytes but
        # for a pooled segment's message id right after it)
        body = None if kind == PRIVATE else staged.encode() + b"\0" + PRIVATE_ID.pack(ident)
        return SendJob(req, kind, offset, body, staged, copy)

    def try_ack(self, tag: int) -> bool:
        """Write an empty INLINE record of wire ``tag`` (an acknowledgement, Engine.owe_ack)
        if ``send_lock`` is free and the ring has room; never waits (it runs where a
        receive completes, maybe holding a channel's ``poll_lock``). True if written."""
        if not self.send_lock.acquire(blocking=False):
            return False
        try:
            return not self.closed and self._try_append(INLINE, tag, 0, 0, b"")
        finally:
            self.send_lock.release()

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
        return True

    # -- receiving ---------------------------------------------------------------------------
    def poll(self) -> None:
        if self.lent or self.held:
            self.settle_lent()
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
            # the name ends at its NUL, the message id follows (then stale ring bytes)
            raw, rest = bytes(data[off + HEADER.size:off + length]).split(b"\0", 1)
            name = raw.decode()
            pooled = kind == SEGMENT
            mm = self.mapped.get(name) if pooled else None
            if mm is None:
                mm = self._open_staged(name, pooled, nbytes)
                if pooled:
                    self._drop_replaced(name)
                    self.mapped[name] = mm
            ident = PRIVATE_ID.unpack_from(rest)[0] if pooled else 0
            self.engine.arrived(self.peer, tag, nbytes, _SegmentBody(mm, aux, nbytes, pooled, ident), sig)
        elif kind == PRIVATE:
            self._take_private(tag, nbytes, aux, PRIVATE_ID.unpack_from(data, off + HEADER.size)[0], sig)
        elif kind == LENT:
            self.take_lent(off, tag, nbytes, aux, sig)
        self.tail += length

    def _drop_replaced(self, name: str) -> None:
        """A new pooled segment ``name`` takes the pool slot of one we have mapped (the
        sender replaced it once we had acknowledged its last message): unmap that one."""
        slot = self.pool_slot_of(name)
        for old in [o for o in self.mapped if slot and self.pool_slot_of(o) == slot]:
            try:
                self.mapped.pop(old).close()
            except BufferError:
                pass   # a view still holds it; it goes when that does
