"""Large broadcast, all_gather, gather, scatter and all_to_all on the shared-memory arena (issue 8,
part 3): staged in pipelined steps, or read from the peers' memory by cross-memory attach,
as the size and ``arena.cma_cost`` decide (see shm_large.reads_peers and docs/large-copies.md).

One job per row below runs every case on real ranks. Slots of 256 KiB
(``COLLCOMM_SHM_SLOT``) make a few-MB buffer take many steps and chunks, so the large-message
paths run on small, quick buffers. The rows cover world sizes 1-5 and the ways a call can
go: the measured choice, CMA forced cheap (``COLLCOMM_CMA_COST=0.5``: every large call reads
by address), no CMA (``COLLCOMM_CMA=0``), no native core (``COLLCOMM_NATIVE=0``), and
ranks that disagree on the native core (one runs the steps in Python, the others in C).
"""
from __future__ import annotations

import numpy as np
import pytest

from tests.harness import run_ranks

SLOT = 256 << 10
#: element counts: zero, small odd, around the CMA threshold (256 KiB) and the pipeline's
#: step (128 KiB), and several slots' worth
COUNTS = (0, 7, 65_536, 300_007, 700_001)
DTYPES = ("float32", "int16", "float64")


def _arena():
    from collcomm.core.runtime import get_world

    world = get_world("test")
    return world.run("test", lambda c: c.arena()) if world.size > 1 else None


def _cases(read_only_cma: bool = False) -> tuple[int, float]:
    """Every case on this rank; (cases done, the arena's agreed CMA cost or -1).
    ``read_only_cma``: every rank acts as if it could not write the others' memory."""
    import collcomm as dist
    from collcomm.core.runtime import get_world
    from collcomm.errors import MismatchError

    n, me = dist.get_world_size(), dist.get_rank()
    arena = _arena()
    if arena is not None and read_only_cma:
        arena.cma_write = False
        fast = get_world("test").fast    # (built with the arena: it split broadcasts and
        if fast is not None:             # scatters by CMA, the root writing)
            fast.bcast_cma = fast.scatter_cma = 0
    done = 0
    for dt in DTYPES:
        for count in COUNTS:
            if dt != "float32" and count not in (7, 300_007):
                continue
            if n > 3 and (count == 65_536 or (dt != "float32" and count == 7)):
                continue
            if n > 2 and dt == "int16":
                continue
            base = np.arange(count).astype(dt)
            for root in range(n):                       # broadcast, every root
                buf = base + me if count else base.copy()
                dist.broadcast(buf, src=root)
                assert np.array_equal(buf, base + root if count else base), ("broadcast", dt, count, root)
                done += 1
            mine = (base * (me + 1)).astype(dt)         # all_gather, out of place and in place
            out = np.empty(n * count, dt)
            dist.all_gather_into_tensor(out, mine)
            want = np.concatenate([(base * (r + 1)).astype(dt) for r in range(n)])
            assert np.array_equal(out, want), ("all_gather", dt, count)
            out2 = np.zeros(n * count, dt)
            out2[me * count:(me + 1) * count] = mine
            dist.all_gather_into_tensor(out2, out2[me * count:(me + 1) * count])
            assert np.array_equal(out2, want), ("all_gather in place", dt, count)
            for root in range(n):                       # gather, every root
                parts = [np.empty(count, dt) for _ in range(n)] if me == root else None
                dist.gather(mine, parts, dst=root)
                if me == root:
                    assert np.array_equal(np.concatenate(parts), want), ("gather", dt, count, root)
            for root in range(n):                       # scatter, every root
                out = np.full(count, 99).astype(dt)
                parts = [(base * (r + 1) + root).astype(dt) for r in range(n)] if me == root else None
                dist.scatter(out, parts, src=root)
                assert np.array_equal(out, (base * (me + 1) + root).astype(dt)), ("scatter", dt, count, root)
            done += 2
            # all_to_all: equal blocks, then uneven ones (rank i sends j (i + j + 1) * q)
            send = (np.arange(n * count) + 1000 * me).astype(dt)
            recv = np.empty(n * count, dt)
            dist.all_to_all_single(recv, send)
            want = np.concatenate([(np.arange(me * count, (me + 1) * count) + 1000 * r).astype(dt)
                                   for r in range(n)])
            assert np.array_equal(recv, want), ("all_to_all", dt, count)
            q = count // (2 * n) + 1 if count else 0
            ssplit = [(me + j + 1) * q for j in range(n)]
            rsplit = [(i + me + 1) * q for i in range(n)]
            send = (np.arange(sum(ssplit)) + 1000 * me).astype(dt)
            recv = np.empty(sum(rsplit), dt)
            dist.all_to_all_single(recv, send, output_split_sizes=rsplit, input_split_sizes=ssplit)
            want = []
            for i in range(n):
                start = sum((i + j + 1) * q for j in range(me))
                want.append((np.arange(start, start + rsplit[i]) + 1000 * i).astype(dt))
            assert np.array_equal(recv, np.concatenate(want)), ("all_to_all uneven", dt, count)
            done += 3
    if n > 1:   # a call the ranks disagree on raises on every rank, before any traffic
        for call in (lambda: dist.broadcast(np.zeros(300_007 + me, np.float32), src=0),
                     lambda: dist.broadcast(np.zeros(300_007, np.float32), src=me % 2),
                     lambda: dist.all_gather_into_tensor(np.empty(n * (300_007 + me), np.float32),
                                                         np.zeros(300_007 + me, np.float32)),
                     lambda: dist.scatter(np.empty(300_007 + me, np.float32),
                                          [np.zeros(300_007, np.float32)] * n if me == 0 else None, src=0),
                     lambda: dist.gather(np.zeros(300_007 + me, np.float32),
                                         [np.empty(300_007, np.float32) for _ in range(n)] if me == 0 else None,
                                         dst=0),
                     lambda: dist.all_to_all_single(np.empty(n * 80_000, np.float32 if me else np.int32),
                                                    np.zeros(n * 80_000, np.float32 if me else np.int32))):
            with pytest.raises(MismatchError):
                call()
            done += 1
        buf = np.arange(300_007, dtype=np.float32) + me       # and the group still works
        dist.broadcast(buf, src=n - 1)
        assert np.array_equal(buf, np.arange(300_007, dtype=np.float32) + n - 1)
        _shared_root()
    return done, (arena.cma_cost if arena is not None and arena.cma else -1.0), \
        (arena.cores if arena is not None else 0)


