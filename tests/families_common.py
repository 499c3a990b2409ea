"""Shared by the family tests (tests/test_families.py and its rank side): the message
sizes, dtypes and ops the cases use, the data every rank makes and the numpy references
it is checked against (integer-valued, |x| <= 3, so float sums are exact whatever the
combination order), and :class:`Ctx`, what one rank records while it runs the cases.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import numpy as np

from collcomm.ops import ReduceOp

SMALL_COUNTS = (0, 1, 7)
LARGE = 300_001        # per-rank vector of broadcast/reduce/all_reduce: 2.4 MB float64, 1.2 MB int32
LARGE_BLOCK = 150_001  # per-rank block of gather-like collectives: 1.2 MB float64
HUGE = 1_200_001       # shm_direct only: 9.6 MB float64, more than two 4 MiB slots
HUGE_BLOCK = 600_001   # shm_direct only: 4.8 MB float64 block, more than one slot
DTYPES = (np.float64, np.int32)
OPS = {"SUM": (ReduceOp.SUM, np.add), "MAX": (ReduceOp.MAX, np.maximum),
       "PRODUCT": (ReduceOp.PRODUCT, np.multiply)}


# ---------------------------------------------------------------------- data & references


def data(rank: int, count: int, dtype: Any, salt: int = 0) -> np.ndarray:
    """Small integer values (|x| <= 3 so products stay small), different per rank and along
    the vector, so a block or chunk moved to the wrong place shows: element i is
    ``(i + rank * 13 + salt * 5) % 7 - 3``, made by repeating its 7-value cycle (the
    modulo over a whole large vector was a third of a rank's time); test_data_formula
    checks it against the formula."""
    start = (rank * 13 + salt * 5) % 7
    cycle = (np.arange(start, start + 7) % 7 - 3).astype(dtype)
    return np.resize(cycle, count) if count else np.empty(0, dtype=dtype)


@functools.lru_cache(maxsize=32)
def reference(n: int, count: int, dtype: Any, op: str, salt: int = 0) -> np.ndarray:
    """The expected reduction; read-only, as the loops over roots ask for it again and again."""
    ufunc = OPS[op][1]
    ref = functools.reduce(ufunc, [data(r, count, dtype, salt) for r in range(n)]).astype(dtype)
    ref.flags.writeable = False
    return ref


def a2a_counts(n: int, uniform: int | None, scale: int = 1) -> list[list[int]]:
    """counts[i][j]: elements rank i sends to rank j (uneven, with zeros, unless uniform)."""
    if uniform is not None:
        return [[uniform] * n for _ in range(n)]
    return [[(i * 3 + j * 5 + 1) % 4 * (1 + (i + j) % 3) * scale for j in range(n)]
            for i in range(n)]


def a2a_block(i: int, j: int, c: int, dtype: Any) -> np.ndarray:
    return ((i * 1000 + j * 100 + np.arange(c, dtype=np.int64)) % 100_003).astype(dtype)


def diff(got: Any, expected: np.ndarray) -> str | None:
    """None when equal, else a short description of the first difference."""
    if got is None:
        return "got None"
    if got.dtype != expected.dtype or got.shape != expected.shape:
        return f"got {got.dtype}{got.shape}, expected {expected.dtype}{expected.shape}"
    if np.array_equal(got, expected):
        return None
    bad = np.flatnonzero(got != expected)
    i = int(bad[0])
    return (f"{bad.size} of {got.size} elements wrong; first at [{i}]: got {got[i]!r}, "
            f"expected {expected[i]!r}; last wrong at [{int(bad[-1])}]")


# ---------------------------------------------------------------------- the rank side


class Ctx:
    """What one rank records while it runs every case."""

    def __init__(self, world: Any, transport: str) -> None:
        self.world, self.transport = world, transport  # transport: the config's mode
        self.n, self.rank = world.size, world.rank
        self.failures: list[tuple[str, str, str, str]] = []
        self.barrier_times: dict[str, list[tuple[float, float]]] = {}

    def fail(self, collective: str, family: str, what: str, msg: str) -> None:
        self.failures.append((collective, family, what, f"rank {self.rank}: {msg}"))

    def expect(self, collective: str, family: str, what: str, got: Any,
               expected: np.ndarray) -> None:
        msg = diff(got, expected)
        if msg:
            self.fail(collective, family, what, msg)

    def guard(self, collective: str, family: str, what: str, case: Callable[[], None]) -> None:
        try:
            case()
        except Exception as exc:  # noqa: BLE001 - recorded, the next case still runs
            self.fail(collective, family, what, f"raised {type(exc).__name__}: {exc}")

    def big(self, family: str) -> bool:
        """Whether this family gets the larger-than-a-slot cases here."""
        return family == "shm_direct" and self.transport == "shm" and self.n > 1

    def large(self, family: str) -> bool:
        """Whether this family gets the large (> 1 MiB) cases here. The multi-host jobs
        give them only to hierarchical (the others are covered by the shm and tcp jobs)."""
        return self.transport != "multi" or family == "hierarchical"


def supported(family: str, mode: str) -> bool:
    """Whether ``family`` can work in this kind of job (else it must refuse cleanly)."""
    mode = "shm" if mode in ("shm-staged", "shm-python") else mode
    if family == "shm_direct":
        return mode == "shm"
    if family == "hierarchical":
        return mode == "multi"
    return True
