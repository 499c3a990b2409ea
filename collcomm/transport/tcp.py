"""TCP channels between ranks on different hosts (or everywhere, with COLLCOMM_TRANSPORT=tcp).

Each pair of ranks shares one connection, made during the rendezvous (tcp_setup.py:
the higher rank connects to the lower one's listener, both authenticate, the connector
says which rank it is). After that every socket is non-blocking and one
I/O thread per process (the *hub*) drives them all with a selector, except while a caller
waits for a receive (:meth:`TcpHub.drive`): then the waiting thread runs the same selector
steps itself and lands the messages on its own thread, and the I/O thread stands aside
until no caller has driven for ``ASIDE`` seconds. A thread blocked in ``Event.wait`` for
the I/O thread to land a message, and the GIL passed back and forth between them, cost
several thread wake-ups per message (docs/tcp-small-messages.md):

* a frame is a 24-byte header (tag, nbytes, kind) and a body; DATA bodies are read
  straight into the posted receive buffer when one is waiting (else aside, until posted);
* sends are queued per channel; the caller writes what the socket takes at once and the
  hub writes the rest when the socket is writable, so a send completes without any help
  from the receiver's program and two ranks sending large messages to each other at once
  never deadlock (each side's hub keeps reading);
* every second of silence the hub sends a HEARTBEAT; a peer silent for
  ``COLLCOMM_HEARTBEAT_TIMEOUT`` seconds (default 15) or whose connection ends (EOF, reset)
  is lost: the engine fails everything pending with it. A peer that leaves cleanly sends
  BYE first, so the message says it left rather than crashed.

Locks, and the rule for failures (a socket error can strike on any thread that writes):

* ``TcpChannel.lock`` guards the channel's send queue, its ``closed`` flag and the writes
  to its socket. It is a leaf: a thread holding it takes no other lock and calls nothing
  outside the channel (no request, no hub, no engine).
* ``TcpHub.wlock`` guards the hub's hand-over lists (channels to flush, sockets to
  retire) and the count of driving callers. A leaf too, never held together with a
  channel's lock.
* ``TcpHub.io`` is held by whichever thread runs the selector: the I/O thread, or a caller
  in :meth:`TcpHub.drive`. It is the outermost lock: taken only by a thread that holds no
  other lock, and its holder takes the others (a channel's lock, ``wlock``, the engine's)
  one at a time, as the I/O thread always did. The selector, the reading state of every
  channel and the sockets' closing belong to its holder (inline only while the I/O thread
  does not run).

A failure is *recorded* under the channel's lock (``closed`` set, the error kept, the
queued sends taken out) by whichever thread notices it first, and *acted on* by that
thread after releasing the lock: the queued sends fail, the engine hears ``peer_lost``
and the socket goes to the I/O thread to be closed. Any later notice finds ``closed`` set
and does nothing. Completed sends are likewise completed after the lock is released.
"""
from __future__ import annotations

import selectors
import socket
import threading
import time
from typing import TYPE_CHECKING, Callable

from ..errors import ClosedError
from .tcp_channel import BYE, FRAME, ChannelFailure, TcpChannel
from .tcp_setup import TcpSetup, advertised_host
from ..helper_thread import HelperThread

__all__ = ["ASIDE", "TcpHub", "advertised_host"]

if TYPE_CHECKING:
    from .engine import Engine, Request

ASIDE = 1e-3                      # the I/O thread stays aside this long after a caller drove