def _shared_root() -> None:
    """A broadcast root / all_gather ranks whose buffers are in the shared heap (read in
    place) while the others' are plain numpy."""
    import collcomm as dist

    n, me = dist.get_world_size(), dist.get_rank()
    count = 300_007
    heap = dist.empty(count, dtype=np.float32)
    for root in range(n):
        buf = heap if me == root else np.empty(count, np.float32)
        buf[:] = np.arange(count) + me
        dist.broadcast(buf, src=root)
        assert np.array_equal(buf, np.arange(count, dtype=np.float32) + root)
    mine = heap if me % 2 else np.empty(count, np.float32)
    mine[:] = np.arange(count) * (me + 1)
    out = np.empty(n * count, np.float32)
    dist.all_gather_into_tensor(out, mine)
    assert np.array_equal(out, np.concatenate([np.arange(count, dtype=np.float32) * (r + 1)
                                               for r in range(n)]))


ROWS = [   # (n, environment, read_only_cma)
    (1, {}, False),
    (2, {}, False),
    (3, {"COLLCOMM_CMA_COST": "0.5"}, True),
    (4, {"COLLCOMM_CMA": "0"}, False),
    (5, {}, False),
    (2, {"COLLCOMM_NATIVE": "0", "COLLCOMM_CMA_COST": "0.5"}, False),
    # a core per rank: scatters and gathers from ROOTED_PARALLEL split, all_to_all past a
    # slot by CMA (c < n), whatever this machine has
    (3, {"COLLCOMM_CORES": "3", "COLLCOMM_CMA_COST": "2.9"}, False),
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n,env,read_only", ROWS, ids=[
    f"n{n}-" + ("-".join(f"{k[9:]}={v}" for k, v in e.items()) or "measured") + ("-readonly" if ro else "")
    for n, e, ro in ROWS])
