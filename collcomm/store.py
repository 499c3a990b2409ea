"""The rendezvous key-value store: how the ranks of a job find each other.

The API follows ``torch.distributed``'s stores. Keys are ``str``; values are ``bytes``
(``str`` values are encoded as UTF-8). ``get`` and ``wait`` block until the keys exist or
the timeout passes (:class:`~collcomm.errors.CommTimeoutError` naming the missing keys).
``add`` keeps an atomic counter stored as decimal bytes; ``compare_set`` has torch's
semantics (a missing key is set only when ``expected == b""``; the current value is
returned).

Implementations:

* :class:`TCPStore` talks to a :class:`TCPStoreServer` (hosted by rank 0 or by the
  launcher). The server is one thread around ``selectors``: non-blocking sockets, many
  clients, blocking ``get``/``wait`` requests are parked server-side and answered when
  their keys appear or their deadline passes, so a connection never gets out of step.
  Every accepted connection must pass :func:`collcomm.auth.authenticate` (in a short-lived
  helper thread) before a single request byte is parsed.
* :class:`FileStore`: an append-only record log guarded by ``fcntl.flock``, for processes
  on one host or a shared file system.
* :class:`PrefixStore`: a namespace inside another store.

Wire protocol (no pickle), both directions: ``!BI`` (op or status, field count), then per
field ``!I`` length + bytes. Timeouts travel as an 8-byte ``!d`` field.
"""
from __future__ import annotations

import errno
import fcntl
import os
import queue
import selectors
import socket
import struct
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable
from urllib.parse import urlparse

from . import auth
from .errors import (AuthError, ClosedError, CollcommError, CommTimeoutError,
                     InvalidArgumentError)

__all__ = ["Store", "TCPStore", "TCPStoreServer", "FileStore", "PrefixStore",
           "store_from_url", "DEFAULT_TIMEOUT"]

DEFAULT_TIMEOUT = 300.0
#: Keys the stores use for their own bookkeeping; not counted by ``num_keys``.
_INTERNAL = "__collcomm__/"
_WORKERS_KEY = _INTERNAL + "workers"
_WORKERS_READY_KEY = _INTERNAL + "workers_ready"
_FILE_CLOSED_KEY = _INTERNAL + "closed"

Value = bytes | bytearray | memoryview | str


def _key_bytes(key: str) -> bytes:
    if not isinstance(key, str):
        raise InvalidArgumentError(f"store keys must be str, got {type(key).__name__}")
    return key.encode("utf-8")


def _value_bytes(value: Value) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise InvalidArgumentError(f"store values must be bytes or str, got {type(value).__name__}")


class Store(ABC):
    """A key-value store shared by the ranks of one job."""

    def __init__(self, timeout: float = DEFAULT_TIMEOUT) -> None:
        self._timeout = float(timeout)

    @property
    def timeout(self) -> float:
        """Default timeout (seconds) of blocking calls."""
        return self._timeout

    def set_timeout(self, seconds: float) -> None:
        """Change the default timeout of blocking calls."""
        self._timeout = float(seconds)

    def _resolve(self, timeout: float | None) -> float:
        return self._timeout if timeout is None else float(timeout)

    @abstractmethod
    def set(self, key: str, value: Value) -> None:
        """Store ``value`` under ``key`` (overwrites) and wake everyone waiting for it."""

    @abstractmethod
    def get(self, key: str, timeout: float | None = None) -> bytes:
        """The value of ``key``, blocking until it exists. Raises CommTimeoutError."""

    @abstractmethod
    def wait(self, keys: list[str], timeout: float | None = None) -> None:
        """Block until every key in ``keys`` exists. Raises CommTimeoutError naming the missing."""

    @abstractmethod
    def add(self, key: str, amount: int) -> int:
        """Atomically add ``amount`` to the counter ``key`` (missing = 0); return the new value."""

    @abstractmethod
    def compare_set(self, key: str, expected: Value, desired: Value) -> bytes:
        """Set ``key`` to ``desired`` if it equals ``expected`` (or is missing and
        ``expected == b""``); return the value now current (torch semantics)."""

    @abstractmethod
    def delete_key(self, key: str) -> bool:
        """Remove ``key``; True if it existed."""

    @abstractmethod
    def check(self, keys: list[str]) -> bool:
        """True if every key exists (never blocks)."""

    @abstractmethod
    def num_keys(self) -> int:
        """How many keys the store holds (the store's own bookkeeping keys excluded)."""

    @abstractmethod
    def close(self) -> None:
        """Release the store's resources. Idempotent; later calls raise ClosedError."""

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------- wire format

