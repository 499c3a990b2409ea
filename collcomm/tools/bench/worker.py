"""What runs inside every rank: the library-neutral sweep and the collcomm backend.

A *backend* wraps one library (collcomm here; mpi4py and torch Gloo in ``peers.py``) behind
a few calls: ``barrier``, ``bcast_int`` (rank 0's value to all), ``allgather_floats`` and
``make`` (buffers + one callable for an op). :func:`sweep` drives any backend the same
way, so every library is measured by the same code:

    warmup (>= 1 call) -> rank 0 picks the iteration count, broadcasts it ->
    iters x (barrier; t0; op; t1) -> per-rank median and mean -> gathered to every rank
    -> optional check (refill inputs with a rank-dependent pattern, one more call, count
    wrong elements).

``python -m collcomm.tools.bench.worker OPTIONS.json OUT.json`` is the collcomm rank program;
rank 0 writes the rows to OUT.json.
"""
from __future__ import annotations

import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .checks import count_wrong, expected, pattern, timing_fill
from .options import REDUCING, ROOTED, Options, collcomm_env, count_for, format_size
from .facts import collect as collect_facts
from .facts import verdicts
from .placement import placed_empty, rank_offset
from .report import make_row
from .turns import RankTurns, Stopped, cells


class Unsupported(Exception):
    """The library cannot run this op / mode / dtype / redop; the row records why."""


@dataclass
class Case:
    """One op at one size: ``call()`` runs it once; ``send`` is this rank's whole input
    (filled before a check), ``recv`` the output to verify (None: nothing to check here)."""

    call: Callable[[], Any]
    send: np.ndarray | None
    recv: np.ndarray | None


# --------------------------------------------------------------------------- the sweep

def write_progress(path: str, done: int, total: int, label: str) -> None:
    """``done total label`` into the file the parent draws its bar from (replaced whole;
    a failed write is skipped)."""
    tmp = path + ".tmp"
    try:
        with open(tmp, "w") as fh:
            fh.write(f"{done} {total} {label}\n")
        os.replace(tmp, path)
    except OSError:
        pass


class Progress:
    """Rank 0 reports each cell done (write_progress)."""

    def __init__(self, path: str | None, total: int) -> None:
        self.path, self.total, self.done = path, total, 0

    def step(self, label: str) -> None:
        self.done += 1
        if self.path:
            write_progress(self.path, self.done, self.total, label)


def pick_iters(estimate_s: float, opts: Options) -> int:
    """Iterations for about ``opts.time_per_size`` seconds, within [min_iters, iters]."""
    lo, hi = max(1, min(opts.min_iters, opts.iters)), opts.iters
    if estimate_s <= 0:
        return hi
    return int(max(lo, min(hi, math.ceil(opts.time_per_size / estimate_s))))


def run_case(backend: Any, case: Case, opts: Options) -> tuple[list[float], int]:
    """Warm up, agree on the iteration count, time it; return this rank's times (s), iters."""
    perf, barrier, call = time.perf_counter, backend.barrier, case.call
    loop = []
    for _ in range(max(1, opts.warmup)):
        a = perf()
        barrier()
        call()
        loop.append(perf() - a)
    iters = pick_iters(statistics.median(loop), opts) if backend.rank == 0 else 0
    iters = backend.bcast_int(iters)
    times = [0.0] * iters
    for i in range(iters):
        barrier()
        t0 = perf()
        call()
        times[i] = perf() - t0
    return times, iters


def _run_check(backend: Any, case: Case, op: str, count: int, per: int, opts: Options,
               root: int) -> int:
    n, rank = backend.size, backend.rank
    if case.send is not None:
        size = case.send.size
        case.send.reshape(-1)[:] = pattern(rank, np.arange(size), opts.redop, opts.dtype)
    backend.barrier()
    case.call()
    backend.barrier()
    if case.recv is None:
        return 0
    want = expected(op, rank, n, count, per, opts.redop, opts.dtype, root)
    return 0 if want is None else count_wrong(case.recv, want)