def test_large_one_to_many(n, env, read_only):
    res = run_ranks(_cases, n, read_only, env={"COLLCOMM_SHM_SLOT": str(SLOT), **env}, timeout=100)
    assert len(set(res)) == 1 and res[0][0] > 0      # the same cases, the same CMA cost
    cost = res[0][1]
    if "COLLCOMM_CORES" in env:
        assert res[0][2] == int(env["COLLCOMM_CORES"])
    if n > 1 and env.get("COLLCOMM_CMA") != "0":
        assert cost == float(env.get("COLLCOMM_CMA_COST", cost)) and cost > 0
    elif n > 1:
        assert cost == -1.0


@pytest.mark.timeout(60)
def test_mixed_native_and_python_ranks_take_the_same_steps_and_agree_on_the_cost():
    # rank 1 runs the staged steps in Python, the others in C: the same syncs either way;
    # the ranks measure (or are told) different CMA costs and all take the largest
    res = run_ranks(_cases, 3, False, env={"COLLCOMM_SHM_SLOT": str(SLOT)}, timeout=100,
                    rank_env={0: {"COLLCOMM_CMA_COST": "0.25"},
                              1: {"COLLCOMM_NATIVE": "0", "COLLCOMM_CMA_COST": "2.5"}})
    assert len(set(res)) == 1
    assert res[0][1] == -1.0 or res[0][1] >= 2.5


@pytest.mark.timeout(120)
def test_mixed_ranks_with_a_core_each():
    # a core per rank (forced), c < n: scatters and gathers from ROOTED_PARALLEL split,
    # all_to_all past a slot by CMA; rank 1 on the Python path, rank 2 without fast calls,
    # rank 0 with them: the same steps everywhere, the right results
    # (the default 4 MiB slot: the fast call could stage what the regular path splits)
    res = run_ranks(_cases, 3, False, env={"COLLCOMM_CORES": "3", "COLLCOMM_CMA_COST": "2.9"},
                    timeout=100,
                    rank_env={1: {"COLLCOMM_NATIVE": "0"}, 2: {"COLLCOMM_FAST": "0"}})
    assert len(set(res)) == 1 and res[0][1:] == (2.9, 3)


@pytest.mark.timeout(60)
def test_mixed_ranks_staged_and_split_broadcast():
    # n = 2, rank 1 in Python: told a high CMA cost, the broadcasts from CMA_MIN stage in
    # steps (one native call on rank 0, the Python loop on rank 1); told a low one, they go
    # split by CMA (rank 0 in C: rooted_cma, rank 1: rooted_split), where the ranks
    # may write each other's memory
    for cost in ("7", "0.5"):
        res = run_ranks(_cases, 2, False, env={"COLLCOMM_SHM_SLOT": str(SLOT), "COLLCOMM_CMA_COST": cost},
                        timeout=100, rank_env={1: {"COLLCOMM_NATIVE": "0"}})
        assert len(set(res)) == 1
        assert res[0][1] in (-1.0, float(cost))