_HEADER = struct.Struct("!BI")
_LEN = struct.Struct("!I")
_F64 = struct.Struct("!d")
_MAX_FIELDS = 1 << 16
_MAX_FIELD_BYTES = 1 << 30

_SET, _GET, _WAIT, _ADD, _CAS, _DELETE, _CHECK, _NUM_KEYS = range(1, 9)
_OP_NAMES = {_SET: "set", _GET: "get", _WAIT: "wait", _ADD: "add", _CAS: "compare_set",
             _DELETE: "delete_key", _CHECK: "check", _NUM_KEYS: "num_keys"}
_OK, _TIMEOUT, _ERROR = 0, 1, 2


class _ProtocolError(Exception):
    pass


def _encode(code: int, fields: Iterable[bytes]) -> bytes:
    fields = list(fields)
    parts = [_HEADER.pack(code, len(fields))]
    for f in fields:
        parts.append(_LEN.pack(len(f)))
        parts.append(f)
    return b"".join(parts)


def _try_decode(buf: bytearray) -> tuple[int, list[bytes], int] | None:
    """Parse one frame from the front of ``buf``: (code, fields, bytes used), or None."""
    if len(buf) < _HEADER.size:
        return None
    code, nfields = _HEADER.unpack_from(buf, 0)
    if nfields > _MAX_FIELDS:
        raise _ProtocolError(f"frame declares {nfields} fields")
    pos = _HEADER.size
    fields = []
    for _ in range(nfields):
        if len(buf) < pos + _LEN.size:
            return None
        (n,) = _LEN.unpack_from(buf, pos)
        if n > _MAX_FIELD_BYTES:
            raise _ProtocolError(f"frame declares a {n}-byte field")
        pos += _LEN.size
        if len(buf) < pos + n:
            return None
        fields.append(bytes(buf[pos:pos + n]))
        pos += n
    return code, fields, pos


def _read_frame(sock: socket.socket) -> tuple[int, list[bytes]]:
    code, nfields = _HEADER.unpack(auth.recv_exact(sock, _HEADER.size))
    fields = []
    for _ in range(nfields):
        (n,) = _LEN.unpack(auth.recv_exact(sock, _LEN.size))
        fields.append(auth.recv_exact(sock, n))
    return code, fields


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
    (:func:`collcomm.auth.authenticate`); a client that fails is dropped, the server goes on.
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


# --------------------------------------------------------------------------- TCP client

