"""The TCP store server: one ``selectors`` thread, parked blocking requests, every client
authenticated (the responder's half of :func:`collcomm.rendezvous.auth.authenticate`)
before a byte is parsed.

Everything runs on that one thread, the handshakes too (:class:`~collcomm.rendezvous.handshake.Responder`, a non-blocking
state machine): a client that connects and says nothing, or stops halfway, holds one
socket until its handshake deadline (``auth_timeout``) and costs nobody else anything. At
most ``max_pending`` handshakes wait at a time (the oldest is dropped for a new one), and a
failure to accept (out of file descriptors) drops the oldest pending handshake and pauses
accepting for a moment instead of ending the server. No thread is started per connection.
"""
from __future__ import annotations

import collections
import selectors
import socket
import struct
import time
from collections.abc import Iterable

from . import auth
from ..errors import CollcommError
from .base import _INTERNAL
from .handshake import Responder, accept_some
from .protocol import _ADD, _CAS, _CHECK, _DELETE, _ERROR, _F64, _GET, _NUM_KEYS, _OK, _ProtocolError, _SET, _TIMEOUT, _WAIT, _encode, _try_decode
from ..helper_thread import HelperThread


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
                 *, auth_timeout: float = 10.0, max_pending: int = 1024) -> None:
        self._token = auth.job_token() if token is None else token
        self._auth_timeout = auth_timeout
        self._max_pending = max_pending
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
        self._pending: collections.OrderedDict[socket.socket, Responder] = collections.OrderedDict()
        self._listening = True
        self._resume_at = 0.0          # accepting paused (out of descriptors) until then
        self.accept_failures = 0       # times accepting ran out of resources (for tests)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._listener, selectors.EVENT_READ, "listen")
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._closing = False
        self._thread = HelperThread(self._serve, f"collcomm-store:{self.port}")
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
        self._thread.end(timeout=10)

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
                    try:
                        if key.data == "listen":
                            self._accept()
                        elif key.data == "wake":
                            self._drain_wake()
                        elif isinstance(key.data, Responder):
                            self._handshake(key.data)
                        else:
                            self._on_event(key.data, mask)
                    except Exception:  # noqa: BLE001 - one bad client never ends the server
                        self._forget(key.fileobj, key.data)
                self._expire_waiters()
                self._expire_handshakes()
        finally:
            self._shutdown()

    def _next_timeout(self) -> float:
        deadlines = [w.deadline for w in self._parked if w.deadline is not None]
        if self._pending:
            deadlines.append(next(iter(self._pending.values())).deadline)
        if not self._listening:
            deadlines.append(self._resume_at)
        if not deadlines:
            return 1.0
        return min(max(min(deadlines) - time.monotonic(), 0.0), 1.0)

    def _watch(self, sock: socket.socket, r: Responder | None) -> None:
        """(Un)register a pending handshake's socket with the selector."""
        try:
            if r is None:
                self._sel.unregister(sock)
            else:
                self._sel.register(sock, selectors.EVENT_READ, r)
        except (KeyError, ValueError, OSError):
            pass

    def _accept(self) -> None:
        if not accept_some(self._listener, self._pending, self._token, self._auth_timeout,
                           self._max_pending, register=self._watch):
            self.accept_failures += 1            # out of descriptors: pause accepting
            self._sel.unregister(self._listener)
            self._listening = False
            self._resume_at = time.monotonic() + 0.1

    def _handshake(self, r: Responder) -> None:
        done = r.step()
        if done is None:
            self._sel.modify(r.sock, selectors.EVENT_READ | (selectors.EVENT_WRITE if r.wants_write() else 0), r)
            return
        self._pending.pop(r.sock, None)
        self._sel.unregister(r.sock)
        if not done or self._closing:
            r.sock.close()
            return
        conn = _Conn(r.sock, r.peer)
        self._conns[r.sock] = conn
        self._sel.register(r.sock, selectors.EVENT_READ, conn)

    def _expire_handshakes(self) -> None:
        now = time.monotonic()
        while self._pending:
            sock, r = next(iter(self._pending.items()))
            if r.deadline > now:
                break
            self._pending.popitem(last=False)
            self._watch(sock, None)
            sock.close()
        if not self._listening and now >= self._resume_at and not self._closing:
            self._sel.register(self._listener, selectors.EVENT_READ, "listen")
            self._listening = True

    def _forget(self, sock: object, data: object) -> None:
        """Drop whatever a failing event belonged to (a client or a handshake)."""
        if isinstance(data, _Conn):
            self._drop(data)
        elif isinstance(data, Responder):
            self._pending.pop(data.sock, None)
            self._watch(data.sock, None)
            data.sock.close()

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass

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
            if timeout != timeout:
                raise _ProtocolError("NaN timeout")
            keys = f[:-1]
            deadline = None if timeout < 0 or timeout == float("inf") else time.monotonic() + timeout
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
        for sock in list(self._pending):
            sock.close()
        self._pending.clear()
        for s in (self._listener, self._wake_r, self._wake_w):
            s.close()
        self._sel.close()
