"""``collcomm explain OP --algo A -n N [--count K] [--out F.html|F.gif|F.svg]``: watch an algorithm.

It runs OP with family A for real on N ranks (N processes on this machine meeting through a
file store; ``hierarchical`` gets two fake hosts, so its TCP tier is real too), each
rank's call wrapped in a :class:`~collcomm.core.tracing.TracingComm` that records every
message and arena sync. The data make the picture: rank r contributes the integer
``2**r`` (int64, SUM), so any value is the set of ranks whose contributions it holds
(all_to_all blocks carry their source instead, broadcast/scatter the root's mark). After
each step of each rank the buffer is copied, and steps are aligned across ranks (a step
that receives a message is not earlier than the step that sent it), one frame per step
(:mod:`~collcomm.tools.explain_frames`).

Beside the frames it prints, per rank, the bytes sent, against the α-β cost model of
:mod:`collcomm.algorithms.cost` (its α coefficient is the rounds, its β coefficient the
bytes on the critical path: e.g. ring all_reduce 2(N−1) rounds and 2(N−1)/N·K bytes per
rank), and the model's time against the measured one (median of 20 untraced runs).

Output: a terminal grid per step (default), or ``--out F.html`` (one self-contained page,
play/pause/step, ``#last`` opens on the final frame), ``--out F.gif`` (an animated GIF, one
frame per step: :mod:`~collcomm.tools.explain_raster`) or ``--out F.svg`` (every frame).
"""
from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

from .explain_frames import build

ROOTED = ("broadcast", "reduce", "gather", "scatter")
MASK_OPS = ("all_reduce", "reduce", "reduce_scatter", "all_gather", "gather", "broadcast",
            "scatter")


# ---------------------------------------------------------------------------- one rank
def _inputs(op: str, rank: int, n: int, k: int) -> tuple[tuple, np.ndarray | None, list[int]]:
    """(arguments after comm, the array shown, chunk bounds in elements)."""
    from ..algorithms.ring import chunk_bounds

    mark = np.int64(1) << rank
    add = _sum
    blocks = [i * k for i in range(n + 1)]
    if op == "all_reduce":
        buf = np.full(k, mark, dtype=np.int64)
        return (buf, add), buf, chunk_bounds(k, n)
    if op == "reduce":
        send = np.full(k, mark, dtype=np.int64)
        recv = np.zeros(k, dtype=np.int64) if rank == 0 else None
        return (send, recv, add, 0), (recv if rank == 0 else send), chunk_bounds(k, n)
    if op == "broadcast":
        buf = np.full(k, 1 if rank == 0 else 0, dtype=np.int64)
        return (buf, 0), buf, chunk_bounds(k, n)
    if op == "all_gather":
        send = np.full(k, mark, dtype=np.int64)
        recv = np.zeros(n * k, dtype=np.int64)
        return (send, recv), recv, blocks
    if op == "gather":
        send = np.full(k, mark, dtype=np.int64)
        recv = np.zeros(n * k, dtype=np.int64) if rank == 0 else None
        return (send, recv, 0), (recv if rank == 0 else send), (blocks if rank == 0 else [0, k])
    if op == "scatter":
        send = np.repeat(np.int64(1) << np.arange(n, dtype=np.int64), k) if rank == 0 else None
        recv = np.zeros(k, dtype=np.int64)
        return (send, recv, 0), recv, [0, k]
    if op == "reduce_scatter":
        send = np.full(n * k, mark, dtype=np.int64)
        recv = np.zeros(k, dtype=np.int64)
        return (send, recv, add), recv, [0, k]
    if op == "all_to_all":
        send = np.repeat(rank * n + np.arange(n, dtype=np.int64) + 1, k)
        recv = np.zeros(n * k, dtype=np.int64)
        return (send, [k] * n, recv, [k] * n), recv, blocks
    if op == "barrier":
        return (), None, [0]
    raise ValueError(f"explain: unknown collective {op!r}")


def _sum(acc: np.ndarray, other: np.ndarray) -> None:
    np.add(acc, other, out=acc)


def _cells(arr: np.ndarray | None, bounds: list[int]) -> list[int]:
    if arr is None:
        return []
    return [int(arr[a]) if b > a else 0 for a, b in zip(bounds, bounds[1:])]


