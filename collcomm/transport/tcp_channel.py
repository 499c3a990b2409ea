"""One TCP connection to a peer: framing, the send queue, reading frames, heartbeats.

A frame is a 32-byte header (tag, nbytes, call signature, kind) and a body; DATA bodies
are read straight into the posted receive buffer when one is waiting (else aside, until
posted). Sends are queued; the caller writes what the socket takes at once and the hub
(:mod:`.tcp`) writes the rest when the socket is writable. Every
``HEARTBEAT_INTERVAL`` seconds of silence the channel sends a HEARTBEAT; a peer silent
for :func:`heartbeat_timeout` seconds is lost. The lock rules (``TcpChannel.lock`` is a
leaf; failures recorded under it, acted on after releasing it) are in :mod:`.tcp`.
"""
from __future__ import annotations

import collections
import os
import socket
import struct
import threading
import time
from typing import TYPE_CHECKING, Any, Callable

from ..errors import PeerLostError

if TYPE_CHECKING:
    from .engine import Request
    from .tcp import TcpHub

__all__ = ["BYE", "DATA", "FRAME", "HEARTBEAT", "HEARTBEAT_INTERVAL", "MAX_BODY", "ChannelFailure",
           "TcpChannel", "heartbeat_timeout"]

FRAME = struct.Struct("<QQQI4x")   # tag, nbytes, call signature, kind
DATA, HEARTBEAT, BYE = 0, 1, 2
MAX_BODY = 1 << 48                # a frame announcing more is malformed (not a message size)
HEARTBEAT_INTERVAL = 1.0


def heartbeat_timeout() -> float:
    return float(os.environ.get("COLLCOMM_HEARTBEAT_TIMEOUT", "15"))


