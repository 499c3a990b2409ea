"""Copies whose destination lies 1-63 bytes past the source modulo 4 KiB take a vector
loop where the CPU's memcpy is slow there (native/_copy_near.c ``near_copy``; timed once a
process, or COLLCOMM_NEAR_COPY=1/0): glibc copies 2 KiB up to the L2's size with ``rep
movsb``, which some CPUs run 10-30x slower at such distances, and a numpy array lies
wherever malloc put it. Every collective's data must arrive whole with the caller's
buffers at any place in a page (odd places, odd lengths: the loop's head and tail), and
the copies in the band must be the ones that take the loop. The pure-Python path runs the
same calls for their results."""
from __future__ import annotations

import os

import numpy as np
import pytest

from collcomm import native
from tests.harness import run_ranks
from tests.test_cma_bounce import _at, swap

SMALL = 16 * 1024 + 5          # staged in the slot at a page's start (below ONE_SHOT)
LARGE = 96 * 1024 + 7          # staged at the sender's page offset (ONE_SHOT and up)


def _pattern(nbytes: int, rank: int, salt: int) -> np.ndarray:
    return ((np.arange(nbytes) * (2 * salt + 1) + 7 * rank + salt) % 251).astype(np.uint8)


def _calls(offsets: list[int], nbytes: int) -> dict:
    """Each collective once with rank r's buffers ``offsets[r]`` bytes into a page (uint8,
    per-rank blocks of ``nbytes``): whether each result is right, and the near copies each
    counted (None without the native core)."""
    import collcomm as dist

    me, n = dist.get_rank(), dist.get_world_size()
    o = offsets[me]
    counted = (lambda: native.core.near_copies()[0]) if native.core is not None else (lambda: 0)
    every = [_pattern(nbytes, r, 1) for r in range(n)]
    total = np.sum(np.stack(every).astype(np.int64), axis=0) % 256
    ok: dict = {}
    near: dict = {}

    def run(name: str, fn, check) -> None:
        dist.barrier()
        before = counted()
        fn()
        near[name] = counted() - before
        ok[name] = bool(check())

    buf = _at(nbytes, o)
    buf[:] = every[0] if me == 0 else 0
    run("broadcast", lambda: dist.broadcast(buf, src=0), lambda: np.array_equal(buf, every[0]))
    send, recv = _at(nbytes, o), _at(nbytes, o)
    send[:] = every[me]
    run("all_reduce", lambda: (recv.__setitem__(slice(None), send), dist.all_reduce(recv)),
        lambda: np.array_equal(recv, total))
    red = _at(nbytes, o)
    red[:] = every[me]
    run("reduce", lambda: dist.reduce(red, dst=n - 1),
        lambda: me != n - 1 or np.array_equal(red, total))
    whole = _at(n * nbytes, o)
    run("all_gather", lambda: dist.all_gather_into_tensor(whole, send),
        lambda: np.array_equal(whole, np.concatenate(every)))
    pieces = [_at(nbytes, o) for _ in range(n)] if me == 0 else None
    run("gather", lambda: dist.gather(send, pieces, dst=0),
        lambda: me != 0 or all(np.array_equal(pieces[r], every[r]) for r in range(n)))
    part = _at(nbytes, o)
    scat = [_at(nbytes, o) for _ in range(n)] if me == 0 else None
    if me == 0:
        for r in range(n):
            scat[r][:] = _pattern(nbytes, r, 2)
    run("scatter", lambda: dist.scatter(part, scat, src=0),
        lambda: np.array_equal(part, _pattern(nbytes, me, 2)))
    from collcomm import MPI           # (contiguous blocks: the staged scatter and gather)

    comm = MPI.COMM_WORLD
    block_send = _at(n * nbytes, o)
    if me == 0:
        block_send[:] = np.concatenate([_pattern(nbytes, r, 6) for r in range(n)])
    run("Scatter", lambda: comm.Scatter(block_send, part, root=0),
        lambda: np.array_equal(part, _pattern(nbytes, me, 6)))
    block_recv = _at(n * nbytes, o)
    run("Gather", lambda: comm.Gather(send, block_recv, root=0),
        lambda: me != 0 or np.array_equal(block_recv, np.concatenate(every)))
    rs_in = _at(n * nbytes, o)
    rs_in[:] = np.concatenate([_pattern(nbytes, me * n + j, 3) for j in range(n)])
    rs_out = _at(nbytes, o)
    rs_want = sum(_pattern(nbytes, r * n + me, 3).astype(np.int64) for r in range(n)) % 256
    run("reduce_scatter", lambda: dist.reduce_scatter_tensor(rs_out, rs_in),
        lambda: np.array_equal(rs_out, rs_want))
    a2a_in, a2a_out = _at(n * nbytes, o), _at(n * nbytes, o)
    a2a_in[:] = np.concatenate([_pattern(nbytes, me * n + j, 4) for j in range(n)])
    run("all_to_all", lambda: dist.all_to_all_single(a2a_out, a2a_in),
        lambda: np.array_equal(a2a_out, np.concatenate([_pattern(nbytes, r * n + me, 4) for r in range(n)])))
    got = _at(nbytes, o)
    ops = [dist.P2POp(dist.isend, send, (me + 1) % n), dist.P2POp(dist.irecv, got, (me - 1) % n)]
    run("sendrecv", lambda: [w.wait() for w in dist.batch_isend_irecv(ops)],
        lambda: np.array_equal(got, every[(me - 1) % n]))
    return {"ok": ok, "near": near,
            "slow": native.core.near_copies()[1] if native.core is not None else None}