def test_cma_failure_errors():
    # what Arena.read_remote raises and the native core raises through (Arena.cma_failed):
    # a dead peer (ESRCH) is PeerLostError; a peer whose process is gone within the grace
    # after an EFAULT (it unmapped its buffers on its way out) is too; so is a failure while
    # another member died without leaving cleanly (the peer left the call because of it:
    # seen as "could not read ... (Bad address)" in test_faults at 4 ranks); any other
    # failure names COLLCOMM_CMA=0
    import errno
    import os
    import subprocess
    import sys
    import time
    from types import SimpleNamespace

    from collcomm.errors import CollcommError, PeerLostError
    from collcomm.transport.arena import Arena

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    me = os.getpid()

    def fake(pids, left=(0, 0, 0)):
        return SimpleNamespace(pids=pids, global_ranks=[4, 7, 9], rank=0, n=len(pids),
                               get=lambda r, word: left[r])

    with pytest.raises(PeerLostError, match="rank 7"):
        Arena.cma_failed(fake([me, me, me]), 1, "read", errno.ESRCH)
    with pytest.raises(CollcommError, match="COLLCOMM_CMA=0") as info:
        Arena.cma_failed(fake([me, me, me]), 1, "write", errno.EPERM)
    assert not isinstance(info.value, PeerLostError)
    with pytest.raises(PeerLostError, match="rank 9 .* died; rank 4 could then not read rank 7") as lost:
        Arena.cma_failed(fake([me, me, dead.pid]), 1, "read", errno.EFAULT)
    assert lost.value.peer == 9
    with pytest.raises(CollcommError, match="COLLCOMM_CMA=0"):     # (rank 9 left cleanly)
        Arena.cma_failed(fake([me, me, dead.pid], left=(0, 0, 1)), 1, "read", errno.EFAULT)
    leaving = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.1)"])
    try:
        t0 = time.monotonic()
        with pytest.raises(PeerLostError, match="rank 7 .* died") as gone:
            Arena.cma_failed(fake([me, leaving.pid, me]), 1, "read", errno.EFAULT)
        assert gone.value.peer == 7 and time.monotonic() - t0 < 2.0
    finally:
        leaving.wait()


def test_split_broadcast_choice_at_two_ranks():
    # a broadcast splits by CMA from CMA_MIN itself, at n = 2 (with writes) from
    # BCAST_PAIR_MIN while c < 2 * BCAST_PAIR (c measured 3.3-4.4 on one VM: the old c < 4
    # flipped between jobs), beyond by BCAST_STAGED; the other collectives still stage at CMA_MIN
    from types import SimpleNamespace

    from collcomm.algorithms import shm_large
    from collcomm.transport.arena_layout import AG_PAIR_MIN, CMA_MIN

    def arena(n: int, c: float, write: bool = True) -> SimpleNamespace:
        return SimpleNamespace(cma=True, cma_write=write, cma_cost=c, n=n, cores=2)

    assert shm_large.reads_peers(arena(2, 4.4), "broadcast", CMA_MIN)
    assert shm_large.reads_peers(arena(2, 5.9), "broadcast", 1 << 20)
    assert not shm_large.reads_peers(arena(2, 6.5), "broadcast", 1 << 20)
    assert shm_large.reads_peers(arena(2, 0.5), "broadcast", CMA_MIN - 1)
    assert shm_large.reads_peers(arena(2, 5.9), "broadcast", shm_large.BCAST_PAIR_MIN)
    assert not shm_large.reads_peers(arena(2, 0.5), "broadcast", shm_large.BCAST_PAIR_MIN - 1)
    assert not shm_large.reads_peers(arena(2, 6.5), "broadcast", shm_large.BCAST_PAIR_MIN)
    assert not shm_large.reads_peers(arena(2, 0.5, write=False), "broadcast", CMA_MIN - 1)
    assert not shm_large.reads_peers(arena(3, 0.5), "broadcast", CMA_MIN - 1)
    assert not shm_large.reads_peers(arena(3, 3.3), "broadcast", 1 << 20)
    assert shm_large.reads_peers(arena(3, 2.9), "broadcast", 1 << 20)
    assert not shm_large.reads_peers(arena(2, 4.4, write=False), "broadcast", 1 << 20)
    assert not shm_large.reads_peers(arena(2, 0.5), "all_to_all", CMA_MIN)
    assert shm_large.reads_peers(arena(2, 0.5), "all_to_all", CMA_MIN + 1)
    # an all_gather between two ranks from AG_PAIR_MIN whatever c is, writes or not
    for c, write in ((0.5, True), (9.0, True), (9.0, False)):
        assert not shm_large.reads_peers(arena(2, c, write), "all_gather", AG_PAIR_MIN - 1)
        assert shm_large.reads_peers(arena(2, c, write), "all_gather", AG_PAIR_MIN)
    assert not shm_large.reads_peers(arena(3, 0.5), "all_gather", CMA_MIN)
    assert shm_large.reads_peers(arena(3, 0.5), "all_gather", CMA_MIN + 1)
    assert not shm_large.reads_peers(SimpleNamespace(cma=False, cma_write=False, cma_cost=0.5,
                                                     n=2, cores=2), "all_gather", 1 << 20)
    # a gather between two ranks (with writes) from GATHER_PAIR_MIN while c < 2 * GATHER_STAGED
    assert not shm_large.reads_peers(arena(2, 0.5), "gather", shm_large.GATHER_PAIR_MIN - 1)
    assert shm_large.reads_peers(arena(2, 7.9), "gather", shm_large.GATHER_PAIR_MIN)
    assert not shm_large.reads_peers(arena(2, 8.1), "gather", CMA_MIN + 1)
    assert not shm_large.reads_peers(arena(2, 0.5, write=False), "gather", CMA_MIN)
    assert not shm_large.reads_peers(arena(3, 0.5), "gather", CMA_MIN)
    assert shm_large.reads_peers(arena(3, 0.5), "gather", CMA_MIN + 1)
    # a scatter between two ranks (with writes) from SCATTER_PAIR_MIN, as a broadcast
    assert not shm_large.reads_peers(arena(2, 0.5), "scatter", shm_large.SCATTER_PAIR_MIN - 1)
    assert shm_large.reads_peers(arena(2, 5.9), "scatter", shm_large.SCATTER_PAIR_MIN)
    assert not shm_large.reads_peers(arena(2, 6.5), "scatter", CMA_MIN + 1)
    assert not shm_large.reads_peers(arena(2, 0.5, write=False), "scatter", CMA_MIN)
    assert shm_large.reads_peers(arena(2, 0.5, write=False), "scatter", CMA_MIN + 1)


