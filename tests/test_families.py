"""Every algorithm family of every collective through the real transports (processes).

tests/test_algorithms.py checks the point-to-point families on thread-ranks
(tests/threadcomm.py); this file runs every family on separate processes, through the
entry points (``collcomm.algorithms.X(comm, ..., algorithm=family)`` inside
``world.run``), in three kinds of job: all ranks over shared memory (``shm``, 1-5 ranks),
all over TCP (``tcp``, 2, 3, 5 ranks), and pretend multi-host jobs (``multi``: each rank's
COLLCOMM_HOST_ID names its "host"; shm inside one, TCP between). Large messages go through
shm segments / partial socket writes, and ``shm_direct`` really uses its arena (chunked
when a buffer is larger than its 4 MiB slot; also on shared-heap buffers, zero-copy).

One job per configuration runs every case on every rank (``_rank_main``); each rank checks
its own results against a numpy reference computed from (rank, size, case) and returns a
list of failures, which the per-(collective, family) tests then report. Data is
integer-valued (|x| <= 3) so float sums are exact whatever the combination order.

Where a family cannot work (``shm_direct`` without shared memory, ``hierarchical`` on one
host) its test checks that every collective it has raises InvalidArgumentError naming it,
on every rank, and that the group still works afterwards.
"""
from __future__ import annotations

import functools
import time
from typing import Any, Callable

import numpy as np
import pytest

from collcomm import algorithms
from collcomm.algorithms import ALGORITHMS, available
from collcomm.errors import InvalidArgumentError
from collcomm.ops import ReduceOp, resolve
from tests.harness import run_ranks

SHM_SIZES = [1, 2, 3, 4, 5]
TCP_SIZES = [2, 3, 5]
#: Pretend multi-host jobs (COLLCOMM_HOST_ID per rank): shm inside a "host", tcp between.
#: "ABABB": hosts with interleaved, non-contiguous ranks; "ABB": a host with one rank.
MULTI_HOSTS = ["ABB", "ABABB"]
#: (mode, hosts): mode "shm"/"tcp" forces COLLCOMM_TRANSPORT; "multi" mixes them.
#: "shm-staged": shared memory with cross-memory attach off (COLLCOMM_CMA=0), so large
#: chunks go through the arena's staging slots instead of being read from the peers.
#: "shm-python": shm_direct (only) with the native core off (COLLCOMM_NATIVE=0): the
#: pure-Python implementation, which the other shm jobs bypass where the core is built.
CONFIGS = ([("shm", "A" * n) for n in SHM_SIZES] + [("shm-staged", "AAA")]
           + [("shm-python", "AA"), ("shm-python", "AAA")]
           + [("tcp", "A" * n) for n in TCP_SIZES] + [("multi", h) for h in MULTI_HOSTS])
#: families the "shm-python" jobs run (the others have no native path)
PYTHON_ONLY = ("shm_direct",)

SMALL_COUNTS = (0, 1, 7)
LARGE = 300_001        # per-rank vector of broadcast/reduce/all_reduce: 2.4 MB float64, 1.2 MB int32
LARGE_BLOCK = 150_001  # per-rank block of gather-like collectives: 1.2 MB float64
HUGE = 1_200_001       # shm_direct only: 9.6 MB float64, more than two 4 MiB slots
HUGE_BLOCK = 600_001   # shm_direct only: 4.8 MB float64 block, more than one slot
DTYPES = (np.float64, np.int32)
OPS = {"SUM": (ReduceOp.SUM, np.add), "MAX": (ReduceOp.MAX, np.maximum),
       "PRODUCT": (ReduceOp.PRODUCT, np.multiply)}

JOB_TIMEOUT = 240.0     # one whole (transport, size) job
CALL_TIMEOUT = "30"     # COLLCOMM_TIMEOUT: bounds a hung case, so later cases still run
TEST_TIMEOUT = 300      # the first test of a configuration pays for its whole job

#: Known library bugs: (predicate(mode, n, collective, family, what), reason).
#: A failure matching one is reported as xfail (only if every other case passed).
KNOWN_BUGS: list[tuple[Callable[[str, int, str, str, str], bool], str]] = []


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


