"""reduce between two ranks by cross-memory attach (shm_reduce._reduce_cma, native/_cma.c
Core_reduce_cma, the fast call's route to it): the root reads the other's buffer and
combines rank 0's data first. Every path gives numpy's bits: the fast call, the regular
native call (COLLCOMM_FAST=0), the Python code (COLLCOMM_NATIVE=0), and a rank of each
together; every root, in place and not, a buffer in the shared heap (the native root
hands the call back), a signature mismatch."""
from __future__ import annotations

import numpy as np
import pytest

from collcomm.transport.arena_layout import REDUCE_CMA_MAX, REDUCE_CMA_MIN
from tests.harness import run_ranks

# bytes a rank: REDUCE_CMA_MIN, an odd count past it, REDUCE_CMA_MAX; and below (staged)
SIZES = [REDUCE_CMA_MIN, 280_004, REDUCE_CMA_MAX, REDUCE_CMA_MIN // 2]
DTYPES = ["float32", "float64", "int32", "float16"]
OPS = ["SUM", "PROD", "MIN", "MAX"]


def _data(rank: int, dtype: str, nbytes: int) -> np.ndarray:
    dt = np.dtype(dtype)
    n = nbytes // dt.itemsize
    rng = np.random.default_rng(1000 + rank)
    x = rng.standard_normal(n) * 3 if dt.kind == "f" else rng.integers(-50, 50, n)
    out = x.astype(dt)
    if dt.kind == "f" and n > 8:        # ties of signed zeros and NaNs: the order shows in the bits
        out[:4] = [0.0, -0.0, np.nan, 1.0] if rank == 0 else [-0.0, 0.0, 1.0, np.nan]
    return out


def _want(dtype: str, nbytes: int, op: str) -> np.ndarray:
    fn = {"SUM": np.add, "PROD": np.multiply, "MIN": np.minimum, "MAX": np.maximum}[op]
    acc = _data(0, dtype, nbytes).copy()
    fn(acc, _data(1, dtype, nbytes), out=acc)
    return acc


def _sweep(in_place: bool) -> list[str]:
    """Every size, dtype, op and root; the wrong cells by name (empty: all bit-exact)."""
    import collcomm as dist
    from collcomm import MPI

    comm = MPI.COMM_WORLD
    r = comm.Get_rank()
    bad = []
    for nbytes in SIZES:
        for dtype in DTYPES:
            for op in OPS:
                for root in (0, 1):
                    mine = _data(r, dtype, nbytes)
                    if in_place:     # the functional API: the root's tensor is send and recv
                        got = mine.copy()
                        dist.reduce(got, dst=root, op=getattr(dist.ReduceOp, op))
                    else:
                        got = np.zeros_like(mine) if r == root else None
                        comm.Reduce(mine, got, op=getattr(MPI, op), root=root)
                    if r == root:
                        want = _want(dtype, nbytes, op)
                        if got.view(np.uint8).tobytes() != want.view(np.uint8).tobytes():
                            bad.append(f"{nbytes}/{dtype}/{op}/root{root}")
    return bad


@pytest.mark.timeout(180)
@pytest.mark.parametrize("in_place", [False, True], ids=["out_of_place", "in_place"])
@pytest.mark.parametrize("path", ["fast", "regular", "python", "mixed"])
def test_every_path_gives_numpy_bits(path, in_place):
    env = {"fast": {}, "regular": {"COLLCOMM_FAST": "0"}, "python": {"COLLCOMM_NATIVE": "0"},
           "mixed": {}}[path]
    rank_env = {1: {"COLLCOMM_NATIVE": "0"}} if path == "mixed" else None
    for bad in run_ranks(_sweep, 2, in_place, transport="shm", timeout=150, env=env, rank_env=rank_env):
        assert bad == [], bad


def _heap_and_mismatch() -> dict:
    """A send buffer in the shared heap (announced in place: the native root hands the call
    back to Python), then counts that differ between the ranks (a MismatchError on both)."""
    import collcomm as dist
    from collcomm import MPI

    comm = MPI.COMM_WORLD
    r = comm.Get_rank()
    out: dict = {}
    n = (256 << 10) // 4
    shared = dist.empty(n, dtype=np.float32)
    shared[:] = np.arange(n, dtype=np.float32) * (r + 1)
    got = np.zeros(n, np.float32) if r == 0 else None
    comm.Reduce(shared, got, op=MPI.SUM, root=0)
    if r == 0:
        out["heap"] = bool(np.array_equal(got, np.arange(n, dtype=np.float32) * 3))
    mine = np.ones(n + (4096 if r else 0), np.float32)
    try:
        comm.Reduce(mine, np.zeros_like(mine) if r == 0 else None, op=MPI.SUM, root=0)
        out["mismatch"] = "no error"
    except dist.MismatchError as exc:
        out["mismatch"] = "MismatchError" if "reduce" in str(exc) else str(exc)
    comm.Barrier()
    return out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("path", ["fast", "python"])
def test_heap_buffer_and_mismatch(path):
    env = {"COLLCOMM_NATIVE": "0"} if path == "python" else {}
    root, other = run_ranks(_heap_and_mismatch, 2, transport="shm", timeout=90, env=env)
    assert root == {"heap": True, "mismatch": "MismatchError"}, root
    assert other == {"mismatch": "MismatchError"}, other


def _taken() -> list[int]:
    """Which way a 256 KiB reduce went: how often the regular path's _reduce_cma ran
    (COLLCOMM_FAST=0), and whether the arena reads peers by cross-memory attach."""
    import collcomm as dist
    from collcomm.algorithms import shm_reduce

    calls = [0]
    real = shm_reduce._reduce_cma

    def spy(*args):
        calls[0] += 1
        return real(*args)

    shm_reduce._reduce_cma = spy
    x = np.ones((256 << 10) // 4, np.float32)
    for root in (0, 1, 0):
        dist.reduce(x.copy(), dst=root)
    small = np.ones(1024, np.float32)
    dist.reduce(small, dst=0)                # (32 KiB down: staged, not this way)
    from collcomm.core import runtime
    return calls + [int(bool(runtime._world._arena.cma))]


def test_the_native_core_announces_cma_as_the_layout_does():
    from collcomm import native
    from collcomm.transport.arena_layout import CMA

    if native.core is None:
        pytest.skip("no native core")
    assert native.core.CMA_KEY == CMA


@pytest.mark.timeout(120)
def test_two_ranks_with_cma_take_it_and_three_do_not():
    two = run_ranks(_taken, 2, transport="shm", timeout=90, env={"COLLCOMM_FAST": "0"})
    if not two[0][1]:
        pytest.skip("cross-memory attach is not permitted here")
    assert two == [[3, 1], [3, 1]]
    assert [c for c, _ in run_ranks(_taken, 3, transport="shm", timeout=90,
                                      env={"COLLCOMM_FAST": "0"})] == [0] * 3
    assert run_ranks(_taken, 2, transport="shm", timeout=90,
                     env={"COLLCOMM_FAST": "0", "COLLCOMM_CMA": "0"}) == [[0, 0], [0, 0]]
