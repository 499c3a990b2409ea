"""The native shared-memory core (collcomm/native) keeps every check the Python path makes
(what it computes: tests/test_native.py).

* mismatched calls (signature, all_to_all split sizes), a timeout, a SIGKILLed peer, a
  Ctrl-C, all with the Python path's exceptions and texts; ranks that disagree on the
  all_reduce's steps;
* the GIL is released while a rank waits; heap buffers on some ranks only and buffers the
  core cannot take (the Python code finishes such calls).
"""
from __future__ import annotations

import os
import re
import time
from typing import Any

import numpy as np
import pytest

from collcomm import ops
from tests.harness import run_ranks
from tests.test_native import needs_core


def _mismatch_rank() -> list[tuple[str, str]]:
    """Rank 1 differs in one field per case; every rank reports what it raised, and the
    group keeps working after each."""
    import collcomm as dist
    from collcomm.errors import MismatchError

    me, n = dist.get_rank(), dist.get_world_size()
    odd = me == 1
    f32 = np.float32
    cases = {
        "dtype": lambda: dist.all_reduce(np.ones(4, dtype=np.float64 if odd else f32)),
        "count": lambda: dist.all_reduce(np.ones(5 if odd else 4, dtype=f32)),
        "op": lambda: dist.all_reduce(np.ones(4, dtype=f32), op=dist.ReduceOp.MAX if odd else dist.ReduceOp.SUM),
        "root": lambda: dist.broadcast(np.ones(3, dtype=f32), src=1 if odd else 0),
        "collective": lambda: (dist.barrier() if odd else dist.all_reduce(np.ones(4, dtype=f32))),
        "reduce root": lambda: dist.reduce(np.ones(2, dtype=f32), dst=1 if odd else 0),
        "gather dtype": lambda: dist.all_gather_into_tensor(np.empty(2 * n, dtype=np.int32 if odd else f32),
                                                            np.ones(2, dtype=np.int32 if odd else f32)),
        "a2a splits": lambda: dist.all_to_all_single(
            np.empty(2 * n), np.arange(2.0 * n), output_split_sizes=[2] * n,
            input_split_sizes=[1, 2, 3] + [2] * (n - 3) if odd else [2] * n),
    }
    out = []
    for what, call in cases.items():
        try:
            call()
            out.append((what, "no error"))
        except MismatchError as exc:
            out.append((what, str(exc)))
        except Exception as exc:  # noqa: BLE001 - reported
            out.append((what, f"{type(exc).__name__}: {exc}"))
        x = np.full(3, me + 1.0)
        dist.all_reduce(x)
        assert x.tolist() == [n * (n + 1) / 2] * 3, (what, x)
    return out


@needs_core
@pytest.mark.timeout(200)
def test_mismatches_raise_the_python_paths_errors() -> None:
    nat = run_ranks(_mismatch_rank, 3, transport="shm", timeout=90,
                   env={"COLLCOMM_EAGER_ROOTED": "0"})   # (errors within the call, as Python)
    py = run_ranks(_mismatch_rank, 3, transport="shm", timeout=90, env={"COLLCOMM_NATIVE": "0"})
    def same(text: str) -> str:   # job-specific paths (a flight-recorder dump) aside
        return re.sub(r"collcomm-fr-[0-9a-f]+", "collcomm-fr-JOB", text)

    for r in range(3):
        for (what, got), (_, want) in zip(nat[r], py[r]):
            assert got != "no error" and "Error" not in got.split(":")[0], (r, what, got)
            assert same(got) == same(want), (r, what, got, want)


def _await_file(path: str, limit: float) -> None:
    """Until ``path`` exists (another rank's word that something happened), ``limit`` s at most."""
    deadline = time.monotonic() + limit
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.01)


def _skip_rank(victim: int, gave_up: str) -> str:
    import collcomm as dist

    me = dist.get_rank()
    x = np.ones(2, dtype=np.float32)
    dist.all_reduce(x)
    if me == victim:
        _await_file(gave_up, 3.0)  # skips the next call; leaves after the others gave up
        return "skipped"
    t0 = time.monotonic()
    try:
        with dist.call_timeout(1.0):
            dist.all_reduce(x)
    except dist.CommTimeoutError as exc:
        took = time.monotonic() - t0
        open(gave_up, "w").close()
        return f"{took:.2f} {exc}"
    return "no error"


@needs_core
@pytest.mark.timeout(120)
def test_timeout_names_the_late_rank(tmp_path) -> None:
    res = run_ranks(_skip_rank, 2, 1, str(tmp_path / "gave-up"), transport="shm", timeout=60)
    elapsed, text = res[0].split(" ", 1)
    assert 0.9 < float(elapsed) < 3.0, res[0]
    assert "timed out after 1 s in shared memory" in text and "still waiting for rank 1" in text, text


