"""Between two ranks an all_gather and an all_to_all read the peer's block by cross-memory
attach (issue 8): an all_gather from arena_layout.AG_PAIR_MIN, an all_to_all from a block
of shm_large.A2A_PAIR_BLOCK past the eager size, by the fixed rule below
arena_layout.vote_min(2) = 512 KiB and rank 0's vote above.

An all_gather's
fast call takes it itself, from a flat receive buffer and from a list of n buffers
(list_voted, native/_fastcall_lists.c), and a rank on the regular path (COLLCOMM_FAST=0)
or in Python (COLLCOMM_NATIVE=0) takes the same steps (shm_move._gather_voted).

Each job gathers below, at and past AG_PAIR_MIN, odd sizes and past the vote's start included, in
every form: out of place, in place (the send buffer our block of the receive buffer), a
list of separate arrays, a list whose own element is the send buffer, a list whose other
element overlaps the send buffer (the regular path's: the peer reads the send buffer while
the list is filled), and checks every result, which calls read by CMA below the vote's
start (Core.ag_read) and which ones the fast call completed. all_to_all_single likewise,
with split sizes (even, uneven, a block of exactly A2A_PAIR_BLOCK and one element less)
and without (the fast call's form; Fast.calls), counting Core.a2a_read.
"""
from __future__ import annotations

import numpy as np
import pytest

from collcomm import native
from tests.harness import run_ranks

pytestmark = pytest.mark.timeout(120)

#: (elements a rank, dtype)
CASES = ((8_191, "float32"), (8_192, "float32"), (8_195, "float32"), (4_097, "float64"),
         (16_387, "int16"), (40_000, "float32"), (50_001, "float32"), (131_075, "float32"))
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
    a2a = _all_to_alls(core)
    return {"bad": bad + a2a["bad"], "seen": seen, "a2a": a2a["seen"], "cma": bool(arena.cma),
            "vote_min": arena.ag_vote_min}


#: all_to_all_single: (float32s this rank sends itself, float32s it sends the peer, with
#: split sizes); without them (the fast call's form) only equal blocks
A2A_CASES = ((8_192, 8_192, True), (8_194, 8_194, True), (8_191, 8_193, True),
             (40_000, 4_000, True), (20_000, 8_200, True), (8_200, 8_192, True),
             (8_200, 8_191, True), (8_200, 8_200, False), (50_000, 50_000, False),
             (50_000, 50_000, True), (65_536, 65_536, False), (300_001, 299_999, True))


def _all_to_alls(core) -> dict:
    import collcomm as dist
    from collcomm.core.runtime import get_world

    n, me = dist.get_world_size(), dist.get_rank()
    g = get_world("test")
    seen, bad = [], []
    for own, other, splits in A2A_CASES:
        sizes = [own if j == me else other for j in range(n)]      # what we send each rank
        got = [own if r == me else other for r in range(n)]        # what each rank sends us
        send = np.concatenate([np.arange(sizes[j], dtype=np.float32) * 5 + 100 * me + j
                               for j in range(n)])
        recv = np.full(sum(got), -1, np.float32)
        before = core.a2a_read if core is not None else 0
        fast_before = g.fast.calls if g.fast is not None else 0
        if splits:
            dist.all_to_all_single(recv, send, output_split_sizes=got, input_split_sizes=sizes)
        else:
            dist.all_to_all_single(recv, send)
        want = np.concatenate([np.arange(got[r], dtype=np.float32) * 5 + 100 * r + me
                               for r in range(n)])
        if not np.array_equal(recv, want):
            bad.append(("all_to_all", own, other))
        seen.append((send.nbytes, other * 4, None if core is None else core.a2a_read - before,
                     splits, g.fast is not None and g.fast.calls > fast_before))
    return {"bad": bad, "seen": seen}


@pytest.mark.parametrize("env", [None, {0: {"COLLCOMM_FAST": "0"}}, {1: {"COLLCOMM_NATIVE": "0"}}],
                         ids=["fast", "rank0-regular", "rank1-python"])
def test_pair_all_gather_and_all_to_all_read_by_cma(env) -> None:
    from collcomm.algorithms.shm_large import A2A_PAIR_BLOCK
    from collcomm.transport.arena_layout import AG_PAIR_MIN, ONE_SHOT, vote_min

    votes_from = vote_min(2)

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
            if nbytes < votes_from:
                assert read == (1 if nbytes >= AG_PAIR_MIN else 0), (r, nbytes, form, read)
            # the fast call takes every form but a list overlapping the send buffer there
            assert by_fast == (not regular and not (form == "list_overlap" and
                                                    nbytes >= AG_PAIR_MIN)), (r, nbytes, form)
        for nbytes, block, read, splits, by_fast in out["a2a"]:
            if python:
                continue
            # the fast call takes an all_to_all without split sizes
            assert by_fast == (not regular and not splits), (r, nbytes, splits, by_fast)
            if nbytes >= votes_from:    # (there rank 0 votes)
                continue
            # eager if the send buffers fit ONE_SHOT (of the same size on both ranks in
            # these cases), else by CMA from a block of A2A_PAIR_BLOCK (both ways alike)
            eager = nbytes <= ONE_SHOT
            assert read == (0 if eager or block < A2A_PAIR_BLOCK else 1), (r, nbytes, block, read)
