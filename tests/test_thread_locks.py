"""The core's direct ways of taking threading.Lock / RLock (native/_thread_locks.c): a
Lock's and an RLock's try by sem_trywait where CPython's locks are POSIX semaphores
(``SEM_DIRECT``: Linux, CPython 3.10-3.12, checked on a lock of its own at import), else
by PyThread_acquire_lock; either way the lock's own methods and other threads see what
the direct way did, and the other way round."""
from __future__ import annotations

import sys
import sysconfig
import threading

import pytest

from collcomm import native

pytestmark = pytest.mark.skipif(native.core is None, reason=f"native core: {native.reason}")


def test_semaphore_tries_where_cpython_locks_are_semaphores() -> None:
    want = sys.platform == "linux" and sys.version_info < (3, 13) and not sysconfig.get_config_var("Py_GIL_DISABLED")
    assert native.core.SEM_DIRECT == int(want)


def _taken_elsewhere(lock) -> bool:
    got: list[bool] = []

    def take() -> None:
        ok = lock.acquire(False)
        got.append(ok)
        if ok:
            lock.release()

    t = threading.Thread(target=take)
    t.start()
    t.join(10)
    return got == [False]


@pytest.mark.parametrize("make", [threading.Lock, threading.RLock])
def test_direct_and_method_ways_see_each_other(make) -> None:
    core = native.core
    lock = make()
    try:
        core.lock_take(lock)
    except TypeError:
        pytest.skip("this interpreter's locks are taken through their methods")
    core.lock_give(lock)
    for _ in range(3):
        assert core.lock_take(lock) is True
        assert _taken_elsewhere(lock), "another thread took a lock held the direct way"
        if make is threading.Lock:
            assert lock.locked() and core.lock_take(lock) is False
        else:
            assert lock._is_owned() and core.lock_take(lock) is True   # (re-entered)
            core.lock_give(lock)
        lock.release()                            # given back by the method
        assert not _taken_elsewhere(lock)
        assert lock.acquire(False)                # taken by the method ...
        if make is threading.Lock:
            assert core.lock_take(lock) is False  # ... busy for the direct way
            lock.release()
        else:
            lock.release()
        assert core.lock_take(lock) is True
        core.lock_give(lock)                      # given back the direct way
        assert lock.acquire(False)
        lock.release()
    with pytest.raises(RuntimeError):
        core.lock_give(lock)


def test_a_lock_held_by_another_thread_is_busy_for_the_direct_way() -> None:
    core = native.core
    for make in (threading.Lock, threading.RLock):
        lock = make()
        held, go = threading.Event(), threading.Event()

        def hold() -> None:
            with lock:
                held.set()
                go.wait(10)

        t = threading.Thread(target=hold)
        t.start()
        assert held.wait(10)
        try:
            assert core.lock_take(lock) is False
        except TypeError:
            pass
        go.set()
        t.join(10)
        try:
            assert core.lock_take(lock) is True
            core.lock_give(lock)
        except TypeError:
            pass