def test_split_scatter_and_gather_choice(monkeypatch):
    # a scatter splits as a broadcast does (from above CMA_MIN); a gather while
    # c·(n-1) < GATHER_STAGED·n; without writes, both only while c <= 1; above a quarter
    # of the cache, always (a 32 MiB cache here: the host's may be 300 MiB)
    from types import SimpleNamespace

    from collcomm.algorithms import shm_large
    from collcomm.transport.arena_layout import CMA_MIN

    monkeypatch.setattr(shm_large, "llc_bytes", lambda: 32 << 20)

    def arena(n: int, c: float, write: bool = True) -> SimpleNamespace:
        return SimpleNamespace(cma=True, cma_write=write, cma_cost=c, n=n, cores=2)

    mib = 1 << 20
    assert shm_large.reads_peers(arena(2, 3.3), "scatter", mib)
    assert not shm_large.reads_peers(arena(2, 6.5), "scatter", mib)
    assert not shm_large.reads_peers(arena(4, 3.3), "scatter", mib - 4)
    assert shm_large.reads_peers(arena(4, 2.5), "scatter", mib - 4)
    assert shm_large.reads_peers(arena(4, 3.3), "scatter", mib)     # (SCATTER_SPLIT)
    assert shm_large.reads_peers(arena(2, 4.2), "gather", mib)
    assert not shm_large.reads_peers(arena(2, 8.1), "gather", mib)
    assert not shm_large.reads_peers(arena(4, 5.4), "gather", mib)   # (two ranks a core)
    assert shm_large.reads_peers(arena(4, 5.3), "gather", mib)
    for name in ("scatter", "gather"):
        assert not shm_large.reads_peers(arena(2, 1.5, write=False), name, mib)
        assert shm_large.reads_peers(arena(2, 1.0, write=False), name, mib)
        assert shm_large.reads_peers(arena(4, 50.0), name, 64 * mib)


