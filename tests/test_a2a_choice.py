"""all_to_all staged or by cross-memory attach, as rank 0 votes (native/_a2a_choice.c):
rank 0 tries both ways on a size it has not seen, then goes the cheaper one; every rank
follows its vote, native or Python; results are right whichever way a call went, with
even and uneven blocks; COLLCOMM_VOTE=0 leaves the fixed rule alone.
"""
from __future__ import annotations

import numpy as np
import pytest

from collcomm import native
from tests.harness import run_ranks

pytestmark = [pytest.mark.timeout(90),
              pytest.mark.skipif(native.core is None, reason=f"native core: {native.reason}")]


def _calls(count: int) -> dict:
    import collcomm as dist
    from collcomm.core import runtime

    n, me = dist.get_world_size(), dist.get_rank()
    dist.barrier()
    arena = runtime._world._arena
    core = arena.native_core
    per = (96 << 10) + 3 * me          # float32s per block (uneven: rank i sends 96K + 3i)
    bad = 0
    for i in range(count):
        sizes = [per] * n                              # what we send to each rank
        send = np.concatenate([np.arange(per, dtype=np.float32) + 1e6 * me + 1e3 * j + i
                               for j in range(n)])
        got = [(96 << 10) + 3 * r for r in range(n)]   # what each rank sends us
        recv = np.full(sum(got), -1, np.float32)
        dist.all_to_all_single(recv, send, output_split_sizes=got, input_split_sizes=sizes)
        at = 0
        for r in range(n):
            want = np.arange(got[r], dtype=np.float32) + 1e6 * r + 1e3 * me + i
            bad += not np.array_equal(recv[at:at + got[r]], want)
            at += got[r]
    votes = None if core is None else (core.a2a_staged, core.a2a_cma)
    return {"bad": bad, "votes": votes, "cma": bool(arena.cma)}


@pytest.mark.parametrize("n,python_rank", [(2, None), (3, None), (2, 1), (3, 0)])
def test_rank_0_votes_and_every_rank_follows(n, python_rank) -> None:
    env = None if python_rank is None else {python_rank: {"COLLCOMM_NATIVE": "0"}}
    res = run_ranks(_calls, n, 12, transport="shm", timeout=80, rank_env=env)
    assert all(r["bad"] == 0 for r in res), [r["bad"] for r in res]
    if not res[0]["cma"]:
        pytest.skip("no cross-memory attach here: nothing to choose")
    for r, out in enumerate(res):
        if r == python_rank:
            assert out["votes"] is None
        elif r == 0:
            staged, by_cma = out["votes"]
            assert staged >= 2 and by_cma >= 2 and staged + by_cma == 12, out["votes"]
        else:
            assert out["votes"] == (0, 0), out["votes"]


def test_no_votes_when_switched_off() -> None:
    res = run_ranks(_calls, 2, 6, transport="shm", timeout=80, env={"COLLCOMM_VOTE": "0"})
    assert all(r["bad"] == 0 for r in res)
    assert [r["votes"] for r in res] == [(0, 0), (0, 0)]


def _gathers(count: int) -> dict:
    """all_gather past the vote's start (256 KiB; 512 KiB between two ranks), flat and as
    lists, out of place and in place, float32 and int16 (an odd count: chunks of whole
    elements across a 256 KiB slot)."""
    import collcomm as dist
    from collcomm.core import runtime

    n, me = dist.get_world_size(), dist.get_rank()
    dist.barrier()
    core = runtime._world._arena.native_core
    bad = 0
    for dt, k in (("float32", (100 << 10) + 7), ("int16", (300 << 10) + 1)):
        want = np.concatenate([(np.arange(k) % 1000 + 7 * r).astype(dt) for r in range(n)])
        for i in range(count):
            mine = (np.arange(k) % 1000 + 7 * me).astype(dt)
            out = np.zeros(k * n, dt)
            dist.all_gather_into_tensor(out, mine)
            bad += not np.array_equal(out, want)
            lst = [np.zeros(k, dt) for _ in range(n)]
            dist.all_gather(lst, mine)
            bad += not np.array_equal(np.concatenate(lst), want)
            inplace = np.zeros(k * n, dt)
            inplace[me * k:(me + 1) * k] = mine
            dist.all_gather_into_tensor(inplace, inplace[me * k:(me + 1) * k])
            bad += not np.array_equal(inplace, want)
    votes = None if core is None else (core.ag_staged, core.ag_cma)
    return {"bad": bad, "votes": votes, "cma": bool(runtime._world._arena.cma)}


