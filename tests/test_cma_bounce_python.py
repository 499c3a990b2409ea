"""The pure-Python path's cross-memory transfers (transport/cma_move.py ``move``) go
through a bounce buffer in two hops where the destination lies 1-63 bytes past the source
modulo 4 KiB and the CPU is slow there (COLLCOMM_CMA_BOUNCE=1/0, else timed once a
process), as the native core's do (test_cma_bounce.py). The bytes must arrive whole at
every distance, length and step, read or written, and only transfers in the band bounce."""
from __future__ import annotations

import os

import numpy as np
import pytest

from collcomm.transport import cma_move
from tests.harness import run_ranks
from tests.test_cma_bounce import _at, all_gather_whole, scatter_whole, swap

def _self_read_works() -> bool:
    into, src = np.zeros(8, np.uint8), np.ones(8, np.uint8)     # (both alive while read)
    return cma_move.READV is not None and \
        cma_move.direct(os.getpid(), into.ctypes.data, src.ctypes.data, 8) == 0 and bool(into.all())


pytestmark = pytest.mark.skipif(not _self_read_works(), reason="cross-memory attach is not permitted here")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("write", [False, True])
@pytest.mark.parametrize("distance", [16, 1, 63, 64, 0, 2048, 4095])
@pytest.mark.parametrize("nbytes", [4096, 5000, 300 * 1024 + 3, 4095])
def test_move_whole_at_every_distance(write: bool, distance: int, nbytes: int,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Our own memory moved as a peer's would be (pid = ours), the source at a page's
    start plus 5, the destination ``distance`` bytes past that modulo 4 KiB."""
    monkeypatch.setattr(cma_move, "_slow", True)
    src = _at(nbytes, 5)
    src[:] = (np.arange(nbytes) * 7 + 3) % 251
    dst = _at(nbytes, (5 + distance) % 4096)
    hops: list[int] = []          # each kernel hop's distance, destination past source
    direct = cma_move.direct

    def spy(pid: int, local: int, remote: int, n: int, write: bool = False) -> int:
        hops.append(((remote - local) if write else (local - remote)) & 4095)
        return direct(pid, local, remote, n, write)

    copies: list[int] = []        # each local copy's distance
    memmove = cma_move.ctypes.memmove

    def copy_spy(dst: int, src: int, n: int) -> int:
        copies.append((dst - src) & 4095)
        return memmove(dst, src, n)

    monkeypatch.setattr(cma_move, "direct", spy)
    monkeypatch.setattr(cma_move.ctypes, "memmove", copy_spy)
    before = cma_move.bounced()
    s, d = src.ctypes.data, dst.ctypes.data
    # a read moves remote -> local; a write local -> remote
    err = cma_move.move(os.getpid(), s, d, nbytes, write=True) if write else \
        cma_move.move(os.getpid(), d, s, nbytes)
    assert err == 0 and np.array_equal(dst, src)
    bounced = cma_move.bounced() - before
    assert bounced == (1 if nbytes >= 4096 and 0 < distance < 64 else 0)
    if bounced:       # every hop, the kernel's and the local copy's, out of the band
        assert len(hops) == len(copies) == -(-nbytes // cma_move.STEP), (hops, copies)
        assert all(h >= 64 for h in hops + copies), (hops, copies)


@pytest.mark.timeout(60)
def test_the_setting_and_a_failed_move(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cma_move, "_slow", None)
    monkeypatch.setenv("COLLCOMM_CMA_BOUNCE", "0")
    assert cma_move.band_slow() is False
    monkeypatch.setattr(cma_move, "_slow", None)
    monkeypatch.setenv("COLLCOMM_CMA_BOUNCE", "1")
    assert cma_move.band_slow() is True
    monkeypatch.setattr(cma_move, "_slow", None)
    monkeypatch.delenv("COLLCOMM_CMA_BOUNCE")
    assert cma_move.band_slow() in (True, False)
    dst = _at(8192, 16)
    for slow in (True, False):    # (page 1 is never mapped: the first hop fails, bounced or not)
        monkeypatch.setattr(cma_move, "_slow", slow)
        assert cma_move.move(os.getpid(), dst.ctypes.data, 4096, 8192) == 14     # EFAULT


def _read_a_dead_rank(n: int) -> str:
    """Rank 0 reads rank 1's memory by the arena's read_remote after rank 1 exited."""
    import collcomm as dist
    from collcomm.core import runtime as rt
    from collcomm.errors import PeerLostError

    dist.all_reduce(np.zeros(4, np.float32))     # (the group's arena is built)
    arena = rt.get_world("test")._arena
    dist.barrier()
    if dist.get_rank() == 1:
        os._exit(0)
    import time

    from collcomm.transport.peer_process import pid_alive

    while pid_alive(arena.pids[1]):
        time.sleep(0.01)
    try:
        arena.read_remote(1, 1 << 20, _at(n, 16))
    except PeerLostError as exc:
        return str(exc)
    return "no error"


@pytest.mark.timeout(60)
def test_a_dead_peers_memory_names_it() -> None:
    """A read of a rank that died raises PeerLostError naming it, bounced or direct."""
    res = run_ranks(_read_a_dead_rank, 2, 8192, transport="shm", timeout=50, expect_failure=True,
                    env={"COLLCOMM_NATIVE": "0", "COLLCOMM_CMA_BOUNCE": "1", "COLLCOMM_CMA_COST": "1"})
    assert res[0].ok and "rank 1 " in res[0].value and "died" in res[0].value, res[0]


def _python_transfers(recv_offset: int) -> dict:
    """A pure-Python rank's large transfers (a 1 MiB + 3 message, read from the sender's
    copy; an all_gather and a scatter of 4 MiB + 4 KiB blocks by cross-memory attach) with
    every receive buffer ``recv_offset`` bytes into a page: what arrived right, and the
    bounces counted."""
    import collcomm as dist

    me = dist.get_rank()
    out: dict = {}
    before = cma_move.bounced()
    size = (1 << 20) + 3
    send = _at(size, 0)
    send[:] = (np.arange(size) * 7 + me) % 251
    recv = _at(size, recv_offset)
    swap(dist, send, recv)
    out["p2p"] = bool(np.array_equal(recv, (np.arange(size) * 7 + 1 - me) % 251))
    block = (4 << 20) + 4096
    out["all_gather"] = all_gather_whole(dist, block, recv_offset)
    out["scatter"] = scatter_whole(dist, block, recv_offset)
    out["bounced"] = cma_move.bounced() - before
    return out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("recv_offset", [16, 0])
def test_python_ranks_transfers(recv_offset: int) -> None:
    res = run_ranks(_python_transfers, 2, recv_offset, transport="shm", timeout=100,
                    env={"COLLCOMM_NATIVE": "0", "COLLCOMM_CMA_COST": "1", "COLLCOMM_VOTE": "0",
                         "COLLCOMM_CMA_BOUNCE": "1"})
    for r in res:
        assert r["p2p"] and r["all_gather"] and r["scatter"], r
        if recv_offset:
            assert r["bounced"] >= 1, res
        else:
            assert r["bounced"] == 0, res