def _loop_until_lost(victim: int, stamp: str) -> tuple[str, float, str]:
    """Loop on small all_reduces; the victim SIGKILLs itself in the middle of the loop,
    after writing down when."""
    import signal

    import collcomm as dist

    x = np.ones(2, dtype=np.float32)
    try:
        for i in range(10**9):
            if i == 300 and dist.get_rank() == victim:
                with open(stamp, "w") as f:
                    f.write(repr(time.time()))
                os.kill(os.getpid(), signal.SIGKILL)
            dist.all_reduce(x)
    except Exception as exc:  # noqa: BLE001 - reported
        return type(exc).__name__, time.time(), str(exc)
    return "no error", time.time(), ""


@needs_core
@pytest.mark.timeout(120)
def test_sigkilled_peer_is_lost_quickly(tmp_path) -> None:
    """Ranks loop on small all_reduces on the native path; rank 2 is SIGKILLed in the
    middle: both survivors raise PeerLostError naming it within a few seconds."""
    stamp = str(tmp_path / "killed")
    outcomes = run_ranks(_loop_until_lost, 3, 2, stamp, transport="shm", timeout=60,
                         expect_failure=True)
    killed = float(open(stamp).read())
    assert outcomes[2].exitcode == -9
    for o in outcomes[:2]:
        assert o.ok, o.error
        kind, when, text = o.value
        assert kind == "PeerLostError", (kind, text)
        assert "rank 2" in text and "died" in text, text
        assert when - killed < 5.0, f"raised {when - killed:.1f} s after the kill"


def _gil_rank() -> int:
    """Rank 0 waits in a barrier for rank 1 (asleep for 0.6 s) while a thread of rank 0
    counts: the count grows only if the wait released the GIL."""
    import threading

    import collcomm as dist

    if dist.get_rank() == 1:
        dist.barrier()
        time.sleep(0.6)
        dist.barrier()
        return 0
    dist.barrier()
    stop, count = threading.Event(), [0]

    def spin() -> None:
        while not stop.is_set():
            count[0] += 1

    t = threading.Thread(target=spin)
    t.start()
    time.sleep(0.01)
    before = count[0]
    dist.barrier()
    after = count[0]
    stop.set()
    t.join()
    return after - before


def test_all_reduce_one_step_rule() -> None:
    # one step while (n-1)(n-2)/n x the bytes <= ALL_REDUCE_EXTRA (4 KiB), at most ONE_SHOT
    # with a core per rank; with more ranks than cores one step up to ONE_SHOT
    from collcomm.transport.arena_layout import ALL_REDUCE_EXTRA, ONE_SHOT, ONE_STEP_ALWAYS, all_reduce_one_step

    edges = {2: ONE_SHOT, 3: 6144, 4: 2730, 5: 1706, 8: 780, 16: 312}
    for n, edge in edges.items():
        assert all_reduce_one_step(edge, n, ALL_REDUCE_EXTRA), n
        assert not all_reduce_one_step(edge + 4 if n > 2 else edge + 1, n, ALL_REDUCE_EXTRA), n
        assert all_reduce_one_step(ONE_SHOT, n, ONE_STEP_ALWAYS)
        assert not all_reduce_one_step(ONE_SHOT + 1, n, ONE_STEP_ALWAYS)


def _all_reduce_or_error() -> str:
    import collcomm as dist
    from collcomm.errors import MismatchError

    import collcomm.core.runtime as rt

    try:
        buf = np.ones(3)
        dist.all_reduce(buf)
        big = np.arange(3000, dtype=np.float32)      # 12 KB: two steps at n = 3 by default
        dist.all_reduce(big)
        assert np.array_equal(big, np.arange(3000, dtype=np.float32) * 3)
        arena = rt.get_world("x")._arena
        core = arena.native_core
        return f"done {buf.tolist()} {arena.cores} {arena.all_reduce_extra} " \
               f"{arena.all_reduce_extra if core is None else core.all_reduce_extra}"
    except MismatchError as exc:
        return str(exc)


@pytest.mark.timeout(60)
def test_ranks_must_agree_on_the_all_reduce_steps() -> None:
    # one rank told COLLCOMM_ALL_REDUCE_EXTRA=0 (two steps from n = 3), the others not:
    # every rank refuses the arena with a MismatchError naming the setting, nobody hangs
    res = run_ranks(_all_reduce_or_error, 3, transport="shm", timeout=40,
                    rank_env={1: {"COLLCOMM_ALL_REDUCE_EXTRA": "0"}})
    for text in res:
        assert "COLLCOMM_ALL_REDUCE_EXTRA differs" in text and "rank 1: 0" in text, text
    # alike: a core per rank (the fewest any rank has) takes the bound, else one step to
    # ONE_SHOT; the native core gets the group's value
    from collcomm.transport.arena_layout import ONE_STEP_ALWAYS
    for env, cores, extra in (({"COLLCOMM_ALL_REDUCE_EXTRA": "0", "COLLCOMM_CORES": "3"}, 3, 0),
                              ({"COLLCOMM_CORES": "2"}, 2, ONE_STEP_ALWAYS)):
        same = run_ranks(_all_reduce_or_error, 3, transport="shm", timeout=40, env=env,
                         rank_env={2: {"COLLCOMM_CORES": "8"}})
        assert same == [f"done [3.0, 3.0, 3.0] {cores} {extra} {extra}"] * 3, same


