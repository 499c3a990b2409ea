"""The fast call runs a gather split by cross-memory attach (issue 8): where shm_large splits
every gather from some size up (shm_large.split_from; forced here by ``COLLCOMM_CMA_COST``),
the C entry calls Core.gather's split form (rooted_cma) itself, as it does for scatter
(core/fastpath.py: _rooted_cma); below that, and where the cost stages, it stages as before.

Each job gathers around CMA_MIN (n blocks) at every root, from plain buffers, a send buffer
in the shared heap, a root's send buffer that is its own block of the receive buffer (in
place) or another rank's block (both the regular path's: it copies the latter first), through the functional
API (a flat receive through collcomm.MPI's Gather; through collcomm.gather a list of separate
arrays, which the regular path splits, or of views lying back to back, as the benchmark
passes them, which the fast call splits), and checks
every result and which calls the fast call completed. A job with one rank in Python has the
two forms meet: the Python rank publishes a heap buffer in place, which a fast root hands
back (Hooks.finish: shm_move.gather_after with the split's root; from a list, on the list's
memory, where the others have written their share).
"""
from __future__ import annotations

import numpy as np
import pytest

from tests.harness import run_ranks

#: (elements a rank, dtype): below and at GATHER_PAIR_MIN = 64 KiB at n = 2, around CMA_MIN =
#: 256 KiB (where a gather among three ranks splits past), odd sizes
CASES = ((8_191, "float32"), (8_192, "float32"), (32_767, "float32"), (32_768, "float32"),
         (32_769, "float32"), (21_846, "float64"), (65_539, "int16"), (150_001, "float32"))


def _gathers() -> list[tuple[int, int, str, bool]]:
    """Every case here: (all ranks' bytes, root, form, completed by the fast call)."""
    import collcomm as dist
    from collcomm import MPI
    from collcomm.core.runtime import get_world

    n, me = dist.get_world_size(), dist.get_rank()
    dist.barrier()
    MPI.COMM_WORLD.Barrier()
    fasts = {"flat": MPI.COMM_WORLD._h.g.fast, "list": get_world("test").fast}
    fasts.update(heap=fasts["flat"], own=fasts["flat"], other=fasts["flat"],
                 joined=fasts["list"], joined_heap=fasts["list"])
    seen = []
    for count, dt in CASES:
        want = np.concatenate([np.arange(count, dtype=dt) + r for r in range(n)])
        shared = dist.empty(count, dtype=dt)
        for root in range(n):
            for form in ("flat", "heap", "own", "other", "list", "joined", "joined_heap"):
                fast = fasts[form]
                before = fast.calls if fast is not None else 0
                send = shared if form.endswith("heap") else np.empty(count, dt)
                send[:] = np.arange(count, dtype=dt) + me
                if form.endswith("heap"):   # (2-D: a call handed back flattens them too)
                    send = send.reshape(count, 1)
                if form.startswith(("list", "joined")):
                    one = np.full(n * count, -1, dt)
                    parts = (list(one.reshape(n, count, 1)) if form == "joined_heap"
                             else list(one.reshape(n, count)) if form == "joined"
                             else [np.full(count, -1, dt) for _ in range(n)])
                    dist.gather(send, parts if me == root else None, dst=root)
                    got = np.concatenate(parts) if me == root else None
                else:
                    recv = np.full(n * count, -1, dt) if me == root else None
                    if me == root and form == "heap":
                        recv = recv.reshape(n * count, 1)
                    if me == root and form in ("own", "other"):
                        at = me if form == "own" else (me + 1) % n
                        recv[at * count:(at + 1) * count] = send
                        send = recv[at * count:(at + 1) * count]
                    MPI.COMM_WORLD.Gather(send, recv, root=root)
                    got = recv
                if me == root:
                    assert np.array_equal(got.reshape(-1), want), (count, dt, root, form)
                seen.append((n * count * np.dtype(dt).itemsize, root, form,
                             fast is not None and fast.calls > before))
    return seen


def _split_from() -> int:
    """From how many bytes a gather splits on this job's arena (0: never, or no writes)."""
    from collcomm.algorithms import shm_large
    from collcomm.core.runtime import get_world

    arena = get_world("test").run("test", lambda c: c.arena())
    return shm_large.split_from(arena, "gather") if arena.cma_write else 0


def _job() -> tuple[int, list]:
    return _split_from(), _gathers()


def _expect(rank: int, root: int, form: str, nbytes: int, split_from: int, python: tuple) -> bool:
    """Should the fast call have completed this call on ``rank``?"""
    if rank in python:
        return False
    if form == "list":   # separate arrays at the root: staged up to the limit, never split
        return rank != root or not split_from or nbytes < split_from
    if form in ("own", "other") and rank == root:   # buffers that overlap: the regular path
        return False
    # a Python rank but the root publishes its heap buffer in place: every fast rank
    # hands the call back past the first sync (rooted_cma: ST_PYTHON)
    return not (form.endswith("heap") and any(r != root for r in python))


@pytest.mark.timeout(90)
@pytest.mark.parametrize("n,cost,python", [(2, "3", ()), (2, "3", (1,)), (2, "9", ()),
                                           (3, "5", (2,))])
def test_fast_call_takes_split_gathers(n: int, cost: str, python: tuple) -> None:
    # cost 3 and 5: split (c·(n-1) < GATHER_STAGED·n); 9: staged
    from collcomm import native
    from collcomm.algorithms.shm_large import GATHER_PAIR_MIN
    from collcomm.transport.arena_layout import CMA_MIN

    if native.core is None:    # COLLCOMM_NATIVE=0 (or not built): no rank has the fast call
        python = tuple(range(n))
    # two CPUs whatever this host has (with a core for every rank the rule differs)
    res = run_ranks(_job, n, env={"COLLCOMM_CMA_COST": cost, "COLLCOMM_CORES": "2"}, timeout=80,
                    rank_env={r: {"COLLCOMM_NATIVE": "0"} for r in python})
    split_from = res[0][0]
    if cost != "9" and not split_from:
        pytest.skip("ranks may not write each other's memory here (cross-memory attach): no split")
    if cost == "9":   # staged up to a quarter of the cache (or never split), past these
        assert not split_from or split_from > n * CASES[-1][0] * 4, split_from
    else:
        assert split_from == (GATHER_PAIR_MIN if n == 2 else CMA_MIN + 1), split_from
    for rank, (_, seen) in enumerate(res):
        for nbytes, root, form, fast in seen:
            want = _expect(rank, root, form, nbytes, split_from, python)
            assert fast == want, (n, cost, python, rank, nbytes, root, form)
