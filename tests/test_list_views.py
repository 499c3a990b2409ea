"""The list forms on the regular path when the list's buffers lie back to back in memory
(views of one buffer, in order, as ``big.split(k)`` gives): a scatter's list is sent from,
and a gather's or all_gather's list received into, that memory itself (api_lists._joined),
with no concatenation in or copy out. Every root, world sizes 1-4, in place and out of
place, lists that alias the call's other buffer, lists that are not back to back, async
calls; large enough that scatter and gather go split by cross-memory attach too.
"""
from __future__ import annotations

import numpy as np
import pytest

from tests.harness import TORCH, run_ranks


def test_joined_only_for_back_to_back_views():
    import gc

    from collcomm.buffer_runs import apart_or_own, joined

    big = np.arange(12, dtype=np.float32)
    views = [big[0:4], big[4:8], big[8:12]]
    flat = joined(views, False)
    assert flat is not None and np.shares_memory(flat, big) and np.array_equal(flat, big)
    assert not flat.flags.writeable and joined(views, True).flags.writeable
    assert joined(views[::-1], False) is None                         # out of order
    assert joined([big[0:8:2], big[8:12]], False) is None             # strided
    assert joined([big[0:4], big[4:8].view(np.int32)], False) is None  # two dtypes
    assert joined([big[0:0], big[0:4]], False) is None                # an empty one
    assert joined([np.zeros(4, np.float32), np.zeros(4, np.float32)], False) is None
    ro = big.copy()
    ro.flags.writeable = False
    assert joined([ro[:6], ro[6:]], True) is None                     # not writable
    assert joined([ro[:6], ro[6:]], False) is not None
    # the joined view keeps every buffer of the run alive
    parts = list(np.arange(8.0).reshape(2, 4))
    run = joined(parts, True)
    del parts
    gc.collect()
    assert run.tolist() == list(range(8))
    # the call's other buffer: apart, or exactly the block the call skips, else a copy
    assert apart_or_own(flat, np.zeros(4, np.float32), 1) is flat
    assert apart_or_own(flat, big[4:8], 1) is flat
    assert apart_or_own(flat, big[4:8], 2) is None
    assert apart_or_own(flat, big[5:9], 1) is None


def _cases(count: int) -> int:
    import collcomm as dist

    n, me = dist.get_world_size(), dist.get_rank()
    done = 0
    for root in range(n):
        # scatter from views of one buffer, out of place and with the root's tensor its own block
        for in_place in (False, True):
            big = (np.arange(n * count) + 10 * root).astype(np.float32)
            views = list(big.reshape(n, count)) if me == root else None
            out = views[me] if in_place and me == root else np.full(count, -1, np.float32)
            dist.scatter(out, views, src=root)
            assert np.array_equal(out, (np.arange(me * count, (me + 1) * count) + 10 * root).astype(np.float32))
            done += 1
        # the root's tensor is another rank's block of the list: that block is sent as it was
        if n > 1:
            big = (np.arange(n * count) + 7).astype(np.float32)
            views = list(big.reshape(n, count)) if me == root else None
            other = (root + 1) % n
            out = views[other] if me == root else np.empty(count, np.float32)
            dist.scatter(out, views, src=root)
            want = np.arange(n * count).reshape(n, count)[me] + 7
            if me != root:
                assert np.array_equal(out, want.astype(np.float32))
            else:
                assert np.array_equal(out, (np.arange(n * count).reshape(n, count)[root] + 7).astype(np.float32))
            done += 1
        # gather into views of one buffer, out of place, in place and aliasing another block
        for how in ("apart", "own", "other"):
            big = np.full(n * count, -1.0, np.float64)
            views = list(big.reshape(n, count)) if me == root else None
            mine = (np.arange(count) + 100 * me).astype(np.float64)
            if me == root and how == "own":
                views[me][:] = mine
                mine = views[me]
            elif me == root and how == "other" and n > 1:
                spot = views[(root + 1) % n]
                spot[:] = mine
                mine = spot
            dist.gather(mine, views, dst=root)
            if me == root:
                want = (np.arange(count)[None, :] + 100 * np.arange(n)[:, None]).ravel()
                assert np.array_equal(big, want), (root, how)
            done += 1
    # all_gather into views, out of place and in place; then async
    big = np.zeros(n * count, np.int32)
    views = list(big.reshape(n, count))
    mine = np.full(count, me + 1, np.int32)
    dist.all_gather(views, mine)
    assert np.array_equal(big, np.repeat(np.arange(1, n + 1, dtype=np.int32), count))
    big[:] = 0
    views[me][:] = me + 1
    dist.all_gather(views, views[me])
    assert np.array_equal(big, np.repeat(np.arange(1, n + 1, dtype=np.int32), count))
    big = np.zeros(n * count, np.float32)
    views = list(big.reshape(n, count))
    work = dist.gather(np.full(count, me, np.float32), views if me == 0 else None, dst=0, async_op=True)
    if work is not None:
        work.wait()
    if me == 0:
        assert np.array_equal(big, np.repeat(np.arange(n, dtype=np.float32), count))
    src = np.arange(n * count, dtype=np.float32)
    out = np.empty(count, np.float32)
    work = dist.scatter(out, list(src.reshape(n, count)) if me == 0 else None, src=0, async_op=True)
    if work is not None:
        work.wait()
    assert np.array_equal(out, src.reshape(n, count)[me])
    return done + 4