def test_choices_with_a_core_per_rank(monkeypatch):
    # n >= 3 ranks with a core each: scatter and gather (with writes) split from
    # ROOTED_PARALLEL bytes while c < n; all_to_all by CMA once a rank's data outgrows its
    # slot; broadcast and all_gather as before; n > cores or n = 2: the rules above
    from types import SimpleNamespace

    from collcomm.algorithms import shm_large

    monkeypatch.setattr(shm_large, "llc_bytes", lambda: 300 << 20)
    mib, big = 1 << 20, shm_large.ROOTED_PARALLEL

    def arena(n: int, c: float, cores: int, write: bool = True) -> SimpleNamespace:
        return SimpleNamespace(cma=True, cma_write=write, cma_cost=c, n=n, cores=cores,
                               slot=4 * mib)

    for n in (4, 8, 16):
        for name in ("scatter", "gather"):
            assert shm_large.reads_peers(arena(n, n - 0.5, 16), name, big)
            assert not shm_large.reads_peers(arena(n, n + 0.5, 16), name, big)
            # below it: as before (a gather among ranks with a core each: c·(n-1) < n)
            assert not shm_large.reads_peers(arena(n, 3.4, 16), name, big - 1)
            assert shm_large.reads_peers(arena(n, 0.9, 16), name, big - 1)
            # more ranks than cores: a gather splits (GATHER_STAGED); a scatter with writes
            # from SCATTER_SPLIT whatever c, below it staged (c·(n-1) >= BCAST_STAGED·n)
            split = shm_large.SCATTER_SPLIT
            assert shm_large.reads_peers(arena(n, 3.4, n - 1), name, split - 4) == (name == "gather")
            assert shm_large.reads_peers(arena(n, 3.4, n - 1), name, big)
            assert shm_large.reads_peers(arena(n, 9.0, 2), "scatter", split)
            assert not shm_large.reads_peers(arena(n, 9.0, 2, write=False), "scatter", split)
            assert shm_large.split_from(arena(n, 9.0, 2), "scatter") == split
            assert shm_large.split_from(arena(n, n + 0.5, 16), "scatter") != split   # (a core each)
        assert shm_large.reads_peers(arena(n, 3.4, 16, write=False), "scatter", big)
        assert not shm_large.reads_peers(arena(n, 3.4, 16, write=False), "gather", big)
        for name in ("broadcast", "all_gather"):   # unchanged: staged
            assert not shm_large.reads_peers(arena(n, 3.4, 16), name, 32 * mib)
        # all_to_all: blocks past slot / n go by CMA (a rank's data over its slot)
        assert shm_large.a2a_cma_limit(arena(n, 3.4, 16)) == 4 * mib // n
        assert shm_large.a2a_cma_limit(arena(n, 3.4, n - 1)) == (300 << 20) // 4 // n
    assert shm_large.reads_peers(arena(2, 3.4, 16), "gather", big)   # n = 2: GATHER_STAGED
    # n = 2: blocks from A2A_PAIR_BLOCK, whatever c or the cache
    for c in (0.5, 3.4, 9.0):
        assert shm_large.a2a_cma_limit(arena(2, c, 16)) == shm_large.A2A_PAIR_BLOCK - 1
        assert shm_large.a2a_cma_limit(arena(2, c, 2)) == shm_large.A2A_PAIR_BLOCK - 1