def test_waiting_releases_the_gil() -> None:
    counted = run_ranks(_gil_rank, 2, transport="shm", timeout=60)[0]
    assert counted > 10_000, counted


def _heap_rank() -> dict[str, Any]:
    """all_reduce / broadcast / all_gather where only rank 0's buffer is in the shared heap
    (read in place): the native ranks hand the rest of the call to the Python code."""
    import collcomm as dist
    import collcomm.core.runtime as rt

    me, n = dist.get_rank(), dist.get_world_size()
    heap = dist.empty(6, dtype=np.float64)
    buf = heap if me == 0 else np.empty(6)
    buf[:] = np.arange(6) + me
    dist.all_reduce(buf)
    ar = buf.tolist()
    buf[:] = 7.0 + me
    dist.broadcast(buf, src=0)
    bc = buf.tolist()
    buf[:] = me
    ag = np.empty(6 * n)
    dist.all_gather_into_tensor(ag, buf)
    core = rt.get_world("x")._arena.native_core
    return {"all_reduce": ar, "broadcast": bc, "all_gather": ag.tolist(), "finished": core.finished}


@needs_core
@pytest.mark.timeout(120)
@pytest.mark.parametrize("fast", ["0", "1"])
def test_heap_buffer_on_one_rank_only(fast: str) -> None:
    # rank 0 takes the regular path (the fast call stages heap buffers like any other);
    # ranks 1 and 2 the regular path's native call, or the fast call (core/fastpath.py)
    res = run_ranks(_heap_rank, 3, transport="shm", timeout=60, env={"COLLCOMM_FAST": fast},
                    rank_env={0: {"COLLCOMM_FAST": "0"}})
    for r, out in enumerate(res):
        assert out["all_reduce"] == (np.arange(6) * 3 + 3).tolist()
        assert out["broadcast"] == [7.0] * 6
        assert out["all_gather"] == np.repeat(np.arange(3.0), 6).tolist()
        # ranks 1 and 2 ran their part natively up to the first sync, then Python finished
        assert out["finished"] == (0 if r == 0 else 3), out


def _interrupted_rank(done: str) -> str:
    """Rank 0 waits in a barrier that rank 1 never enters (it waits until rank 0 is done, 2 s
    at most); a SIGINT after 0.3 s must end rank 0's wait with KeyboardInterrupt (as in the
    Python path)."""
    import signal
    import threading

    import collcomm as dist

    if dist.get_rank() == 1:
        dist.barrier()
        _await_file(done, 2.0)
        return "slept"
    dist.barrier()
    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
    t0 = time.monotonic()
    try:
        with dist.call_timeout(10):
            dist.barrier()
    except KeyboardInterrupt:
        took = time.monotonic() - t0
        open(done, "w").close()
        return f"interrupted after {took:.2f} s"
    open(done, "w").close()
    return "not interrupted"


@needs_core
@pytest.mark.timeout(120)
def test_ctrl_c_ends_a_wait(tmp_path) -> None:
    got = run_ranks(_interrupted_rank, 2, str(tmp_path / "done"), transport="shm", timeout=60,
                    expect_failure=True)[0]
    assert got.ok and got.value.startswith("interrupted"), (got.value, got.error)
    assert float(got.value.split()[2]) < 1.5, got.value


def _odd_buffers_rank() -> list[str]:
    """Buffers the core cannot take (a read-only output, a strided view) go to the Python
    code, which says what is wrong (or copes), the same on every rank; the group goes on."""
    import collcomm.core.runtime as rt
    from collcomm import algorithms

    g = rt.get_world("x")
    n, me = g.size, g.rank
    out = []
    recv = np.zeros(2 * n)
    recv.flags.writeable = False
    try:
        g.run("all_gather", lambda c: algorithms.all_gather(c, np.ones(2), recv, algorithm="shm_direct"))
        out.append("no error")
    except ValueError as exc:
        out.append(f"ValueError: {exc}")
    view = np.arange(16.0)[::2]                 # not contiguous
    view[:] = me + 1.0
    g.run("broadcast", lambda c: algorithms.broadcast(c, view, 0, algorithm="shm_direct"))
    out.append(str(view.tolist()))
    x = np.full(3, me + 1.0)
    g.run("all_reduce", lambda c: algorithms.all_reduce(c, x, ops.resolve("sum", x.dtype),
                                                         algorithm="shm_direct"))
    out.append(str(x.tolist()))
    return out


@needs_core
@pytest.mark.timeout(120)
def test_buffers_the_core_cannot_take_go_to_python() -> None:
    res = run_ranks(_odd_buffers_rank, 2, transport="shm", timeout=60)
    for r, out in enumerate(res):
        assert out[0].startswith("ValueError") and "read-only" in out[0], out[0]
        assert out[1] == str([1.0] * 8), out[1]
        assert out[2] == "[3.0, 3.0, 3.0]", out[2]