class TCPStore(Store):
    """Client of a :class:`TCPStoreServer`; with ``is_master=True`` it also hosts one.

    The client retries connecting until ``timeout`` (the master may start later), then
    authenticates with ``token`` (default :func:`collcomm.auth.job_token`). With
    ``world_size`` every instance registers itself; the master with
    ``wait_for_workers=True`` then blocks until ``world_size`` instances have joined.
    Thread-safe. A dead or closed server gives :class:`~collcomm.errors.ClosedError` naming
    its address, never a hang.
    """

    #: Extra seconds the client allows the server beyond an operation's own timeout.
    _SLACK = 10.0

    def __init__(self, host: str, port: int, world_size: int | None = None,
                 is_master: bool = False, timeout: float = DEFAULT_TIMEOUT,
                 token: bytes | None = None, wait_for_workers: bool = False) -> None:
        super().__init__(timeout)
        self.host = host
        self._token = auth.job_token() if token is None else token
        self._server: TCPStoreServer | None = None
        if is_master:
            bind = "::" if ":" in host else "0.0.0.0"
            self._server = TCPStoreServer(bind, port, self._token)
            port = self._server.port
        self.port = port
        self._lock = threading.Lock()
        self._closed = False
        self._broken: str | None = None
        try:
            self._sock = self._connect(time.monotonic() + self._timeout)
            if world_size is not None:
                if self.add(_WORKERS_KEY, 1) >= world_size:
                    self.set(_WORKERS_READY_KEY, b"1")
                if is_master and wait_for_workers:
                    self.wait([_WORKERS_READY_KEY])
        except BaseException:
            self.close()
            raise

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def _connect(self, deadline: float) -> socket.socket:
        delay = 0.01
        last: OSError | None = None
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise CommTimeoutError(f"could not connect to the store at {self.address} "
                                       f"within {self._timeout:g}s: {last}") from last
            try:
                sock = socket.create_connection((self.host, self.port),
                                                timeout=min(remaining, 5.0))
                break
            except OSError as exc:
                last = exc
                time.sleep(min(delay, max(deadline - time.monotonic(), 0)))
                delay = min(delay * 2, 0.5)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            auth.authenticate(sock, self._token, initiator=True,
                              timeout=max(deadline - time.monotonic(), 5.0))
        except AuthError as exc:
            sock.close()
            raise AuthError(f"store at {self.address}: {exc}") from exc
        except BaseException:
            sock.close()
            raise
        return sock

    def _request(self, op: int, fields: list[bytes], wait_s: float = 0.0) -> list[bytes]:
        name = _OP_NAMES[op]
        with self._lock:
            if self._closed:
                raise ClosedError(f"store client for {self.address} is closed ({name})")
            if self._broken is not None:
                raise ClosedError(f"store connection to {self.address} is broken "
                                  f"({self._broken}); cannot {name}")
            sock = self._sock
            try:
                sock.settimeout(max(wait_s, 0.0) + self._SLACK + min(self._timeout, 60.0))
                auth.send_all(sock, _encode(op, fields))
                status, out = _read_frame(sock)
            except socket.timeout as exc:
                self._break(f"no answer to {name}")
                raise CommTimeoutError(f"store at {self.address} did not answer {name} "
                                       f"in time") from exc
            except (OSError, struct.error) as exc:
                self._break(f"{type(exc).__name__}: {exc}")
                raise ClosedError(f"store server at {self.address} closed the connection "
                                  f"during {name}: {exc}") from exc
        if status == _TIMEOUT:
            missing = [k.decode("utf-8", "replace") for k in out]
            raise CommTimeoutError(f"store at {self.address}: {name} timed out after "
                                   f"{wait_s:g}s waiting for key(s) {missing}")
        if status == _ERROR:
            raise InvalidArgumentError(f"store at {self.address}: "
                                       f"{out[0].decode('utf-8', 'replace') if out else name}")
        return out

    def _break(self, reason: str) -> None:
        self._broken = reason
        try:
            self._sock.close()
        except OSError:
            pass

    def set(self, key: str, value: Value) -> None:
        self._request(_SET, [_key_bytes(key), _value_bytes(value)])

    def get(self, key: str, timeout: float | None = None) -> bytes:
        t = self._resolve(timeout)
        return self._request(_GET, [_key_bytes(key), _F64.pack(t)], wait_s=t)[0]

    def wait(self, keys: list[str], timeout: float | None = None) -> None:
        t = self._resolve(timeout)
        self._request(_WAIT, [_key_bytes(k) for k in keys] + [_F64.pack(t)], wait_s=t)

    def add(self, key: str, amount: int) -> int:
        return int(self._request(_ADD, [_key_bytes(key), str(int(amount)).encode()])[0])

    def compare_set(self, key: str, expected: Value, desired: Value) -> bytes:
        return self._request(_CAS, [_key_bytes(key), _value_bytes(expected),
                                    _value_bytes(desired)])[0]

    def delete_key(self, key: str) -> bool:
        return self._request(_DELETE, [_key_bytes(key)])[0] == b"1"

    def check(self, keys: list[str]) -> bool:
        return self._request(_CHECK, [_key_bytes(k) for k in keys])[0] == b"1"

    def num_keys(self) -> int:
        return int(self._request(_NUM_KEYS, [])[0])

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            sock = getattr(self, "_sock", None)
            if sock is not None:
                sock.close()
        if self._server is not None:
            self._server.close()


# --------------------------------------------------------------------------- file store

_REC = struct.Struct("!BII")
_REC_SET, _REC_DEL = 1, 2