def test_fast_calls_stop_where_the_regular_path_splits(monkeypatch):
    # the fast call stages a broadcast / scatter / gather only below the size from which
    # shm_large reads the peers (a rank on the regular path must take the same steps), and
    # splits a scatter from exactly there; an all_gather it takes up to n slots, the voted
    # way from ag_vote_min, never above that size, with its answer (Fast.ag_cma); a core
    # per rank or not, any cost, writes or not
    from types import SimpleNamespace

    from collcomm.algorithms import shm_large
    from collcomm.core import fastpath
    from collcomm.transport.arena_layout import ag_vote_min

    monkeypatch.setattr(fastpath, "_limit", lambda group, c, most: most)
    mib = 1 << 20
    for llc in (4 * mib, 32 * mib, 300 * mib):
        monkeypatch.setattr(shm_large, "llc_bytes", lambda: llc)
        for n in (2, 3, 4, 8, 16):
            for cores in (2, 16):
                for c in (0.5, 1.2, 2.5, 3.5, 6.0, 20.0):
                    for write in (True, False):
                        arena = SimpleNamespace(cma=True, cma_write=write, cma_cost=c, n=n,
                                                cores=cores, slot=4 * mib)
                        split = shm_large.split_from(arena, "all_gather")
                        assert fastpath._staged_max(arena, "all_gather", n) == n * arena.slot
                        assert 0 < ag_vote_min(n, True) <= (split or ag_vote_min(n, True))
                        assert not split or all(shm_large.reads_peers(arena, "all_gather", b)
                                                for b in (split, 2 * split, split + 4 * mib))
                        for name in ("broadcast", "scatter", "gather"):
                            staged = fastpath._staged_max(arena, name, n)
                            split = shm_large.split_from(arena, name)
                            assert not shm_large.reads_peers(arena, name, staged), (name, n, c)
                            if split:
                                assert staged < split and all(
                                    shm_large.reads_peers(arena, name, b)
                                    for b in (split, 2 * split, split + 4 * mib, split + 64 * mib)), (name, n, c)
                        for rooted in ("scatter", "gather"):
                            cma = fastpath._rooted_cma(SimpleNamespace(), arena, rooted)
                            assert cma in (0, shm_large.split_from(arena, rooted))
                            assert cma == 0 or write
                        staged = fastpath._staged_max(arena, "broadcast", n)
                        cma = fastpath._bcast_cma(SimpleNamespace(), arena, staged)
                        assert cma in (0, shm_large.split_from(arena, "broadcast"))
                        assert cma == 0 or (write and staged == cma - 1)


def _fast_split_cases() -> list[tuple[int, int, bool, bool]]:
    """Broadcasts around BCAST_PAIR_MIN (16 KiB), 64 KiB and CMA_MIN, every root, plain and shared-heap
    roots: (bytes, root, heap, completed by the fast call) per call, results checked."""
    import collcomm as dist
    from collcomm.core.runtime import get_world

    n, me = dist.get_world_size(), dist.get_rank()
    dist.barrier()
    fast = get_world("test").fast            # None on a rank without the native core
    seen = []
    for count, dt in ((4_095, "float32"), (4_096, "float32"),   # around BCAST_PAIR_MIN
                      (16_383, "float32"), (16_384, "float32"), (32_771, "int16"),
                      (65_535, "float32"), (65_536, "float32"), (131_072, "int16"),
                      (300_007, "float32"), (131_075, "float64")):
        base = np.arange(count).astype(dt)
        shared = dist.empty(count, dtype=dt)   # (every rank allocates; the root's is used)
        for root in range(n):
            for heap in (False, True):
                buf = shared if heap and me == root else np.empty(count, dt)
                buf[:] = base + me
                before = fast.calls if fast is not None else 0
                dist.broadcast(buf, src=root)
                assert np.array_equal(buf, base + root), (count, dt, root, heap)
                seen.append((buf.nbytes, root, heap, fast is not None and fast.calls > before))
    return seen


@pytest.mark.timeout(60)
def test_fast_call_takes_split_broadcasts():
    # where a broadcast between two ranks splits by CMA (from BCAST_PAIR_MIN), the fast call
    # runs it (no Python front end): staged below, split from there; with a cost that
    # stages, only up to CMA_MIN.
    # Rank 1 of the last job runs in Python (rooted_split) against rank 0's fast call;
    # its shared-heap buffer as the root is read in place (rank 0's fast call hands that
    # back to shm_move.broadcast_after), a fast root's is read by CMA.
    from collcomm import native
    from collcomm.transport.arena_layout import CMA_MIN

    for cost, python in (("4.4", ()), ("7", ()), ("4.4", (1,))):
        if native.core is None:     # COLLCOMM_NATIVE=0 (or not built): no rank has the fast call
            python = (0, 1)
        res = run_ranks(_fast_split_cases, 2, env={"COLLCOMM_CMA_COST": cost}, timeout=50,
                        rank_env={r: {"COLLCOMM_NATIVE": "0"} for r in python})
        split = cost == "4.4"
        for rank, seen in enumerate(res):
            for nbytes, root, heap, fast in seen:
                want = (rank not in python and (split or nbytes <= CMA_MIN)
                        and not (heap and root in python))
                assert fast == want, (cost, python, rank, nbytes, root, heap)