def _exchanges(offset: int, nbytes: int) -> dict:
    """64 exchanges of ``nbytes`` (batched, then blocking send / recv) with both buffers
    ``offset`` bytes into a page: whether every one arrived whole, and the near copies. A
    message's record in the ring takes a whole number of cache lines, odd for 2,650 bytes,
    so 64 of them start at every line of a page in turn."""
    import collcomm as dist

    me, n = dist.get_rank(), dist.get_world_size()
    send, got = _at(nbytes, offset), _at(nbytes, offset)
    ok = True
    before = native.core.near_copies()[0] if native.core is not None else 0
    for k in range(128):
        send[:] = _pattern(nbytes, me, k)
        if k < 64:
            ops = [dist.P2POp(dist.isend, send, (me + 1) % n), dist.P2POp(dist.irecv, got, (me - 1) % n)]
            for w in dist.batch_isend_irecv(ops):
                w.wait()
        else:
            swap(dist, send, got)
        ok = ok and bool(np.array_equal(got, _pattern(nbytes, (me - 1) % n, k)))
    after = native.core.near_copies()[0] if native.core is not None else 0
    return {"ok": ok, "near": after - before}


PLACES = [(0, 0), (16, 16), (1, 33), (63, 4080), (0, 16), (48, 0), (32, 96), (4080, 8)]


def _places(places: list[tuple[int, ...]], nbytes: int) -> dict:
    """_calls at each placement in turn: every result right, and the near copies per
    collective summed over the placements."""
    ok, near, slow = True, {}, None
    for offsets in places:
        got = _calls(list(offsets), nbytes)
        ok = ok and all(got["ok"].values())
        for name, count in got["near"].items():
            near[name] = near.get(name, 0) + count
        slow = got["slow"]
    return {"ok": ok, "near": near, "slow": slow}


def _run(places: list[tuple[int, ...]], nbytes: int, setting: str = "1") -> list[dict]:
    return run_ranks(_places, len(places[0]), places, nbytes, transport="shm", timeout=100,
                     env={"COLLCOMM_NEAR_COPY": setting, "COLLCOMM_VOTE": "0", "COLLCOMM_CMA_COST": "1"})


def _native() -> bool:
    return native.core is not None and os.environ.get("COLLCOMM_NATIVE", "1") != "0"


def _total(res: list[dict]) -> dict:
    return {name: sum(r["near"][name] for r in res) for name in res[0]["near"]}