def config_id(mode: str, hosts: str) -> str:
    return f"multi-{hosts}" if mode == "multi" else f"{mode}-n{len(hosts)}"


def reduce_cases(large: bool, huge: bool) -> list[tuple[int, Any, str]]:
    cases = [(c, d, op) for d in DTYPES for op in ("SUM", "MAX") for c in SMALL_COUNTS]
    cases.append((7, np.int32, "PRODUCT"))
    if large:
        cases += [(LARGE, np.float64, "SUM"), (LARGE, np.int32, "SUM"), (LARGE, np.float64, "MAX")]
    if huge:
        cases += [(HUGE, np.float64, "SUM")]
    return cases


def edge_roots(n: int) -> set[int]:
    return {0, n - 1}


def block_counts(ctx: Ctx, family: str, large: bool, dtype: Any) -> list[int]:
    counts = list(SMALL_COUNTS)
    if large:
        counts.append(LARGE_BLOCK)
        if ctx.big(family) and dtype == np.float64:
            counts.append(HUGE_BLOCK)
    return counts


def c_broadcast(ctx: Ctx, fam: str) -> None:
    n, me = ctx.n, ctx.rank
    for root in range(n):
        for dtype in DTYPES:
            counts = list(SMALL_COUNTS)
            if root in edge_roots(n) and ctx.large(fam):
                counts.append(LARGE)
                if ctx.big(fam) and dtype == np.float64 and root == n - 1:
                    counts.append(HUGE)
            for count in counts:
                what = f"root={root} count={count} {np.dtype(dtype)}"

                def case() -> None:
                    expected = data(root, count, dtype, salt=root)
                    buf = expected.copy() if me == root else np.full(count, 99, dtype)
                    ctx.world.run("broadcast", lambda c: algorithms.broadcast(
                        c, buf, root, algorithm=fam))
                    ctx.expect("broadcast", fam, what, buf, expected)

                ctx.guard("broadcast", fam, what, case)


def c_reduce(ctx: Ctx, fam: str) -> None:
    n, me = ctx.n, ctx.rank
    for root in range(n):
        edge = root in edge_roots(n) and ctx.large(fam)
        for inplace in (False, True):
            for count, dtype, op in reduce_cases(edge, edge and ctx.big(fam) and inplace):
                what = f"root={root} inplace={inplace} count={count} {np.dtype(dtype)} {op}"

                def case() -> None:
                    mine = data(me, count, dtype)
                    send = mine.copy()
                    recv = None
                    if me == root:
                        recv = send if inplace else np.full(count, 99, dtype)
                    fn = resolve(OPS[op][0], np.dtype(dtype))
                    ctx.world.run("reduce", lambda c: algorithms.reduce(
                        c, send, recv, fn, root, algorithm=fam))
                    if me == root:
                        ctx.expect("reduce", fam, what, recv, reference(n, count, dtype, op))
                    if not (me == root and inplace):
                        ctx.expect("reduce", fam, what + " (send modified)", send, mine)

                ctx.guard("reduce", fam, what, case)


def c_all_reduce(ctx: Ctx, fam: str) -> None:
    n, me = ctx.n, ctx.rank
    for count, dtype, op in reduce_cases(ctx.large(fam), ctx.big(fam)):
        what = f"count={count} {np.dtype(dtype)} {op}"

        def case() -> None:
            buf = data(me, count, dtype)
            fn = resolve(OPS[op][0], np.dtype(dtype))
            ctx.world.run("all_reduce", lambda c: algorithms.all_reduce(c, buf, fn, algorithm=fam))
            ctx.expect("all_reduce", fam, what, buf, reference(n, count, dtype, op))

        ctx.guard("all_reduce", fam, what, case)


def c_all_gather(ctx: Ctx, fam: str) -> None:
    n, me = ctx.n, ctx.rank
    for inplace in (False, True):
        for dtype in DTYPES:
            for count in block_counts(ctx, fam, ctx.large(fam), dtype):
                what = f"inplace={inplace} count={count} {np.dtype(dtype)}"

                def case() -> None:
                    mine = data(me, count, dtype)
                    recv = np.full(n * count, 99, dtype)
                    send = mine.copy()
                    if inplace:
                        recv[me * count:(me + 1) * count] = mine
                        send = recv[me * count:(me + 1) * count]
                    ctx.world.run("all_gather", lambda c: algorithms.all_gather(
                        c, send, recv, algorithm=fam))
                    expected = np.concatenate([data(r, count, dtype) for r in range(n)])
                    ctx.expect("all_gather", fam, what, recv, expected)
                    ctx.expect("all_gather", fam, what + " (send modified)", send, mine)

                ctx.guard("all_gather", fam, what, case)


