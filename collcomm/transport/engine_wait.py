"""How a thread waits on the engine: :class:`EngineWaiting`, a base class of
:class:`~.engine.Engine` holding its waits (:meth:`~EngineWaiting.wait` for a request,
:meth:`~EngineWaiting.probe` for an unexpected message), the peers' liveness checks and the
timeouts every wait has, and :meth:`~EngineWaiting.native_check`, the same checks for a
native receive.

A wait spins on the progress loop briefly, then yields the CPU, then blocks on the
request's event with a growing sleep; a request polling cannot complete (a TCP peer) is
not spun for: its waiter runs TCP's selector itself or blocks (see engine.py's docstring,
"waiting" and "failure"). Every ``LIVENESS_PERIOD`` the peers are checked, then the clock.

Acknowledgements a receive owes (:meth:`~EngineWaiting.owe_ack`: a synchronous send's
message taken, core/p2p_sync.py) are written at once without waiting: the hook that owes
one may run inside a channel's poll (holding its ``poll_lock``) or under
``_defer_mutex``, where a send into a full ring could not wait for the peer to make room
(two ranks flooding each other would each wait for the other's ring). One to a
shared-memory peer whose ring is full at that moment (or whose ``send_lock`` is busy)
stays owed and every :meth:`~EngineWaiting.progress` tries it again, after its polls;
``Engine.close`` tries for up to a second (and a channel's close, which progresses while
it lingers for a reader, longer). A native receive's periodic check progresses
too, so one waiting on a single peer's ring still delivers other peers' messages to
posted receives (and what they owe) every ``LIVENESS_PERIOD``. A synchronous send's
message waiting unexpected while deferred receives are held (an ``Irecv`` posted
natively waits in the line until its own wait) has every progress post them
(``prompt_bits``; one receiving natively in its own wait is asked to stop), so its
receive takes it now. A rank waiting in a collective progresses too, every millisecond
its wait sleeps (:meth:`~EngineWaiting.collective_progress`, the arena's hook), so a
synchronous send to a rank that posted the receive and went into a barrier completes,
and an ack owed meanwhile goes.
"""
from __future__ import annotations

import os
import threading
import time
from typing import Any, Sequence

from ..errors import CollcommError, CommTimeoutError, PeerLostError
from .base import ANY_SOURCE
from .request import FULL_MASK, Channel, Incoming, Request, describe

SPIN_ROUNDS = 200
YIELD_ROUNDS = 50
SLEEP_MIN, SLEEP_MAX = 50e-6, 2e-3
LIVENESS_PERIOD = 0.1
#: The largest receive whose waiter runs TCP's selector itself (``_block``); a larger one
#: waits for TCP's I/O thread, which then reads it while the caller is busy elsewhere.
DRIVE_MAX = 256 << 10
_NOTHING = memoryview(b"")
#: the byte count a native probe's waits give :meth:`EngineWaiting.native_check`
#: (native/_p2p_probe.c PROBE_NBYTES): its timeout then reads as a probe's
NATIVE_PROBE = (1 << 64) - 1
NATIVE_PROBE_ANY = (1 << 64) - 2     # (one of ANY_TAG)