@pytest.mark.parametrize("n,python_rank", [(2, None), (3, None), (2, 0), (3, 1)])
def test_all_gather_follows_rank_0s_vote(n, python_rank) -> None:
    env = None if python_rank is None else {python_rank: {"COLLCOMM_NATIVE": "0"}}
    res = run_ranks(_gathers, n, 4, transport="shm", timeout=80, rank_env=env,
                    env={"COLLCOMM_SHM_SLOT": str(256 << 10)})
    assert all(r["bad"] == 0 for r in res), [r["bad"] for r in res]
    if not res[0]["cma"]:
        pytest.skip("no cross-memory attach here: nothing to choose")
    if python_rank == 0:          # a Python rank 0 does not vote: the fixed rule
        assert all(r["votes"] in (None, (0, 0)) for r in res), res
        return
    staged, by_cma = res[0]["votes"]
    assert staged >= 2 and by_cma >= 2 and staged + by_cma == 24, res[0]["votes"]
    assert all(r["votes"] in (None, (0, 0)) for r in res[1:])


def _gathers_in_a_slot(count: int) -> dict:
    """all_gather of 800 KiB in all (two ranks vote from 512 KiB: arena_layout.vote_min),
    each block within the default slot: the native fast call's size, flat and as a list,
    out of place."""
    import collcomm as dist
    from collcomm.core import runtime

    n, me = dist.get_world_size(), dist.get_rank()
    dist.barrier()
    core = runtime._world._arena.native_core
    k = (100 << 10) + 3                                 # float32s per rank: 400 KiB + 12 B
    want = np.concatenate([np.arange(k, dtype=np.float32) * (r + 1) - r for r in range(n)])
    bad = 0
    for _ in range(count):
        mine = np.arange(k, dtype=np.float32) * (me + 1) - me
        out = np.full(k * n, -1, np.float32)
        dist.all_gather_into_tensor(out, mine)
        bad += not np.array_equal(out, want)
        lst = [np.full(k, -1, np.float32) for _ in range(n)]
        dist.all_gather(lst, mine)
        bad += not np.array_equal(np.concatenate(lst), want)
    votes = None if core is None else (core.ag_staged, core.ag_cma)
    return {"bad": bad, "votes": votes, "cma": bool(runtime._world._arena.cma)}


@pytest.mark.parametrize("python_rank,knob", [
    (None, {}), (1, {}), (0, {}),
    (0, {"COLLCOMM_CMA_COST": "0.5"}),     # the fixed rule reads by CMA; rank 0 cannot vote
    (None, {"COLLCOMM_CMA_COST": "0.5"}),
    (1, {"COLLCOMM_VOTE": "0"}),
])
def test_all_gather_within_a_slot_follows_the_vote(python_rank, knob) -> None:
    env = None if python_rank is None else {python_rank: {"COLLCOMM_NATIVE": "0"}}
    res = run_ranks(_gathers_in_a_slot, 2, 5, transport="shm", timeout=80, rank_env=env,
                    env=knob)
    assert all(r["bad"] == 0 for r in res), [r["bad"] for r in res]
    if not res[0]["cma"]:
        pytest.skip("no cross-memory attach here: nothing to choose")
    if python_rank == 0 or knob.get("COLLCOMM_VOTE") == "0":     # nobody votes
        assert all(r["votes"] in (None, (0, 0)) for r in res), res
        return
    staged, by_cma = res[0]["votes"]
    assert staged >= 2 and by_cma >= 2 and staged + by_cma == 10, res[0]["votes"]
    assert res[1]["votes"] in (None, (0, 0)), res