def worker(folder: str, pairs: list[tuple[str, str]], count: int, repeats: int) -> None:
    """One rank of an explain job (``python -m collcomm.tools.explain --worker ...``): runs
    each (op, algorithm) of ``pairs`` traced, then ``repeats`` times untraced."""
    import collcomm as dist
    from ..core import runtime

    rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group(init_method=f"file://{folder}/store", rank=rank, world_size=n)
    results = [_one(runtime._world, op, algo, rank, n, count, repeats) for op, algo in pairs]
    with open(os.path.join(folder, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)
    dist.destroy_process_group()


def _one(g: Any, op: str, algo: str, rank: int, n: int, count: int, repeats: int) -> dict[str, Any]:
    from ..algorithms import registry
    from ..core.tracing import TracingComm

    family = registry.ALGORITHMS[op][algo]
    args, shown, bounds = _inputs(op, rank, n, count)
    base = shown.__array_interface__["data"][0] if shown is not None else 0
    snaps: list[dict[str, Any]] = []
    msgs: list[dict[str, Any]] = []

    def chunk_of(arr: np.ndarray) -> int | None:
        if shown is None or not arr.nbytes:
            return None
        off = (arr.__array_interface__["data"][0] - base) // 8
        if 0 <= off < shown.size:
            for i, (a, b) in enumerate(zip(bounds, bounds[1:])):
                if a <= off < b:
                    return i
        return None

    def on_post(c: Any, kind: str, arr: np.ndarray, peer: int, msg: dict[str, Any]) -> None:
        info = {"kind": kind, "peer": peer, "bytes": msg["bytes"], "step": msg["step"],
                "flow": msg["flow"], "chunk": chunk_of(arr)}
        if kind == "send" and arr.dtype == np.int64 and arr.size:
            info["value"] = int(arr[0])
        msgs.append(info)

    def on_step(c: Any, why: str) -> None:
        snaps.append({"step": c.step, "cells": _cells(shown, bounds)})

    snaps.append({"step": 0, "cells": _cells(shown, bounds)})
    box: list[Any] = []

    def body(comm: Any) -> None:
        t = TracingComm(comm, ("explain", comm._tag), on_post=on_post, on_step=on_step)
        box.append(t)
        family(t, *args)

    g.run(f"explain {op}", body)
    t = box[0]
    snaps.append({"step": t.step, "cells": _cells(shown, bounds)})
    times = []
    fresh = _inputs(op, rank, n, count)[0]
    for _ in range(repeats):
        g.run("barrier", registry.ALGORITHMS["barrier"]["linear"])
        t0 = time.perf_counter()
        g.run(f"explain {op}", lambda c: family(c, *fresh))
        times.append(time.perf_counter() - t0)
    return {"rank": rank, "op": op, "algorithm": algo, "steps": t.step, "snaps": snaps,
            "msgs": msgs, "syncs": [{"step": s["step"]} for s in t.syncs], "times": times,
            "reads": [{"step": s["step"], "from": t.ranks[s["slot_rank"]], "bytes": s["bytes"]}
                      for s in t.slots if t.ranks[s["slot_rank"]] != rank],
            "link": g.link, "bounds": bounds}


# ----------------------------------------------------------------------------- driver
def run(op: str, algo: str, n: int, count: int | None = None, repeats: int = 20,
        timeout: float = 120.0) -> dict[str, Any]:
    """Run ``op`` with ``algo`` on ``n`` ranks; the explanation (see :func:`build`)."""
    return run_many([(op, algo)], n, count, repeats, timeout)[0]


def run_many(pairs: list[tuple[str, str]], n: int, count: int | None = None, repeats: int = 20,
             timeout: float = 120.0) -> list[dict[str, Any]]:
    """Explanations of several (op, algorithm) pairs, run in one job per kind of topology
    (``hierarchical`` on two fake hosts, everything else on one)."""
    from ..algorithms import registry

    for op, algo in pairs:
        algos = registry.available(op)
        if algo not in algos:
            raise ValueError(f"explain: {op} has no algorithm {algo!r}; valid: {', '.join(algos)}")
    if n < 1 or n > 62:
        raise ValueError("explain: -n must be in [1, 62] (ranks are bits of an int64)")
    count = n if count is None else count
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for hier in (False, True):
        todo = [p for p in pairs if (p[1] == "hierarchical") == hier]
        if todo:
            for ranks in _job(todo, n, count, repeats, timeout, hier):
                key = (ranks[0]["op"], ranks[0]["algorithm"])
                out[key] = build(key[0], key[1], n, count, ranks)
    return [out[(op, algo)] for op, algo in pairs]


def _job(pairs: list[tuple[str, str]], n: int, count: int, repeats: int, timeout: float,
         hierarchical: bool) -> list[list[dict[str, Any]]]:
    """Start the n ranks, wait, return per pair the ranks' records."""
    folder = tempfile.mkdtemp(prefix="collcomm-explain-")
    job = secrets.token_hex(6)
    procs = []
    try:
        for r in range(n):
            env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(n), LOCAL_RANK=str(r),
                       COLLCOMM_JOB_ID=job, COLLCOMM_TOKEN=job, COLLCOMM_FR_DIR=folder)
            for v in ("COLLCOMM_STORE", "MASTER_ADDR", "MASTER_PORT", "COLLCOMM_TRACE"):
                env.pop(v, None)
            if hierarchical:
                env["COLLCOMM_HOST_ID"] = f"explain-host{r * 2 // n}"
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "collcomm.tools.explain", "--worker", folder,
                 json.dumps(pairs), str(count), str(repeats)], env=env, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, start_new_session=True))
        deadline = time.monotonic() + timeout
        outputs = []
        for p in procs:
            try:
                out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise RuntimeError(f"explain: the ranks did not finish within {timeout:g} s") from None
            outputs.append(out.decode(errors="replace"))
        bad = [r for r, p in enumerate(procs) if p.returncode]
        if bad:
            raise RuntimeError(f"explain: rank {bad[0]} failed:\n{outputs[bad[0]][-3000:]}")
        per_rank = []
        for r in range(n):
            with open(os.path.join(folder, f"rank{r}.json")) as f:
                per_rank.append(json.load(f))
    finally:
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, 9)
                except OSError:
                    pass
                p.wait()
        shm = "/dev/shm"
        for seg in os.listdir(shm) if os.path.isdir(shm) else []:
            if seg.startswith(f"collcomm-{job}-"):
                try:
                    os.unlink(os.path.join(shm, seg))
                except OSError:
                    pass
        shutil.rmtree(folder, ignore_errors=True)
    return [[per_rank[r][i] for r in range(n)] for i in range(len(pairs))]


