"""A guided tour: every worked example of the source documents, run for real.

Run it on 4 processes (or any number: every expected value is computed for the actual
world size)::

    collcomm run -n 4 -m collcomm.tour          # 1 machine, 4 ranks
    python -m collcomm.tour                      # a single process: a world of one

Each step prints, in rank order, what every rank held before and after the operation
(``Rank 1: before [...] after [...]``), then one verification line (``all_reduce SUM: OK``).
The exit status is 1 if any check failed.
"""
from __future__ import annotations

import sys
import time
from typing import Any, Callable

import numpy as np

import collcomm as dist
from collcomm import helpers


def _fmt(x: Any) -> str:
    if isinstance(x, np.ndarray):
        return str(x.tolist())
    if isinstance(x, list):
        return "[" + ", ".join(_fmt(v) for v in x) + "]"
    if isinstance(x, dict):
        return "{" + ", ".join(f"{k!r}: {_fmt(v)}" for k, v in x.items()) + "}"
    return repr(x)


class Tour:
    def __init__(self, out: Callable[[str], None] = print) -> None:
        self.rank = dist.get_rank()
        self.n = dist.get_world_size()
        self.out = out
        self.failed: list[str] = []

    def section(self, title: str) -> None:
        dist.barrier()
        if self.rank == 0:
            self.out(f"\n== {title} (world size {self.n}) ==")

    def show(self, before: Any, after: Any) -> None:
        """Print every rank's line on rank 0, in rank order."""
        line = f"Rank {self.rank}: before {_fmt(before)} after {_fmt(after)}"
        lines: list[Any] | None = [None] * self.n if self.rank == 0 else None
        dist.gather_object(line, lines, dst=0)
        if lines is not None:
            for text in lines:
                self.out(text)

    def check(self, name: str, ok: bool) -> bool:
        oks: list[Any] = [None] * self.n
        dist.all_gather_object(oks, bool(ok))
        bad = [r for r, v in enumerate(oks) if not v]
        if bad:
            self.failed.append(name)
        if self.rank == 0:
            self.out(f"{name}: OK" if not bad else f"{name}: FAILED on ranks {bad}")
        dist.barrier()
        return not bad

    # --------------------------------------------------------------------- the examples
    def broadcast(self) -> None:
        self.section("broadcast from rank 0")
        t = np.array([1, 2, 3, 4, 5]) if self.rank == 0 else np.zeros(5, dtype=np.int64)
        before = t.copy()
        dist.broadcast(t, src=0)
        self.show(before, t)
        self.check("broadcast", np.array_equal(t, [1, 2, 3, 4, 5]))

    def reduce(self) -> None:
        self.section("reduce SUM to rank 0")
        t = np.full(5, self.rank + 1)
        before = t.copy()
        dist.reduce(t, dst=0, op=dist.ReduceOp.SUM)
        self.show(before, t)
        want = np.full(5, self.n * (self.n + 1) // 2) if self.rank == 0 else before
        self.check("reduce SUM", np.array_equal(t, want))

    def all_reduce(self) -> None:
        self.section("all_reduce SUM and AVG")
        t = np.full(5, self.rank + 1)
        before = t.copy()
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        self.show(before, t)
        self.check("all_reduce SUM", np.array_equal(t, np.full(5, self.n * (self.n + 1) // 2)))
        a = np.full(2, float(self.rank + 1))
        before = a.copy()
        dist.all_reduce(a, op=dist.ReduceOp.AVG)
        self.show(before, a)
        self.check("all_reduce AVG", np.allclose(a, (self.n + 1) / 2))

    def gather(self) -> None:
        self.section("gather to rank 0")
        t = np.full(5, self.rank + 1)
        out = [np.zeros(5, dtype=t.dtype) for _ in range(self.n)] if self.rank == 0 else None
        dist.gather(t, out, dst=0)
        self.show(t, out)
        if self.rank == 0:
            ok = out is not None and all(np.array_equal(o, np.full(5, i + 1)) for i, o in enumerate(out))
        else:
            ok = out is None
        self.check("gather", ok)

    def scatter(self) -> None:
        self.section("scatter from rank 0")
        chunks = [np.full(5, i + 1) for i in range(self.n)] if self.rank == 0 else None
        t = np.zeros(5, dtype=np.int64)
        before = t.copy()
        dist.scatter(t, chunks, src=0)
        self.show(before, t)
        self.check("scatter", np.array_equal(t, np.full(5, self.rank + 1)))

    def reduce_scatter(self) -> None:
        self.section("reduce_scatter SUM")
        base = np.array([(self.rank + 1) * 1, (self.rank + 1) * 2])
        inputs = [base ** (j + 1) for j in range(self.n)]
        out = np.zeros(2, dtype=base.dtype)
        dist.reduce_scatter(out, inputs, op=dist.ReduceOp.SUM)
        self.show(inputs, out)
        want = sum(np.array([r + 1, 2 * (r + 1)]) ** (self.rank + 1) for r in range(self.n))
        self.check("reduce_scatter SUM", np.array_equal(out, want))

    def all_reduce_by_parts(self) -> None:
        self.section("all_reduce = reduce_scatter + all_gather")
        n = self.n
        x = np.arange(self.rank, self.rank + n)
        mine = np.zeros(1, dtype=x.dtype)
        dist.reduce_scatter_tensor(mine, x)
        full = np.zeros(n, dtype=x.dtype)
        dist.all_gather_into_tensor(full, mine)
        direct = x.copy()
        dist.all_reduce(direct)
        self.show(x, {"reduce_scatter": mine, "all_gather": full, "all_reduce": direct})
        want = n * (n - 1) // 2 + n * np.arange(n)
        self.check("reduce_scatter + all_gather == all_reduce",
                   np.array_equal(mine, want[self.rank:self.rank + 1]) and np.array_equal(full, want)
                   and np.array_equal(direct, want))

    def all_to_all(self) -> None:
        self.section("all_to_all, 2 elements per peer")
        n, k = self.n, 2
        send = np.arange(self.rank * n * k, (self.rank + 1) * n * k).reshape(n, k)
        recv = np.zeros_like(send)
        dist.all_to_all_single(recv, send)
        self.show(send, recv)
        want = np.array([[j * n * k + self.rank * k + c for c in range(k)] for j in range(n)])
        self.check("all_to_all", np.array_equal(recv, want))

    def objects(self) -> None:
        self.section("objects (mpi4py style)")
        n, r = self.n, self.rank
        total = dist.reduce_object((r + 1) ** 2, op="sum", dst=0)
        self.show((r + 1) ** 2, total)
        self.check("reduce_object SUM", total == (n * (n + 1) * (2 * n + 1) // 6 if r == 0 else None))
        biggest = dist.all_reduce_object((r + 1) * 2, op=dist.ReduceOp.MAX)
        self.show((r + 1) * 2, biggest)
        self.check("all_reduce_object MAX", biggest == 2 * n)
        box: list[Any] = [{"msg": "Hello", "vec": np.arange(4)} if r == 0 else None]
        before = list(box)
        dist.broadcast_object_list(box, src=0)
        self.show(before, box)
        self.check("broadcast_object_list",
                   box[0]["msg"] == "Hello" and np.array_equal(box[0]["vec"], np.arange(4)))
        out: list[Any] = [None]
        parts = np.split(np.arange(3 * n), n) if r == 0 else None
        dist.scatter_object_list(out, parts, src=0)
        self.show(None, out[0])
        self.check("scatter_object_list", np.array_equal(out[0], [3 * r, 3 * r + 1, 3 * r + 2]))

    def barrier(self) -> None:
        self.section("barrier: rank r sleeps 0.1*r s")
        dist.barrier()
        start = time.monotonic()
        time.sleep(0.1 * self.rank)
        dist.barrier()
        elapsed = time.monotonic() - start
        self.show(f"slept {0.1 * self.rank:.1f} s", f"left after {elapsed:.2f} s")
        self.check("barrier", elapsed >= 0.1 * (self.n - 1) - 0.02)

    def helpers(self) -> None:
        self.section("seed-004 helpers, losses 0.5 0.3 0.7 0.4")
        losses = [0.5, 0.3, 0.7, 0.4]
        mine = [losses[r % 4] for r in range(self.n)]
        loss = mine[self.rank]
        total = helpers.reduce_tensor(loss, op="sum")
        mean = helpers.reduce_tensor(loss, op="mean")
        self.show(loss, {"sum": round(total, 6), "mean": round(mean, 6)})
        self.check("reduce_tensor sum/mean", abs(total - sum(mine)) < 1e-9
                   and abs(mean - sum(mine) / self.n) < 1e-9 and loss == mine[self.rank])
        gathered = helpers.gather_tensor(loss, dst=0)
        self.show(loss, gathered)
        self.check("gather_tensor", gathered == mine if self.rank == 0 else gathered is None)
        value = helpers.broadcast_tensor(loss, src=0)
        self.show(loss, value)
        self.check("broadcast_tensor", value == mine[0])
        self.check("is_main_process", helpers.is_main_process() == (self.rank == 0)
                   and helpers.get_world_size() == self.n and helpers.get_device() == "cpu")

    def run(self) -> list[str]:
        for step in (self.broadcast, self.reduce, self.all_reduce, self.gather, self.scatter,
                     self.reduce_scatter, self.all_reduce_by_parts, self.all_to_all, self.objects,
                     self.barrier, self.helpers):
            step()
        dist.barrier()
        if self.rank == 0:
            self.out("\nall checks passed" if not self.failed
                     else f"\nFAILED: {', '.join(self.failed)}")
        return self.failed


def main(argv: list[str] | None = None) -> int:
    """Run the tour; returns the exit status (0: every check passed)."""
    owner = not dist.is_initialized()
    if owner:
        dist.init_process_group()
    try:
        failed = Tour(lambda s: print(s, flush=True)).run()
    finally:
        if owner:
            dist.destroy_process_group()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
