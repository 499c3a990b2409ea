"""The responder's half of the job's connection handshake, without blocking.

:class:`Responder` is a state machine for one accepted connection: it runs the
responder's side of :func:`collcomm.rendezvous.auth.authenticate` (and reads ``extra``
bytes after it, e.g. the TCP transport's HELLO) as data arrives, with its own deadline.
:func:`accept_some` accepts what a listener has waiting into a bounded table of such
handshakes (the oldest dropped beyond ``max_pending``; out of file descriptors, it drops
the oldest and asks the caller to pause accepting). Used by the store server and by the
TCP transport's hub, each on its own selector thread; no thread per connection.
"""
from __future__ import annotations

import collections
import errno
import hmac
import secrets
import socket
import time
from typing import Any, Callable

from . import auth

__all__ = ["Responder", "accept_some"]


class Responder:
    """The responder's half of :func:`~collcomm.rendezvous.auth.authenticate` on a
    non-blocking socket, driven by a selector: call :meth:`step` when the socket is
    readable or writable. It reads exactly what the protocol says (and then ``extra`` more
    bytes: what the initiator sends first after the handshake, e.g. the transport's HELLO),
    never more, so nothing the client sends later is consumed here."""

    __slots__ = ("sock", "peer", "token", "deadline", "extra", "state", "inbuf", "outbuf",
                 "nonce_i", "nonce_r", "payload")

    HELLO_BYTES = len(auth._MAGIC) + auth.NONCE_BYTES

    def __init__(self, sock: socket.socket, peer: str, token: bytes, deadline: float,
                 extra: int = 0) -> None:
        self.sock, self.peer, self.token, self.deadline, self.extra = sock, peer, token, deadline, extra
        self.state = 0                  # 0: their hello, 1: their proof, 2: extra bytes, 3: flushing
        self.inbuf = bytearray()
        self.outbuf = bytearray()
        self.nonce_i = b""
        self.nonce_r = secrets.token_bytes(auth.NONCE_BYTES)
        self.payload = b""              # the ``extra`` bytes, once read

    def _want(self) -> int:
        return (self.HELLO_BYTES, auth._MAC_BYTES, self.extra, 0)[self.state]

    def wants_write(self) -> bool:
        return bool(self.outbuf)

    def step(self) -> bool | None:
        """Advance: True when authenticated (and ``extra`` read, and everything we owe sent),
        False when the client failed (close it), None when it has to wait for the socket."""
        try:
            while True:
                if self.outbuf:
                    n = self.sock.send(self.outbuf)
                    del self.outbuf[:n]
                    if self.outbuf:
                        return None
                if self.state == 3:
                    return True
                want = self._want()
                if len(self.inbuf) < want:
                    chunk = self.sock.recv(want - len(self.inbuf))
                    if not chunk:
                        return False
                    self.inbuf += chunk
                    continue
                data, self.inbuf = bytes(self.inbuf), bytearray()
                if self.state == 0:
                    if not hmac.compare_digest(data[:len(auth._MAGIC)], auth._MAGIC):
                        return False
                    self.nonce_i = data[len(auth._MAGIC):]
                    self.outbuf += auth._MAGIC + self.nonce_r
                    self.state = 1
                elif self.state == 1:
                    expected = auth._mac(self.token, b"I", self.nonce_i, self.nonce_r)
                    if not hmac.compare_digest(data, expected):
                        return False
                    self.outbuf += auth._mac(self.token, b"R", self.nonce_i, self.nonce_r)
                    self.state = 2 if self.extra else 3
                else:
                    self.payload = data
                    self.state = 3
        except (BlockingIOError, InterruptedError):
            return None
        except OSError:
            return False


def accept_some(listener: socket.socket, pending: "collections.OrderedDict[socket.socket, Responder]",
                token: bytes, timeout: float, max_pending: int, extra: int = 0,
                register: "Callable[[socket.socket, Responder | None], Any] | None" = None) -> bool:
    """Accept what ``listener`` has waiting into ``pending`` handshakes (oldest dropped
    beyond ``max_pending``). Returns False when accepting failed for lack of resources (file
    descriptors, memory): the caller should stop watching the listener for a moment."""
    while True:
        try:
            sock, addr = listener.accept()
        except (BlockingIOError, InterruptedError):
            return True
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                if pending:                      # make room: the oldest handshake goes
                    old, _ = pending.popitem(last=False)
                    if register is not None:
                        register(old, None)
                    old.close()
                return False
            return True                          # ECONNABORTED & co: that client is gone
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            sock.close()
            continue
        while len(pending) >= max_pending:
            old, _ = pending.popitem(last=False)
            if register is not None:
                register(old, None)
            old.close()
        peer = f"{addr[0]}:{addr[1]}" if isinstance(addr, tuple) else str(addr)
        pending[sock] = Responder(sock, peer, token, time.monotonic() + timeout, extra)
        if register is not None:
            register(sock, pending[sock])