# ------------------------------------------------------------------------------ command
def add_command(subparsers: Any) -> None:
    """``collcomm explain`` (for tools/cli.py)."""
    from ..algorithms.registry import ALGORITHMS

    p = subparsers.add_parser(
        "explain", help="run one collective with one algorithm and draw it step by step",
        description=__doc__.splitlines()[0].split(": ", 1)[-1])
    p.add_argument("op", choices=sorted(ALGORITHMS), help="the collective")
    p.add_argument("--algo", "-a", required=True, help="the family (see collcomm.algorithms.available)")
    p.add_argument("-n", type=int, default=4, help="ranks (default 4)")
    p.add_argument("--count", "-k", type=int, default=None,
                   help="elements per rank (default N: one element per chunk)")
    p.add_argument("--out", "-o", default=None,
                   help="write F.html (animated page), F.gif (animated GIF) or F.svg instead")
    p.add_argument("--repeats", type=int, default=20, help="untraced runs timed (default 20)")
    p.set_defaults(func=run_command)


def run_command(args: argparse.Namespace) -> int:
    from . import explain_raster as raster
    from . import explain_render as render

    writers = {".svg": render.svg, ".html": render.html, ".htm": render.html, ".gif": raster.gif}
    suffix = os.path.splitext(args.out)[1].lower() if args.out else ""
    if args.out and suffix not in writers:
        print(f"collcomm explain: --out {args.out}: unknown suffix {suffix or '(none)'!r}; "
              "expecting .html, .gif or .svg", file=sys.stderr)
        return 2
    try:
        ex = run(args.op, args.algo, args.n, args.count, args.repeats)
    except (ValueError, RuntimeError) as exc:
        print(f"collcomm explain: {exc}", file=sys.stderr)
        return 2
    if args.out:
        data = writers[suffix](ex)
        with open(args.out, "wb") as f:
            f.write(data if isinstance(data, bytes) else data.encode())
        print(render.summary(ex))
        print(f"wrote {args.out}")
    else:
        print(render.terminal(ex))
    return 0 if ex["final_ok"] else 1


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--worker":
        folder, pairs, count, repeats = argv[1:5]
        worker(folder, [tuple(p) for p in json.loads(pairs)], int(count), int(repeats))
        return 0
    parser = argparse.ArgumentParser(prog="collcomm")
    add_command(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["explain", *argv])
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
