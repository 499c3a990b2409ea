"""The native GilLock (native/_gil_lock.c): the shared-memory channels' send_lock and
poll_lock, taken and released with a plain load and store under the GIL. It must behave
as threading.Lock does for every use the package makes of it: mutual exclusion between
threads (also while a holder lets the GIL go), non-blocking tries, timeouts, errors."""
from __future__ import annotations

import sys
import threading
import time

import pytest

from collcomm import native

pytestmark = [pytest.mark.skipif(native.core is None, reason="needs the native core"),
              pytest.mark.timeout(60)]


def _lock():
    return native.core.GilLock()


def test_acquire_release_like_threading_lock():
    lk = _lock()
    assert not lk.locked()
    assert lk.acquire() is True and lk.locked()
    assert lk.acquire(False) is False
    assert lk.acquire(blocking=False) is False
    t0 = time.monotonic()
    assert lk.acquire(timeout=0.05) is False
    assert time.monotonic() - t0 >= 0.05
    lk.release()
    assert not lk.locked()
    with pytest.raises(RuntimeError, match="release unlocked lock"):
        lk.release()
    with pytest.raises(ValueError):
        lk.acquire(False, 1.0)
    with lk:
        assert lk.locked()
    assert not lk.locked()
    assert "unlocked" in repr(lk)


def test_threads_exclude_each_other_while_a_holder_lets_the_gil_go():
    # four threads, each holding the lock across a GIL release (time.sleep(0), as the
    # native receive waits holding poll_lock), with a tiny switch interval: no two inside
    lk = _lock()
    inside, overlaps, done = [0], [0], [0]

    def work() -> None:
        for _ in range(300):
            with lk:
                inside[0] += 1
                if inside[0] != 1:
                    overlaps[0] += 1
                time.sleep(0)
                inside[0] -= 1
                done[0] += 1

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    finally:
        sys.setswitchinterval(old)
    assert not any(t.is_alive() for t in threads)
    assert overlaps[0] == 0 and done[0] == 1200, (overlaps, done)


def test_a_blocked_acquire_gets_the_lock_when_released_and_lets_others_run():
    lk = _lock()
    lk.acquire()
    got: list[float] = []

    def waiter() -> None:
        t0 = time.monotonic()
        lk.acquire()
        got.append(time.monotonic() - t0)
        lk.release()

    t = threading.Thread(target=waiter)
    t.start()
    ticks = 0
    end = time.monotonic() + 0.2
    while time.monotonic() < end:      # the waiter must not hold the GIL while it waits
        ticks += 1
    lk.release()
    t.join(10)
    assert got and got[0] >= 0.2 and ticks > 1000, (got, ticks)


def test_the_channels_use_it():
    from collcomm.transport import shm

    assert type(shm._lock()).__name__ == "GilLock"