def _many_all_to_alls(count: int) -> dict:
    """``count`` all_to_alls of 768 KiB a rank, back to back (a few ms in all)."""
    import collcomm as dist
    from collcomm.core import runtime

    n, me = dist.get_world_size(), dist.get_rank()
    dist.barrier()
    core = runtime._world._arena.native_core
    per = 96 << 10
    send = np.concatenate([np.arange(per, dtype=np.float32) + 1e6 * me + 1e3 * j for j in range(n)])
    recv = np.empty_like(send)
    want = np.concatenate([np.arange(per, dtype=np.float32) + 1e6 * r + 1e3 * me for r in range(n)])
    bad = 0
    for _ in range(count):
        dist.all_to_all_single(recv, send)
        bad += not np.array_equal(recv, want)
    return {"bad": bad, "votes": None if core is None else (core.a2a_staged, core.a2a_cma)}


def test_first_pick_is_tried_again_soon() -> None:
    # the first pick rests on two calls each way: the other way is tried again (4 calls)
    # after 8, 16, 32 and 64 calls of the picked way (A2A_EARLY), not only every 0.5 s: within 200
    # calls of a few ms each way runs its first try and four more (4 + 16), or, picked in
    # between, at least as many. (Without the early tries a pick that holds leaves the
    # other way its first 4 calls: measured (4, 196), and (48, 152) where it flipped.)
    res = run_ranks(_many_all_to_alls, 2, 200, transport="shm", timeout=80)
    assert [r["bad"] for r in res] == [0, 0]
    staged, by_cma = res[0]["votes"]
    if staged + by_cma == 0:
        pytest.skip("no cross-memory attach here: nothing to choose")
    assert staged + by_cma == 200 and min(staged, by_cma) >= 20, res[0]["votes"]


def _staged_calls(ways: list[int]) -> int:
    return sum(1 for w in ways if w == 0)


def test_vote_rules_on_chosen_samples() -> None:
    """Rank 0's vote (native/_a2a_choice.c) run on chosen costs (native.core.vote_sim: no
    processes, no timing): CMA 20 µs, staging 44, 400 calls of 512 KiB unless said."""
    sim = native.core.vote_sim
    size, calls = 512 << 10, 400
    # the first pick is CMA; staged only for the first try and the four early ones
    steady = sim(size, [44.0] * calls, [20.0] * calls)
    assert steady[:8] == [0, 0, 0, 0, 1, 1, 1, 1] and _staged_calls(steady) == 20
    # one hiccup (388 µs) taking CMA changes nothing (it counts as 2x the figure at most)
    spike = sim(size, [44.0] * calls, [20.0] * 100 + [388.0] + [20.0] * 299)
    assert _staged_calls(spike) == 20, spike
    # CMA turning 10x slower for good: staging from within a few calls, and it stays
    turn = sim(size, [44.0] * calls, [20.0] * 150 + [200.0] * 250)
    assert all(w == 0 for w in turn[170:]), turn[150:200]
    # a first pick made on the settling calls (staging 30, CMA 80 before they settle at
    # 44 / 20): the first early try, after 8 calls, finds CMA cheaper and switches
    settle = sim(size, [30.0] * 10 + [44.0] * 390, [80.0] * 10 + [20.0] * 390)
    assert settle[8:12] == [0, 0, 0, 0] and all(w == 1 for w in settle[19:35]), settle[:40]
    # two ways within the margin: no switching back and forth, only the tries
    close = sim(size, [21.0] * calls, [20.0] * calls)
    assert _staged_calls(close) == 20, close
    # (as many samples each way, or nothing)
    with pytest.raises(ValueError):
        sim(size, [1.0, 2.0], [1.0])
