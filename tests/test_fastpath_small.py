"""Small calls that take fewer syncs: what they move and how many syncs they take.

A small all_to_all(v) stages its data with its split sizes, so the agreement's one sync
moves it too (shm_a2a.a2a_eager, native/_collectives_move.c); a rank whose send buffer
is too large for that makes every rank take the rounds. These jobs run the native core
on every rank and mixed (one rank on the Python path: the two implement one protocol),
with sizes on both sides of the limit, and count each call's syncs on the arena's
counter. And the CPU word a native rank publishes when it arrives (a waiter whose late
peer shares its CPU yields at once instead of spinning), with the ranks pinned to one CPU.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from collcomm import native
from tests.harness import run_ranks

from collcomm.transport.arena_layout import ONE_SHOT

#: (name, counts(i, j, n): what rank i sends rank j, syncs: 1 eager, 2 agreement + a round
#: or, blocks read by cross-memory attach (two ranks, a block of A2A_PAIR_BLOCK = 32 KiB:
#: the last two here), agreement + the closing sync)
Q = ONE_SHOT // 4   # int32 elements in ONE_SHOT bytes
A2A_CASES: list[tuple[str, Any, int]] = [
    ("equal 2", lambda i, j, n: 2, 1),
    ("uneven", lambda i, j, n: (3 * i + j) % 4, 1),
    ("one rank sends nothing", lambda i, j, n: 0 if i == 0 else j + 1, 1),
    ("nothing at all", lambda i, j, n: 0, 1),
    ("exactly the limit", lambda i, j, n: Q // n + (Q % n if j == 0 else 0), 1),
    ("one element past it on one rank", lambda i, j, n: Q // n + (Q % n + 1 if i == j == 0 else 0), 2),
    ("large on every rank", lambda i, j, n: Q, 2),
]
#: ... with 4 KiB slots (COLLCOMM_SHM_SLOT=4096): the data must also fit the slot after the
#: table (64 bytes at n = 2, 3): 1008 int32 elements do, 1009 do not (one round of pieces)
SLOT_CASES: list[tuple[str, Any, int]] = [
    ("fills the slot", lambda i, j, n: 1008 // n + (1008 % n if j == 0 else 0), 1),
    ("one element more", lambda i, j, n: 1008 // n + (1008 % n + 1 if j == 0 else 0), 2),
]


def _a2a_rank(cases: str = "A2A_CASES") -> dict[str, Any]:
    """Each case once (the equal ones without split sizes: the fast call); the bytes got,
    the syncs taken, and what the bytes should be."""
    import collcomm as dist
    from collcomm.core import runtime

    n, me = dist.get_world_size(), dist.get_rank()
    dist.barrier()   # (the arena exists from the first call on)
    arena = runtime.get_world("test")._arena
    core = arena.native_core
    out: dict[str, Any] = {"cma": bool(arena.cma)}
    for name, counts, _ in globals()[cases]:
        sc = [counts(me, j, n) for j in range(n)]
        rc = [counts(j, me, n) for j in range(n)]
        send = np.concatenate([1000 * me + 100 * j + np.arange(c) for j, c in enumerate(sc)]).astype(np.int32)
        want = np.concatenate([1000 * j + 100 * me + np.arange(c) for j, c in enumerate(rc)]).astype(np.int32)
        recv = np.full(sum(rc), -1, np.int32)
        dist.barrier()
        before = arena.count
        read_before = core.a2a_read if core is not None else 0
        if len(set(sc)) == 1 and sc == rc:
            dist.all_to_all_single(recv, send)
        else:
            dist.all_to_all_single(recv, send, output_split_sizes=rc, input_split_sizes=sc)
        out[name] = (arena.count - before, recv.tobytes() == want.tobytes())
        if core is not None:
            out["read " + name] = core.a2a_read - read_before
    return out


@pytest.mark.skipif(native.core is None, reason=f"native core: {native.reason}")
@pytest.mark.timeout(120)
def test_small_all_to_all_is_one_sync_native_and_mixed() -> None:
    jobs = {"native n=2": run_ranks(_a2a_rank, 2, transport="shm", timeout=60),
            "mixed n=3": run_ranks(_a2a_rank, 3, transport="shm", timeout=60,
                                   rank_env={1: {"COLLCOMM_NATIVE": "0"}})}
    jobs["mixed n=2, 4 KiB slots"] = run_ranks(_a2a_rank, 2, "SLOT_CASES", transport="shm", timeout=60,
                                               env={"COLLCOMM_SHM_SLOT": "4096"},
                                               rank_env={1: {"COLLCOMM_NATIVE": "0"}})
    for job, results in jobs.items():
        cases = SLOT_CASES if "slots" in job else A2A_CASES
        for r, res in enumerate(results):
            for name, _, syncs in cases:
                assert res[name] == (syncs, True), (job, r, name, res[name])
    # which of them went by cross-memory attach: between two ranks the blocks of 32 KiB
    by_cma = {"one element past it on one rank", "large on every rank"}
    for r, res in enumerate(jobs["native n=2"]):
        for name, _, _ in A2A_CASES:
            assert res["read " + name] == (name in by_cma and res["cma"]), (r, name)


@pytest.mark.timeout(60)
def test_small_all_to_all_python_path() -> None:
    for r, res in enumerate(run_ranks(_a2a_rank, 2, transport="shm", timeout=50,
                                      env={"COLLCOMM_NATIVE": "0"})):
        for name, _, syncs in A2A_CASES:
            assert res[name] == (syncs, True), (r, name, res[name])


def _one_cpu_rank() -> tuple[list[int], float]:
    """Every rank pinned to one CPU (the waits take the same-CPU path): 50 all_reduces, then
    each rank's CPU word as this rank reads it, and the result."""
    import os

    import collcomm as dist
    from collcomm.core import runtime
    from collcomm.transport.arena_layout import CPU

    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    x = np.ones(4)
    for _ in range(50):
        dist.all_reduce(x)
    dist.barrier()
    arena = runtime.get_world("test")._arena
    return [int(arena.get(r, CPU)) for r in range(arena.n)], float(x[0])


@pytest.mark.skipif(native.core is None, reason=f"native core: {native.reason}")
@pytest.mark.timeout(120)
def test_native_ranks_publish_their_cpu() -> None:
    """A native rank writes the CPU it arrives on (+ 1) in its header word CPU, which a
    waiter compares with its own: ranks sharing a CPU yield at once. A Python rank leaves
    it 0 (never "the same CPU"); both kinds still meet."""
    import os

    want = min(os.sched_getaffinity(0)) + 1
    for job, env in (("native", None), ("mixed", {1: {"COLLCOMM_NATIVE": "0"}})):
        for r, (words, value) in enumerate(run_ranks(_one_cpu_rank, 2, transport="shm", timeout=90,
                                                     rank_env=env)):
            assert value == 2.0 ** 50, (job, r, value)
            assert words == ([want, want] if job == "native" else [want, 0]), (job, r, words)