def measure_cell(backend: Any, opts: Options, lib: str, op: str, size: int,
                 mode: str) -> dict[str, Any]:
    """One (op, size, mode) on ``backend``: the row every rank gets (collective)."""
    n = backend.size
    root = opts.root % n
    itemsize = np.dtype(opts.dtype).itemsize
    count, per = count_for(op, size, itemsize, n)
    base = dict(lib=lib, op=op, size=count * itemsize, count=count,
                dtype=opts.dtype, redop=opts.redop if op in REDUCING else "none",
                root=root if op in ROOTED else -1, mode=mode, nproc=n)
    error = None
    try:
        if op == "sendrecv" and n < 2:
            raise Unsupported("sendrecv needs at least 2 ranks")
        case = backend.make(op, mode, count, per, opts.dtype, opts.redop, root)
        if case.send is not None:
            case.send.reshape(-1)[:] = timing_fill(opts.redop)
        times, iters = run_case(backend, case, opts)
    except Unsupported as exc:
        error = str(exc) or "unsupported"
    except Exception as exc:  # a peer library refusing an op, e.g. Gloo + avg
        if lib == "collcomm":  # a collcomm failure is a bug: fail loudly, whole job
            raise
        error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:160]
    if error is not None:
        backend.barrier()
        return make_row(**base, time_us=None, error=error)
    wrong = -1
    if opts.check:
        try:
            wrong = _run_check(backend, case, op, count, per, opts, root)
        except Exception as exc:
            if lib == "collcomm":
                raise
            print(f"collcomm bench: {lib} {op} check failed: {exc}", file=sys.stderr)
            wrong = count
    med = statistics.median(times) if times else 0.0
    mean = statistics.fmean(times) if times else 0.0
    stats = backend.allgather_floats([med, mean, float(max(wrong, 0))])
    meds, means, wrongs = stats[:, 0], stats[:, 1], stats[:, 2]
    return make_row(
        **base, time_us=float(meds.max()) * 1e6, iters=iters,
        wrong=int(wrongs.sum()) if opts.check else -1,
        lat_avg_us=float(means.mean()) * 1e6, lat_min_us=float(means.min()) * 1e6,
        lat_max_us=float(means.max()) * 1e6)


def sweep(backend: Any, opts: Options, lib: str) -> list[dict[str, Any]]:
    """Every (op, size, mode) of ``opts`` on ``backend``; the same rows on every rank. With
    ``opts.turns_path`` (set by the parent of ``--interleave size``) each cell waits for its
    turns (turns.py), is measured ``opts.rounds`` times, and the rows carry their round."""
    backend.offset = rank_offset(opts.offset, opts.skew, backend.rank)
    if opts.turns_path:
        return _sweep_in_turns(backend, opts, lib)
    table = cells(opts, backend.size)
    progress = Progress(opts.progress_path if backend.rank == 0 else None, len(table))
    rows = []
    for op, size, mode in table:
        rows.append(measure_cell(backend, opts, lib, op, size, mode))
        progress.step(f"{op} {format_size(size)} {mode}")
    return rows


def _sweep_in_turns(backend: Any, opts: Options, lib: str) -> list[dict[str, Any]]:
    if backend.size != opts.nproc:     # (the parent's schedule is for opts.nproc ranks)
        raise RuntimeError(f"collcomm bench: {lib} runs {backend.size} ranks, the turns were "
                           f"made for {opts.nproc}")
    turns = RankTurns(opts, lib, backend.rank)
    table = turns.table
    backend.barrier()           # every rank up: only then may the parent start the turns
    turns.ready()
    rows = []
    try:
        for k, cell, rnd in turns.mine:
            turns.wait(k)
            op, size, mode = table[cell]
            row = measure_cell(backend, opts, lib, op, size, mode)
            row["round"] = rnd
            rows.append(row)
            turns.done()
    except Stopped:
        pass
    return rows


# --------------------------------------------------------------------------- collcomm backend