# Which collectives copy in the band somewhere among PLACES, by block size (both ranks'
# counts together; the paths pinned by COLLCOMM_CMA_COST=1 and COLLCOMM_VOTE=0, so a
# change of a path's threshold can change these): below ONE_SHOT every staged copy sits at its slot's page start; from it
# at its sender's page offset; 16 KiB broadcast goes by cross-memory attach (_cma_move.c's
# bounce), a two-rank reduce folds into the output without a copy.
IN_BAND = {
    3000: ["broadcast", "all_reduce", "reduce", "all_gather", "gather", "Scatter", "Gather",
           "reduce_scatter", "all_to_all"],
    SMALL: ["all_reduce", "all_gather", "gather", "scatter", "Scatter", "Gather", "reduce_scatter",
            "all_to_all"],
    LARGE: ["all_reduce", "all_gather", "reduce_scatter"],
}


@pytest.mark.timeout(150)
@pytest.mark.parametrize("nbytes", [3000, SMALL, LARGE])
def test_every_collective_whole_at_every_place(nbytes: int) -> None:
    res = _run(PLACES, nbytes)
    assert all(r["ok"] for r in res), res
    if _native():
        total = _total(res)
        assert all(total[name] >= 1 for name in IN_BAND[nbytes]), total


@pytest.mark.timeout(120)
def test_copies_off_the_band_take_memcpy() -> None:
    """Buffers and blocks on cache lines: no copy lies 1-63 bytes past its source."""
    res = _run([(0, 0), (64, 128), (4032, 0)], 16384)
    assert all(r["ok"] for r in res), res
    if _native():    # (not sendrecv: a ring's record starts 40 bytes into a line, anywhere)
        assert sum(v for name, v in _total(res).items() if name != "sendrecv") == 0, res


@pytest.mark.timeout(120)
@pytest.mark.parametrize("offset", [16, 0])
def test_point_to_point_whole(offset: int) -> None:
    res = run_ranks(_exchanges, 2, offset, 2650, transport="shm", timeout=100,
                    env={"COLLCOMM_NEAR_COPY": "1"})
    assert all(r["ok"] for r in res), res
    if _native():          # the ring's copies in and out, some at every buffer's place
        assert all(r["near"] >= 1 for r in res), res


@pytest.mark.timeout(120)
@pytest.mark.parametrize("setting", ["0", ""])
def test_the_loop_is_timed_or_turned_off(setting: str) -> None:
    """COLLCOMM_NEAR_COPY=0: every copy memcpy's, the data whole; unset: the CPU timed at
    the first copy in the band (the loop taken only where it says memcpy is slow there)."""
    if not _native():
        pytest.skip("the native core's copies")
    for r in _run([(16, 16), (0, 16)], SMALL, setting):
        assert r["ok"], r
        if setting == "0":
            assert r["slow"] == 0 and sum(r["near"].values()) == 0, r
        else:
            assert r["slow"] in (0, 1), r
            assert (sum(r["near"].values()) > 0) == (r["slow"] == 1), r


@pytest.mark.timeout(150)
def test_three_ranks_at_three_places() -> None:
    res = _run([(16, 0, 40), (0, 48, 4080)], SMALL)
    assert all(r["ok"] for r in res), res


def _overlapping(shift: int, count: int) -> bool:
    """A group of one's all_gather whose output starts ``shift`` float32s past its input
    (negative: before it): the output must read as the input did."""
    import collcomm as dist

    a = np.arange(count + abs(shift), dtype=np.float32)
    want = a[max(0, -shift):max(0, -shift) + count].copy()
    src = a[max(0, -shift):max(0, -shift) + count]
    dst = a[max(0, shift):max(0, shift) + count]
    dist.all_gather_into_tensor(dst, src)
    return bool(np.array_equal(dst, want))


@pytest.mark.timeout(60)
def test_a_group_of_one_moves_overlapping_blocks() -> None:
    """Its own block copied within one array, 16 bytes past (in the band) and before."""
    for shift in (4, -4, 1, 600):
        assert run_ranks(_overlapping, 1, shift, 4096, timeout=50,
                         env={"COLLCOMM_NEAR_COPY": "1"}) == [True], shift
