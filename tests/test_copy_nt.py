"""COLLCOMM_COPY_NT_MIN: the native core copies a rank's own block into its output with
streaming (non-temporal) stores from that many bytes (native/_stage_nt.c ``out_copy``;
default 4 MiB, 0: never). Results stay bit for bit what plain stores give, with ranks in C
and on the Python path together, at odd sizes and odd addresses; the setting is read and
checked."""
from __future__ import annotations

import numpy as np
import pytest

from collcomm import native
from tests.harness import run_ranks
from tests.native_common import lone_core

pytestmark = pytest.mark.skipif(native.core is None, reason="the native core is not built")


def test_the_setting(monkeypatch):
    assert lone_core().out_nt_min == 0 and lone_core(out_nt_min=4096).out_nt_min == 4096
    with pytest.raises(ValueError, match="out_nt_min"):
        lone_core(out_nt_min=-1)
    monkeypatch.delenv("COLLCOMM_COPY_NT_MIN", raising=False)
    assert native.copy_nt_min() == native.COPY_NT_MIN == 4 << 20
    monkeypatch.setenv("COLLCOMM_COPY_NT_MIN", "0")
    assert native.copy_nt_min() == 0
    monkeypatch.setenv("COLLCOMM_COPY_NT_MIN", " 65536 ")
    assert native.copy_nt_min() == 65536
    for bad in ("4M", "-5", "yes"):
        monkeypatch.setenv("COLLCOMM_COPY_NT_MIN", bad)
        with pytest.warns(RuntimeWarning, match="not a byte count"):
            assert native.copy_nt_min() == 4 << 20


#: (dtype, elements a rank, at an odd address): odd byte counts, 1/2/4/8-byte items
CASES = [(np.int8, 70_001, True), (np.float16, 3_001, False), (np.float32, 40_003, False),
         (np.float64, 9_999, False), (np.int8, 17, True), (np.float32, 300_001, False),
         (np.int8, 2_000_001, True)]


def _array(count: int, dt, odd: bool) -> np.ndarray:
    """A zeroed array of ``count`` items; ``odd``: starting one byte past an aligned one
    (the streamed copy's unaligned head and tail)."""
    if not odd:
        return np.zeros(count, dt)
    raw = np.zeros(count * np.dtype(dt).itemsize + 1, np.uint8)
    return raw[1:].view(dt)


def _own_blocks() -> tuple:
    """Every collective that copies a rank's own block into its output, checked against
    numpy; then (the core's setting, own blocks it streamed) or (None, 0) on the Python
    path."""
    import collcomm as dist
    from collcomm import MPI
    from collcomm.core import runtime as rt

    me, n = dist.get_rank(), dist.get_world_size()
    for dt, count, odd in CASES:
        base = (np.arange(count * n) % 11).astype(dt)
        mine = _array(count, dt, odd)
        mine[:] = base[:count] + me
        out = _array(count * n, dt, odd)
        dist.all_gather_into_tensor(out, mine)
        assert np.array_equal(out, np.concatenate([base[:count] + r for r in range(n)])), dt
        send = _array(count * n, dt, odd)
        send[:] = base + me
        got = _array(count * n, dt, odd)
        dist.all_to_all_single(got, send)
        want = np.concatenate([(base + r)[me * count:(me + 1) * count] for r in range(n)])
        assert np.array_equal(got, want), dt
        # all_to_allv: rank r sends j elements r + j + 1 (its own block the largest part)
        sizes = [me + j + 1 + (count if j == me else 0) for j in range(n)]
        gets = [r + me + 1 + (count if r == me else 0) for r in range(n)]
        vsend = (np.arange(sum(sizes)) % 7).astype(dt) + me
        vgot = np.zeros(sum(gets), dt)
        dist.all_to_all_single(vgot, vsend, output_split_sizes=gets, input_split_sizes=sizes)
        at = 0
        for r in range(n):
            first = sum(r + j + 1 + (count if j == r else 0) for j in range(me))
            want = (np.arange(first, first + gets[r]) % 7).astype(dt) + r
            assert np.array_equal(vgot[at:at + gets[r]], want), (dt, r)
            at += gets[r]
        root = (count + n) % n
        parts = [_array(count, dt, odd) for _ in range(n)] if me == root else None
        dist.gather(mine, parts, dst=root)
        if me == root:
            assert all(np.array_equal(p, base[:count] + r) for r, p in enumerate(parts)), dt
        pieces = [base[:count] + 3 * r for r in range(n)] if me == root else None
        piece = _array(count, dt, odd)
        dist.scatter(piece, pieces, src=root)
        assert np.array_equal(piece, base[:count] + 3 * me), dt
        # mpi4py's flat forms: the root's own block of one buffer
        flat = _array(count * n, dt, odd) if me == root else None
        if me == root:
            flat[:] = base + 5
        piece = _array(count, dt, odd)
        MPI.COMM_WORLD.Scatter(flat, piece, root=root)
        assert np.array_equal(piece, (base + 5)[me * count:(me + 1) * count]), dt
        MPI.COMM_WORLD.Gather(piece, flat, root=root)
        if me == root:
            assert np.array_equal(flat, base + 5), dt
    arena = rt.get_world("test")._arena
    core = None if arena is None else arena.native_core
    return (None, 0) if core is None else (core.out_nt_min, core.out_streamed)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("setting", ["1", "0"])
