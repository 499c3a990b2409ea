"""Random collective calls checked against numpy: the program tests/test_random_calls.py
runs on every rank (and ``python -m collcomm run -n N tests/random_calls.py SEED CALLS``
runs by hand, its options from ``RANDOM_*`` variables: see :class:`Options`).

Every rank draws the same calls from one seed: the collective, dtype, op, root, in place
or not, the group (the world or one of two subgroups) and a byte count near the sizes
where the library changes its way (a slot, the CMA and pair thresholds, one-shot limits,
0, 1, odd counts). Each rank's data is a function of its rank, so every rank computes
what it must get with numpy. A rank may make its calls asynchronously (``async_op``:
waited in batches of one to three, in or against the order they were made) while
another makes the same calls blocking, be on the pure-Python path, or use shared-memory
buffers (``collcomm.empty``). What differs is returned, one line a call.

Why: whether a call is queued, started in two parts or run whole, natively or in Python,
is each rank's own business; the way the call goes must be every rank's. Two ranks that
disagree read memory the other has let go of, or wait for each other forever: the
failure a fixed list of cases does not think of (session 26 found a reduce by CMA that
one-sided asynchrony broke this way).
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

K = 1024
#: byte counts a call is drawn near (each then moved by -2..2 elements)
BOUNDS = [0, 1, 3, 8 * K, 16 * K, 32 * K, 64 * K, 128 * K, 256 * K, 512 * K, K * K, 2 * K * K,
          4 * K * K, 5 * K * K]
DTYPES = [np.float32, np.float64, np.int32, np.int64, np.int8, np.uint8, np.float16, np.int16,
          np.complex64, np.uint32, np.uint64, np.bool_]
CALLS = ["all_reduce", "reduce", "broadcast", "all_gather", "all_gather_list", "gather", "scatter",
         "reduce_scatter", "all_to_all", "all_to_all_uneven", "sendrecv", "barrier"]


@dataclass
class Options:
    """What this rank does differently (from the environment, per rank)."""
    asynchronous: bool = False     # RANDOM_ASYNC_RANKS: a comma list of ranks
    shared: bool = False           # RANDOM_SHARED=1: buffers from collcomm.empty
    groups: bool = False           # RANDOM_GROUPS=1: subgroups too (from 3 ranks)
    skip: list[str] = field(default_factory=list)   # RANDOM_SKIP: calls left out

    @classmethod
    def from_env(cls, rank: int) -> "Options":
        env = os.environ
        return cls(asynchronous=str(rank) in env.get("RANDOM_ASYNC_RANKS", "").split(","),
                   shared=env.get("RANDOM_SHARED") == "1", groups=env.get("RANDOM_GROUPS") == "1",
                   skip=[c for c in env.get("RANDOM_SKIP", "").split(",") if c])


def _operand(rank: int, count: int, dt: np.dtype, op: str) -> np.ndarray:
    """Rank ``rank``'s data: small integers (exact sums in every dtype; PROD of 1s and 2s)."""
    x = (np.arange(count) * 7 + rank * 13) % 5
    return (1 + x % 2 if op == "prod" else x % 2 if dt.kind == "b" else x).astype(dt)


def _fold(parts: list[np.ndarray], op: str, dt: np.dtype) -> np.ndarray:
    """What a reduction of ``parts`` gives, in rank order (AVG: the sum, then / n)."""
    ufunc = {"sum": np.add, "avg": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum,
             "band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor,
             "land": np.logical_and, "lor": np.logical_or, "lxor": np.logical_xor}[op]
    acc = parts[0].copy()
    if op in ("land", "lor", "lxor"):
        acc = acc.astype(bool).astype(dt)
    for p in parts[1:]:
        acc = ufunc(acc, p).astype(dt)
    return (acc / len(parts)).astype(dt) if op == "avg" else acc


@dataclass
class Drawn:
    """One call, drawn the same on every rank."""
    name: str
    dt: np.dtype
    op: str
    root: int          # the group's local rank
    in_place: bool
    count: int         # elements: the call's, or one rank's block
    group: int         # index into the groups
    split: np.ndarray  # all_to_all_uneven's table: split[i][j] what rank i sends j
    batch: int         # asynchronous calls waited for once this many are pending
    reverse: bool      # ... in reverse order

    def __str__(self) -> str:
        return (f"{self.name} {self.dt} count={self.count} op={self.op} root={self.root} "
                f"in_place={self.in_place} group={self.group}")


