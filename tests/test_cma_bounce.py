"""Cross-memory transfers whose destination lies 1-63 bytes past the source modulo 4 KiB
go through a bounce buffer where the CPU is slow at such distances (native/_cma_move.c
``cma_move``; timed once a process, or COLLCOMM_CMA_BOUNCE=1/0): the kernel's ``rep
movsb`` runs 4-5x slower there on some CPUs, and ranks that allocate alike meet them all
the time (a receive buffer allocated right after a send buffer lies the allocator's
header past the peer's). The data must arrive whole at every distance, odd lengths and
steps included, for reads (lent point-to-point, all_gather and all_to_all by CMA, one
long enough to end in streamed stores) and writes (a split scatter's root); other
distances go direct."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from collcomm import native
from collcomm.tools.bench.placement import placed_empty
from tests.harness import run_ranks

pytestmark = pytest.mark.skipif(native.core is None, reason=f"native core: {native.reason}")


def _at(nbytes: int, page_offset: int) -> np.ndarray:
    """A zeroed uint8 array of ``nbytes`` starting ``page_offset`` bytes into a page."""
    arr = placed_empty(nbytes, "uint8", page_offset)
    arr[:] = 0
    return arr


def swap(dist: Any, send: np.ndarray, recv: np.ndarray) -> None:
    """Blocking send / recv between ranks 0 and 1, rank 0 sending first."""
    if dist.get_rank() == 0:
        dist.send(send, 1)
        dist.recv(recv, 1)
    else:
        dist.recv(recv, 0)
        dist.send(send, 0)


def all_gather_whole(dist: Any, block: int, recv_offset: int) -> bool:
    """An all_gather of ``block`` bytes a rank into an output ``recv_offset`` bytes into a
    page: every block right?"""
    me, n = dist.get_rank(), dist.get_world_size()
    mine = _at(block, 0)
    mine[:] = (np.arange(block) + 3 * me) % 253
    gathered = _at(n * block, recv_offset)
    dist.all_gather_into_tensor(gathered, mine)
    return all(np.array_equal(gathered[r * block:(r + 1) * block], (np.arange(block) + 3 * r) % 253)
               for r in range(n))


def scatter_whole(dist: Any, block: int, recv_offset: int) -> bool:
    """A scatter from rank 0 of ``block`` bytes a rank into a buffer ``recv_offset`` bytes
    into a page: our block right?"""
    me, n = dist.get_rank(), dist.get_world_size()
    big = _at(n * block, 0) if me == 0 else None
    if big is not None:
        big[:] = (np.arange(n * block) * 3) % 239
    piece = _at(block, recv_offset)
    dist.scatter(piece, [big[r * block:(r + 1) * block] for r in range(n)] if big is not None else None, src=0)
    return bool(np.array_equal(piece, ((np.arange(n * block) * 3) % 239)[me * block:(me + 1) * block]))


def _transfers(recv_offset: int) -> dict:
    """Every rank's send buffers at a page's start, its receive buffers ``recv_offset``
    bytes in: a lent exchange (1 MiB + 3 bytes), an all_gather and an all_to_all of
    blocks large enough to go by cross-memory attach, a scatter split by it (the root
    writes). Returns what arrived right and the bounces counted."""
    import collcomm as dist
    from collcomm.core import runtime as rt

    me, n = dist.get_rank(), dist.get_world_size()
    dist.barrier()
    arena = rt.get_world("test")._arena
    if arena is None or not arena.cma:
        return {"cma": False}
    def bounces() -> int:
        return native.core.cma_bounces()[0]

    out: dict = {"cma": True, "bounced": {}}
    before = bounces()
    size = (1 << 20) + 3
    send = _at(size, 0)
    send[:] = (np.arange(size) * 7 + me) % 251
    recv = _at(size, recv_offset)
    ops = [dist.P2POp(dist.isend, send, (me + 1) % n), dist.P2POp(dist.irecv, recv, (me - 1) % n)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    out["p2p"] = bool(np.array_equal(recv, (np.arange(size) * 7 + (me - 1) % n) % 251))
    out["bounced"]["p2p"], before = bounces() - before, bounces()
    block = (4 << 20) + 4096          # (a read past COPY_NT_MIN: its bounce streams)
    out["all_gather"] = all_gather_whole(dist, block, recv_offset)
    out["bounced"]["all_gather"], before = bounces() - before, bounces()
    a2a_in = _at(n * block, 0)
    a2a_in[:] = (np.arange(n * block) + 5 * me) % 241
    a2a_out = _at(n * block, recv_offset)
    dist.all_to_all_single(a2a_out, a2a_in)
    out["all_to_all"] = all(np.array_equal(a2a_out[r * block:(r + 1) * block],
                                           ((np.arange(n * block) + 5 * r) % 241)[me * block:(me + 1) * block])
                            for r in range(n))
    out["bounced"]["all_to_all"], before = bounces() - before, bounces()
    out["scatter"] = scatter_whole(dist, block, recv_offset)
    out["bounced"]["scatter"] = bounces() - before
    out["slow"] = native.core.cma_bounces()[1]
    return out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("recv_offset", [16, 1, 63, 64, 0, 2048])
def test_transfers_arrive_whole_at_every_distance(recv_offset: int) -> None:
    res = run_ranks(_transfers, 2, recv_offset, transport="shm", timeout=100,
                    env={"COLLCOMM_CMA_COST": "1", "COLLCOMM_VOTE": "0", "COLLCOMM_CMA_BOUNCE": "1"})
    if not res[0]["cma"]:
        pytest.skip("cross-memory attach is not permitted here")
    for r in res:
        assert r["p2p"] and r["all_gather"] and r["all_to_all"] and r["scatter"], r
        bounced = r["bounced"]
        if 0 < recv_offset < 64:
            # all_gather's and all_to_all's reads (by CMA whatever the load: no vote); the
            # lent read too, unless a busy machine made the loan withdrawn (read from the
            # sender's copy, elsewhere)
            assert bounced["all_gather"] >= 1 and bounced["all_to_all"] >= 1, r
        else:   # (not the lent read: a withdrawn loan's copy may lie anywhere)
            assert bounced["all_gather"] == bounced["all_to_all"] == bounced["scatter"] == 0, r
    if 0 < recv_offset < 64:
        assert res[0]["bounced"]["scatter"] >= 1, res[0]    # the root's writes, split


@pytest.mark.timeout(120)
@pytest.mark.parametrize("setting", ["0", ""])
def test_the_bounce_is_timed_or_turned_off(setting: str) -> None:
    """COLLCOMM_CMA_BOUNCE=0: every transfer direct, the data whole; unset: the CPU timed at
    the first transfer in the band (bounced only where it says it is slow there)."""
    res = run_ranks(_transfers, 2, 16, transport="shm", timeout=100,
                    env={"COLLCOMM_CMA_COST": "1", "COLLCOMM_VOTE": "0", "COLLCOMM_CMA_BOUNCE": setting})
    if not res[0]["cma"]:
        pytest.skip("cross-memory attach is not permitted here")
    for r in res:
        assert r["p2p"] and r["all_gather"] and r["all_to_all"] and r["scatter"], r
        if setting == "0":
            assert r["slow"] == 0 and sum(r["bounced"].values()) == 0, r
        else:
            assert r["slow"] in (0, 1), r
            assert (sum(r["bounced"].values()) > 0) == (r["slow"] == 1), r