def _fast_scatter_cases() -> list[tuple[int, int, str, bool]]:
    """Scatters around SCATTER_PAIR_MIN and CMA_MIN (n blocks), every root, from a list lying back to back, a
    list of separate arrays and (collcomm.MPI) a flat buffer: (bytes, root, form, completed
    by the fast call) per call, results checked."""
    import collcomm as dist
    from collcomm import MPI
    from collcomm.core.runtime import get_world

    n, me = dist.get_world_size(), dist.get_rank()
    dist.barrier()
    MPI.COMM_WORLD.Barrier()                 # (collcomm.MPI's world is a group of its own)
    fasts = {"joined": get_world("test").fast, "apart": get_world("test").fast,
             "flat": MPI.COMM_WORLD._h.g.fast}
    seen = []
    for count, dt in ((8_191, "float32"), (8_192, "float32"),   # around SCATTER_PAIR_MIN
                      (16_383, "float32"), (16_384, "float32"), (32_767, "float32"),
                      (32_768, "float32"), (32_769, "float32"), (150_001, "float64"),
                      (65_539, "int16")):
        for root in range(n):
            big = (np.arange(n * count) + root).astype(dt)
            want = big[me * count:(me + 1) * count].copy()
            for form in ("joined", "apart", "flat"):
                out = np.full(count, -1).astype(dt)
                fast = fasts[form]
                before = fast.calls if fast is not None else 0
                if form == "flat":
                    MPI.COMM_WORLD.Scatter(big if me == root else None, out, root=root)
                else:
                    parts = (list(big.reshape(n, count)) if form == "joined"
                             else [b.copy() for b in big.reshape(n, count)])
                    dist.scatter(out, parts if me == root else None, src=root)
                assert np.array_equal(out, want), (count, dt, root, form)
                seen.append((n * count * np.dtype(dt).itemsize, root, form,
                             fast is not None and fast.calls > before))
    return seen


@pytest.mark.timeout(60)
def test_fast_call_takes_split_scatters():
    # where a scatter between two ranks splits by CMA (from SCATTER_PAIR_MIN), the fast
    # call runs it too: from a flat buffer or a list lying back to back (a list of separate
    # arrays goes the regular way, which concatenates it); with a cost that stages, up to
    # the staged limit. Rank 1 of the last job runs in Python against rank 0's fast call.
    from collcomm import native
    from collcomm.algorithms.shm_large import SCATTER_PAIR_MIN

    for cost, python in (("4.4", ()), ("7", ()), ("4.4", (1,))):
        if native.core is None:
            python = (0, 1)
        res = run_ranks(_fast_scatter_cases, 2, env={"COLLCOMM_CMA_COST": cost}, timeout=50,
                        rank_env={r: {"COLLCOMM_NATIVE": "0"} for r in python})
        split = cost == "4.4"
        for rank, seen in enumerate(res):
            for nbytes, root, form, fast in seen:
                if rank in python:
                    want = False
                elif not split or nbytes < SCATTER_PAIR_MIN:   # staged: up to the slot, one step
                    want = True
                else:         # split; the others: a flat receive buffer, always taken
                    want = rank != root or form != "apart"
                assert fast == want, (cost, python, rank, nbytes, root, form)


def test_the_roots_share_of_a_split_scatter_or_gather():
    # the root moves 1/n of each other block, 1/(2n) when it also copies its own (the
    # others read the rest: a read costs more than the root's memcpy); every rank uses the
    # number the root publishes, so C and Python ranks meet (the mixed jobs above)
    from collcomm.algorithms.shm_large import split_head

    assert split_head(1000, 2, False) == 500 and split_head(1000, 2, True) == 250
    assert split_head(1000, 4, False) == 250 and split_head(1000, 4, True) == 125
    assert split_head(3, 4, True) == 0 and split_head(0, 2, True) == 0