class TcpChannel:
    """The connection to one peer."""

    kind = "tcp"

    def __init__(self, hub: "TcpHub", peer: int, sock: socket.socket) -> None:
        self.hub, self.engine, self.peer, self.sock = hub, hub.engine, peer, sock
        self.queue: collections.deque[list[Any]] = collections.deque()
        self.lock = threading.Lock()     # a leaf: see the module docstring
        self.closed = False              # set once, under ``lock``, by whoever ends the channel
        self.error: PeerLostError | None = None   # why it ended, when it failed
        self.bye = False
        self.last_send = self.last_recv = time.monotonic()
        # reading state: header first, then the body into ``target``
        self.header = bytearray(FRAME.size)
        self.hview = memoryview(self.header)
        self.hpos = 0
        self.target: memoryview | None = None
        self.tpos = 0
        self.token: Any = None
        self.frame: tuple[int, int, int] = (0, 0, 0)

    # -- sending (any thread) ------------------------------------------------------------
    def send(self, req: "Request", lend: bool = False) -> None:
        self._enqueue(FRAME.pack(req.tag, len(req.buf), req.sig, DATA), req.buf, req)

    def _enqueue(self, header: bytes, body: memoryview | bytes, req: "Request | None") -> None:
        item = [memoryview(header), memoryview(body), req]
        done: list["Request"] = []
        failure: ChannelFailure | None = None
        with self.lock:
            refused = self.closed
            if not refused:
                self.queue.append(item)
                if len(self.queue) == 1:
                    done, failure = self._flush_locked()
            pending = bool(self.queue) and not self.closed
        if refused:
            if req is not None:
                req.fail(self._closed_error())
            return
        self._settle(done, failure)
        if pending:
            self.hub.want_write(self)

    def _closed_error(self) -> BaseException:
        return self.error or self.engine.lost.get(self.peer) or PeerLostError(
            f"rank {self.engine.rank}: connection to rank {self.peer} is closed", peer=self.peer)

    def _flush_locked(self) -> tuple[list["Request"], "ChannelFailure | None"]:
        """Write queued frames until the socket would block (caller holds ``lock``).

        Only writes and records: returns the sends that finished and the failure, if the
        socket broke, for the caller to act on (:meth:`_settle`) once it released the lock.
        """
        done: list["Request"] = []
        while self.queue:
            item = self.queue[0]
            head, body, req = item
            try:
                if head:
                    sent = self.sock.sendmsg([head, body[:1 << 30]] if body else [head])
                else:
                    sent = self.sock.send(body[:1 << 30])
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                return done, self._claim_locked(f"sending to rank {self.peer} failed: {exc}", exc)
            self.last_send = time.monotonic()
            if sent < len(head):
                item[0] = head[sent:]
                continue
            sent -= len(head)
            item[0] = head[:0]
            item[1] = body = body[sent:]
            if not body:
                self.queue.popleft()
                if req is not None:
                    done.append(req)
        return done, None

    def _claim_locked(self, why: str, exc: BaseException | None) -> "ChannelFailure | None":
        """Record that the connection failed (caller holds ``lock``): the first to notice
        gets the failure to act on, later ones get None."""
        if self.closed:
            return None
        self.closed = True
        err = PeerLostError(f"rank {self.engine.rank}: {why}", peer=self.peer)
        if exc is not None:
            err.__cause__ = exc
        self.error = err
        doomed = [req for _, _, req in self.queue if req is not None]
        self.queue.clear()
        return ChannelFailure(err, doomed, crashed=not self.bye)

    def _settle(self, done: list["Request"], failure: "ChannelFailure | None") -> None:
        """Act on what a flush found (no lock held)."""
        for req in done:
            req.complete(self.peer, len(req.buf))
        if failure is not None:
            self.hub.lost(self, failure)

    def flush(self) -> None:
        with self.lock:
            done, failure = self._flush_locked() if not self.closed else ([], None)
        self._settle(done, failure)

    # -- receiving (hub thread) ------------------------------------------------------------
    def on_readable(self) -> None:
        sock = self.sock
        while True:
            try:
                if self.target is None:
                    n = sock.recv_into(self.hview[self.hpos:])
                else:
                    n = sock.recv_into(self.target[self.tpos:], min(len(self.target) - self.tpos, 1 << 30))
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self.hub.fail(self, f"connection to rank {self.peer} broke: {exc}", exc)
                return
            if n == 0:
                why = (f"rank {self.peer} left the job (closed its connection)" if self.bye
                       else f"connection to rank {self.peer} was closed (the process died?)")
                self.hub.fail(self, why, None)
                return
            self.last_recv = time.monotonic()
            if self.target is None:
                self.hpos += n
                if self.hpos == FRAME.size:
                    self.hpos = 0
                    self._on_header()
            else:
                self.tpos += n
                if self.tpos == len(self.target):
                    self._on_body()

    def _on_header(self) -> None:
        tag, nbytes, sig, kind = FRAME.unpack(self.header)
        if kind not in (DATA, HEARTBEAT, BYE) or nbytes > MAX_BODY or (kind != DATA and nbytes):
            raise ValueError(f"malformed frame (kind {kind}, {nbytes} bytes)")
        if kind == HEARTBEAT:
            return
        if kind == BYE:
            self.bye = True
            return
        self.frame = (tag, nbytes, kind)
        self.target, self.token = self.engine.arriving(self.peer, tag, nbytes, sig)
        self.tpos = 0
        if nbytes == 0:
            self._on_body()

    def _on_body(self) -> None:
        _, nbytes, _ = self.frame
        token, self.target, self.token = self.token, None, None
        self.engine.landed(self.peer, nbytes, token)

    # -- health ---------------------------------------------------------------------------
    def tick(self, now: float) -> None:
        if now - self.last_recv > heartbeat_timeout():
            self.hub.fail(self, f"rank {self.peer} missed its heartbeats for "
                                f"{now - self.last_recv:.1f} s (host down or process hung?)", None)
        elif now - self.last_send > HEARTBEAT_INTERVAL and not self.queue:
            self._enqueue(FRAME.pack(0, 0, 0, HEARTBEAT), b"", None)

    def check_alive(self) -> None:
        """The hub notices failures by itself; nothing to probe here."""

    def drive(self, until: float, ready: Callable[[], bool]) -> bool:
        """Run the hub's selector on the calling thread (see :meth:`TcpHub.drive`)."""
        return self.hub.drive(until, ready)

    def resume(self) -> None:
        """A caller waits without driving: have the I/O thread take over (TcpHub.resume)."""
        self.hub.resume()

    def nudge(self) -> None:
        """A request was completed off the selector (a self-send, a cancel): end the
        driving caller's select, so that it sees it now."""
        if self.hub.driver is not None:
            self.hub._wake()

    def close(self, linger: float = 10.0) -> None:
        """Closing one channel closes the hub's connections together (after flushing)."""
        self.hub.close(linger)


class ChannelFailure:
    """A channel's death as recorded under its lock: the error and the sends it dooms."""

    __slots__ = ("error", "doomed", "crashed")

    def __init__(self, error: PeerLostError, doomed: list["Request"], crashed: bool) -> None:
        self.error, self.doomed, self.crashed = error, doomed, crashed
