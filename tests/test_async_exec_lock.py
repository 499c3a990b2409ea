"""The runner's lock of a group's queue (``AsyncCalls._exec``, a ``threading.RLock``) as the
second part of a call started in two parts takes it (native/_fastcall_parts_end.c,
``try_lock``): straight from the lock's fields where the interpreter's RLock has the layout
of CPython 3.10-3.13 (native/_thread_locks.c, ``RLOCK_DIRECT``; 3.14 and free-threaded
builds: its methods), else through its methods. Either way it must behave as the methods do:

* held by another thread, the lock is busy: the wait leaves the call to the queue's way
  (``AsyncCalls.run_through``), which waits for that thread, and the call still ends right;
* held by this thread (a call waited for inside ``with exec_lock``), it is taken again and
  given back once: still held by this thread after the wait, free after the ``with``;
* after a wait it is free (another thread takes it at once).
"""
from __future__ import annotations

import sys
import sysconfig
import threading
import time
from typing import Any

import numpy as np
import pytest

from collcomm import native
from tests.harness import run_ranks

pytestmark = pytest.mark.skipif(native.core is None, reason=f"native core: {native.reason}")


def test_rlocks_are_taken_directly_where_the_layout_allows() -> None:
    direct = (sys.version_info < (3, 14) and not sysconfig.get_config_var("Py_GIL_DISABLED")
              and type(threading.RLock()).__basicsize__ == 48)
    assert native.core.RLOCK_DIRECT == int(direct)


def _free_elsewhere(lock: Any, patience: float = 2.0) -> bool:
    """Can another thread take ``lock`` (trying for up to ``patience`` s: the group's worker
    may be leaving a run of the queue it took the lock for)? It gives it back."""
    got: list[bool] = []

    def take() -> None:
        deadline = time.monotonic() + patience
        ok = lock.acquire(False)
        while not ok and time.monotonic() < deadline:
            time.sleep(0.001)
            ok = lock.acquire(False)
        got.append(ok)
        if ok:
            lock.release()

    t = threading.Thread(target=take)
    t.start()
    t.join(10)
    return got == [True]


def _waits_around_the_lock() -> list[Any]:
    import collcomm as dist
    from collcomm.core import runtime

    me, n = dist.get_rank(), dist.get_world_size()
    calls = runtime.get_world("test").async_calls
    lock = calls.exec_lock
    out: list[Any] = []
    for i in range(3):
        x = np.full(3, float(me + i))
        w = dist.all_reduce(x, async_op=True)       # (small: started in two parts)
        w.wait()
        out.append(float(x[0]) == sum(r + i for r in range(n)) and _free_elsewhere(lock))
    # held by another thread while this one waits: the wait takes the queue's way
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            held.set()
            release.wait(10)

    x = np.full(3, 10.0 * (me + 1))
    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(10)
    w = dist.all_reduce(x, async_op=True)
    threading.Timer(0.2, release.set).start()
    t0 = time.monotonic()
    w.wait()
    out.append(("busy", float(x[0]) == 10.0 * sum(range(1, n + 1)), time.monotonic() - t0 >= 0.15))
    holder.join(10)
    out.append(_free_elsewhere(lock))
    # held by this thread: taken again and given back once
    x = np.full(3, 1.0)
    with lock:
        w = dist.all_reduce(x, async_op=True)
        w.wait()
        out.append(("mine", float(x[0]) == float(n), lock._is_owned(), not _free_elsewhere(lock, 0.05)))
    out.append(not lock._is_owned() and _free_elsewhere(lock))
    return out


@pytest.mark.timeout(120)
def test_the_runners_lock_as_its_methods_would() -> None:
    for out in run_ranks(_waits_around_the_lock, 2, transport="shm", timeout=90):
        assert out == [True, True, True, ("busy", True, True), True, ("mine", True, True, True), True], out


def test_set_async_on_a_fast_call_without_a_group() -> None:
    """``set_async`` reads the group's class (where ``_pending`` is a slot it stores
    straight into); a fast call never given a group (made without ``__init__``) has none:
    no crash, and nothing to store into (review of session 43: it read a NULL group)."""
    from collcomm.core.async_calls import AsyncCalls
    from collcomm.core.work import Work

    fast_type = native.core.Fast
    calls = AsyncCalls("test-set-async")
    fast = fast_type.__new__(fast_type)
    assert fast.set_async(Work, threading.Lock, calls.items, calls.exec_lock, threading.Lock(), calls) is None
    calls.close()


def test_the_group_s_pending_is_a_slot() -> None:
    """ProcessGroup keeps ``_pending`` in a plain slot (the C code stores it straight) and
    everything else in its ``__dict__``."""
    from collcomm.core.group import ProcessGroup

    assert "_pending" in ProcessGroup.__slots__ and "__dict__" in ProcessGroup.__slots__
    assert type(ProcessGroup.__dict__["_pending"]).__name__ == "member_descriptor"
