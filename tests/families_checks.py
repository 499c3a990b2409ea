"""The family tests' checks of each collective (tests/test_families.py runs them on
every rank of a job): ``CHECKS[collective](ctx, family)`` runs every case of one family
of one collective (roots, in place or not, counts, dtypes, ops) and records what differs
from the numpy reference in ``ctx``; :func:`rejected` checks that a family that cannot
work in the job refuses every collective cleanly.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Iterator

import numpy as np

from collcomm import algorithms
from collcomm.algorithms import ALGORITHMS
from collcomm.errors import InvalidArgumentError
from collcomm.ops import ReduceOp, resolve
from tests.families_common import (DTYPES, HUGE, HUGE_BLOCK, LARGE, LARGE_BLOCK, OPS, SMALL_COUNTS, Ctx,
                                   a2a_block, a2a_counts, data, reference)


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


def rooted_cases(ctx: Ctx, fam: str) -> Iterator[tuple[int, bool, Any, int, str]]:
    """Every (root, in place, dtype, block count) a rooted gather or scatter of ``fam`` is
    checked with, and its description."""
    for root in range(ctx.n):
        for inplace in (False, True):
            for dtype in DTYPES:
                for count in block_counts(ctx, fam, root in edge_roots(ctx.n) and not inplace
                                          and ctx.large(fam), dtype):
                    yield root, inplace, dtype, count, \
                        f"root={root} inplace={inplace} count={count} {np.dtype(dtype)}"


def c_gather(ctx: Ctx, fam: str) -> None:
    n, me = ctx.n, ctx.rank
    for root, inplace, dtype, count, what in rooted_cases(ctx, fam):
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
    for root, inplace, dtype, count, what in rooted_cases(ctx, fam):
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
