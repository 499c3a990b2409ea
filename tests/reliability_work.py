"""Workloads run on real ranks by the reliability proofs (tools/shm_small.py, tools/soak.py)
and their fast tests (tests/test_shm_space.py): module-level functions, so that
``tests.harness.run_ranks`` can start them in other processes. Every result is checked
against the value computed locally; a function returns its counts, it never prints."""
from __future__ import annotations

import gc
import os
import random
import resource
import time
from typing import Any

import numpy as np

MiB = 1 << 20


def _expect_sum(n: int, count: int, dtype: Any) -> np.ndarray:
    base = np.arange(count, dtype=np.int64) % 97
    return (base * n + n * (n + 1) // 2).astype(dtype)


def _mine(rank: int, count: int, dtype: Any) -> np.ndarray:
    return ((np.arange(count, dtype=np.int64) % 97) + rank + 1).astype(dtype)


def every_collective(nbytes: int, dtype: str = "float32") -> dict[str, int]:
    """Each collective once with ``nbytes`` per rank of ``dtype`` (values exact in float32),
    checked. Returns {collective: 1 if right}."""
    import collcomm as dist

    rank, n = dist.get_rank(), dist.get_world_size()
    dt = np.dtype(dtype)
    count = max(n, nbytes // dt.itemsize // n * n)
    ok: dict[str, int] = {}

    x = _mine(rank, count, dt)
    dist.all_reduce(x)
    ok["all_reduce"] = int(np.array_equal(x, _expect_sum(n, count, dt)))

    x = _mine(rank, count, dt)
    dist.reduce(x, dst=n - 1)
    ok["reduce"] = int(rank != n - 1 or np.array_equal(x, _expect_sum(n, count, dt)))

    x = _mine(rank, count, dt) if rank == 0 else np.zeros(count, dt)
    dist.broadcast(x, src=0)
    ok["broadcast"] = int(np.array_equal(x, _mine(0, count, dt)))

    k = count // n
    part = _mine(rank, k, dt)
    out = np.empty(n * k, dt)
    dist.all_gather_into_tensor(out, part)
    ok["all_gather"] = int(all(np.array_equal(out[r * k:(r + 1) * k], _mine(r, k, dt)) for r in range(n)))

    full = _mine(rank, n * k, dt)
    got = np.empty(k, dt)
    dist.reduce_scatter_tensor(got, full)
    ok["reduce_scatter"] = int(np.array_equal(got, _expect_sum(n, n * k, dt)[rank * k:(rank + 1) * k]))

    send = (np.arange(n * k, dtype=np.int64) + 1000 * rank).astype(dt)
    recv = np.empty(n * k, dt)
    dist.all_to_all_single(recv, send)
    want = np.concatenate([(np.arange(rank * k, (rank + 1) * k, dtype=np.int64) + 1000 * r).astype(dt)
                           for r in range(n)])
    ok["all_to_all"] = int(np.array_equal(recv, want))

    glist = [np.empty(k, dt) for _ in range(n)] if rank == 0 else None
    dist.gather(_mine(rank, k, dt), glist, dst=0)
    ok["gather"] = int(rank != 0 or all(np.array_equal(glist[r], _mine(r, k, dt)) for r in range(n)))

    slist = [_mine(r, k, dt) for r in range(n)] if rank == 0 else None
    got = np.empty(k, dt)
    dist.scatter(got, slist, src=0)
    ok["scatter"] = int(np.array_equal(got, _mine(rank, k, dt)))

    dist.barrier()
    ok["barrier"] = 1
    return ok


def ring_p2p(nbytes: int, repeat: int = 2) -> int:
    """Each rank sends ``nbytes`` to its right neighbour and receives from its left,
    ``repeat`` times (isend first, so large messages pile up as they can); returns the
    number of messages received right."""
    import collcomm as dist

    rank, n = dist.get_rank(), dist.get_world_size()
    count = max(1, nbytes // 8)
    right, left = (rank + 1) % n, (rank - 1) % n
    good = 0
    for i in range(repeat):
        out = np.arange(count, dtype=np.float64) + rank * 7 + i
        inp = np.empty(count, np.float64)
        w = dist.isend(out, right)
        dist.recv(inp, left)
        w.wait()
        good += int(np.array_equal(inp, np.arange(count, dtype=np.float64) + left * 7 + i))
    return good


def burst_p2p(nbytes: int, burst: int = 4) -> int:
    """Rank 0 sends ``burst`` messages of ``nbytes`` to rank 1 before rank 1 receives any
    (the staging segments of all of them are alive at once); returns how many arrived right."""
    import collcomm as dist

    rank = dist.get_rank()
    count = max(1, nbytes // 8)
    good = 0
    if rank == 0:
        works = [dist.isend(np.full(count, float(i)), 1, tag=i) for i in range(burst)]
        dist.barrier()
        for w in works:
            w.wait()
        good = burst
    elif rank == 1:
        dist.barrier()
        for i in range(burst):
            buf = np.empty(count)
            dist.recv(buf, 0, tag=i)
            good += int(np.all(buf == float(i)))
    else:
        dist.barrier()
        good = burst
    dist.barrier()
    return good


def sizes_sweep(sizes: list[int], p2p_sizes: list[int]) -> dict[str, Any]:
    """every_collective at each size, then ring_p2p and burst_p2p at each p2p size."""
    import collcomm as dist

    wrong: list[str] = []
    done = 0
    for s in sizes:
        for name, good in every_collective(s).items():
            done += 1
            if not good:
                wrong.append(f"{name}@{s}")
    for s in p2p_sizes:
        done += 2
        if ring_p2p(s) != 2:
            wrong.append(f"ring_p2p@{s}")
        if dist.get_world_size() > 1 and burst_p2p(s, 2) != 2:
            wrong.append(f"burst_p2p@{s}")
    shared_ok = 1
    try:
        z = dist.zeros(max(p2p_sizes + [1 << 18]) // 16, dtype=np.float32)   # 1/4 of the largest
        z[:] = dist.get_rank() + 1
        dist.all_reduce(z)
        n = dist.get_world_size()
        shared_ok = int(np.all(z == n * (n + 1) / 2))
    except Exception as exc:  # noqa: BLE001 - reported, not hidden
        wrong.append(f"zeros: {type(exc).__name__}: {exc}")
        shared_ok = 0
    done += 1
    if not shared_ok:
        wrong.append("zeros+all_reduce")
    return {"done": done, "wrong": wrong}


# ------------------------------------------------------------------------------- soak
_OPS = ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all",
        "gather", "scatter", "barrier", "p2p", "async_all_reduce")


def _rss_kib() -> int:
    with open(f"/proc/{os.getpid()}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def soak(ops: int, seed: int, max_count: int = 1 << 16, seconds: float = 0.0) -> dict[str, Any]:
    """``ops`` randomized collectives and point-to-point exchanges (the same sequence on
    every rank: one seed), every result checked exactly. Stops early after ``seconds`` (>0)
    at an op count every rank agrees on. Returns counts, wrong ops and RSS samples (KiB)."""
    import collcomm as dist

    rank, n = dist.get_rank(), dist.get_world_size()
    rng = random.Random(seed)
    dtypes = [np.dtype(t) for t in ("float64", "float32", "int64", "int32", "int16", "uint8")]
    wrong: list[str] = []
    counts: dict[str, int] = {}
    rss: list[tuple[int, int]] = []
    start = time.monotonic()
    stop_flag = np.zeros(1, np.int64)
    i = 0
    for i in range(ops):
        if i % 500 == 0:
            gc.collect()
            rss.append((i, _rss_kib()))
            if seconds > 0 and i:
                stop_flag[0] = int(time.monotonic() - start > seconds)
                dist.all_reduce(stop_flag, op=dist.ReduceOp.MAX)
                if stop_flag[0]:
                    break
        op = rng.choice(_OPS)
        dt = rng.choice(dtypes)
        # sizes: mostly small, sometimes large (log-uniform)
        count = int(2 ** rng.uniform(0, np.log2(max_count)))
        root = rng.randrange(n)
        counts[op] = counts.get(op, 0) + 1
        mod = 5 if dt.itemsize == 1 else 97   # exact sums in every dtype
        base = (np.arange(count, dtype=np.int64) + i) % mod

        def mine(r: int, c: int = count) -> np.ndarray:
            return (((np.arange(c, dtype=np.int64) + i) % mod) + r).astype(dt)

        good = True
        if op in ("all_reduce", "async_all_reduce"):
            x = mine(rank)
            if op == "async_all_reduce":
                dist.all_reduce(x, async_op=True).wait()
            else:
                dist.all_reduce(x)
            good = np.array_equal(x, (base * n + n * (n - 1) // 2).astype(dt))
        elif op == "reduce":
            x = mine(rank)
            dist.reduce(x, dst=root)
            good = rank != root or np.array_equal(x, (base * n + n * (n - 1) // 2).astype(dt))
        elif op == "broadcast":
            x = mine(root) if rank == root else np.zeros(count, dt)
            dist.broadcast(x, src=root)
            good = np.array_equal(x, mine(root))
        elif op == "all_gather":
            out = np.empty(n * count, dt)
            dist.all_gather_into_tensor(out, mine(rank))
            good = all(np.array_equal(out[r * count:(r + 1) * count], mine(r)) for r in range(n))
        elif op == "reduce_scatter":
            full = mine(rank, n * count)
            got = np.empty(count, dt)
            dist.reduce_scatter_tensor(got, full)
            fb = ((np.arange(n * count, dtype=np.int64) + i) % mod)[rank * count:(rank + 1) * count]
            good = np.array_equal(got, (fb * n + n * (n - 1) // 2).astype(dt))
        elif op == "all_to_all":
            send = mine(rank, n * count)
            recv = np.empty(n * count, dt)
            dist.all_to_all_single(recv, send)
            good = all(np.array_equal(recv[r * count:(r + 1) * count], mine(r, n * count)[rank * count:(rank + 1) * count])
                       for r in range(n))
        elif op == "gather":
            lst = [np.empty(count, dt) for _ in range(n)] if rank == root else None
            dist.gather(mine(rank), lst, dst=root)
            good = rank != root or all(np.array_equal(lst[r], mine(r)) for r in range(n))
        elif op == "scatter":
            lst = [mine(r) for r in range(n)] if rank == root else None
            got = np.empty(count, dt)
            dist.scatter(got, lst, src=root)
            good = np.array_equal(got, mine(rank))
        elif op == "barrier":
            dist.barrier()
        elif op == "p2p":
            right, left = (rank + 1) % n, (rank - 1) % n
            got = np.empty(count, dt)
            w = dist.isend(mine(rank), right)
            dist.recv(got, left)
            w.wait()
            good = np.array_equal(got, mine(left))
        if not good:
            wrong.append(f"#{i} {op} {dt} x{count} root {root}")
    gc.collect()
    rss.append((i + 1, _rss_kib()))
    return {"ops": i + 1, "counts": counts, "wrong": wrong, "rss": rss,
            "seconds": time.monotonic() - start}


# ------------------------------------------------------------------------------- running
def spawn(fn: Any, n: int, *args: Any, env: dict[str, str] | None = None,
          timeout: float = 300.0, init: bool = True, rank_env: dict[int, dict[str, str]] | None = None,
          before: dict[int, Any] | None = None) -> tuple[list[Any], list[str]]:
    """``tests.harness.run_ranks`` that never raises: (per-rank Outcomes, leaked segment
    paths, removed). A rank still running at ``timeout`` is killed and its Outcome says
    ``Hang``. Every rank is killed (its whole process group) before this returns.
    ``rank_env``: extra variables per rank; ``before``: {rank: f} calls ``f(base_env)``
    just before starting that rank; ``init=False``: ``fn`` calls init itself."""
    import glob
    import pickle
    import secrets
    import shutil
    import signal
    import subprocess
    import sys
    import tempfile

    from tests import harness

    job_id = secrets.token_hex(6)
    harness.JOBS.append(job_id)
    tmp = tempfile.mkdtemp(prefix="collcomm-rel-")
    with open(os.path.join(tmp, "job.pkl"), "wb") as f:
        pickle.dump((fn, args, init), f)
    base = dict(os.environ)
    base.update({"WORLD_SIZE": str(n), "LOCAL_WORLD_SIZE": str(n), "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": str(harness.free_port()), "COLLCOMM_TOKEN": secrets.token_hex(16),
                 "COLLCOMM_JOB_ID": job_id,
                 "PYTHONPATH": harness.ROOT + os.pathsep + base.get("PYTHONPATH", "")})
    base.pop("COLLCOMM_STORE", None)
    base.update(env or {})
    procs: list[subprocess.Popen] = []
    hung = False
    try:
        for r in range(n):
            if before and r in before:
                before[r](base)
            log = open(os.path.join(tmp, f"out-{r}.txt"), "wb")
            procs.append(subprocess.Popen([sys.executable, "-m", "tests.rank_main", tmp],
                                          env=dict(base, RANK=str(r), LOCAL_RANK=str(r),
                                                   **(rank_env or {}).get(r, {})),
                                          stdout=log, stderr=subprocess.STDOUT, cwd=harness.ROOT,
                                          start_new_session=True))
            log.close()
        deadline = time.monotonic() + timeout
        while any(p.poll() is None for p in procs):
            if time.monotonic() > deadline:
                hung = True
                for p in procs:
                    if p.poll() is None:
                        p.send_signal(signal.SIGUSR1)
                time.sleep(0.5)
                break
            time.sleep(0.02)
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
    outcomes = []
    for r in range(n):
        path = os.path.join(tmp, f"result-{r}.pkl")
        if os.path.exists(path):
            with open(path, "rb") as f:
                o = pickle.load(f)
        else:
            o = harness.Outcome(r, False, error_type="Hang" if hung else "NoResult",
                                error="rank produced no result")
        o.exitcode, o.output = procs[r].returncode, harness._read(os.path.join(tmp, f"out-{r}.txt"))
        outcomes.append(o)
    shutil.rmtree(tmp, ignore_errors=True)   # every output is in the outcomes
    leaked = glob.glob(f"/dev/shm/collcomm-{job_id}-*")
    for path in leaked:
        os.unlink(path)
    return outcomes, leaked


# ------------------------------------------------------------------------------- abuse
def timed_init() -> dict[str, Any]:
    """init_process_group timed, one checked all_reduce, destroy (for ``spawn(init=False)``)."""
    import collcomm as dist

    t0 = time.monotonic()
    dist.init_process_group()
    took = time.monotonic() - t0
    rank, n = dist.get_rank(), dist.get_world_size()
    x = np.full(4, rank + 1.0)
    dist.all_reduce(x)
    ok = bool(np.all(x == n * (n + 1) / 2))
    dist.destroy_process_group()
    return {"init": took, "ok": ok}


class Flood:
    """``count`` connections to ``(host, port)`` that never finish a handshake: opened as
    soon as the port listens (retrying until ``wait`` s), then left idle; ``half`` of them
    first send half of a collcomm hello, ``garbage`` of them a few random bytes."""

    def __init__(self, host: str, port: int, count: int, half: int = 0, garbage: int = 0,
                 wait: float = 60.0) -> None:
        import socket

        self.socks: list[Any] = []
        self.refused = 0      # connections the server's queue would not take (after ``wait``)
        deadline = time.monotonic() + wait
        for i in range(count):
            while True:
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                s.settimeout(5.0)
                try:
                    s.connect((host, port))
                    break
                except OSError:
                    s.close()
                    if time.monotonic() > deadline:
                        s = None
                        break
                    time.sleep(0.01)
            if s is None:
                self.refused = count - i
                break
            if i < half:
                s.sendall(b"CCAUTH1\0" + os.urandom(5))
            elif i < half + garbage:
                s.sendall(os.urandom(37))
            self.socks.append(s)

    def close(self) -> None:
        for s in self.socks:
            try:
                s.close()
            except OSError:
                pass
        self.socks.clear()


def wait_listening(host: str, port: int, wait: float = 60.0) -> None:
    """Return once ``(host, port)`` accepts connections (the probe connection is closed)."""
    import socket

    deadline = time.monotonic() + wait
    while True:
        try:
            socket.create_connection((host, port), timeout=1.0).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def abused_init(n: int = 3, idle: int = 200, half: int = 0, transport: str = "tcp",
                timeout: float = 120.0) -> dict[str, Any]:
    """A job of ``n`` ranks whose rank 0 hosts the store (env://); once rank 0's store and
    transport listener are up, ``idle`` connections are opened to each and left idle (plus
    ``half`` half-open ones), then ranks 1.. start. ``idle=0``: the same sequence without
    the flood (the baseline). Returns each rank's init seconds and whether all went right."""
    from tests import harness

    port = harness.free_port()
    floods: list[Flood] = []

    def attack(base: dict[str, str]) -> None:
        host, store_port = "127.0.0.1", int(base["MASTER_PORT"])
        if idle or half:
            floods.append(Flood(host, store_port, idle + half, half=half))
            floods.append(Flood(host, port, idle + half, half=half))
        else:
            wait_listening(host, store_port)
            wait_listening(host, port)

    try:
        outcomes, leaked = spawn(timed_init, n, env={"COLLCOMM_TRANSPORT": transport}, init=False,
                                 rank_env={0: {"COLLCOMM_PORT": str(port)}}, before={1: attack},
                                 timeout=timeout)
    finally:
        for f in floods:
            f.close()
    ok = all(o.ok and o.value["ok"] for o in outcomes) and not leaked
    return {"ok": ok, "init": [o.value["init"] if o.ok else None for o in outcomes],
            "errors": [f"{o.error_type}: {o.error[:300]}" for o in outcomes if not o.ok]}
