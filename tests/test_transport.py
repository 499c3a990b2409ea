"""The transport conformance suite: every transport (shared memory, TCP) passes all of it.

Each test runs real ranks through tests.harness with COLLCOMM_TRANSPORT forced, talking to
the transport contract directly (``isend``/``irecv`` with global ranks and tags).
"""
from __future__ import annotations

import os
import shutil
import signal
import time

import numpy as np
import pytest

import collcomm.core.runtime as rt
from collcomm.errors import CommTimeoutError, MismatchError, PeerLostError
from collcomm.transport.base import ANY_SOURCE
from tests.harness import run_ranks

TRANSPORTS = ["shm", "tcp"]


def _t():
    return rt.get_world("test").transport


def _mv(a: np.ndarray) -> memoryview:
    return memoryview(a.reshape(-1).view(np.uint8))


# -- rank bodies (module level so the ranks can import them) ------------------------------
def exchange_sizes(sizes):
    """Every rank sends every size to every other rank; checks contents and byte counts."""
    t = _t()
    bad = []
    for i, n in enumerate(sizes):
        sends = [np.arange(n, dtype=np.int32) * 3 + t.rank * 7 + p for p in range(t.size)]
        recvs = {p: np.full(n + 3, -1, dtype=np.int32) for p in range(t.size) if p != t.rank}
        hr = {p: t.irecv(_mv(recvs[p]), p, i) for p in recvs}
        hs = [t.isend(_mv(sends[p]), p, i) for p in range(t.size) if p != t.rank]
        for p, h in hr.items():
            st = h.wait()
            want = np.arange(n, dtype=np.int32) * 3 + p * 7 + t.rank
            if st.nbytes != 4 * n or st.source != p or not np.array_equal(recvs[p][:n], want):
                bad.append((n, p, st))
            if (recvs[p][n:] != -1).any():
                bad.append((n, p, "wrote past the message"))
        for h in hs:
            h.wait()
    return bad


def fifo_and_tags(count):
    """Messages of one (source, tag) arrive in order; other tags do not interfere."""
    t = _t()
    if t.rank == 0:
        hs = []
        for i in range(count):
            for tag in (1, 2):
                hs.append(t.isend(_mv(np.array([i * 10 + tag], dtype=np.int64)), 1, tag))
        for h in hs:
            h.wait()
        return True
    out = []
    for tag in (2, 1):  # receive tag 2 first: tag 1's messages wait unexpected meanwhile
        for _ in range(count):
            a = np.zeros(1, dtype=np.int64)
            t.irecv(_mv(a), 0, tag).wait()
            out.append(int(a[0]))
    return out


def any_source():
    t = _t()
    if t.rank == 0:
        got = set()
        for _ in range(t.size - 1):
            a = np.zeros(1, dtype=np.int64)
            st = t.irecv(_mv(a), ANY_SOURCE, 5).wait()
            assert a[0] == st.source * 100, (a, st)
            got.add(st.source)
        return sorted(got)
    t.isend(_mv(np.array([t.rank * 100], dtype=np.int64)), 0, 5).wait()
    return None


def _await_file(path, limit):
    """Until ``path`` exists (another rank's word that something happened), ``limit`` s at most."""
    deadline = time.monotonic() + limit
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.01)


def late_waiter(nbytes, received):
    """Rank 0 sends and waits only once rank 1 has received (1.5 s later at most); rank 1's
    receive must finish long before 1.5 s."""
    t = _t()
    a = np.ones(nbytes, dtype=np.uint8)
    if t.rank == 0:
        h = t.isend(_mv(a), 1, 3)
        _await_file(received, 1.5)
        h.wait()
        return None
    b = np.zeros(nbytes, dtype=np.uint8)
    start = time.monotonic()
    t.irecv(_mv(b), 0, 3).wait()
    took = time.monotonic() - start
    open(received, "w").close()
    return took, bool((b == 1).all())


def late_receiver(nbytes):
    """Rank 1 posts its receive only after 1 s: rank 0's isend still completes."""
    t = _t()
    if t.rank == 0:
        a = np.full(nbytes, 9, dtype=np.uint8)
        t.isend(_mv(a), 1, 4).wait(timeout=20)
        return True
    time.sleep(1.0)
    b = np.zeros(nbytes, dtype=np.uint8)
    t.irecv(_mv(b), 0, 4).wait()
    return bool((b == 9).all())


def simultaneous_large(nbytes):
    """Both ranks isend a large message to each other before receiving: no deadlock."""
    t = _t()
    peer = 1 - t.rank
    a = np.full(nbytes, t.rank + 1, dtype=np.uint8)
    b = np.zeros(nbytes, dtype=np.uint8)
    hs = t.isend(_mv(a), peer, 0)
    hr = t.irecv(_mv(b), peer, 0)
    hs.wait()
    hr.wait()
    return bool((b == peer + 1).all())


def flood(count):
    """Both ranks send many small messages before receiving any (rings fill up)."""
    t = _t()
    peer = 1 - t.rank
    payload = np.full(8192, t.rank, dtype=np.uint8)
    hs = [t.isend(_mv(payload), peer, 1) for _ in range(count)]
    b = np.zeros(8192, dtype=np.uint8)
    ok = 0
    for _ in range(count):
        t.irecv(_mv(b), peer, 1).wait()
        ok += int((b == peer).all())
    for h in hs:
        h.wait()
    return ok


def overflow():
    t = _t()
    if t.rank == 0:
        t.isend(_mv(np.zeros(100, dtype=np.uint8)), 1, 1).wait()
        return None
    try:
        t.irecv(_mv(np.zeros(10, dtype=np.uint8)), 0, 1).wait()
    except MismatchError as exc:
        return str(exc)
    return "no error"


