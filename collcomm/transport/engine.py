"""The engine: one :class:`Transport` per process, routing each peer to its channel.

A *channel* moves messages to and from one peer (shared memory on this host, TCP to other
hosts). The engine owns what is common to all of them:

* matching: incoming messages meet posted receives by (source, tag) in posting order; an
  early message waits in the *unexpected* list; ``ANY_SOURCE`` receives match any peer;
  a receive posted with a ``mask`` matches every tag equal to its own on the mask's bits
  (an MPI ``ANY_TAG`` inside one tag space), and its status reports the tag that arrived;
* probing: :meth:`Engine.probe` looks at the first unexpected message that would match a
  receive, without taking it; :meth:`Engine.mprobe` takes it out of matching and
  :meth:`Engine.mrecv` receives exactly that message later (MPI's matched probe). Both
  see only messages no posted receive has claimed; ``block=True`` waits for one (with the
  same timeout and liveness checks as a receive);
* waiting: spin on the progress loop briefly, then yield the CPU, then block on the
  request's event with a growing sleep (50 µs up to 2 ms), so 4 ranks on 2 cores still run.
  A request polling cannot complete (one with a TCP peer; or any request when no channel
  needs polling) is not spun for: spinning would hold the GIL that TCP's I/O thread needs
  to land the message (it gets it only at the next switch interval or ``time.sleep(0)``,
  whose timer slack is about 50 µs). The waiter of a receive of up to ``DRIVE_MAX``
  bytes runs TCP's selector itself (``Channel.drive``, see tcp.TcpHub.drive), so the
  message lands on the waiting thread; other waiters (a send, a larger receive, a second
  thread while one drives) block on the request's event, TCP's I/O thread landing it.
  The shared-memory channels, if any, are still polled in between (50 µs up to 2 ms);
* failure: a channel that loses its peer fails every pending operation with that peer,
  later operations with it fail at once, and every wait checks the peer's liveness at
  least every 100 ms, so nobody waits on a dead rank for more than about a second.

Channels feed the engine through :meth:`Engine.arrived` (a whole message, shared memory)
or :meth:`Engine.arriving` / :meth:`Engine.landed` (a message whose body is still being
read from a socket, straight into the posted buffer when one is waiting).

Where it lives: this module has the :class:`Engine` (setup, the contract's send and
receive, abort and close); engine_arrivals.py what channels report and the matching and
delivery (:class:`~.engine_arrivals.EngineArrivals`); engine_wait.py its waits (``wait``,
``probe``), liveness checks and timeouts (:class:`~.engine_wait.EngineWaiting`);
engine_deferred.py the deferred receives; shm_backlog.py the writer of sends queued behind
full rings (all but the last the Engine's base classes); request.py the Request, Incoming,
Payload and Channel types.

Lock order of the transport (a lock may be taken while holding the ones before it, never
the other way round; "leaf": nothing else is taken while holding it):

    ShmChannel.send_lock  →  ShmChannel.poll_lock (only tried, never waited for)  →  Engine._lock (leaf)
    (a poll settling lent sends, shm_lent.py, only tries send_lock: the native receive
    polls holding poll_lock)
    TcpHub.io (the selector's holder: the I/O thread or a waiting caller; taken holding no
    other lock)  →  TcpChannel.lock (leaf), TcpHub.wlock (leaf), Engine._lock (leaf)
    Heap._lock (leaf)
    BacklogWriter._lock (leaf; taken holding no channel lock: shm_backlog.py)
    Engine._defer_mutex (with its Condition _defer_lock; taken holding no other lock: posting the deferred
    receives; the native attempt of a deferred receive's test() holds it; only tried by a
    channel about to read a large body, which holds its poll_lock: post_deferred_if_free)  →
    ShmChannel.poll_lock (only tried)  →  Engine._lock (leaf)
    request._EVENT_LOCK (leaf: only makes a request's event, see Request)

A receive's ``matched`` hook (Request) runs wherever its request completes, so maybe
holding a channel's ``poll_lock``, ``_defer_mutex`` (a deferred receive being posted) or
``TcpHub.io``; it never waits for a ring or a non-leaf lock: an acknowledgement it owes a
shared-memory peer is written only if that peer's ``send_lock`` is free (tried) and the
ring has room, else left owed (``owe_ack``; ``progress`` tries again); one to a TCP peer
takes ``TcpChannel.lock`` and ``TcpHub.wlock``, one to this process ``Engine._lock``:
leaves.

The native point-to-point receive (native/_p2p.c) holds a channel's ``poll_lock`` (tried)
while it waits and calls, holding it, ``ShmChannel._take_one`` (→ ``Engine._lock``) and
:meth:`Engine.native_check` (→ ``check_alive`` → ``Engine._lock``): the same order.
It reads ``_posted`` and ``_unexpected`` (holding the GIL, not ``_lock``: a list read is
atomic) to stay out of the way of any message the engine holds or owes an earlier receive,
and ``_deferred``: receives (core/p2p.py ``Deferred``: a non-blocking receive from a peer on
this host) whose posting waits for their ``wait()``, which receives natively. They count as
posted before anything later: :meth:`irecv` and :meth:`probe` post them first, in order
(:meth:`post_deferred`), and a native receive declines while any is held (but the one a
deferred receive's own wait makes, after posting those deferred before it).

``Engine._lock`` guards the posted and unexpected lists and ``lost``. Nothing is called
under it but list edits and copying an early message aside: requests are completed or
failed (``Request.complete`` / ``fail``, which wake their waiters) after it is released,
and so is everything a failure sets off. It is a plain lock on purpose: no path may come
back into the engine while holding it.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable

from ..errors import ClosedError, MismatchError
from .base import ANY_SOURCE, Buffer, Handle, Transport
from .engine_arrivals import EngineArrivals
from .engine_deferred import DeferredReceives
from .engine_wait import EngineWaiting
from .heap import Heap
from .shm_backlog import BacklogWriter
from .request import FULL_MASK, Channel, Incoming, Request, _Bytes


class Engine(DeferredReceives, EngineWaiting, EngineArrivals, Transport):
    """The process's transport: matching, waiting and failure handling over channels."""

    def __init__(self, rank: int, size: int, timeout: float, job: str = "local") -> None:
        self.rank, self.size, self.timeout = rank, size, timeout
        self.job = job          # names this job's shared-memory segments
        self.heap = Heap()      # user buffers in shared memory (collcomm.empty)
        self.hosts: list[str] = ["local"] * size   # host id of every rank (set at rendezvous)
        self.channels: dict[int, Channel] = {}
        self.lost: dict[int, BaseException] = {}
        self.crashed: set[int] = set()     # lost without leaving cleanly
        self._lock = threading.Lock()     # a leaf: see the module docstring
        self._posted: list[Request] = []
        self._unexpected: list[Incoming] = []
        self._inflight: dict[int, Any] = {}     # source -> token of the body being read (arriving..landed)
        self._polled: list[Channel] = []        # channels that need polling (shared memory)
        self._polled_peers: set[int] = set()    # their peers
        self._drive: Any = None                  # runs TCP's selector on a waiting thread
        self._nudge: Any = None                  # ends that thread's select (see _completed_off_selector)
        self._resume: Any = None                 # has TCP's I/O thread take over (a wait that does not drive)
        self._aborted: BaseException | None = None
        self._closed = False
        # byte 0 is 1 once the engine is aborted or closed or has lost a peer (it never goes
        # back): what the native point-to-point calls read instead of those three attributes
        self.health = bytearray(1)
        self._news = threading.Event()          # set when a message joins the unexpected list
        # receives whose posting is deferred to their wait (core/p2p.py Deferred), in
        # posting order; every receive posted here comes after them (post_deferred)
        self._deferred: list[Any] = []
        self._defer_mutex = threading.Lock()       # guards _deferred (taken directly: a C lock)
        self._defer_lock = threading.Condition(self._defer_mutex)   # waited on to post after a native wait
        self._stealing = 0                          # threads waiting on it
        self._acks: list[tuple[int, int]] = []      # (peer, wire tag): acknowledgements owed (owe_ack)
        # tag bits of a message that must meet its receive as it arrives (the core sets
        # them: a synchronous send's): while one waits unexpected (``_prompt``), progress
        # posts the deferred receives (see engine_wait.py)
        self.prompt_bits = 0
        self._prompt = False
        self._ack_lock = threading.Lock()           # one thread sends them at a time (send_acks)
        # writes the sends queued behind a full ring (shm_backlog.py); its list of channels
        # with a backlog is what progress looks at
        self.backlog_writer = BacklogWriter(self)
        self._backlogged = self.backlog_writer.channels

    # -- setup ---------------------------------------------------------------------------
    def add_channel(self, channel: Channel, polled: bool) -> None:
        self.channels[channel.peer] = channel
        if polled:
            self._polled.append(channel)
            self._polled_peers.add(channel.peer)
        elif self._drive is None and hasattr(channel, "drive"):
            self._drive = channel.drive   # one hub serves every TCP channel
            self._nudge = channel.nudge
            self._resume = channel.resume

    def kinds(self) -> dict[int, str]:
        """Which channel kind serves each peer (for diagnostics and tests)."""
        return {p: c.kind for p, c in sorted(self.channels.items())}

    # -- the contract -----------------------------------------------------------------------
    def isend(self, buf: Buffer, dst: int, tag: int, sig: int = 0, lend: bool = False) -> Handle:
        """The contract's send; ``sig``: the call signature the message carries; ``lend``:
        the caller leaves ``buf`` alone until the send is done (a non-blocking send), so a
        channel may read it there instead of copying it first (shm_lent.py)."""
        if self._aborted is not None or self._closed:
            self._check_open()
        req = Request(self, "send", buf, dst, tag, FULL_MASK, sig)
        if dst == self.rank:
            self.arrived(self.rank, tag, len(buf), _Bytes(bytes(buf)), sig)
            req.complete(dst, len(buf))
            self._completed_off_selector()
            return req
        channel = self.channels.get(dst)
        if channel is None:
            self._check_peer(dst)      # raises: no channel to dst
        if self.lost:
            lost = self.lost.get(dst)
            if lost is not None:
                req.fail(lost)
                return req
        channel.send(req, lend)  # type: ignore[union-attr]
        return req

    def irecv(self, buf: Buffer, src: int, tag: int, mask: int = FULL_MASK, sig: int = 0,
              matched: Callable[[Request], None] | None = None) -> Handle:
        """The contract's receive; ``mask``: match any tag equal to ``tag`` on its bits;
        ``sig``: the call signature expected (a message carrying another fails the receive
        with SignatureMismatchError; 0 on either side: not checked); ``matched``: the
        request's hook (see Request), called when a message completes it."""
        if self._deferred:
            self.post_deferred()     # receives issued before this one are posted first
        return self._post_recv(buf, src, tag, mask, sig, matched)

    def _post_recv(self, buf: Buffer, src: int, tag: int, mask: int = FULL_MASK,
                   sig: int = 0, matched: Callable[[Request], None] | None = None) -> Request:
        """Post a receive (:meth:`irecv` without the deferred receives' turn first)."""
        if self._aborted is not None or self._closed:
            self._check_open()
        if src != ANY_SOURCE and src != self.rank and src not in self.channels:
            self._check_peer(src)      # raises: no channel to src
        req = Request(self, "recv", buf, src, tag, mask, sig)
        req.matched = matched
        early: Incoming | None = None
        lost: BaseException | None = None
        with self._lock:
            for i, inc in enumerate(self._unexpected):
                if ((inc.tag == tag or not (inc.tag ^ tag) & mask)
                        and (src == ANY_SOURCE or inc.source == src) and inc.waiter is None):
                    del self._unexpected[i]
                    req.tag = inc.tag
                    if inc.ready:
                        early = inc
                    else:
                        inc.waiter = req   # landed() delivers it
                    break
            else:
                if src != ANY_SOURCE and src in self.lost:
                    lost = self.lost[src]
                else:
                    self._posted.append(req)
        if early is not None:
            self._deliver(req, early.source, early.nbytes, early.payload, early.sig)
        elif lost is not None:
            req.fail(lost)
        return req

    # -- a probed message (MPI_Mrecv; Engine.probe is in engine_wait.py) -----------------------
    def mrecv(self, message: Incoming, buf: Buffer,
              matched: Callable[[Request], None] | None = None) -> Handle:
        """Receive the message :meth:`probe` took (``take=True``) into ``buf``."""
        req = Request(self, "recv", buf, message.source, message.tag)
        req.matched = matched
        with self._lock:
            ready = message.ready
            if not ready:
                message.waiter = req      # landed() delivers it
        if ready:
            self._deliver(req, message.source, message.nbytes, message.payload, message.sig)
        return req

    def cancel(self, req: Handle) -> bool:
        """Withdraw a receive no message has matched yet (MPI_Cancel): True if it was
        withdrawn, and then its wait raises ClosedError; False if it is matched or done."""
        with self._lock:
            withdrawn = req in self._posted
            if withdrawn:
                self._posted.remove(req)  # type: ignore[arg-type]
        if withdrawn:
            req.fail(ClosedError(f"rank {self.rank}: the {req.describe()} was cancelled"))  # type: ignore[attr-defined]
            self._completed_off_selector()
        return withdrawn

    def _completed_off_selector(self) -> None:
        """A receive may have completed on this thread while another one waits for it in
        TCP's selector (``_block``): wake that one now rather than at its next check."""
        if self._nudge is not None:
            self._nudge()

    def abort(self, exc: BaseException) -> None:
        with self._lock:
            if self._aborted is None:
                self._aborted = exc
            self.health[0] = 1
            posted, self._posted = self._posted, []
        for req in posted:
            req.fail(exc)
        for ch in list(self.channels.values()):
            ch.close(linger=0)

    def close(self) -> None:
        if self._closed:
            return
        deadline = time.monotonic() + 1.0
        while self._acks and time.monotonic() < deadline:   # acks owed, rings full till now
            try:
                self.progress()
            except Exception:   # noqa: BLE001 - leaving anyway (a peer died: ShmChannel.close does the same)
                break
            time.sleep(0.001)
        self._closed = True
        self.health[0] = 1
        for ch in list(self.channels.values()):
            ch.close()
        self.heap.clear()
        self.abort(ClosedError(f"rank {self.rank}: transport closed"))

    def _check_open(self) -> None:
        if self._aborted is not None:
            raise self._aborted
        if self._closed:
            raise ClosedError(f"rank {self.rank}: transport closed")

    def _check_peer(self, peer: int) -> None:
        if not 0 <= peer < self.size or peer not in self.channels:
            raise MismatchError(f"rank {self.rank}: no channel to rank {peer} (world size {self.size})")