def c_reduce_scatter(ctx: Ctx, fam: str) -> None:
    n, me = ctx.n, ctx.rank
    cases = [(c, d, op) for c, d, op in reduce_cases(False, False)]
    if ctx.large(fam):
        cases += [(LARGE_BLOCK, np.float64, "SUM"), (LARGE_BLOCK, np.int32, "SUM"),
                  (LARGE_BLOCK, np.int32, "MAX")]
    if ctx.big(fam):
        cases.append((HUGE_BLOCK, np.float64, "SUM"))
    for count, dtype, op in cases:
        what = f"count={count} {np.dtype(dtype)} {op}"

        def case() -> None:
            mine = data(me, n * count, dtype)
            send = mine.copy()
            recv = np.full(count, 99, dtype)
            fn = resolve(OPS[op][0], np.dtype(dtype))
            ctx.world.run("reduce_scatter", lambda c: algorithms.reduce_scatter(
                c, send, recv, fn, algorithm=fam))
            full = reference(n, n * count, dtype, op)
            ctx.expect("reduce_scatter", fam, what, recv, full[me * count:(me + 1) * count])
            ctx.expect("reduce_scatter", fam, what + " (send modified)", send, mine)

        ctx.guard("reduce_scatter", fam, what, case)


def c_gather(ctx: Ctx, fam: str) -> None:
    n, me = ctx.n, ctx.rank
    for root in range(n):
        for inplace in (False, True):
            for dtype in DTYPES:
                counts = block_counts(ctx, fam, root in edge_roots(n) and not inplace and ctx.large(fam),
                                      dtype)
                for count in counts:
                    what = f"root={root} inplace={inplace} count={count} {np.dtype(dtype)}"

                    def case() -> None:
                        mine = data(me, count, dtype, salt=root)
                        send = mine.copy()
                        recv = None
                        if me == root:
                            recv = np.full(n * count, 99, dtype)
                            if inplace:
                                recv[me * count:(me + 1) * count] = mine
                                send = recv[me * count:(me + 1) * count]
                        ctx.world.run("gather", lambda c: algorithms.gather(
                            c, send, recv, root, algorithm=fam))
                        if me == root:
                            expected = np.concatenate([data(r, count, dtype, salt=root)
                                                       for r in range(n)])
                            ctx.expect("gather", fam, what, recv, expected)
                        ctx.expect("gather", fam, what + " (send modified)", send, mine)

                    ctx.guard("gather", fam, what, case)


def c_scatter(ctx: Ctx, fam: str) -> None:
    n, me = ctx.n, ctx.rank
    for root in range(n):
        for inplace in (False, True):
            for dtype in DTYPES:
                counts = block_counts(ctx, fam, root in edge_roots(n) and not inplace and ctx.large(fam),
                                      dtype)
                for count in counts:
                    what = f"root={root} inplace={inplace} count={count} {np.dtype(dtype)}"

                    def case() -> None:
                        full = np.concatenate([data(r, count, dtype, salt=root)
                                               for r in range(n)])
                        send = None
                        recv = np.full(count, 99, dtype)
                        if me == root:
                            send = full.copy()
                            if inplace:
                                recv = send[me * count:(me + 1) * count]
                        ctx.world.run("scatter", lambda c: algorithms.scatter(
                            c, send, recv, root, algorithm=fam))
                        ctx.expect("scatter", fam, what, recv, full[me * count:(me + 1) * count])
                        if me == root:
                            ctx.expect("scatter", fam, what + " (send modified)", send, full)

                    ctx.guard("scatter", fam, what, case)