def silent_peer(gave_up):
    """Rank 1 never sends (and stays until rank 0 gave up, 2 s at most): rank 0's receive
    times out naming rank 1."""
    t = _t()
    if t.rank == 1:
        _await_file(gave_up, 2.0)
        return None
    start = time.monotonic()
    try:
        t.irecv(_mv(np.zeros(4, dtype=np.uint8)), 1, 9).wait(timeout=0.5)
    except CommTimeoutError as exc:
        took = time.monotonic() - start
        open(gave_up, "w").close()
        return took, exc.peer, str(exc)
    open(gave_up, "w").close()
    return "no error"


def victim_waits():
    """The last rank is SIGKILLed by the harness; everybody else is waiting on it."""
    t = _t()
    last = t.size - 1
    if t.rank == last:
        time.sleep(60)
    start = time.monotonic()
    try:
        t.irecv(_mv(np.zeros(4, dtype=np.uint8)), last, 1).wait()
    except PeerLostError as exc:
        took = time.monotonic() - start
        # a later operation with the lost peer fails at once
        try:
            t.isend(_mv(np.zeros(4, dtype=np.uint8)), last, 2).wait()
        except PeerLostError:
            return took, exc.peer, str(exc)
        return "second operation did not fail"
    return "no error"


def huge_marks(nbytes: int) -> dict[int, int]:
    """Where huge_message's message is not zero, and what it holds there: every 256 MiB,
    around the 4 GiB line (a 32-bit length or offset wraps there) and the last byte."""
    at = list(range(0, nbytes, 256 << 20)) + [(1 << 32) - 1, 1 << 32, (1 << 32) + 1, nbytes - 1]
    return {i: 1 + k % 250 for k, i in enumerate(sorted(set(at)))}


def huge_message(nbytes):
    """A message over 4 GiB, zero but for huge_marks: the sender's buffer is untouched
    memory (the zero page) but for those bytes, so the test pays for the receiver's 4 GiB
    and the transport's copy (over shared memory, past the staging pool, the sender's
    private copy the receiver reads), not a third buffer. The receiver's buffer starts as 0xAB everywhere,
    so a range the receive never wrote shows up as non-zero bytes beside the marks."""
    t = _t()
    marks = huge_marks(nbytes)
    if t.rank == 0:
        a = np.zeros(nbytes, dtype=np.uint8)
        for i, v in marks.items():
            a[i] = v
        t.isend(_mv(a), 1, 1).wait()
        return True
    b = np.full(nbytes, 0xAB, dtype=np.uint8)   # a byte the receive never writes stays non-zero
    st = t.irecv(_mv(b), 0, 1).wait()
    return (st.nbytes == nbytes and int(np.count_nonzero(b)) == len(marks)
            and all(int(b[i]) == v for i, v in marks.items()))


# -- the tests -------------------------------------------------------------------------------
@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("n", [2, 3])
def test_exchange_sizes(transport, n):
    # 0, 1, odd, around the shared-memory eager limit, and multi-MiB (segment / streamed)
    sizes = [0, 1, 7, 16383, 16384, 16385, 100_001, 2_500_000]
    results = run_ranks(exchange_sizes, n, sizes, transport=transport)
    assert results == [[]] * n


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_fifo_per_tag(transport):
    out = run_ranks(fifo_and_tags, 2, 50, transport=transport)[1]
    assert out == [i * 10 + 2 for i in range(50)] + [i * 10 + 1 for i in range(50)]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_any_source(transport):
    assert run_ranks(any_source, 4, transport=transport)[0] == [1, 2, 3]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_progress_without_wait(transport, tmp_path):
    took, ok = run_ranks(late_waiter, 2, 8 << 20, str(tmp_path / "received"),
                         transport=transport)[1]
    assert ok and took < 1.0, took
    assert run_ranks(late_receiver, 2, 8 << 20, transport=transport) == [True, True]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_simultaneous_large_exchange(transport):
    assert run_ranks(simultaneous_large, 2, 32 << 20, transport=transport) == [True, True]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_flood_does_not_deadlock(transport):
    assert run_ranks(flood, 2, 400, transport=transport) == [400, 400]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_overflow_is_a_mismatch(transport):
    msg = run_ranks(overflow, 2, transport=transport)[1]
    assert "100 bytes" in msg and "10 bytes" in msg and "rank 0" in msg


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_timeout_names_the_peer(transport, tmp_path):
    took, peer, msg = run_ranks(silent_peer, 2, str(tmp_path / "gave-up"), transport=transport)[0]
    assert peer == 1 and 0.4 < took < 3.0 and "rank 1" in msg and "timed out" in msg


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_killed_peer_is_lost_everywhere(transport):
    outcomes = run_ranks(victim_waits, 3, transport=transport, expect_failure=True, kill={2: 1.5})
    assert outcomes[2].exitcode == -signal.SIGKILL
    for o in outcomes[:2]:
        assert o.ok, o.error + o.output
        took, peer, msg = o.value
        assert peer == 2 and "rank 2" in msg
        assert took < 5.0, took


@pytest.mark.timeout(240)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_message_over_4_gib(transport):
    nbytes = (4 << 30) + 4099
    need = 3 * nbytes if transport == "shm" else 2 * nbytes
    avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    if avail < need + (2 << 30) or shutil.disk_usage("/dev/shm").free < nbytes + (1 << 30):
        pytest.skip(f"needs {need >> 30} GiB free memory and {nbytes >> 30} GiB in /dev/shm")
    assert run_ranks(huge_message, 2, nbytes, transport=transport, timeout=200) == [True, True]