class CollcommBackend:
    """collcomm itself; ``alloc="shared"`` takes buffers from ``collcomm.empty``."""

    name = "collcomm"

    def __init__(self, alloc: str = "numpy") -> None:
        import collcomm as dist

        self.dist = dist
        if not dist.is_initialized():
            dist.init_process_group()
        self.rank, self.size = dist.get_rank(), dist.get_world_size()
        self.shared = alloc == "shared" and hasattr(dist, "empty")
        if alloc == "shared" and not self.shared and self.rank == 0:
            print("collcomm bench: collcomm.empty is not available yet; --alloc shared falls "
                  "back to numpy buffers", file=sys.stderr)
        self._i64 = np.zeros(1, dtype=np.int64)

    def barrier(self) -> None:
        self.dist.barrier()

    def bcast_int(self, value: int) -> int:
        self._i64[0] = value
        self.dist.broadcast(self._i64, src=0)
        return int(self._i64[0])

    def allgather_floats(self, values: list[float]) -> np.ndarray:
        mine = np.asarray(values, dtype=np.float64)
        out = np.empty(mine.size * self.size, dtype=np.float64)
        self.dist.all_gather_into_tensor(out, mine)
        return out.reshape(self.size, mine.size)

    offset: int | None = 0     # where its numpy buffers start past a page (sweep sets it)

    def alloc(self, count: int, dtype: str) -> np.ndarray:
        arr = self.dist.empty((count,), dtype) if self.shared else placed_empty(count, dtype, self.offset)
        arr.fill(0)  # touch every page now, not inside the timed loop
        return arr

    def _op(self, redop: str) -> Any:
        R = self.dist.ReduceOp
        return {"sum": R.SUM, "prod": R.PRODUCT, "max": R.MAX, "min": R.MIN, "avg": R.AVG}[redop]

    def make(self, op: str, mode: str, count: int, per: int, dtype: str, redop: str,
             root: int) -> Case:
        d, n, r, ip = self.dist, self.size, self.rank, mode == "ip"
        A = self.alloc
        if op == "all_reduce":
            buf, rop = A(count, dtype), self._op(redop)
            return Case(lambda: d.all_reduce(buf, op=rop), buf, buf)
        if op == "broadcast":
            buf = A(count, dtype)
            return Case(lambda: d.broadcast(buf, src=root), buf, buf)
        if op == "reduce":
            buf, rop = A(count, dtype), self._op(redop)
            return Case(lambda: d.reduce(buf, dst=root, op=rop), buf, buf if r == root else None)
        if op == "all_gather":
            out = A(n * per, dtype)
            inp = out[r * per:(r + 1) * per] if ip else A(per, dtype)
            return Case(lambda: d.all_gather_into_tensor(out, inp), inp, out)
        if op == "reduce_scatter":
            inp, rop = A(n * per, dtype), self._op(redop)
            out = inp[r * per:(r + 1) * per] if ip else A(per, dtype)
            return Case(lambda: d.reduce_scatter_tensor(out, inp, op=rop), inp, out)
        if op in ("gather", "scatter"):
            # collcomm.empty is collective: every rank allocates the same buffers
            big, small = A(n * per, dtype), A(per, dtype)
            views = [big[i * per:(i + 1) * per] for i in range(n)]
            mine = views[r] if ip and r == root else small
            if op == "gather":
                if r == root:
                    return Case(lambda: d.gather(mine, views, dst=root), mine, big)
                return Case(lambda: d.gather(mine, None, dst=root), mine, None)
            if r == root:
                return Case(lambda: d.scatter(mine, views, src=root), big, mine)
            return Case(lambda: d.scatter(mine, None, src=root), None, mine)
        if op == "all_to_all":
            out = A(n * per, dtype)
            inp = out if ip else A(n * per, dtype)
            return Case(lambda: d.all_to_all_single(out, inp), inp, out)
        if op == "barrier":
            return Case(d.barrier, None, None)
        if op == "sendrecv":
            if ip:
                raise Unsupported("sendrecv has no in-place form")
            sbuf, rbuf = A(count, dtype), A(count, dtype)
            ops = [d.P2POp(d.isend, sbuf, (r + 1) % n), d.P2POp(d.irecv, rbuf, (r - 1) % n)]

            def call() -> None:
                for w in d.batch_isend_irecv(ops):
                    w.wait()
            return Case(call, sbuf, rbuf)
        raise Unsupported(f"unknown op {op}")

    def close(self) -> None:
        self.dist.destroy_process_group()


def run_in_job(opts: Options) -> list[dict[str, Any]]:
    """Sweep with collcomm in the current (already launched) job; every rank gets the rows."""
    env = collcomm_env(opts)
    os.environ.update(env)  # read at init / per call by collcomm
    backend = CollcommBackend(opts.alloc)
    try:
        rows = sweep(backend, opts, "collcomm")
        found = verdicts(collect_facts(), backend.allgather_floats)   # (what it met: facts.py)
        for row in rows:
            row["facts"] = found
        return rows
    finally:
        backend.close()


def main(argv: list[str] | None = None) -> int:
    import json

    argv = sys.argv[1:] if argv is None else argv
    with open(argv[0]) as fh:
        opts = Options.from_json(fh.read())
    rows = run_in_job(opts)
    if int(os.environ.get("RANK", "0")) == 0 and len(argv) > 1:
        with open(argv[1], "w") as fh:
            json.dump(rows, fh)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
