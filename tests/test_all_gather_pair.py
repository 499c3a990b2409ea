"""An all_gather between two ranks reads its peer's block by cross-memory attach from
arena_layout.AG_PAIR_MIN (issue 8): the fixed rule below CMA_MIN, rank 0's vote above; the
fast call takes it itself, from a flat receive buffer and from a list of n buffers
(list_voted, native/_fastcall_lists.c), and a rank on the regular path (COLLCOMM_FAST=0)
or in Python (COLLCOMM_NATIVE=0) takes the same steps (shm_move._gather_voted).

Each job gathers below, at and past AG_PAIR_MIN, odd sizes and past CMA_MIN included, in
every form: out of place, in place (the send buffer our block of the receive buffer), a
list of separate arrays, a list whose own element is the send buffer, a list whose other
element overlaps the send buffer (the regular path's: the peer reads the send buffer while
the list is filled), and checks every result, which calls read by CMA below CMA_MIN
(Core.ag_read) and which ones the fast call completed.
"""
from __future__ import annotations

import numpy as np
import pytest

from collcomm import native
from tests.harness import run_ranks

pytestmark = pytest.mark.timeout(120)

#: (elements a rank, dtype)
CASES = ((8_191, "float32"), (8_192, "float32"), (8_195, "float32"), (4_097, "float64"),
         (16_387, "int16"), (40_000, "float32"), (131_075, "float32"))
FORMS = ("flat", "in_place", "list", "list_own", "list_overlap")


def _gathers() -> dict:
    import collcomm as dist
    from collcomm.core.runtime import get_world

    n, me = dist.get_world_size(), dist.get_rank()
    dist.barrier()
    g = get_world("test")
    arena = g._arena
    core = arena.native_core
    seen, bad = [], []
    for count, dt in CASES:
        want = np.concatenate([np.arange(count, dtype=dt) * 3 + r for r in range(n)])
        for form in FORMS:
            fast_before = g.fast.calls if g.fast is not None else 0
            read_before = core.ag_read if core is not None else 0
            mine = np.arange(count, dtype=dt) * 3 + me
            if form in ("flat", "in_place"):
                recv = np.full(n * count, -1, dt)
                send = mine
                if form == "in_place":
                    send = recv[me * count:(me + 1) * count]
                    send[:] = mine
                dist.all_gather_into_tensor(recv, send)
                got = recv
            else:
                parts = [np.full(count, -1, dt) for _ in range(n)]
                send = mine
                if form == "list_own":
                    send = parts[me]
                    send[:] = mine
                if form == "list_overlap":    # the peer's element starts inside our send buffer
                    joined = np.full(count + count // 2, -1, dt)
                    send = joined[:count]
                    send[:] = mine
                    parts[1 - me] = joined[count // 2:]
                dist.all_gather(parts, send)
                got = np.concatenate(parts)
            if not np.array_equal(got, want):
                bad.append((count, dt, form))
            seen.append((n * count * np.dtype(dt).itemsize, form,
                         g.fast is not None and g.fast.calls > fast_before,
                         None if core is None else core.ag_read - read_before))
    return {"bad": bad, "seen": seen, "cma": bool(arena.cma), "vote_min": arena.ag_vote_min}


@pytest.mark.parametrize("env", [None, {0: {"COLLCOMM_FAST": "0"}}, {1: {"COLLCOMM_NATIVE": "0"}}],
                         ids=["fast", "rank0-regular", "rank1-python"])
def test_pair_all_gather_reads_by_cma_from_ag_pair_min(env) -> None:
    from collcomm.transport.arena_layout import AG_PAIR_MIN, CMA_MIN

    res = run_ranks(_gathers, 2, transport="shm", timeout=100, rank_env=env)
    assert [r["bad"] for r in res] == [[], []], [r["bad"] for r in res]
    if not res[0]["cma"]:
        pytest.skip("no cross-memory attach here: every all_gather stages")
    assert res[0]["vote_min"] == res[1]["vote_min"] == AG_PAIR_MIN
    if native.core is None:
        return
    for r, out in enumerate(res):
        python = env is not None and env.get(r, {}).get("COLLCOMM_NATIVE") == "0"
        regular = env is not None and env.get(r, {}).get("COLLCOMM_FAST") == "0"
        for nbytes, form, by_fast, read in out["seen"]:
            if python:
                assert read is None
                continue
            # the fixed rule, rank 0 not voting: below AG_PAIR_MIN staged, then by CMA
            if nbytes < CMA_MIN:
                assert read == (1 if nbytes >= AG_PAIR_MIN else 0), (r, nbytes, form, read)
            # the fast call takes every form but a list overlapping the send buffer there
            assert by_fast == (not regular and not (form == "list_overlap" and
                                                    nbytes >= AG_PAIR_MIN)), (r, nbytes, form)
