"""The TCP store client (:class:`TCPStore`), which can also host the server (``is_master``)."""
from __future__ import annotations

import socket
import struct
import threading
import time

from . import auth
from ..errors import AuthError, ClosedError, CommTimeoutError, InvalidArgumentError
from .base import DEFAULT_TIMEOUT, Store, Value, _WORKERS_KEY, _WORKERS_READY_KEY, _key_bytes, _value_bytes
from .protocol import _ADD, _CAS, _CHECK, _DELETE, _ERROR, _F64, _GET, _NUM_KEYS, _OP_NAMES, _SET, _TIMEOUT, _WAIT, _encode, _read_frame
from .netaddr import bind_address_for
from .tcp_server import TCPStoreServer

# --------------------------------------------------------------------------- TCP client

class TCPStore(Store):
    """Client of a :class:`TCPStoreServer`; with ``is_master=True`` it also hosts one.

    The client retries connecting until ``timeout`` (the master may start later), then
    authenticates with ``token`` (default :func:`collcomm.rendezvous.auth.job_token`). With
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
            # the address clients reach it at when it is this machine's (loopback for a
            # one-host job), else COLLCOMM_SOCKET_IFNAME's, else every interface
            self._server = TCPStoreServer(bind_address_for(host), port, self._token)
            port = self._server.port
        self.port = port
        # ``_lock`` serializes requests on the one connection and is held for a request's
        # whole round trip (a parked get/wait: up to its timeout). Nothing but this
        # connection's own I/O and bookkeeping runs under it; ``close`` does not wait for
        # it to interrupt a request (it shuts the socket down first, which wakes the reader).
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
                if self._closed:
                    raise ClosedError(f"store client for {self.address} was closed during "
                                      f"{name}") from exc
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
        """Close the connection (and the server, if hosted). A request blocked on the server
        in another thread ends at once with ClosedError: the socket is shut down without
        waiting for ``_lock``, then closed under it once that request has let go."""
        if self._closed:
            return
        self._closed = True
        sock = getattr(self, "_sock", None)
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            with self._lock:
                sock.close()
        if self._server is not None:
            self._server.close()
