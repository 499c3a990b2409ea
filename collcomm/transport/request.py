"""What the engine and its channels pass each other: a pending send or receive
(:class:`Request`, the contract's Handle), a message that arrived before its receive
(:class:`Incoming`), a message's body wherever it sits (the :class:`Payload` protocol;
:class:`_Bytes` for one in private memory), and the :class:`Channel` protocol every
channel (shm.ShmChannel, tcp_channel.TcpChannel) follows. See engine.py for how they meet.
"""
from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Callable, Protocol, Sequence

from .base import ANY_SOURCE, Buffer, Handle, Status

if TYPE_CHECKING:
    from .engine import Engine

#: The mask of a receive that matches its tag exactly.
FULL_MASK = (1 << 64) - 1
#: Makes a request's event (``Request._event``); a leaf, taken holding no other lock.
_EVENT_LOCK = threading.Lock()


class Payload(Protocol):
    """The body of an incoming message, wherever it sits."""

    def copy_into(self, dst: memoryview) -> None: ...

    def detach(self) -> "Payload":
        """A payload that stays valid after the channel moves on (called before queueing)."""
        ...

    def release(self) -> None: ...


class Channel(Protocol):
    """One peer's link (see shm.ShmChannel, tcp.TcpChannel)."""

    peer: int
    kind: str

    def send(self, req: "Request", lend: bool = False) -> None: ...

    def poll(self) -> None: ...

    def check_alive(self) -> None: ...

    def close(self, linger: float = 10.0) -> None: ...


class Request(Handle):
    """A pending send or receive; completed by whichever thread finishes it.

    Its ``event`` is made only when a waiter is about to block on it (:meth:`_event`): most
    small shared-memory requests complete while their waiter spins, and an Event (a lock
    and a condition) costs more to make and set than the rest of the request. ``complete``
    and ``fail`` write ``done`` before they read ``event``; ``_event`` stores ``event``
    before it reads ``done``; so whichever comes second sets it, and no wake-up is lost.

    ``matched``: a receive's hook, called once with the request when a message completes
    it, on whichever thread does (the caller, a waiter polling a channel, a native
    receive's poll, TCP's I/O thread), maybe holding that channel's ``poll_lock``,
    ``Engine._defer_mutex`` or TCP's ``io``: it must not wait for a ring or a non-leaf
    lock (core/p2p_sync.py's writes an acknowledgement only where that never waits, else
    leaves it owed: ``Engine.owe_ack``).
    """

    __slots__ = ("engine", "kind", "buf", "peer", "tag", "mask", "done", "exc", "status", "event",
                 "sig", "matched")

    def __init__(self, engine: "Engine", kind: str, buf: Buffer, peer: int, tag: int,
                 mask: int = FULL_MASK, sig: int = 0) -> None:
        self.engine, self.kind, self.buf, self.peer, self.tag = engine, kind, buf, peer, tag
        self.sig = sig          # the call signature it carries / expects (0: none, unchecked)
        self.mask = mask        # a receive matches tags equal to ``tag`` on these bits
        self.done = False
        self.exc: BaseException | None = None
        self.status: Status | None = None
        self.event: threading.Event | None = None   # made by the first waiter that blocks
        self.matched: Callable[["Request"], None] | None = None

    def complete(self, source: int, nbytes: int) -> None:
        if self.done:
            return
        self.status = Status(source, nbytes, self.tag)
        if self.matched is not None:
            self._run_hook()
        self.done = True
        event = self.event
        if event is not None:
            event.set()

    def _run_hook(self) -> None:
        hook, self.matched = self.matched, None
        hook(self)   # type: ignore[misc]

    def fail_matched(self, source: int, exc: BaseException) -> None:
        """A message from ``source`` matched this receive but cannot complete it (larger
        than the buffer, another call's): it is taken all the same, so the hook runs (a
        synchronous send is acknowledged: its sender completes, as in MPI, while this
        receive raises ``exc``)."""
        if self.done:
            return
        if self.matched is not None:
            self.status = Status(source, 0, self.tag)
            self._run_hook()
        self.fail(exc)

    def fail(self, exc: BaseException) -> None:
        if not self.done:
            self.exc = exc
            self.done = True
            event = self.event
            if event is not None:
                event.set()

    def _event(self) -> threading.Event:
        """The event to block on, made on first need (``_EVENT_LOCK``: one per request even
        when two threads wait); set at once if the request completed meanwhile."""
        event = self.event
        if event is None:
            with _EVENT_LOCK:
                event = self.event
                if event is None:
                    event = self.event = threading.Event()
            if self.done:
                event.set()
        return event

    def wait(self, timeout: float | None = None, watch: Sequence[int] = (),
             withdraw: bool = True) -> Status:
        """Wait (see Engine.wait); ``watch``: ranks whose loss also dooms this operation;
        ``withdraw=False``: a timeout leaves it pending (the caller may wait again)."""
        if not self.done:
            self.engine.wait(self, timeout, watch, withdraw)
        if self.exc is not None:
            raise self.exc
        assert self.status is not None
        return self.status

    def test(self) -> bool:
        if not self.done:
            self.engine.progress()
            if not self.done:
                self.engine.let_land(self)
        if self.done and self.exc is not None:
            raise self.exc
        return self.done

    def describe(self) -> str:
        return describe(self.kind, len(self.buf), self.peer, self.tag)


def describe(kind: str, nbytes: int, peer: int, tag: int) -> str:
    """A send or receive in words, as errors name it."""
    who = "any rank" if peer == ANY_SOURCE else f"rank {peer}"
    return f"{kind} of {nbytes} bytes {'to' if kind == 'send' else 'from'} {who} (tag {tag:#x})"


class Incoming:
    """A message that arrived before its receive was posted (or is still arriving)."""

    __slots__ = ("source", "tag", "nbytes", "payload", "ready", "waiter", "sig")

    def __init__(self, source: int, tag: int, nbytes: int, payload: Payload | None,
                 sig: int = 0) -> None:
        self.source, self.tag, self.nbytes, self.payload = source, tag, nbytes, payload
        self.sig = sig
        self.ready = payload is not None
        self.waiter: Request | None = None


class _Bytes:
    """A payload held in private memory (self-sends, unexpected TCP bodies)."""

    __slots__ = ("data",)

    def __init__(self, data: bytearray | bytes) -> None:
        self.data = data

    def copy_into(self, dst: memoryview) -> None:
        dst[:] = self.data

    def detach(self) -> "_Bytes":
        return self

    def release(self) -> None:
        self.data = b""