ROWS = [   # (n, count, environment): the regular path (no fast call unless said), staged and split
    (1, 5, {}),
    (2, 7, {}),
    (2, 300_007, {"COLLCOMM_CMA_COST": "0.5"}),
    (3, 300_007, {}),
    (4, 65_537, {"COLLCOMM_CMA_COST": "0.5"}),
    (3, 300_007, {"COLLCOMM_NATIVE": "0", "COLLCOMM_CMA_COST": "0.5"}),
    # the fast call too: it splits the scatters from a list lying back to back, and leaves
    # a root whose tensor is another rank's block to the regular path (which copies first)
    (2, 300_007, {"COLLCOMM_FAST": "1", "COLLCOMM_CMA_COST": "0.5"}),
    (3, 300_007, {"COLLCOMM_FAST": "1", "COLLCOMM_CMA_COST": "0.5"}),
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n,count,env", ROWS, ids=[
    f"n{n}-{count}-" + ("-".join(f"{k[9:]}={v}" for k, v in e.items()) or "measured") for n, count, e in ROWS])
def test_list_views_every_root(n, count, env):
    res = run_ranks(_cases, n, count, env={"COLLCOMM_FAST": "0", "COLLCOMM_SHM_SLOT": str(256 << 10), **env},
                    timeout=100)
    assert len(set(res)) == 1 and res[0] > 0


def _torch_cases(count: int) -> int:
    """The torch backend's regular path (COLLCOMM_FAST=0) with lists from ``big.chunk(n)``:
    scatter, gather and all_gather, in and out of place, an aliasing list, async."""
    import torch
    import torch.distributed as dist

    import collcomm.torch  # noqa: F401 - registers the backend

    dist.init_process_group("collcomm")
    me, n = dist.get_rank(), dist.get_world_size()
    done = 0
    for dtype in (torch.float32, torch.bfloat16):
        for root in range(n):
            big = (torch.arange(n * count) + root).to(dtype)
            chunks = list(big.chunk(n)) if me == root else None
            out = torch.full((count,), -1).to(dtype)
            dist.scatter(out, chunks, src=root)
            assert torch.equal(out, (torch.arange(me * count, (me + 1) * count) + root).to(dtype))
            if me == root:      # in place: the root's tensor is its own chunk
                dist.scatter(chunks[me], chunks, src=root)
            else:
                dist.scatter(out, None, src=root)
            assert torch.equal(out if me != root else chunks[me],
                               (torch.arange(me * count, (me + 1) * count) + root).to(dtype))
            big = torch.full((n * count,), -1).to(dtype)
            chunks = list(big.chunk(n)) if me == root else None
            mine = (torch.arange(count) + 100 * me).to(dtype)
            if me == root and n > 1:    # aliasing: the root sends from another rank's chunk
                chunks[(root + 1) % n].copy_(mine)
                mine = chunks[(root + 1) % n]
            dist.gather(mine, chunks, dst=root)
            if me == root:
                want = (torch.arange(count)[None, :] + 100 * torch.arange(n)[:, None]).ravel().to(dtype)
                assert torch.equal(big, want), (dtype, root)
            done += 3
        big = torch.zeros(n * count).to(dtype)
        work = dist.all_gather(list(big.chunk(n)), torch.full((count,), me + 1).to(dtype), async_op=True)
        work.wait()
        assert torch.equal(big, torch.arange(1, n + 1).repeat_interleave(count).to(dtype))
        done += 1
    dist.destroy_process_group()
    return done


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n,count,env", [(2, 300_007, {"COLLCOMM_CMA_COST": "0.5"}), (3, 9, {})])
def test_torch_list_views(n, count, env):
    pytest.importorskip("torch")
    res = run_ranks(_torch_cases, n, count, transport="shm", timeout=100, init=False,
                    env={"COLLCOMM_FAST": "0", "COLLCOMM_SHM_SLOT": str(256 << 10), **env}, preload=TORCH)
    assert len(set(res)) == 1 and res[0] > 0