def test_streamed_own_blocks_give_the_same_results(setting: str) -> None:
    """Rank 1 runs the Python path; ranks 0 and 2 copy their own blocks in C, streamed
    (every copy of a byte or more) or plain."""
    res = run_ranks(_own_blocks, 3, transport="shm", timeout=100,
                    env={"COLLCOMM_COPY_NT_MIN": setting}, rank_env={1: {"COLLCOMM_NATIVE": "0"}})
    assert res[1] == (None, 0)
    for at, streamed in (res[0], res[2]):
        assert at == int(setting)
        # each case: an all_gather, two all_to_alls on every rank and a root's gather and
        # scatter blocks (by C where it takes the call)
        assert streamed >= 3 * len(CASES) if setting == "1" else streamed == 0


@pytest.mark.timeout(120)
def test_every_own_block_goes_through_the_streamed_copy() -> None:
    """Two ranks in C, every copy streamed: each case's all_gather and two all_to_alls on
    both ranks, and the root's (rank 1's: every count is odd) four gather and scatter
    blocks, list and flat forms: 3 copies a case, 7 at the root."""
    assert all(count % 2 for _, count, _ in CASES)
    res = run_ranks(_own_blocks, 2, transport="shm", timeout=100, env={"COLLCOMM_COPY_NT_MIN": "1"})
    assert res == [(1, 3 * len(CASES)), (1, 7 * len(CASES))]


def _big_all_gather() -> tuple:
    """A 4 MiB block a rank (the default threshold) gathered by two ranks, and an all_to_all
    whose own block is 4 MiB; then the core's setting, own blocks streamed, and own blocks
    streamed after an all_gather of blocks 4 bytes short of it."""
    import collcomm as dist
    from collcomm.core import runtime as rt

    me = dist.get_rank()
    count = (4 << 20) // 4
    mine = np.arange(count, dtype=np.float32) + me
    out = np.zeros(2 * count, np.float32)
    dist.all_gather_into_tensor(out, mine)
    assert np.array_equal(out[:count], mine - me) and np.array_equal(out[count:], mine - me + 1)
    send = np.arange(2 * count, dtype=np.float32) + 10 * me
    got = np.zeros(2 * count, np.float32)
    dist.all_to_all_single(got, send)
    for r in range(2):
        assert np.array_equal(got[r * count:(r + 1) * count],
                              np.arange(me * count, (me + 1) * count, dtype=np.float32) + 10 * r)
    core = rt.get_world("test")._arena.native_core
    streamed = core.out_streamed
    less = np.zeros(2 * count - 2, np.float32)     # a block of 4 MiB less 4 bytes: plain
    dist.all_gather_into_tensor(less, mine[1:])
    assert np.array_equal(less[:count - 1], mine[1:] - me)
    return core.out_nt_min, streamed, core.out_streamed


@pytest.mark.timeout(120)
def test_the_default_streams_blocks_of_4_mib_between_two_ranks() -> None:
    for at, streamed, after in run_ranks(_big_all_gather, 2, transport="shm", timeout=100,
                                         env={"COLLCOMM_COPY_NT_MIN": ""}):
        assert at == 4 << 20 and streamed == after == 2
