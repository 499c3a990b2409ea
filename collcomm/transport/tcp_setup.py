"""How the TCP connections of a job are made: the listener, connecting to a lower rank's
listener, and accepting the higher ranks' connections (``TcpSetup``, the setup half of
:class:`collcomm.transport.tcp.TcpHub`).

The higher rank of each pair connects to the lower one's listener during the rendezvous;
both prove they belong to the job (``auth.authenticate``) and the connector says which rank
it is (``HELLO``: rank, protocol version). The acceptor runs every handshake side by side on
one selector, each with its own deadline, so a client that connects and stays silent, or
stops halfway, delays nobody. Once every expected peer is connected, ``TcpHub.start`` hands
the sockets to the I/O thread (tcp.py).
"""
from __future__ import annotations

import collections
import errno
import os
import selectors
import socket
import struct
import time
from typing import TYPE_CHECKING

from ..errors import CollcommError, CommTimeoutError
from ..rendezvous.auth import authenticate
from ..rendezvous.handshake import Responder, accept_some
from ..rendezvous.netaddr import interface_address
from .tcp_channel import TcpChannel

if TYPE_CHECKING:
    from .engine import Engine

HELLO = struct.Struct("<II")      # rank, protocol version
PROTOCOL = 1
HANDSHAKE_TIMEOUT = 10.0          # an accepted connection must authenticate and say HELLO within this
MAX_PENDING = 256                 # handshakes in progress at once (the oldest goes for a new one)


def advertised_host(master_addr: str | None) -> str:
    """The address other hosts reach us at: COLLCOMM_HOST, else COLLCOMM_SOCKET_IFNAME's
    address, else the address of the interface that routes to the master (loopback when
    the master is this host's loopback)."""
    explicit = os.environ.get("COLLCOMM_HOST")
    if explicit:
        return explicit
    ifname = os.environ.get("COLLCOMM_SOCKET_IFNAME")
    if ifname:
        return interface_address(ifname)
    target = master_addr or "127.0.0.1"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((target, 9))
            return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"

class TcpSetup:
    """The connection setup of :class:`~collcomm.transport.tcp.TcpHub` (its base class;
    the channels it makes belong to that hub)."""

    engine: "Engine"
    token: bytes
    channels: dict[int, TcpChannel]
    listener: socket.socket | None

    def listen(self, host: str = "0.0.0.0") -> int:
        """Listen on ``host`` (the address we advertise; every interface when it is not one
        of this machine's, e.g. a NAT address in COLLCOMM_HOST)."""
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        port = int(os.environ.get("COLLCOMM_PORT", "0"))
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno != errno.EADDRNOTAVAIL:
                s.close()
                raise
            s.bind(("0.0.0.0", port))
        s.listen(4096)   # a flood of idle connections must not fill the queue before we accept
        self.listener = s
        return s.getsockname()[1]

    def _tune(self, sock: socket.socket) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connect(self, peer: int, host: str, port: int, deadline: float) -> None:
        """Connect to ``peer``'s listener (retrying until ``deadline``) and introduce ourselves."""
        last: Exception | None = None
        while time.monotonic() < deadline:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.settimeout(max(0.1, deadline - time.monotonic()))
                sock.connect((host, port))
                self._tune(sock)
                authenticate(sock, self.token, initiator=True, timeout=deadline - time.monotonic())
                sock.sendall(HELLO.pack(self.engine.rank, PROTOCOL))
                self.channels[peer] = TcpChannel(self, peer, sock)
                return
            except CollcommError:
                sock.close()
                raise
            except OSError as exc:
                sock.close()
                last = exc
                time.sleep(0.05)
        raise CommTimeoutError(f"rank {self.engine.rank} could not connect to rank {peer} at "
                               f"{host}:{port}: {last}", peer=peer) from last

    def accept(self, expected: set[int], deadline: float) -> None:
        """Accept connections until every rank in ``expected`` has connected.

        The handshakes (authentication, then HELLO) run side by side on one selector, each
        with its own deadline (``HANDSHAKE_TIMEOUT``), at most ``MAX_PENDING`` at a time:
        a client that connects and stays silent, or stops halfway, delays nobody."""
        assert self.listener is not None
        waiting = set(expected)
        if not waiting:
            return
        listener = self.listener
        listener.setblocking(False)
        pending: collections.OrderedDict[socket.socket, Responder] = collections.OrderedDict()
        sel = selectors.DefaultSelector()
        sel.register(listener, selectors.EVENT_READ, None)
        listening, resume_at, dropped = True, 0.0, 0

        def watch(sock: socket.socket, r: Responder | None) -> None:
            try:
                if r is None:
                    sel.unregister(sock)
                else:
                    sel.register(sock, selectors.EVENT_READ, r)
            except (KeyError, ValueError, OSError):
                pass

        def drop(sock: socket.socket) -> None:
            pending.pop(sock, None)
            watch(sock, None)
            sock.close()

        try:
            while waiting:
                now = time.monotonic()
                if now >= deadline:
                    raise CommTimeoutError(
                        f"rank {self.engine.rank}: ranks {sorted(waiting)} never connected to it"
                        + (f" ({dropped} other connection(s) failed to authenticate or say which "
                           "rank they are: not this job's)" if dropped else ""), peer=min(waiting))
                while pending and next(iter(pending.values())).deadline <= now:
                    drop(next(iter(pending)))
                    dropped += 1
                if not listening and now >= resume_at:
                    sel.register(listener, selectors.EVENT_READ, None)
                    listening = True
                wake = deadline
                if pending:
                    wake = min(wake, next(iter(pending.values())).deadline)
                if not listening:
                    wake = min(wake, resume_at)
                for key, _ in sel.select(max(0.0, min(wake - now, 1.0))):
                    r = key.data
                    if r is None:
                        if not accept_some(listener, pending, self.token, HANDSHAKE_TIMEOUT,
                                           MAX_PENDING, HELLO.size, watch):
                            sel.unregister(listener)
                            listening, resume_at = False, time.monotonic() + 0.1
                        continue
                    done = r.step()
                    if done is None:
                        sel.modify(r.sock, selectors.EVENT_READ
                                   | (selectors.EVENT_WRITE if r.wants_write() else 0), r)
                        continue
                    pending.pop(r.sock, None)
                    watch(r.sock, None)
                    rank, version = HELLO.unpack(r.payload) if done else (-1, -1)
                    if not done or rank not in waiting or version != PROTOCOL:
                        r.sock.close()   # not one of ours (or a duplicate): drop it, go on
                        dropped += 1
                        continue
                    waiting.discard(rank)
                    r.sock.setblocking(True)
                    self.channels[rank] = TcpChannel(self, rank, r.sock)
        finally:
            for sock in list(pending):
                sock.close()
            sel.close()
            try:
                listener.setblocking(True)
            except OSError:
                pass

