"""A store in one append-only file guarded by ``fcntl.flock`` (one host or a shared file system)."""
from __future__ import annotations

import fcntl
import os
import struct
import threading
import time

from ..errors import ClosedError, CollcommError, CommTimeoutError, InvalidArgumentError
from .base import DEFAULT_TIMEOUT, Store, Value, _FILE_CLOSED_KEY, _INTERNAL, _key_bytes, _value_bytes

# --------------------------------------------------------------------------- file store

_REC = struct.Struct("!BII")
_REC_SET, _REC_DEL = 1, 2


class FileStore(Store):
    """A store in one file, shared by processes on one host (or a shared file system).

    The file is an append-only log of ``set``/``delete`` records; every operation takes
    ``fcntl.flock`` (shared to read, exclusive to write) and replays the records it has not
    seen. ``get``/``wait`` poll with backoff. With ``world_size``, the last of that many
    instances to :meth:`close` removes the file (like torch); :meth:`cleanup` removes it
    at any time. Only the constructor creates the file: once it is removed, every instance's
    operations raise :class:`ClosedError` instead of re-creating it (a rank's background
    thread polling the store after the last rank removed it must not leave the file behind).
    """

    def __init__(self, path: str, world_size: int | None = None,
                 timeout: float = DEFAULT_TIMEOUT, create: bool = True) -> None:
        super().__init__(timeout)
        self.path = os.fspath(path)
        self.world_size = world_size
        self._lock = threading.Lock()
        self._closed = False
        self._data: dict[bytes, bytes] = {}
        self._offset = 0
        self._inode: tuple[int, int] | None = None
        self._locked(fcntl.LOCK_SH, lambda fd: None, create=create)  # fail early

    # -- log access

    def _locked(self, mode: int, body, create: bool = False):  # type: ignore[no-untyped-def]
        with self._lock:
            if self._closed:
                raise ClosedError(f"FileStore {self.path} is closed")
            flags = os.O_RDWR | os.O_APPEND | (os.O_CREAT if create else 0)
            try:
                fd = os.open(self.path, flags, 0o600)
            except FileNotFoundError as exc:
                raise ClosedError(f"FileStore {self.path}: the file was removed (the job's "
                                  "last rank closed the store, or cleanup() was called)") from exc
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