class EngineWaiting:
    """The waiting half of the :class:`~.engine.Engine` (its base class: every attribute
    below is the engine's, set in ``Engine.__init__``; ``_check_open`` and ``_check_peer``
    are its methods)."""

    rank: int
    timeout: float
    channels: dict[int, Channel]
    lost: dict[int, BaseException]
    crashed: set[int]
    _lock: threading.Lock
    _posted: list[Request]
    _unexpected: list[Incoming]
    _polled: list[Channel]
    _polled_peers: set[int]
    _drive: Any
    _resume: Any
    _news: threading.Event
    _deferred: list[Any]
    _acks: list[tuple[int, int]]
    _backlogged: list[Any]
    backlog_writer: Any
    _ack_lock: threading.Lock
    _prompt: bool
    post_deferred: Any
    post_deferred_soon: Any
    prompt_bits: int
    isend: Any

    # -- waiting for a request ---------------------------------------------------------------
    def progress(self) -> None:
        """Poll the channels that need it (shared memory; TCP progresses on its own thread),
        write what fits of the sends queued behind full rings, then send the
        acknowledgements owed."""
        for ch in self._polled:
            ch.poll()
        if self._backlogged:
            self.backlog_writer.flush()
        if self._prompt and self._deferred:
            self._post_for_prompt()
        if self._acks:
            self.send_acks()

    def collective_progress(self) -> Any:
        """What a collective's wait on this rank calls every millisecond it sleeps
        (Arena.progress): :meth:`progress` while this rank has point-to-point work
        outstanding (receives posted or deferred, acknowledgements owed, sends queued),
        its errors left to the requests they concern; None when no channel needs polling
        (TCP progresses on its own thread). A rank with nothing outstanding leaves its
        rings alone: a message polled then would only be copied aside, to be copied again
        into the receive posted later (a lent one read early instead of into it)."""
        if not self._polled:
            return None

        def progress() -> None:
            if self.outstanding():
                try:
                    self.progress()
                except CollcommError:
                    pass
        return progress

    def outstanding(self) -> bool:
        """Whether this rank has point-to-point work that :meth:`progress` would move
        (receives posted or deferred, acknowledgements owed, sends queued behind full
        rings); without it, polling could only copy early messages aside."""
        return bool(self._posted or self._deferred or self._acks or self._backlogged)

    def _post_for_prompt(self) -> None:
        """A message with ``prompt_bits`` (a synchronous send's) waits unexpected while
        deferred receives are held (it came first, or before them): post them (as a
        receive posted in the engine would), so the one it is for takes it now and
        acknowledges it; its rank may be blocked elsewhere until the sender's call
        returns. A receive whose own wait is receiving natively is asked to stop and go
        the regular way (``post_deferred_soon``); the flag stays while such a message
        still waits."""
        self.post_deferred_soon()
        bits = self.prompt_bits
        self._prompt = any(inc.tag & bits for inc in list(self._unexpected))

    def owe_ack(self, dst: int, tag: int) -> None:
        """Owe ``dst`` an acknowledgement, an empty message of wire tag ``tag`` (a receive's
        ``matched`` hook, on whichever thread completed it; see the module doc): sent now
        where that never waits (a shared-memory ring with room and its ``send_lock`` free;
        TCP, whose sends never block; this process itself), else left to :meth:`progress`."""
        if dst in self._polled_peers:
            if not self.channels[dst].try_ack(tag):   # type: ignore[attr-defined]
                self._acks.append((dst, tag))
            return
        try:
            self.isend(_NOTHING, dst, tag)
        except CollcommError:
            pass    # the peer is gone or the engine closed: its send fails on its side

    def send_acks(self) -> None:
        """Try the acknowledgements still owed again (one thread at a time, never waiting);
        those whose peer is gone are dropped."""
        if not self._ack_lock.acquire(blocking=False):
            return
        try:
            for _ in range(len(self._acks)):     # (pops and appends: atomic; others may add)
                dst, tag = self._acks.pop(0)
                if dst not in self.lost and not self.channels[dst].try_ack(tag):   # type: ignore[attr-defined]
                    self._acks.append((dst, tag))
        finally:
            self._ack_lock.release()

    def let_land(self, req: Request) -> None:
        """A test found ``req`` not done: if polling cannot complete it (TCP), have the I/O
        thread take over and let it take the GIL now. A caller testing in a loop holds the
        GIL, and the I/O thread waited up to the switch interval (5 ms) per test for it:
        an 8-byte ping-pong over TCP polled with ``Test`` took 11 ms a round trip."""
        if self._completed_elsewhere(req):
            if self._resume is not None:
                self._resume()
            time.sleep(0)

    def wait(self, req: Request, timeout: float | None, watch: Sequence[int] = (),
             withdraw: bool = True) -> None:
        """Spin, then yield, then sleep on the request's event until it is done.

        When the time is up the request is withdrawn and failed (``withdraw``: the
        operation's own timeout), or, for a caller's shorter look (``withdraw=False``: a
        ``wait(timeout)`` the user may repeat), CommTimeoutError is raised and the request
        stays posted, so a later wait can still complete it.

        A request polling cannot complete (see :meth:`_completed_elsewhere`) is not spun
        for: the waiter runs TCP's selector itself or blocks on its event (:meth:`_block`).
        Every 100 ms the peer (and the ranks in ``watch``: the other members of a
        collective's group) are checked; the peer lost, or a watched rank crashed (lost
        without leaving cleanly: it cannot finish its part), fails the request.
        """
        limit = self.timeout if timeout is None else timeout
        start = time.monotonic()
        next_check = start + LIVENESS_PERIOD
        if self._completed_elsewhere(req):
            self._block(req, limit, start, next_check, watch, withdraw)
            return
        rounds = 0
        sleep = SLEEP_MIN
        progress = self.progress
        while not req.done:
            progress()
            if req.done:
                return
            rounds += 1
            if rounds < SPIN_ROUNDS:
                continue
            if rounds < SPIN_ROUNDS + YIELD_ROUNDS:
                os.sched_yield()
                time.sleep(0)
            else:
                req._event().wait(sleep)
                sleep = min(sleep * 2, SLEEP_MAX)
            next_check = self._checkpoint(req, start, limit, next_check, watch, withdraw)

    def _checkpoint(self, req: Request, start: float, limit: float, next_check: float,
                    watch: Sequence[int], withdraw: bool = True) -> float:
        """Once per ``LIVENESS_PERIOD`` of a wait: the peers' liveness, then the timeout.
        Returns when the next check is due."""
        now = time.monotonic()
        if now >= next_check:
            next_check = now + LIVENESS_PERIOD
            self._check_liveness(req, watch)
            if now - start > limit and not req.done:
                if not withdraw:
                    raise self._timeout_error(req.kind, len(req.buf), req.peer, req.tag, limit)
                self._time_out(req, limit)
        return next_check

    def _completed_elsewhere(self, req: Request) -> bool:
        """Whether polling cannot complete ``req``: its peer's channel is not polled (TCP),
        or no channel is."""
        return not self._polled or (req.peer != ANY_SOURCE and req.peer not in self._polled_peers)

    def _block(self, req: Request, limit: float, start: float, next_check: float,
               watch: Sequence[int], withdraw: bool = True) -> None:
        """Wait for a request polling cannot complete without spinning: a receive of up to
        ``DRIVE_MAX`` bytes runs TCP's selector on this thread (the message lands here);
        otherwise, or when another thread drives the selector, block on the request's
        event (the GIL free for the thread that lands it; TCP's I/O thread is told to take
        over at once). The shared-memory channels, if any, are still polled in
        between (50 µs up to 2 ms), and the liveness and timeout checks run every
        ``LIVENESS_PERIOD`` as in :meth:`wait`."""
        event, polled = req._event(), bool(self._polled)
        drive = self._drive if req.kind == "recv" and len(req.buf) <= DRIVE_MAX else None

        def ready() -> bool:
            return req.done

        sleep = SLEEP_MIN
        while not req.done:
            if polled:
                self.progress()
                if req.done:
                    return
                until = min(time.monotonic() + sleep, next_check)
                sleep = min(sleep * 2, SLEEP_MAX)
            else:
                until = next_check
            if drive is None or not drive(until, ready):
                if drive is None and self._resume is not None:
                    self._resume()
                event.wait(max(0.0, until - time.monotonic()))
            if req.done:
                return
            next_check = self._checkpoint(req, start, limit, next_check, watch, withdraw)

    def check_peers(self) -> None:
        """Check every peer's liveness now (what a wait does every ``LIVENESS_PERIOD``): a
        lost one fails the requests pending with it. For a caller that polls requests with
        ``test()``, which checks nothing (collcomm.MPI's ``Waitany`` / ``Waitsome``)."""
        for p, ch in list(self.channels.items()):
            if p not in self.lost:
                ch.check_alive()
        if self.lost and len(self.lost) == len(self.channels):   # nobody left to answer
            with self._lock:                                    # an any-source receive
                doomed = [r for r in self._posted if r.peer == ANY_SOURCE]
                self._posted = [r for r in self._posted if r.peer != ANY_SOURCE]
            for req in doomed:
                req.fail(next(iter(self.lost.values())))

    def _check_liveness(self, req: Request, watch: Sequence[int] = ()) -> None:
        peers = list(self.channels.keys()) if req.peer == ANY_SOURCE else [req.peer, *watch]
        for p in peers:
            ch = self.channels.get(p)
            if ch is not None and p not in self.lost:
                ch.check_alive()
        if req.peer in self.lost:
            req.fail(self.lost[req.peer])
        elif req.peer == ANY_SOURCE and self.lost and len(self.lost) == len(self.channels):
            req.fail(next(iter(self.lost.values())))
        elif self.crashed:
            gone = [p for p in watch if p in self.crashed]
            if gone:
                with self._lock:
                    if req in self._posted:
                        self._posted.remove(req)
                req.fail(PeerLostError(
                    f"rank {self.rank}: rank {gone[0]} of this group is lost ({self.lost[gone[0]]}), "
                    f"so the {req.describe()} cannot complete", peer=gone[0]))

    def _time_out(self, req: Request, limit: float) -> None:
        with self._lock:
            if req in self._posted:
                self._posted.remove(req)
        req.fail(self._timeout_error(req.kind, len(req.buf), req.peer, req.tag, limit))

    def _timeout_error(self, kind: str, nbytes: int, peer: int, tag: int,
                       limit: float) -> CommTimeoutError:
        who = None if peer == ANY_SOURCE else peer
        return CommTimeoutError(
            f"rank {self.rank} timed out after {limit:g} s waiting for the "
            f"{describe(kind, nbytes, peer, tag)}; rank {peer if who is not None else '(any)'} "
            f"did not {'receive' if kind == 'send' else 'send'} it (did it skip this call?)",
            peer=who)

    def native_check(self, peer: int, nbytes: int, tag: int, elapsed: float, limit: float) -> None:
        """A native receive (native/_p2p.c) of ``nbytes`` (``NATIVE_PROBE``: a probe's,
        native/_p2p_probe.c) from ``peer`` has waited
        ``elapsed`` s (called every ``LIVENESS_PERIOD``, holding the channel's poll_lock):
        raise what :meth:`wait` would fail its request with: the engine aborted or closed,
        the peer lost (its liveness checked here), the timeout ``limit`` passed. Other
        channels are polled first, for the receives posted on them (this one's poll_lock
        is held: its poll is skipped)."""
        if self._aborted is not None or self._closed:
            self._check_open()
        if self._posted or self._acks or (self._prompt and self._deferred):
            self.progress()
        ch = self.channels.get(peer)
        if ch is not None and peer not in self.lost:
            ch.check_alive()
        if peer in self.lost:
            raise self.lost[peer]
        if elapsed > limit:
            if nbytes in (NATIVE_PROBE, NATIVE_PROBE_ANY):
                which = f"tag {tag:#x}" if nbytes == NATIVE_PROBE else f"any tag, context {tag:#x}"
                raise CommTimeoutError(
                    f"rank {self.rank} timed out after {limit:g} s probing for a message from "
                    f"rank {peer} ({which}); none was sent", peer=peer)
            raise self._timeout_error("recv", nbytes, peer, tag, limit)

    # -- probing (MPI_Probe / MPI_Mprobe; not part of the base contract) --------------------
    def probe(self, src: int, tag: int, mask: int = FULL_MASK, *, block: bool = False,
              take: bool = False, timeout: float | None = None) -> Incoming | None:
        """The first unexpected message a receive ``(src, tag, mask)`` would match, or None.

        Its ``source``, ``tag`` and ``nbytes`` are known even while a TCP body is still
        arriving. ``take``: remove it from matching (pass it to :meth:`mrecv` later).
        ``block``: wait until one arrives (CommTimeoutError after ``timeout``; a lost
        ``src``, or every peer lost for ANY_SOURCE, raises its PeerLostError).
        """
        self._check_open()
        if src != ANY_SOURCE and src != self.rank:
            self._check_peer(src)
        if self._deferred:
            self.post_deferred()   # (type: Engine's) a deferred receive matches before a probe sees
        limit = self.timeout if timeout is None else timeout
        start = time.monotonic()
        next_check = start + LIVENESS_PERIOD
        rounds, sleep = 0, SLEEP_MIN
        # only another thread (TCP's) can bring it: block on the news rather than spin
        blocking = not self._polled or (src != ANY_SOURCE and src not in self._polled_peers)
        while True:
            self._news.clear()
            self.progress()
            with self._lock:
                for i, inc in enumerate(self._unexpected):
                    if ((inc.tag == tag or not (inc.tag ^ tag) & mask)
                            and (src == ANY_SOURCE or inc.source == src) and inc.waiter is None):
                        if take:
                            del self._unexpected[i]
                        return inc
            if not block:
                return None
            self._check_open()
            rounds += 1
            if blocking:
                if self._polled:
                    until = min(time.monotonic() + sleep, next_check)
                    sleep = min(sleep * 2, SLEEP_MAX)
                else:
                    until = next_check
                if self._drive is None or not self._drive(until, self._news.is_set):
                    self._news.wait(max(0.0, until - time.monotonic()))
            elif rounds < SPIN_ROUNDS:
                continue
            elif rounds < SPIN_ROUNDS + YIELD_ROUNDS:
                os.sched_yield()
                time.sleep(0)
            else:
                self._news.wait(sleep)
                sleep = min(sleep * 2, SLEEP_MAX)
            now = time.monotonic()
            if now >= next_check:
                next_check = now + LIVENESS_PERIOD
                self._probe_liveness(src)
                if now - start > limit:
                    who = "any rank" if src == ANY_SOURCE else f"rank {src}"
                    raise CommTimeoutError(
                        f"rank {self.rank} timed out after {limit:g} s probing for a message from "
                        f"{who} (tag {tag:#x}, mask {mask:#x}); none was sent",
                        peer=None if src == ANY_SOURCE else src)

    def _probe_liveness(self, src: int) -> None:
        peers = list(self.channels) if src == ANY_SOURCE else [src]
        for p in peers:
            ch = self.channels.get(p)
            if ch is not None and p not in self.lost:
                ch.check_alive()
        if src in self.lost:
            raise self.lost[src]
        if src == ANY_SOURCE and self.channels and len(self.lost) == len(self.channels):
            raise next(iter(self.lost.values()))