def a2a_layouts(ctx: Ctx, fam: str) -> list[tuple[str, list[list[int]], Any]]:
    n = ctx.n
    layouts = [(f"uniform {u}", a2a_counts(n, u), np.float64) for u in SMALL_COUNTS]
    layouts.append(("uniform 7 int32", a2a_counts(n, 7), np.int32))
    if ctx.large(fam):
        layouts.append((f"uniform {LARGE // n}", a2a_counts(n, LARGE // n), np.float64))
    if fam != "bruck":
        layouts.append(("uneven", a2a_counts(n, None), np.float64))
        layouts.append(("uneven int32", a2a_counts(n, None), np.int32))
        if ctx.large(fam):
            layouts.append(("uneven x20000", a2a_counts(n, None, 20_000), np.float64))
        if ctx.big(fam):
            layouts.append(("uneven x80000", a2a_counts(n, None, 80_000), np.float64))
    return layouts


def c_all_to_all(ctx: Ctx, fam: str) -> None:
    n, me = ctx.n, ctx.rank
    for name, counts, dtype in a2a_layouts(ctx, fam):
        what = f"counts={name} {np.dtype(dtype)}"

        def case() -> None:
            send_counts = counts[me]
            recv_counts = [counts[i][me] for i in range(n)]
            mine = np.concatenate([a2a_block(me, j, send_counts[j], dtype) for j in range(n)])
            send = mine.copy()
            recv = np.full(sum(recv_counts), -1, dtype)
            ctx.world.run("all_to_all", lambda c: algorithms.all_to_all(
                c, send, send_counts, recv, recv_counts, algorithm=fam))
            expected = np.concatenate([a2a_block(i, me, counts[i][me], dtype) for i in range(n)])
            ctx.expect("all_to_all", fam, what, recv, expected)
            ctx.expect("all_to_all", fam, what + " (send modified)", send, mine)

        ctx.guard("all_to_all", fam, what, case)
    if fam == "bruck" and n > 1:
        what = "uneven counts must be rejected"

        def reject() -> None:
            counts = a2a_counts(n, None)
            send = np.zeros(sum(counts[me]))
            recv = np.zeros(sum(counts[i][me] for i in range(n)))
            try:
                ctx.world.run("all_to_all", lambda c: algorithms.all_to_all(
                    c, send, counts[me], recv, [counts[i][me] for i in range(n)],
                    algorithm="bruck"))
            except InvalidArgumentError:
                return
            ctx.fail("all_to_all", fam, what, "no InvalidArgumentError")

        # Only when every rank's counts are uneven (so every rank raises before sending).
        if all(len(set(row)) > 1 for row in a2a_counts(n, None)):
            ctx.guard("all_to_all", fam, what, reject)


def c_barrier(ctx: Ctx, fam: str) -> None:
    me = ctx.rank
    times: list[tuple[float, float]] = []
    for rnd in range(2):
        what = f"round {rnd}"

        def case() -> None:
            ctx.world.run("barrier", lambda c: algorithms.barrier(c, algorithm=fam))  # line up
            time.sleep(0.04 * ((me + rnd) % ctx.n))
            arrived = time.monotonic()  # CLOCK_MONOTONIC: one clock for all processes
            ctx.world.run("barrier", lambda c: algorithms.barrier(c, algorithm=fam))
            times.append((arrived, time.monotonic()))

        ctx.guard("barrier", fam, what, case)
    ctx.barrier_times[fam] = times


CHECKS: dict[str, Callable[[Ctx, str], None]] = {
    "broadcast": c_broadcast, "reduce": c_reduce, "all_reduce": c_all_reduce,
    "all_gather": c_all_gather, "reduce_scatter": c_reduce_scatter, "gather": c_gather,
    "scatter": c_scatter, "all_to_all": c_all_to_all, "barrier": c_barrier,
}


def rejected(ctx: Ctx, fam: str) -> None:
    """Where ``fam`` cannot work (shm_direct without shared memory, hierarchical on one
    host): every collective it has raises InvalidArgumentError naming it, on every rank,
    and the group still works afterwards."""
    n, me = ctx.n, ctx.rank
    k = 7
    f64 = np.float64
    fn = resolve(ReduceOp.SUM, np.dtype(f64))
    calls: dict[str, Callable[[Any], None]] = {
        "broadcast": lambda c: algorithms.broadcast(c, np.zeros(k), 0, algorithm=fam),
        "reduce": lambda c: algorithms.reduce(c, np.ones(k), np.zeros(k) if me == 0 else None,
                                              fn, 0, algorithm=fam),
        "all_reduce": lambda c: algorithms.all_reduce(c, np.ones(k), fn, algorithm=fam),
        "all_gather": lambda c: algorithms.all_gather(c, np.ones(k), np.zeros(n * k),
                                                      algorithm=fam),
        "reduce_scatter": lambda c: algorithms.reduce_scatter(c, np.ones(n * k), np.zeros(k), fn,
                                                              algorithm=fam),
        "gather": lambda c: algorithms.gather(c, np.ones(k), np.zeros(n * k) if me == 0 else None,
                                              0, algorithm=fam),
        "scatter": lambda c: algorithms.scatter(c, np.ones(n * k) if me == 0 else None,
                                                np.zeros(k), 0, algorithm=fam),
        "all_to_all": lambda c: algorithms.all_to_all(c, np.ones(n * k), [k] * n, np.zeros(n * k),
                                                      [k] * n, algorithm=fam),
        "barrier": lambda c: algorithms.barrier(c, algorithm=fam),
    }
    assert set(calls) == set(ALGORITHMS)
    for collective, call in calls.items():
        if fam not in ALGORITHMS[collective]:
            continue
        what = f"must raise InvalidArgumentError over {ctx.transport} with {n} ranks"

        def case() -> None:
            try:
                ctx.world.run(collective, call)
            except InvalidArgumentError as exc:
                if fam not in str(exc):
                    ctx.fail(collective, fam, what, f"message lacks {fam!r}: {exc}")
            else:
                ctx.fail(collective, fam, what, "no error")
            # The group still works afterwards.
            buf = data(me, 7, f64)
            ctx.world.run("all_reduce", lambda c: algorithms.all_reduce(c, buf, fn,
                                                                        algorithm="linear"))
            ctx.expect(collective, fam, "all_reduce after the rejected call", buf,
                       reference(n, 7, f64, "SUM"))

        ctx.guard(collective, fam, what, case)


def seq_alternating(ctx: Ctx) -> None:
    """Consecutive calls alternating families (and collectives) on the same group."""
    n, me = ctx.n, ctx.rank
    fams = [f for f in available("all_reduce") if supported(f, ctx.transport)]
    ag = [f for f in available("all_gather") if supported(f, ctx.transport)]
    bc = [f for f in available("broadcast") if supported(f, ctx.transport)]
    fn = resolve(ReduceOp.SUM, np.dtype(np.float64))
    step = 0
    for rnd in range(3):
        for i, fam in enumerate(fams):
            for count in (7, LARGE // 3) if (rnd + i) % 2 else (LARGE // 3, 1):
                step += 1
                what = f"step {step}: all_reduce {fam} count={count}"

                def ar() -> None:
                    buf = data(me, count, np.float64, salt=step)
                    ctx.world.run("all_reduce", lambda c: algorithms.all_reduce(
                        c, buf, fn, algorithm=fam))
                    ctx.expect("sequence", "alternating", what, buf,
                               reference(n, count, np.float64, "SUM", salt=step))

                ctx.guard("sequence", "alternating", what, ar)
                # Interleave another collective with a different family.
                other = ag[(step + rnd) % len(ag)]
                what2 = f"step {step}: all_gather {other} count=5"

                def gat() -> None:
                    recv = np.full(5 * n, -1.0)
                    ctx.world.run("all_gather", lambda c: algorithms.all_gather(
                        c, data(me, 5, np.float64, salt=step), recv, algorithm=other))
                    ctx.expect("sequence", "alternating", what2, recv, np.concatenate(
                        [data(r, 5, np.float64, salt=step) for r in range(n)]))

                ctx.guard("sequence", "alternating", what2, gat)
                bfam = bc[step % len(bc)]
                root = step % n
                what3 = f"step {step}: broadcast {bfam} root={root} count=3"

                def bca() -> None:
                    exp = data(root, 3, np.int32, salt=step)
                    buf = exp.copy() if me == root else np.zeros(3, np.int32)
                    ctx.world.run("broadcast", lambda c: algorithms.broadcast(
                        c, buf, root, algorithm=bfam))
                    ctx.expect("sequence", "alternating", what3, buf, exp)

                ctx.guard("sequence", "alternating", what3, bca)


def seq_mixed_sizes(ctx: Ctx) -> None:
    """shm_direct (multi-host: hierarchical; tcp: auto) with sizes small, large, small...

    Crosses the one-shot/two-shot boundary of shm_direct all_reduce (64 KiB = 8192 float64)
    and the slot size, so arena phases advance by different numbers of syncs per call.
    """
    n, me = ctx.n, ctx.rank
    fam = {"shm": "shm_direct", "multi": "hierarchical"}.get(ctx.transport, "auto")
    sfam = "shm_direct" if ctx.transport == "shm" else "auto"  # scatter has no hierarchical
    fn = resolve(ReduceOp.SUM, np.dtype(np.float64))
    fni = resolve(ReduceOp.MAX, np.dtype(np.int32))
    sizes = [7, HUGE, 1, 8192, 8193, 0, 600_000, 3, 524_288, 524_289, 7]
    for step, count in enumerate(sizes):
        what = f"step {step}: all_reduce count={count}"

        def ar() -> None:
            buf = data(me, count, np.float64, salt=step)
            ctx.world.run("all_reduce", lambda c: algorithms.all_reduce(c, buf, fn, algorithm=fam))
            ctx.expect("sequence", "mixed_sizes", what, buf,
                       reference(n, count, np.float64, "SUM", salt=step))

        ctx.guard("sequence", "mixed_sizes", what, ar)
        # A different collective between, alternating small and large.
        k = 5 if step % 2 else HUGE_BLOCK // n
        root = step % n
        what2 = f"step {step}: scatter root={root} count={k}"

        def sc() -> None:
            full = data(7, n * k, np.int32, salt=step)
            recv = np.zeros(k, np.int32)
            ctx.world.run("scatter", lambda c: algorithms.scatter(
                c, full if me == root else None, recv, root, algorithm=sfam))
            ctx.expect("sequence", "mixed_sizes", what2, recv, full[me * k:(me + 1) * k])

        ctx.guard("sequence", "mixed_sizes", what2, sc)
        what3 = f"step {step}: reduce MAX int32 root={root} count={count}"

        def rd() -> None:
            send = data(me, count, np.int32, salt=step)
            recv = np.zeros(count, np.int32) if me == root else None
            ctx.world.run("reduce", lambda c: algorithms.reduce(
                c, send, recv, fni, root, algorithm=fam))
            if me == root:
                ctx.expect("sequence", "mixed_sizes", what3, recv,
                           reference(n, count, np.int32, "MAX", salt=step))

        ctx.guard("sequence", "mixed_sizes", what3, rd)
        what4 = f"step {step}: barrier"
        ctx.guard("sequence", "mixed_sizes", what4, lambda: ctx.world.run(
            "barrier", lambda c: algorithms.barrier(c, algorithm=fam)))


def seq_shared_heap(ctx: Ctx) -> None:
    """shm_direct on buffers in the shared heap (collcomm.empty: read in place, zero-copy),
    on every rank or on rank 0 only, at a page offset or not, small to larger than a slot."""
    n, me = ctx.n, ctx.rank
    if ctx.transport != "shm" or n == 1:
        return
    from collcomm import memory

    f64 = np.float64
    fn = resolve(ReduceOp.SUM, np.dtype(f64))
    combos = [(7, "all", 0), (7, "rank0", 3), (8192, "all", 3), (8193, "rank0", 0),
              (LARGE, "all", 3), (LARGE, "rank0", 0), (HUGE, "all", 0), (HUGE, "rank0", 3),
              (1, "all", 0)]
    for step, (count, who, skew) in enumerate(combos, 1):
        tag = f"step {step}: count={count} heap on {who} skew={skew}"
        # Collective allocations: every rank makes them, in the same order.
        heap = memory.empty(count + skew, f64)[skew:]
        # In-place all_gather in the heap only up to LARGE (n·HUGE would be 48 MB).
        ag_counts = n * count if count <= LARGE else 0
        heap_all = memory.empty(ag_counts + skew, f64)[skew:]
        use_heap = who == "all" or me == 0

        def buf_for() -> np.ndarray:
            return heap if use_heap else np.empty(count, f64)

        what = f"{tag}: all_reduce"

        def ar() -> None:
            buf = buf_for()
            buf[...] = data(me, count, f64, salt=step)
            ctx.world.run("all_reduce", lambda c: algorithms.all_reduce(
                c, buf, fn, algorithm="shm_direct"))
            ctx.expect("sequence", "shared_heap", what, buf,
                       reference(n, count, f64, "SUM", salt=step))

        ctx.guard("sequence", "shared_heap", what, ar)
        root = step % n
        what2 = f"{tag}: broadcast root={root}"

        def bc() -> None:
            buf = buf_for()
            exp = data(root, count, f64, salt=step)
            buf[...] = exp if me == root else 99
            ctx.world.run("broadcast", lambda c: algorithms.broadcast(
                c, buf, root, algorithm="shm_direct"))
            ctx.expect("sequence", "shared_heap", what2, buf, exp)

        ctx.guard("sequence", "shared_heap", what2, bc)
        for inplace in (False, True)[:2 if count <= LARGE else 1]:
            what3 = f"{tag}: all_gather inplace={inplace}"

            def ag() -> None:
                mine = data(me, count, f64, salt=step)
                if inplace:
                    recv = heap_all if use_heap else np.empty(n * count, f64)
                    recv[...] = 99
                    send = recv[me * count:(me + 1) * count]
                else:
                    recv = np.full(n * count, 99, f64)
                    send = buf_for()
                send[...] = mine
                ctx.world.run("all_gather", lambda c: algorithms.all_gather(
                    c, send, recv, algorithm="shm_direct"))
                ctx.expect("sequence", "shared_heap", what3, recv, np.concatenate(
                    [data(r, count, f64, salt=step) for r in range(n)]))
                ctx.expect("sequence", "shared_heap", what3 + " (send modified)",
                           send, mine)

            ctx.guard("sequence", "shared_heap", what3, ag)
        what4 = f"{tag}: gather root={root}"

        def ga() -> None:
            send = buf_for()
            send[...] = data(me, count, f64, salt=step)
            recv = np.full(n * count, 99, f64) if me == root else None
            ctx.world.run("gather", lambda c: algorithms.gather(
                c, send, recv, root, algorithm="shm_direct"))
            if me == root:
                ctx.expect("sequence", "shared_heap", what4, recv, np.concatenate(
                    [data(r, count, f64, salt=step) for r in range(n)]))

        ctx.guard("sequence", "shared_heap", what4, ga)
        del heap, heap_all


SEQUENCES: dict[str, Callable[[Ctx], None]] = {
    "alternating": seq_alternating, "mixed_sizes": seq_mixed_sizes,
    "shared_heap": seq_shared_heap,
}


def _rank_main(mode: str, only: tuple[str, ...] | None = None) -> dict[str, Any]:
    """Run every case on this rank (of the families in ``only``, if given); return its
    failures, timings and barrier times."""
    import collcomm.core.runtime as rt

    ctx = Ctx(rt.get_world("test_families"), mode)
    timings: dict[str, float] = {}
    for collective, table in ALGORITHMS.items():
        for fam in sorted(table):
            t0 = time.monotonic()
            if supported(fam, mode) and (only is None or fam in only):
                CHECKS[collective](ctx, fam)
                timings[f"{collective}/{fam}"] = time.monotonic() - t0
    for fam in sorted({f for table in ALGORITHMS.values() for f in table}):
        if not supported(fam, mode) and only is None:
            t0 = time.monotonic()
            rejected(ctx, fam)
            timings[f"{fam} rejected"] = time.monotonic() - t0
    for name, seq in SEQUENCES.items():
        t0 = time.monotonic()
        seq(ctx)
        timings[f"sequence/{name}"] = time.monotonic() - t0
    return {"failures": ctx.failures, "barrier": ctx.barrier_times, "timings": timings}


# ---------------------------------------------------------------------- the pytest side

def test_data_formula():
    """data() is its formula, computed the short way, and varies along the vector."""
    for rank in range(6):
        for salt in (0, 1, 4, 9):
            for count in (0, 1, 7, 1001):
                for dtype in DTYPES:
                    x = (np.arange(count, dtype=np.int64) + rank * 13 + salt * 5) % 7 - 3
                    want = np.ascontiguousarray(x.astype(dtype))
                    got = data(rank, count, dtype, salt)
                    assert got.dtype == want.dtype and np.array_equal(got, want)
                    assert got.flags.writeable and got.flags.c_contiguous
                    assert count < 7 or len(set(got.tolist())) == 7


_JOBS: dict[tuple[str, str], Any] = {}


def job(mode: str, hosts: str) -> list[dict[str, Any]]:
    """The per-rank results of the (mode, hosts) job, run once per session."""
    key = (mode, hosts)
    if key not in _JOBS:
        n = len(hosts)
        rank_env = None
        if mode == "multi":
            rank_env = {r: {"COLLCOMM_HOST_ID": h} for r, h in enumerate(hosts)}
        env = {"COLLCOMM_TIMEOUT": CALL_TIMEOUT}
        rank_mode, only = mode, None
        if mode == "shm-staged":
            rank_mode, env["COLLCOMM_CMA"] = "shm", "0"
        if mode == "shm-python":
            rank_mode, env["COLLCOMM_NATIVE"], only = "shm", "0", PYTHON_ONLY
        try:
            _JOBS[key] = run_ranks(_rank_main, n, rank_mode, only,
                                   transport=None if mode == "multi" else rank_mode,
                                   timeout=JOB_TIMEOUT, env=env, rank_env=rank_env)
        except Exception as exc:  # noqa: BLE001 - every test of this configuration reports it
            _JOBS[key] = exc
    result = _JOBS[key]
    if isinstance(result, Exception):
        raise result
    return result


def report(mode: str, hosts: str, collective: str, family: str) -> None:
    results = job(mode, hosts)
    n = len(hosts)
    fails = [(r, f) for r, res in enumerate(results) for f in res["failures"]
             if f[0] == collective and f[1] == family]
    known, unknown = [], []
    for r, (coll, fam, what, msg) in fails:
        reason = next((why for pred, why in KNOWN_BUGS if pred(mode, n, coll, fam, what)), None)
        (known if reason else unknown).append((reason, f"{what}: {msg}"))
    assert not unknown, (f"{collective}/{family} on {config_id(mode, hosts)}: "
                         f"{len(unknown)} failures:\n" + "\n".join(m for _, m in unknown[:40]))
    if known:
        pytest.xfail(str(known[0][0]) + "\n" + "\n".join(m for _, m in known[:10]))


def params() -> list[Any]:
    out = []
    for mode, hosts in CONFIGS:
        cid = config_id(mode, hosts)
        for collective in ALGORITHMS:
            for fam in available(collective):
                if mode == "shm-python" and fam not in PYTHON_ONLY:
                    continue
                out.append(pytest.param(mode, hosts, collective, fam,
                                        id=f"{cid}-{collective}-{fam}"))
        for name in SEQUENCES:
            out.append(pytest.param(mode, hosts, "sequence", name, id=f"{cid}-sequence-{name}"))
    return out


@pytest.mark.timeout(TEST_TIMEOUT)
@pytest.mark.parametrize("mode, hosts, collective, family", params())
def test_family(mode, hosts, collective, family):
    report(mode, hosts, collective, family)
    if collective == "barrier" and supported(family, mode):
        results = job(mode, hosts)
        for rnd in range(2):
            per_rank = [res["barrier"][family][rnd] for res in results]
            last_arrival = max(a for a, _ in per_rank)
            early = [r for r, (_, left) in enumerate(per_rank) if left < last_arrival]
            assert not early, (f"barrier {family} on {config_id(mode, hosts)}, round {rnd}: "
                               f"ranks {early} left before the last one arrived")


@pytest.mark.timeout(TEST_TIMEOUT)
@pytest.mark.parametrize("mode, hosts", [pytest.param(m, h, id=config_id(m, h))
                                         for m, h in CONFIGS])
def test_no_failures_outside_the_table(mode, hosts):
    """Every failure the job recorded belongs to some (collective, family) test above."""
    known = {(c, f) for c in ALGORITHMS for f in available(c)}
    known |= {("sequence", s) for s in SEQUENCES}
    stray = [f for res in job(mode, hosts) for f in res["failures"] if (f[0], f[1]) not in known]
    assert not stray, stray