class FileStore(Store):
    """A store in one file, shared by processes on one host (or a shared file system).

    The file is an append-only log of ``set``/``delete`` records; every operation takes
    ``fcntl.flock`` (shared to read, exclusive to write) and replays the records it has not
    seen. ``get``/``wait`` poll with backoff. With ``world_size``, the last of that many
    instances to :meth:`close` removes the file (like torch); :meth:`cleanup` removes it
    at any time.
    """

    def __init__(self, path: str, world_size: int | None = None,
                 timeout: float = DEFAULT_TIMEOUT) -> None:
        super().__init__(timeout)
        self.path = os.fspath(path)
        self.world_size = world_size
        self._lock = threading.Lock()
        self._closed = False
        self._data: dict[bytes, bytes] = {}
        self._offset = 0
        self._inode: tuple[int, int] | None = None
        self._locked(fcntl.LOCK_SH, lambda fd: None)  # create the file, fail early

    # -- log access

    def _locked(self, mode: int, body):  # type: ignore[no-untyped-def]
        with self._lock:
            if self._closed:
                raise ClosedError(f"FileStore {self.path} is closed")
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
            except OSError as exc:
                raise CollcommError(f"cannot open FileStore {self.path}: {exc}") from exc
            try:
                fcntl.flock(fd, mode)
                self._replay(fd)
                return body(fd)
            finally:
                os.close(fd)  # releases the lock

    def _replay(self, fd: int) -> None:
        st = os.fstat(fd)
        inode = (st.st_dev, st.st_ino)
        if inode != self._inode or st.st_size < self._offset:
            self._inode, self._data, self._offset = inode, {}, 0
        if st.st_size == self._offset:
            return
        chunk = os.pread(fd, st.st_size - self._offset, self._offset)
        pos = 0
        while pos + _REC.size <= len(chunk):
            kind, klen, vlen = _REC.unpack_from(chunk, pos)
            end = pos + _REC.size + klen + vlen
            if end > len(chunk):
                break
            key = chunk[pos + _REC.size:pos + _REC.size + klen]
            if kind == _REC_SET:
                self._data[key] = chunk[pos + _REC.size + klen:end]
            else:
                self._data.pop(key, None)
            pos = end
        self._offset += pos

    def _append(self, fd: int, kind: int, key: bytes, value: bytes = b"") -> None:
        record = _REC.pack(kind, len(key), len(value)) + key + value
        view = memoryview(record)
        while view:
            view = view[os.write(fd, view):]
        if kind == _REC_SET:
            self._data[key] = value
        else:
            self._data.pop(key, None)
        self._offset += len(record)

    def _poll(self, keys: list[bytes], timeout: float, what: str) -> dict[bytes, bytes]:
        deadline = time.monotonic() + timeout
        delay = 0.001
        while True:
            found = self._locked(fcntl.LOCK_SH,
                                 lambda fd: {k: self._data[k] for k in keys if k in self._data})
            if len(found) == len(keys):
                return found
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                missing = [k.decode("utf-8", "replace") for k in keys if k not in found]
                raise CommTimeoutError(f"FileStore {self.path}: {what} timed out after "
                                       f"{timeout:g}s waiting for key(s) {missing}")
            time.sleep(min(delay, remaining))
            delay = min(delay * 2, 0.05)

    # -- the Store API

    def set(self, key: str, value: Value) -> None:
        k, v = _key_bytes(key), _value_bytes(value)
        self._locked(fcntl.LOCK_EX, lambda fd: self._append(fd, _REC_SET, k, v))

    def get(self, key: str, timeout: float | None = None) -> bytes:
        k = _key_bytes(key)
        return self._poll([k], self._resolve(timeout), "get")[k]

    def wait(self, keys: list[str], timeout: float | None = None) -> None:
        self._poll([_key_bytes(k) for k in keys], self._resolve(timeout), "wait")

    def add(self, key: str, amount: int) -> int:
        k = _key_bytes(key)

        def body(fd: int) -> int:
            try:
                value = int(self._data.get(k, b"0")) + int(amount)
            except ValueError as exc:
                raise InvalidArgumentError(f"FileStore {self.path}: add: value of key "
                                           f"{key!r} is not an integer") from exc
            self._append(fd, _REC_SET, k, str(value).encode())
            return value
        return self._locked(fcntl.LOCK_EX, body)

    def compare_set(self, key: str, expected: Value, desired: Value) -> bytes:
        k, e, d = _key_bytes(key), _value_bytes(expected), _value_bytes(desired)

        def body(fd: int) -> bytes:
            current = self._data.get(k)
            if current is None:
                if e != b"":
                    return e
                self._append(fd, _REC_SET, k, d)
                return d
            if current == e:
                self._append(fd, _REC_SET, k, d)
                return d
            return current
        return self._locked(fcntl.LOCK_EX, body)

    def delete_key(self, key: str) -> bool:
        k = _key_bytes(key)

        def body(fd: int) -> bool:
            if k not in self._data:
                return False
            self._append(fd, _REC_DEL, k)
            return True
        return self._locked(fcntl.LOCK_EX, body)

    def check(self, keys: list[str]) -> bool:
        ks = [_key_bytes(k) for k in keys]
        return self._locked(fcntl.LOCK_SH, lambda fd: all(k in self._data for k in ks))

    def num_keys(self) -> int:
        internal = _INTERNAL.encode()
        return self._locked(fcntl.LOCK_SH,
                            lambda fd: sum(1 for k in self._data if not k.startswith(internal)))

    def cleanup(self) -> None:
        """Remove the store's file (other instances then see an empty store)."""
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def close(self) -> None:
        if self._closed:
            return
        if self.world_size is not None:
            try:
                if self.add(_FILE_CLOSED_KEY, 1) >= self.world_size:
                    self.cleanup()
            except CollcommError:
                pass
        self._closed = True


