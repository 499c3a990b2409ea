"""The TCP store server: one ``selectors`` thread, parked blocking requests, every client
authenticated (:func:`collcomm.rendezvous.auth.authenticate`) before a byte is parsed."""
from __future__ import annotations

import queue
import selectors
import socket
import struct
import threading
import time
from collections.abc import Iterable

from . import auth
from ..errors import AuthError, CollcommError
from .base import _INTERNAL
from .protocol import _ADD, _CAS, _CHECK, _DELETE, _ERROR, _F64, _GET, _NUM_KEYS, _OK, _ProtocolError, _SET, _TIMEOUT, _WAIT, _encode, _try_decode

# --------------------------------------------------------------------------- server

class _Conn:
    def __init__(self, sock: socket.socket, peer: str) -> None:
        self.sock = sock
        self.peer = peer
        self.inbuf = bytearray()
        self.outbuf = bytearray()
        self.parked: _Waiter | None = None


class _Waiter:
    def __init__(self, conn: _Conn, op: int, keys: list[bytes], deadline: float | None) -> None:
        self.conn = conn
        self.op = op
        self.keys = keys
        self.deadline = deadline


class TCPStoreServer:
    """A TCP key-value store server running in a daemon thread.

    The socket is bound in the constructor, so ``port=0`` picks a free port without a race;
    read it back from :attr:`port`. Clients must know ``token``
    (:func:`collcomm.rendezvous.auth.authenticate`); a client that fails is dropped, the server goes on.
    """

    def __init__(self, host: str = "0.0.0.0", port: int = 0, token: bytes | None = None,
                 *, auth_timeout: float = 10.0) -> None:
        self._token = auth.job_token() if token is None else token
        self._auth_timeout = auth_timeout
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._listener.bind((host, port))
            self._listener.listen(512)
        except OSError as exc:
            self._listener.close()
            raise CollcommError(f"store server cannot listen on {host}:{port}: {exc}") from exc
        self._listener.setblocking(False)
        self.host = host
        self.port: int = self._listener.getsockname()[1]
        self._data: dict[bytes, bytes] = {}
        self._waiters_by_key: dict[bytes, list[_Waiter]] = {}
        self._parked: set[_Waiter] = set()
        self._conns: dict[socket.socket, _Conn] = {}
        self._authed: queue.SimpleQueue[tuple[socket.socket, str]] = queue.SimpleQueue()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._listener, selectors.EVENT_READ, "listen")
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._closing = False
        self._thread = threading.Thread(target=self._serve, name=f"collcomm-store:{self.port}",
                                        daemon=True)
        self._thread.start()

    @property
    def address(self) -> tuple[str, int]:
        """(host, port) the server is bound to."""
        return (self.host, self.port)

    def close(self) -> None:
        """Stop serving and close every connection (clients then get ClosedError). Idempotent."""
        if self._closing:
            return
        self._closing = True
        self._wake()
        self._thread.join(timeout=10)

    def __enter__(self) -> TCPStoreServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- event loop

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass

    def _serve(self) -> None:
        try:
            while not self._closing:
                for key, mask in self._sel.select(self._next_timeout()):
                    if key.data == "listen":
                        self._accept()
                    elif key.data == "wake":
                        self._drain_wake()
                    else:
                        self._on_event(key.data, mask)
                self._expire_waiters()
        finally:
            self._shutdown()

    def _next_timeout(self) -> float:
        deadlines = [w.deadline for w in self._parked if w.deadline is not None]
        if not deadlines:
            return 1.0
        return min(max(min(deadlines) - time.monotonic(), 0.0), 1.0)

    def _accept(self) -> None:
        while True:
            try:
                sock, addr = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            peer = f"{addr[0]}:{addr[1]}"
            threading.Thread(target=self._authenticate, args=(sock, peer), daemon=True,
                             name=f"collcomm-store-auth:{peer}").start()

    def _authenticate(self, sock: socket.socket, peer: str) -> None:
        try:
            sock.settimeout(None)
            auth.authenticate(sock, self._token, initiator=False, timeout=self._auth_timeout)
        except AuthError:
            sock.close()
            return
        if self._closing:
            sock.close()
            return
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._authed.put((sock, peer))
        self._wake()

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass
        while True:
            try:
                sock, peer = self._authed.get_nowait()
            except queue.Empty:
                return
            sock.setblocking(False)
            conn = _Conn(sock, peer)
            self._conns[sock] = conn
            self._sel.register(sock, selectors.EVENT_READ, conn)

    def _on_event(self, conn: _Conn, mask: int) -> None:
        if mask & selectors.EVENT_WRITE and not self._flush(conn):
            return
        if mask & selectors.EVENT_READ:
            try:
                data = conn.sock.recv(1 << 16)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self._drop(conn)
                return
            if not data:
                self._drop(conn)
                return
            conn.inbuf += data
            self._process(conn)

    def _process(self, conn: _Conn) -> None:
        while conn.parked is None and conn.sock in self._conns:
            try:
                frame = _try_decode(conn.inbuf)
            except _ProtocolError:
                self._drop(conn)
                return
            if frame is None:
                return
            op, fields, used = frame
            del conn.inbuf[:used]
            try:
                self._handle(conn, op, fields)
            except (_ProtocolError, struct.error, IndexError, ValueError):
                self._drop(conn)
                return

    def _reply(self, conn: _Conn, status: int, fields: Iterable[bytes] = ()) -> None:
        conn.outbuf += _encode(status, fields)
        self._flush(conn)

    def _flush(self, conn: _Conn) -> bool:
        """Send what we can; watch for writability if bytes remain. False if dropped."""
        if conn.sock not in self._conns:
            return False
        try:
            while conn.outbuf:
                n = conn.sock.send(conn.outbuf)
                del conn.outbuf[:n]
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            self._drop(conn)
            return False
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.outbuf else 0)
        self._sel.modify(conn.sock, events, conn)
        return True

    def _drop(self, conn: _Conn) -> None:
        if self._conns.pop(conn.sock, None) is None:
            return
        if conn.parked is not None:
            self._unpark(conn.parked)
        try:
            self._sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()

    # -- requests

    def _handle(self, conn: _Conn, op: int, f: list[bytes]) -> None:
        data = self._data
        if op == _SET:
            data[f[0]] = f[1]
            self._reply(conn, _OK)
            self._notify(f[0])
        elif op in (_GET, _WAIT):
            (timeout,) = _F64.unpack(f[-1])
            keys = f[:-1]
            deadline = None if timeout < 0 else time.monotonic() + timeout
            waiter = _Waiter(conn, op, keys, deadline)
            if not self._try_complete(waiter):
                conn.parked = waiter
                self._parked.add(waiter)
                self._register(waiter)
        elif op == _ADD:
            try:
                value = int(data.get(f[0], b"0")) + int(f[1])
            except ValueError:
                self._reply(conn, _ERROR, [b"add: value of key %r is not an integer" % f[0]])
                return
            data[f[0]] = str(value).encode()
            self._reply(conn, _OK, [data[f[0]]])
            self._notify(f[0])
        elif op == _CAS:
            key, expected, desired = f[0], f[1], f[2]
            if key not in data:
                if expected == b"":
                    data[key] = desired
                    self._reply(conn, _OK, [desired])
                    self._notify(key)
                else:
                    self._reply(conn, _OK, [expected])
            else:
                if data[key] == expected:
                    data[key] = desired
                    self._notify(key)
                self._reply(conn, _OK, [data[key]])
        elif op == _DELETE:
            self._reply(conn, _OK, [b"1" if data.pop(f[0], None) is not None else b"0"])
        elif op == _CHECK:
            self._reply(conn, _OK, [b"1" if all(k in data for k in f) else b"0"])
        elif op == _NUM_KEYS:
            internal = _INTERNAL.encode()
            n = sum(1 for k in data if not k.startswith(internal))
            self._reply(conn, _OK, [str(n).encode()])
        else:
            raise _ProtocolError(f"unknown op {op}")

    def _try_complete(self, w: _Waiter) -> bool:
        if any(k not in self._data for k in w.keys):
            return False
        fields = [self._data[w.keys[0]]] if w.op == _GET else []
        self._reply(w.conn, _OK, fields)
        return True

    def _register(self, w: _Waiter) -> None:
        missing = next(k for k in w.keys if k not in self._data)
        self._waiters_by_key.setdefault(missing, []).append(w)

    def _unpark(self, w: _Waiter) -> None:
        self._parked.discard(w)
        w.conn.parked = None
        for lst in self._waiters_by_key.values():
            if w in lst:
                lst.remove(w)

    def _notify(self, key: bytes) -> None:
        for w in self._waiters_by_key.pop(key, []):
            if w not in self._parked:
                continue
            if self._try_complete(w):
                self._parked.discard(w)
                w.conn.parked = None
                self._process(w.conn)
            else:
                self._register(w)

    def _expire_waiters(self) -> None:
        now = time.monotonic()
        for w in [w for w in self._parked if w.deadline is not None and w.deadline <= now]:
            self._unpark(w)
            self._reply(w.conn, _TIMEOUT, [k for k in w.keys if k not in self._data])
            self._process(w.conn)

    def _shutdown(self) -> None:
        for conn in list(self._conns.values()):
            self._drop(conn)
        for s in (self._listener, self._wake_r, self._wake_w):
            s.close()
        self._sel.close()
        while True:
            try:
                self._authed.get_nowait()[0].close()
            except queue.Empty:
                break
