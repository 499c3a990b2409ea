"""The per-group call plan: what every call of a group would otherwise redo.

A :class:`CallPlan` is built once per process group. At construction it reads what cannot
change for the group's lifetime: its topology (one host with shared memory, how many
hosts, the link kind) and the ``COLLCOMM_ALGO_<COLLECTIVE>`` overrides. It then caches,
per key, the answers a call needs:

* :meth:`reducer` — ``(op, dtype)`` → the in-place combiner, whether it is AVG (sum, then
  divide), and the op's name for the call signature;
* :meth:`algorithm` — ``(collective, size class, algorithm name)`` → the family function
  (the cost model is consulted once per power-of-two size class, not per call);
* :meth:`reducing` — both at once for a reducing collective, plus the call signature
  without its count and root (the caller ORs those in).

So a call is: a cheap argument check, two dict lookups, one call. Errors (an unknown
algorithm, an op that does not fit the dtype) are raised by the first call that asks, on
the rank that asked, before any traffic.
"""
from __future__ import annotations

import os
from typing import Any, Callable

from .. import ops
from ..algorithms import registry, signature
from ..errors import InvalidArgumentError

Reducer = tuple[Callable[[Any, Any], None], bool, str]
Entry = tuple[Callable[..., None], Callable[[Any, Any], None], bool, int]
_MAX_ENTRIES = 512


class CallPlan:
    """The cached decisions of one group (see the module docstring)."""

    __slots__ = ("size", "shm", "hosts", "link", "overrides", "_reducers", "_algorithms",
                 "_entries")

    def __init__(self, size: int, shm: bool, hosts: int, link: str) -> None:
        self.size, self.shm, self.hosts, self.link = size, shm, hosts, link
        self.overrides: dict[str, str] = {}
        for collective in registry.ALGORITHMS:
            value = os.environ.get(f"COLLCOMM_ALGO_{collective.upper()}", "").strip().lower()
            if value and value != "auto":
                self.overrides[collective] = value
        self._reducers: dict[Any, tuple[Any, ...]] = {}
        self._entries: dict[Any, tuple[Any, ...]] = {}
        self._algorithms: dict[tuple[str, int, str], Callable[..., None]] = {}

    def reducer(self, op: Any, dtype: Any, where: str) -> Reducer:
        """(combiner, is AVG, op name) for ``op`` on ``dtype``; InvalidArgumentError naming
        ``where`` if the op does not fit the dtype."""
        key = (id(op), dtype)
        hit = self._reducers.get(key)
        if hit is not None and hit[3] is op:
            return hit[:3]  # type: ignore[return-value]
        try:
            fn = ops.resolve(op, dtype, where, None)
        except InvalidArgumentError as exc:
            exc.kind = exc.kind or "op"
            raise
        rop = ops.ReduceOp.from_any(op)
        if len(self._reducers) > _MAX_ENTRIES:   # user ops made per call: do not grow forever
            self._reducers.clear()
        # the entry keeps ``op`` alive, so its id cannot be reused by another object
        self._reducers[key] = (fn, rop is ops.ReduceOp.AVG, rop.name, op)
        return fn, rop is ops.ReduceOp.AVG, rop.name

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

    def reducing(self, collective: str, op: Any, dtype: Any, nbytes: int, algorithm: str,
                 name: str, group_text: str) -> Entry:
        """(family, combiner, is AVG, signature without count and root) of a reducing call.
        ``name`` and ``group_text`` make the error text (``"<name> on <group_text>"``),
        built only on a miss."""
        key = (collective, id(op), dtype, nbytes.bit_length(), algorithm)
        hit = self._entries.get(key)
        if hit is not None and hit[4] is op:
            return hit[:4]  # type: ignore[return-value]
        fn, avg, op_name = self.reducer(op, dtype, f"{name} on {group_text}")
        family = self.algorithm(collective, nbytes, algorithm)
        entry = (family, fn, avg, signature.make(collective, dtype, 0, 0, op_name))
        if len(self._entries) > _MAX_ENTRIES:
            self._entries.clear()
        self._entries[key] = entry + (op,)
        return entry
