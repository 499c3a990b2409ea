"""The store contract every rendezvous store implements (torch.distributed's API):
keys are ``str``, values ``bytes``; see :mod:`collcomm.rendezvous` for the semantics."""
from __future__ import annotations

from abc import ABC, abstractmethod

from ..errors import InvalidArgumentError

__all__ = ["Store", "DEFAULT_TIMEOUT", "Value"]

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
