"""The per-group call plan: what every call of a group would otherwise redo.

A :class:`CallPlan` is built once per process group. At construction it reads what cannot
change for the group's lifetime: its topology (one host with shared memory, how many
hosts, the link kind) and the ``COLLCOMM_ALGO_<COLLECTIVE>`` overrides. It then caches,
per key, the answers a call needs:

* :meth:`reducer` — ``(op, dtype)`` → the in-place combiner, whether it is AVG (sum, then
  divide), and the op's name for the call signature;
* :meth:`algorithm` — ``(collective, size class, algorithm name)`` → the family function
  (the cost model is consulted once per power-of-two size class, not per call).

So a call is: a cheap argument check, two dict lookups, one call. Errors (an unknown
algorithm, an op that does not fit the dtype) are raised by the first call that asks, on
the rank that asked, before any traffic.
"""
from __future__ import annotations

import os
from typing import Any, Callable

from .. import ops
from ..algorithms import registry
from ..errors import InvalidArgumentError

Reducer = tuple[Callable[[Any, Any], None], bool, str]


class CallPlan:
    """The cached decisions of one group (see the module docstring)."""

    __slots__ = ("size", "shm", "hosts", "link", "overrides", "_reducers", "_algorithms")

    def __init__(self, size: int, shm: bool, hosts: int, link: str) -> None:
        self.size, self.shm, self.hosts, self.link = size, shm, hosts, link
        self.overrides: dict[str, str] = {}
        for collective in registry.ALGORITHMS:
            value = os.environ.get(f"COLLCOMM_ALGO_{collective.upper()}", "").strip().lower()
            if value and value != "auto":
                self.overrides[collective] = value
        self._reducers: dict[Any, Reducer] = {}
        self._algorithms: dict[tuple[str, int, str], Callable[..., None]] = {}

    def reducer(self, op: Any, dtype: Any, where: str) -> Reducer:
        """(combiner, is AVG, op name) for ``op`` on ``dtype``; InvalidArgumentError naming
        ``where`` if the op does not fit the dtype."""
        try:
            key = (op, dtype)
            hit = self._reducers.get(key)
        except TypeError:          # an unhashable user op: resolve every time
            key, hit = None, None
        if hit is not None:
            return hit
        fn = ops.resolve(op, dtype, where, None)
        rop = ops.ReduceOp.from_any(op)
        entry = (fn, rop is ops.ReduceOp.AVG, rop.name)
        if key is not None:
            self._reducers[key] = entry
        return entry

    def algorithm(self, collective: str, nbytes: int, algorithm: str = "auto") -> Callable[..., None]:
        """The family function running ``collective`` of ``nbytes`` on this group."""
        key = (collective, nbytes.bit_length(), algorithm)
        fn = self._algorithms.get(key)
        if fn is None:
            name = algorithm
            source = "algorithm argument"
            if name == "auto" and collective in self.overrides:
                name, source = self.overrides[collective], f"COLLCOMM_ALGO_{collective.upper()}"
            try:
                fn = registry.select(collective, nbytes, self.size, name, self.shm, self.hosts,
                                     self.link, env=False)
            except InvalidArgumentError as exc:
                raise InvalidArgumentError(
                    str(exc).replace("(from algorithm argument)", f"(from {source})")) from None
            self._algorithms[key] = fn
        return fn
