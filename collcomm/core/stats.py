"""Per-op statistics: ``COLLCOMM_STATS=1`` prints them when the process exits;
``collcomm.stats()`` returns them, ``collcomm.stats(reset=True)`` also starts over.

Per collective (by the name it was called with): calls, bytes, total and mean time, and
the nccl-tests bandwidths of the mean call (SPEC §5): ``algbw = bytes / time``, ``busbw =
algbw × factor`` with factor ``2(n-1)/n`` for all_reduce, ``(n-1)/n`` for all_gather,
reduce_scatter, all_to_all, gather and scatter (bytes: the total, n × per rank), 1 for the
rest. Bytes come from the call's signature (count × item size), so all_to_all(v), whose
signature carries no count, shows 0 bytes.

Counting costs one dict update per call, so it is on only with ``COLLCOMM_STATS`` set
(any value but 0): without it ``stats()`` returns an empty dict.
"""
from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import Any

from .tracing import sig_bytes

_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n}
_TOTAL = ("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter")


def _kind(op: str) -> str:
    for k in ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "gather", "scatter"):
        if k in op:
            return k
    return op


class Collector:
    def __init__(self) -> None:
        self.ops: dict[tuple[str, int], list[float]] = {}
        self._lock = threading.Lock()

    def add(self, op: str, sig: int, n: int, seconds: float) -> None:
        nbytes = sig_bytes(sig)
        if _kind(op) in _TOTAL:
            nbytes *= n
        with self._lock:
            s = self.ops.get((op, n))
            if s is None:
                s = self.ops[(op, n)] = [0, 0, 0.0]
            s[0] += 1
            s[1] += nbytes
            s[2] += seconds

    def table(self, reset: bool = False) -> dict[str, dict[str, Any]]:
        with self._lock:
            ops = dict(self.ops)
            if reset:
                self.ops = {}
        out: dict[str, dict[str, Any]] = {}
        for (op, n), (calls, nbytes, total) in sorted(ops.items()):
            mean = total / calls if calls else 0.0
            per_call = nbytes / calls if calls else 0
            algbw = per_call / mean / 1e9 if mean else 0.0
            kind = _kind(op)
            factor = _FACTOR[kind](n) if kind in _FACTOR else ((n - 1) / n if kind in _TOTAL else 1.0)
            key = op if (op not in out) else f"{op}[n={n}]"
            out[key] = {"calls": int(calls), "bytes": int(nbytes), "total_s": total, "mean_s": mean,
                        "algbw_GBps": algbw, "busbw_GBps": algbw * factor, "ranks": n}
        return out


def format_table(table: dict[str, dict[str, Any]], rank: int | None = None) -> str:
    head = f"collcomm stats{'' if rank is None else f' (rank {rank})'}:"
    lines = [head, f"  {'op':<24}{'calls':>8}{'bytes':>14}{'total(s)':>11}{'mean(us)':>11}"
                   f"{'algbw(GB/s)':>13}{'busbw(GB/s)':>13}"]
    for op, s in table.items():
        lines.append(f"  {op:<24}{s['calls']:>8}{s['bytes']:>14}{s['total_s']:>11.4f}"
                     f"{s['mean_s'] * 1e6:>11.2f}{s['algbw_GBps']:>13.3f}{s['busbw_GBps']:>13.3f}")
    return "\n".join(lines)


_collector: Collector | None = None


def collector() -> Collector:
    global _collector
    if _collector is None:
        _collector = Collector()
        if os.environ.get("COLLCOMM_STATS", "") not in ("", "0"):
            atexit.register(_print_at_exit)
    return _collector


def _print_at_exit() -> None:
    if _collector is None or not _collector.ops:
        return
    from .recorder import recorder

    print(format_table(_collector.table(), recorder().rank), file=sys.stderr, flush=True)


def stats(reset: bool = False) -> dict[str, dict[str, Any]]:
    """Per-op statistics of this process: ``{op: {calls, bytes, total_s, mean_s, algbw_GBps,
    busbw_GBps, ranks}}``; counted only with ``COLLCOMM_STATS`` set (else ``{}``).
    ``reset=True`` starts the counts over after returning them."""
    if _collector is None:
        return {}
    return _collector.table(reset)