class TcpHub(TcpSetup):
    """The listener, the connections and the one I/O thread of this process (the setup
    half, listen / connect / accept, is :class:`~collcomm.transport.tcp_setup.TcpSetup`)."""

    def __init__(self, engine: "Engine", token: bytes) -> None:
        self.engine, self.token = engine, token
        self.channels: dict[int, TcpChannel] = {}
        self.listener: socket.socket | None = None
        self.sel = selectors.DefaultSelector()
        self.wake_r, self.wake_w = socket.socketpair()
        self.wake_r.setblocking(False)
        self.wake_w.setblocking(False)
        # guarded by ``wlock`` (a leaf): channels for the I/O thread to flush, and failed
        # channels whose sockets it is to unregister and close
        self.writers: set[TcpChannel] = set()
        self.retiring: list[TcpChannel] = []
        self.wlock = threading.Lock()
        self.thread: threading.Thread | None = None
        self.running = False
        self.closed = False
        # the selector's holder (see the module docstring); ``driver``: the caller thread
        # that holds it, if one does; ``callers`` (under ``wlock``): callers driving or about to
        self.io = threading.Lock()
        self.owner: int | None = None
        self.driver: int | None = None
        self.callers = 0
        self.last_drive = 0.0
        self.next_tick = 0.0
        self.aside = False               # the I/O thread waits on ``resumed`` (diagnostics)
        self.resumed = threading.Event()

    def start(self) -> None:
        """Hand every connection to the I/O thread."""
        if self.listener is not None:
            self.listener.close()
            self.listener = None
        for ch in self.channels.values():
            ch.sock.setblocking(False)
            ch.last_send = ch.last_recv = time.monotonic()
            self.sel.register(ch.sock, selectors.EVENT_READ, ch)
        self.sel.register(self.wake_r, selectors.EVENT_READ, None)
        self.running = True
        self.thread = HelperThread(self._loop, "collcomm-tcp")
        self.thread.start()

    # -- the I/O thread --------------------------------------------------------------------
    def want_write(self, ch: TcpChannel) -> None:
        with self.wlock:
            self.writers.add(ch)
        self._wake()
        self.resume()

    def resume(self) -> None:
        """End the I/O thread's time aside now (a send waits for the socket, or a caller
        waits without driving): unless a caller drives, the I/O thread takes over at once."""
        if self.driver is None:
            self.resumed.set()

    def _wake(self) -> None:
        try:
            self.wake_w.send(b"\0")
        except (BlockingIOError, OSError):
            pass

    def _loop(self) -> None:
        self.next_tick = time.monotonic() + 0.25
        while self.running:
            # a caller drives the selector, or did a moment ago and likely soon will again:
            # stay aside (``resume`` ends it early when the hub is needed meanwhile)
            if self.callers or (time.monotonic() - self.last_drive < ASIDE
                                and not self.resumed.is_set()):
                self.aside = True
                self.resumed.wait(ASIDE)
                self.aside = False
                if self.callers:
                    self.resumed.clear()
                continue
            if not self.io.acquire(blocking=False):
                time.sleep(ASIDE)
                continue
            self.resumed.clear()
            try:
                if self.callers:
                    continue
                self.owner = threading.get_ident()
                if not self._step(0.25):
                    break
            finally:
                self.owner = None
                self.io.release()

    def drive(self, until: float, ready: Callable[[], bool]) -> bool:
        """Run the selector steps on the calling thread (a caller waiting for a message)
        until ``ready()`` or the monotonic time ``until``: the messages land on this
        thread, with no hand-off from the I/O thread (which stands aside meanwhile).

        False, having waited for nothing, when it cannot: the hub does not run, this
        thread already holds the selector, or another caller drives it (its steps land
        this caller's messages too; wait on the request's event instead).
        """
        me = threading.get_ident()
        if not self.running or self.thread is None or self.owner == me or self.driver is not None:
            return False
        with self.wlock:
            self.callers += 1
        try:
            if not self.io.acquire(blocking=False):
                self._wake()       # the I/O thread is in select: it lets go after this step
                if not self.io.acquire(timeout=max(0.0, until - time.monotonic())):
                    return True
            try:
                self.owner = self.driver = me
                while self.running and not ready():
                    left = until - time.monotonic()
                    if left <= 0 or not self._step(left):
                        break
            finally:
                self.owner = self.driver = None
                self.last_drive = time.monotonic()
                self.io.release()
        finally:
            with self.wlock:
                self.callers -= 1
        return True

    def _step(self, timeout: float) -> bool:
        """One round of the selector (``io`` held): read and write what is ready, act on
        the hand-over lists, send heartbeats and notice silent peers. False once the
        selector is closed."""
        try:
            events = self.sel.select(timeout=timeout)
        except (OSError, ValueError):
            return False
        for key, mask in events:
            ch = key.data
            if ch is None:
                try:
                    while self.wake_r.recv(4096):
                        pass
                except (BlockingIOError, OSError):
                    pass
                continue
            try:
                if mask & selectors.EVENT_READ and not ch.closed:
                    ch.on_readable()
                if mask & selectors.EVENT_WRITE and not ch.closed:
                    ch.flush()
                    self._interest(ch)
            except Exception as exc:  # noqa: BLE001 - one broken peer never stops the hub
                self.fail(ch, f"rank {ch.peer} sent what rank {self.engine.rank} cannot take "
                              f"({type(exc).__name__}: {exc}); connection closed", exc)
        with self.wlock:
            writers, self.writers = self.writers, set()
            retiring, self.retiring = self.retiring, []
        for ch in retiring:
            self._drop(ch)
        for ch in writers:
            if not ch.closed:
                ch.flush()
                self._interest(ch)
        now = time.monotonic()
        if now >= self.next_tick:
            self.next_tick = now + 0.25
            for ch in list(self.channels.values()):
                if not ch.closed:
                    ch.tick(now)
        return True

    def _interest(self, ch: TcpChannel) -> None:
        mask = selectors.EVENT_READ | (selectors.EVENT_WRITE if ch.queue else 0)
        try:
            self.sel.modify(ch.sock, mask, ch)
        except (KeyError, ValueError, OSError):
            pass

    def fail(self, ch: TcpChannel, why: str, exc: BaseException | None) -> None:
        """``ch``'s connection failed (called with no lock held): record it, then act."""
        with ch.lock:
            failure = ch._claim_locked(why, exc)
        if failure is not None:
            self.lost(ch, failure)

    def lost(self, ch: TcpChannel, failure: ChannelFailure) -> None:
        """Act on a recorded failure (no lock held): retire the socket, fail the sends that
        were queued, tell the engine (which fails the receives)."""
        self._retire(ch)
        for req in failure.doomed:
            req.fail(failure.error)
        self.engine.peer_lost(ch.peer, failure.error, crashed=failure.crashed)

    def _retire(self, ch: TcpChannel) -> None:
        """Have ``ch``'s socket unregistered and closed by the selector's holder (the I/O
        thread, or a driving caller), or here when the I/O thread is not running or this
        thread holds the selector."""
        thread = self.thread
        if thread is None or self.owner == threading.get_ident() or not self.running:
            self._drop(ch)
            return
        with self.wlock:
            self.retiring.append(ch)
        self._wake()

    def _drop(self, ch: TcpChannel) -> None:
        try:
            self.sel.unregister(ch.sock)
        except (KeyError, ValueError, OSError, RuntimeError):
            pass
        ch.sock.close()

    # -- closing ---------------------------------------------------------------------------
    def close(self, linger: float = 10.0) -> None:
        """Flush what is queued (up to ``linger`` s), say BYE, stop the thread, close sockets."""
        if self.closed:
            return
        self.closed = True
        open_channels = [ch for ch in self.channels.values() if not ch.closed]
        for ch in open_channels:
            ch._enqueue(FRAME.pack(0, 0, 0, BYE), b"", None)
        deadline = time.monotonic() + linger
        while any(ch.queue and not ch.closed for ch in open_channels) and time.monotonic() < deadline:
            time.sleep(0.001)
        for ch in open_channels:
            try:
                ch.sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
        self.running = False
        self._wake()
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.end(timeout=2)
        self.thread = None
        # a caller driving the selector lets go after its step (the wake above ends it)
        held = self.owner != threading.get_ident() and self.io.acquire(timeout=2)
        try:
            leftover = self._close_all()
        finally:
            if held:
                self.io.release()
        for req in leftover:   # sends whose bytes never left (linger ran out)
            req.fail(ClosedError(f"rank {self.engine.rank}: transport closed before the "
                                 f"{req.describe()} went out"))

    def _close_all(self) -> list["Request"]:
        """Close every socket and the selector; return the sends still queued."""
        leftover: list["Request"] = []
        for ch in list(self.channels.values()):
            with ch.lock:
                ch.closed = True
                leftover += [req for _, _, req in ch.queue if req is not None]
                ch.queue.clear()
            self._drop(ch)
        self.channels.clear()
        self.sel.close()
        self.wake_r.close()
        self.wake_w.close()
        if self.listener is not None:
            self.listener.close()
            self.listener = None
        return leftover
