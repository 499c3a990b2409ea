"""Shared memory that never SIGBUSes (issue 9, item 2); the long version is tools/shm_small.py.

Jobs run for real in a small /dev/shm: a tmpfs mounted over it in a private mount
namespace (``unshare -m``, root only; skipped with the reason elsewhere), so the host's
/dev/shm is untouched and nothing can be left behind in it.
"""
from __future__ import annotations

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))

import shm_small  # noqa: E402

from collcomm import native  # noqa: E402

_PROBLEM = shm_small.unshare_problem()
needs_unshare = pytest.mark.skipif(_PROBLEM is not None, reason=f"small /dev/shm: {_PROBLEM}")


def _run(size, n, config, coll, p2p, timeout=60):
    r = shm_small.run(size, n, config, coll, p2p, timeout)
    assert r is not None, "the run in the namespace gave no result"
    for name in config.split(","):
        c = r["configs"][name]
        assert c["sigbus"] == 0 and c["hangs"] == 0 and not c["wrong"], c
        assert not c["left_in_dev_shm"], c
    return r, c


@needs_unshare
@pytest.mark.timeout(200)
def test_16mb_dev_shm_runs_every_collective_and_64mib_send_recv(monkeypatch):
    # 4 ranks: the default inboxes (12 MiB) and arena (32 MiB) alone would not fit. The
    # 64 MiB messages of isend are lent (no room needed: they never say "private memory");
    # with COLLCOMM_LEND=0 (or no native core) they are copied, into private memory when
    # /dev/shm has no room.
    # (Loans need a CPU per rank: COLLCOMM_CORES says there are, whatever this host has.)
    monkeypatch.setenv("COLLCOMM_CORES", "4")
    r, _ = _run("16m", 4, "default,lend0", "1K,8M", "64M")
    assert r["shm_bytes"] == 16 << 20
    for name in ("default", "lend0"):
        c = r["configs"][name]
        assert shm_small.verdict(r, name), c
        assert c["checks_done"] == 4 * (2 * 9 + 2 + 1), c        # 9 collectives x 2 sizes, 2 p2p, zeros
        text = "\n".join(c["warnings"])
        assert "arena" in text and "instead of 4.0 MiB" in text, text    # said once what it chose
        # (lending takes the native core: without it, COLLCOMM_NATIVE=0 or no compiler at
        # install, the default copies into private memory too: shm_lent.lends)
        assert ("private memory" in text) == (name == "lend0" or native.core is None), text


@needs_unshare
@pytest.mark.timeout(120)
def test_full_dev_shm_falls_back_to_tcp_for_the_ranks_without_room():
    r, c = _run("256k", 4, "default", "1K,256K", "1M")
    assert shm_small.verdict(r, "default"), c
    assert any("over TCP" in w for w in c["warnings"]), c["warnings"]


@needs_unshare
@pytest.mark.timeout(120)
def test_without_cma_a_message_that_fits_nowhere_is_refused_by_name():
    r, c = _run("16m", 2, "cma0", "", "64M")
    assert c["refused"] >= 1, c
    err = next(e for e in c["errors"] if e.startswith("ShmSpaceError"))
    assert "needs 64.0 MiB" in err and "free (of 16.0 MiB)" in err, err


def test_a_segment_larger_than_dev_shm_is_refused_and_leaves_nothing():
    from collcomm.transport.shm_segments import SHM_DIR, ShmSpaceError, create_segment, shm_space

    free, total = shm_space()
    name = f"collcomm-test-{os.getpid()}-too-big"
    with pytest.raises(ShmSpaceError) as info:
        create_segment(name, total + (1 << 30), what="a test segment")
    assert info.value.needed == total + (1 << 30) and "a test segment needs" in str(info.value)
    assert not os.path.exists(os.path.join(SHM_DIR, name))
