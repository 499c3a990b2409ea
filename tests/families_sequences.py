"""The family tests' sequences (tests/test_families.py runs them on every rank of a job;
tests/soak_families.py repeats one): several calls in a row on one group, alternating
families and collectives, crossing size boundaries, or on shared-heap buffers, each
result checked against the numpy reference and recorded in the rank's ``Ctx``.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from collcomm import algorithms
from collcomm.algorithms import available
from collcomm.ops import ReduceOp, resolve
from tests.families_common import HUGE, HUGE_BLOCK, LARGE, Ctx, data, reference, supported


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
        # (past LARGE out of place only, and only up to three ranks: n x HUGE float64s is
        # 29-48 MB a rank at n = 3-5, 1.5 s of the n = 5 job on two cores; the chunked
        # heap all_gather is the same code at any n)
        for inplace in (False, True)[:2 if count <= LARGE else 1 if n <= 3 else 0]:
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