# --------------------------------------------------------------------------- prefix store

class PrefixStore(Store):
    """Every key of ``store`` seen through ``prefix + "/"``. ``close`` leaves ``store`` open."""

    def __init__(self, prefix: str, store: Store) -> None:
        super().__init__(store.timeout)
        self.prefix = prefix
        self.underlying = store

    @property
    def timeout(self) -> float:
        return self.underlying.timeout

    def set_timeout(self, seconds: float) -> None:
        self.underlying.set_timeout(seconds)

    def _k(self, key: str) -> str:
        return f"{self.prefix}/{key}"

    def set(self, key: str, value: Value) -> None:
        self.underlying.set(self._k(key), value)

    def get(self, key: str, timeout: float | None = None) -> bytes:
        return self.underlying.get(self._k(key), timeout)

    def wait(self, keys: list[str], timeout: float | None = None) -> None:
        self.underlying.wait([self._k(k) for k in keys], timeout)

    def add(self, key: str, amount: int) -> int:
        return self.underlying.add(self._k(key), amount)

    def compare_set(self, key: str, expected: Value, desired: Value) -> bytes:
        return self.underlying.compare_set(self._k(key), expected, desired)

    def delete_key(self, key: str) -> bool:
        return self.underlying.delete_key(self._k(key))

    def check(self, keys: list[str]) -> bool:
        return self.underlying.check([self._k(k) for k in keys])

    def num_keys(self) -> int:
        """Keys of the whole underlying store (as torch does)."""
        return self.underlying.num_keys()

    def close(self) -> None:
        pass


# --------------------------------------------------------------------------- URLs

def _host_port(text: str, what: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise InvalidArgumentError(f"{what}: expected host:port, got {text!r}")
    return host.strip("[]"), int(port)


def store_from_url(url: str, rank: int, world_size: int, timeout: float = DEFAULT_TIMEOUT,
                   token: bytes | None = None) -> Store:
    """Open the store an ``init_method`` URL names.

    * ``tcp://host:port``: rank 0 hosts the server (as torch does), every rank is a client.
    * ``file:///path``: a :class:`FileStore` removed when all ``world_size`` ranks close it.
    * ``env://``: if ``COLLCOMM_STORE=host:port`` is set the launcher already hosts a server
      and every rank is a plain client; otherwise ``MASTER_ADDR``/``MASTER_PORT`` as
      ``tcp://`` (rank 0 hosts).
    """
    parsed = urlparse(url)
    if parsed.scheme == "tcp":
        host, port = _host_port(parsed.netloc, url)
        return TCPStore(host, port, world_size, is_master=(rank == 0), timeout=timeout,
                        token=token)
    if parsed.scheme == "file":
        path = parsed.path if not parsed.netloc else f"//{parsed.netloc}{parsed.path}"
        if not path:
            raise InvalidArgumentError(f"file:// URL without a path: {url!r}")
        return FileStore(path, world_size, timeout=timeout)
    if parsed.scheme == "env":
        hosted = os.environ.get("COLLCOMM_STORE")
        if hosted:
            host, port = _host_port(hosted, "COLLCOMM_STORE")
            return TCPStore(host, port, world_size, is_master=False, timeout=timeout,
                            token=token)
        addr, port_s = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
        if not addr or not port_s or not port_s.isdigit():
            raise InvalidArgumentError(
                "env:// needs COLLCOMM_STORE=host:port or MASTER_ADDR and MASTER_PORT "
                f"(got MASTER_ADDR={addr!r}, MASTER_PORT={port_s!r})")
        return TCPStore(addr, int(port_s), world_size, is_master=(rank == 0),
                        timeout=timeout, token=token)
    raise InvalidArgumentError(f"unsupported store URL {url!r} (tcp://, file://, env://)")
