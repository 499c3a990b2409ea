"""A namespace inside another store."""
from __future__ import annotations


from .base import Store, Value

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
