"""The point-to-point rings are mapped in when their channel is made, not page by page on
first use (shm_segments.populate): a fresh 1 MiB ring's first pass otherwise paid a page
fault every other 2 KiB message, twice the exchange's time once the ring had wrapped."""
from __future__ import annotations

import mmap
import secrets

import pytest

from collcomm.transport.shm_segments import create_segment, populate, unlink_quietly
from tests.harness import run_ranks


def resident_kib(name_part: str) -> dict[str, int]:
    """Rss (KiB) of this process's mappings whose path holds ``name_part``, by path."""
    out: dict[str, int] = {}
    path = None
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if "-" in head[0] and len(head) >= 5 and ":" not in head[0]:
                path = head[5] if len(head) > 5 and name_part in line else None
            elif path is not None and head[0] == "Rss:":
                out[path] = out.get(path, 0) + int(head[1])
    return out


def _kernel_populates() -> bool:
    mm = mmap.mmap(-1, 1 << 16)
    try:
        return populate(mm, 0, 1 << 16, True)
    finally:
        mm.close()


pytestmark = pytest.mark.skipif(not _kernel_populates(),
                                reason="madvise(MADV_POPULATE_*) needs Linux 5.14+")


def test_populate_maps_a_segments_range_in_now():
    name = f"collcomm-test-populate-{secrets.token_hex(4)}"
    mm = create_segment(name, 4 << 20)
    try:
        assert resident_kib(name) == {f"/dev/shm/{name}": 0}
        assert populate(mm, 4096 + 100, 1 << 20, True)    # start rounded down to its page
        assert resident_kib(name) == {f"/dev/shm/{name}": 1028}
        assert populate(mm, 2 << 20, 1 << 20, False)
        assert resident_kib(name) == {f"/dev/shm/{name}": 2052}
        assert bytes(mm[4096:4104]) == bytes(8)            # contents untouched
    finally:
        mm.close()
        unlink_quietly(name)


def test_populate_refuses_quietly():
    """A range the kernel cannot map in as asked: False, no exception (the pages would
    then fault in on use, as before)."""
    mm = mmap.mmap(-1, 1 << 16, prot=mmap.PROT_READ)
    assert populate(mm, 0, 1 << 16, True) is False          # writing it would fault: EFAULT
    assert populate(mm, 0, 1 << 16, False) is True
    mm.close()


def inbox_residency() -> tuple[dict[str, int], list[int]]:
    from collcomm.core import runtime

    engine = runtime.get_world("test").transport
    rings = [ch.inp.ring for ch in engine.channels.values()] + \
        [ch.out.ring for ch in engine.channels.values()]
    return resident_kib("-inbox-"), rings


def test_both_rings_of_a_channel_are_resident_after_init():
    """Each rank maps its own inbox (the peer's ring in it: read) and the peer's (its own
    ring there: write); both rings are in memory before any message."""
    for rank, (got, rings) in enumerate(run_ranks(inbox_residency, 2, transport="shm")):
        assert len(got) == 2 and len(rings) == 2, (rank, got, rings)
        for path, kib in got.items():
            assert kib >= min(rings) // 1024, (rank, path, kib, rings)