def draw(rng: np.random.Generator, n_max: int, calls: list[str], groups: int) -> Drawn:
    name = calls[rng.integers(len(calls))]
    dt = np.dtype(DTYPES[rng.integers(len(DTYPES))])
    ops = ["sum", "prod", "land", "lor", "lxor"] + (["max", "min"] if dt.kind != "c" else []) + \
        (["band", "bor", "bxor"] if dt.kind in "iu" else []) + (["avg"] if dt.kind in "fc" else [])
    op = ops[rng.integers(len(ops))]
    root, in_place = int(rng.integers(n_max)), bool(rng.integers(2))
    count = max(0, BOUNDS[rng.integers(len(BOUNDS))] // dt.itemsize + int(rng.integers(-2, 3)))
    group = int(rng.integers(groups))
    split = rng.integers(0, max(1, count // n_max + 2), size=(n_max, n_max))
    return Drawn(name, dt, op, root, in_place, count, group, split, int(rng.integers(1, 4)),
                 bool(rng.integers(2)))


class Caller:
    """Makes the drawn calls on this rank and checks them (see the module doc)."""

    def __init__(self, opts: Options, dist: Any = None) -> None:
        """``dist``: the module whose ``get_rank``, ``new_group`` and ``barrier`` it uses
        (collcomm; torch.distributed for random_calls_torch)."""
        if dist is None:
            import collcomm as dist
        self.dist, self.opts = dist, opts
        self.rank, world = dist.get_rank(), dist.get_world_size()
        self.members = [list(range(world))]
        self.groups: list[Any] = [None]
        if opts.groups and world >= 3:
            for ranks in (list(range(1, world)), list(range(0, world, 2))):
                self.members.append(ranks)
                self.groups.append(dist.new_group(ranks))
        self.pending: list[tuple[Any, Callable[[], None]]] = []
        self.bad: list[str] = []

    def buffer(self, count: int, dt: np.dtype, grp: Any, fill: np.ndarray | None = None) -> np.ndarray:
        b = self.dist.empty(count, dt, group=grp) if self.opts.shared else np.empty(count, dt)
        if fill is not None:
            b[...] = fill
        return b

    def call(self, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        return fn(*args, async_op=True, **kw) if self.opts.asynchronous else fn(*args, **kw)

    def barrier(self) -> None:
        """The closing barrier of the world (after the last calls' checks)."""
        self.dist.barrier()

    def settle(self, reverse: bool) -> None:
        for w, _ in (reversed(self.pending) if reverse else self.pending):
            if w is not None:
                w.wait()
        for _, check in self.pending:      # (each check first overwrites its call's inputs:
            check()                         # a rank still reading them would get wrong data)
        self.pending.clear()

    def run(self, c: Drawn, index: int) -> None:
        ranks = self.members[c.group]
        if self.rank not in ranks:
            return
        work, check = self._one(c, ranks, f"call {index}: {c}")
        self.pending.append((work, check))
        if not self.opts.asynchronous or len(self.pending) >= c.batch:
            self.settle(c.reverse)

    def _one(self, c: Drawn, ranks: list[int], what: str) -> tuple[Any, Callable[[], None]]:
        d, grp, n, me = self.dist, self.groups[c.group], len(ranks), ranks.index(self.rank)
        dt, op, k, root = c.dt, c.op, c.count, c.root % n
        groot = ranks[root]
        rop = getattr(d.ReduceOp, op.upper())
        data = lambda r, m: _operand(r, m, dt, op)   # noqa: E731
        each = lambda m: [data(r, m) for r in range(n)]   # noqa: E731
        got: Callable[[], Any] = lambda: None   # noqa: E731
        want: np.ndarray | None = None
        inputs: list[np.ndarray] = []       # read-only inputs, overwritten once the call is done
        w = None
        if c.name == "all_reduce":
            x = self.buffer(k, dt, grp, data(me, k))
            w = self.call(d.all_reduce, x, rop, group=grp)
            got, want = (lambda: x), _fold(each(k), op, dt)
        elif c.name == "reduce":
            x = self.buffer(k, dt, grp, data(me, k))
            w = self.call(d.reduce, x, groot, rop, group=grp)
            if me != root:
                inputs.append(x)
            if me == root:
                got, want = (lambda: x), _fold(each(k), op, dt)
        elif c.name == "broadcast":
            x = self.buffer(k, dt, grp, data(me, k))
            w = self.call(d.broadcast, x, groot, group=grp)
            got, want = (lambda: x), data(root, k)
        elif c.name == "all_gather":
            out = self.buffer(k * n, dt, grp)
            src = out[me * k:(me + 1) * k] if c.in_place else self.buffer(k, dt, grp)
            src[...] = data(me, k)
            inputs += [] if c.in_place else [src]
            w = self.call(d.all_gather_into_tensor, out, src, group=grp)
            got, want = (lambda: out), np.concatenate(each(k))
        elif c.name == "all_gather_list":
            outs = [np.empty(k, dt) for _ in range(n)]
            w = self.call(d.all_gather, outs, self.buffer(k, dt, grp, data(me, k)), group=grp)
            got, want = (lambda: np.concatenate(outs)), np.concatenate(each(k))
        elif c.name == "gather":
            outs = [self.buffer(k, dt, grp) for _ in range(n)]   # (collective when shared:
            spare = self.buffer(k, dt, grp)                      # every rank makes them all)
            mine = outs[me] if c.in_place and me == root else spare
            mine[...] = data(me, k)
            inputs += [] if mine is not spare else [spare]
            w = self.call(d.gather, mine, outs if me == root else None, groot, group=grp)
            if me == root:
                got, want = (lambda: np.concatenate(outs)), np.concatenate(each(k))
        elif c.name == "scatter":
            full = self.buffer(k * n, dt, grp, data(root, k * n))
            parts = [full[r * k:(r + 1) * k] for r in range(n)]
            spare = self.buffer(k, dt, grp)
            out = parts[me] if c.in_place and me == root else spare
            w = self.call(d.scatter, out, parts if me == root else None, groot, group=grp)
            got, want = (lambda: out), data(root, k * n)[me * k:(me + 1) * k]
        elif c.name == "reduce_scatter":
            out = self.buffer(k, dt, grp)
            inputs.append(self.buffer(k * n, dt, grp, data(me, k * n)))
            w = self.call(d.reduce_scatter_tensor, out, inputs[0], rop, group=grp)
            got, want = (lambda: out), _fold(each(k * n), op, dt)[me * k:(me + 1) * k]
        elif c.name == "all_to_all":
            out = self.buffer(k * n, dt, grp)
            inputs.append(self.buffer(k * n, dt, grp, data(me, k * n)))
            w = self.call(d.all_to_all_single, out, inputs[0], group=grp)
            got = lambda: out   # noqa: E731
            want = np.concatenate([data(r, k * n)[me * k:(me + 1) * k] for r in range(n)])
        elif c.name == "all_to_all_uneven":
            split = c.split[:n, :n]
            ins, outs = [int(v) for v in split[me]], [int(split[r][me]) for r in range(n)]
            out = np.empty(sum(outs), dt)
            w = self.call(d.all_to_all_single, out, data(me, sum(ins)), outs, ins, group=grp)
            got = lambda: out   # noqa: E731
            want = np.concatenate([data(r, int(split[r].sum()))[int(split[r][:me].sum()):][:outs[r]]
                                   for r in range(n)])
        elif c.name == "sendrecv" and n > 1:
            rb = np.empty(k, dt)
            ops = [d.P2POp(d.isend, data(me, k), ranks[(me + 1) % n], grp),
                   d.P2POp(d.irecv, rb, ranks[(me - 1) % n], grp)]
            for p in d.batch_isend_irecv(ops):
                p.wait()
            got, want = (lambda: rb), data((me - 1) % n, k)
        elif c.name == "barrier":
            d.barrier(group=grp)

        return w, self.checker(got, want, inputs, what)

    def checker(self, got: Callable[[], Any], want: np.ndarray | None, inputs: list[np.ndarray],
                what: str) -> Callable[[], None]:
        """A call's check, run once it is done: its read-only ``inputs`` overwritten first (a
        rank still reading them gets wrong data), then ``got()`` compared with ``want``."""
        def check() -> None:
            for x in inputs:
                x[...] = 1 if x.dtype.kind == "b" else 99
            if want is None:
                return
            g = np.asarray(got()).reshape(-1)
            if g.shape != want.shape or not np.array_equal(g, want):
                where = "shape" if g.shape != want.shape else np.nonzero(g != want)[0][:4].tolist()
                self.bad.append(f"rank {self.rank} {what}: wrong at {where}")
        return check


def drive(caller: Caller, calls: list[str], seed: int, count: int) -> list[str]:
    """``count`` calls drawn from ``seed`` among ``calls`` made by ``caller``; what differed."""
    rng = np.random.default_rng(seed)
    names = [c for c in calls if c not in caller.opts.skip]
    for i in range(count):
        caller.run(draw(rng, len(caller.members[0]), names, len(caller.groups)), i)
    caller.settle(False)
    caller.barrier()
    return caller.bad


def run(seed: int, count: int) -> list[str]:
    """This rank's part of ``count`` random calls from ``seed`` (the job already
    initialised); what differed."""
    import collcomm as dist
    return drive(Caller(Options.from_env(dist.get_rank())), CALLS, seed, count)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from tests.random_jobs import main
    main(run)
