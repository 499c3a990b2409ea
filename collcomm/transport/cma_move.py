"""Moving bytes to or from a peer process by cross-memory attach, in Python: :func:`move`,
for the pure-Python path's transfers (the arena's reads and writes, arena_cma.py; a lent
or private message read, shm_staging.py). The native core's are ``cma_move`` in
native/_cma_move.c.

The kernel copies a transfer with ``rep movsb``, which some CPUs run 4-5x slower when the
destination lies 1-63 bytes past the source modulo 4 KiB (the AMD EPYC VM of
BENCHMARKS.md: 1 MiB at 16 bytes past 560-630 µs, at 0 110-135), and ranks that allocate
alike meet that all the time. Where the CPU is slow so (timed once a process, at its first
such transfer: 256 KiB of its own memory read 16 bytes past against at 0; or
``COLLCOMM_CMA_BOUNCE=1`` / ``0``, as for the native core), a transfer of 4 KiB or more in
that band goes through a bounce buffer in two hops of :data:`STEP` bytes, the buffer
placed 2 KiB past the remote address's page offset: the kernel's hop then lies 2 KiB from
its source and the local copy (``ctypes.memmove``: glibc's memcpy, which takes ``rep
movsb`` too) 2 KiB plus the distance, both outside the band. The native core's bounce
sits at the remote offset itself and copies out with its own vector loop instead.
"""
from __future__ import annotations

import ctypes
import os
import threading
import time
from typing import Any

import numpy as np

__all__ = ["move", "band_slow", "bounced", "verdict"]

BAND = 64                  # destinations 1-63 bytes past the source
MIN_BYTES = 4096           # smaller transfers go direct
STEP = 128 << 10           # a hop: a core's L2 holds the buffer
PROBE_BYTES = 256 << 10

_slow: bool | None = None  # timed at the first transfer in the band (or the setting)
_count = [0]               # transfers that went through a bounce buffer (tests)
_local = threading.local() # each thread's bounce buffer (ctypes calls release the GIL)


class _IoVec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


def _libc(name: str) -> Any:
    try:
        fn = getattr(ctypes.CDLL(None, use_errno=True), name)
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_ssize_t
    fn.argtypes = [ctypes.c_int, ctypes.POINTER(_IoVec), ctypes.c_ulong,
                   ctypes.POINTER(_IoVec), ctypes.c_ulong, ctypes.c_ulong]
    return fn


READV, WRITEV = _libc("process_vm_readv"), _libc("process_vm_writev")


def direct(pid: int, local: int, remote: int, nbytes: int, write: bool = False) -> int:
    """Move ``nbytes`` between address ``local`` here and ``remote`` in process ``pid``
    (process_vm_readv, or process_vm_writev if ``write``) as given, looping over partial
    transfers: 0, or the errno of the call that failed."""
    fn = WRITEV if write else READV
    if fn is None:
        return 38     # ENOSYS
    done = 0
    while done < nbytes:
        lv, rv = _IoVec(local + done, nbytes - done), _IoVec(remote + done, nbytes - done)
        got = fn(pid, ctypes.byref(lv), 1, ctypes.byref(rv), 1, 0)
        if got <= 0:
            return ctypes.get_errno() or 14    # EFAULT
        done += got
    return 0


def _in_band(local: int, remote: int, write: bool) -> bool:
    d = ((remote - local) if write else (local - remote)) & 4095
    return 0 < d < BAND


def _probe() -> bool:
    """Does this CPU read 16 bytes past the source 1.5x slower than at a distance of 0?"""
    setting = os.environ.get("COLLCOMM_CMA_BOUNCE", "")
    if setting in ("0", "1"):
        return setting == "1"
    raw = np.ones(2 * PROBE_BYTES + 3 * 4096, np.uint8)
    base = raw.__array_interface__["data"][0]
    src = base + (-base) % 4096
    dst = src + PROBE_BYTES + 4096
    times = []
    for distance in (0, 16):
        best = float("inf")
        for i in range(4):        # (the first one warms the pages up)
            t0 = time.perf_counter()
            if direct(os.getpid(), dst + distance, src, PROBE_BYTES):
                return False
            if i:
                best = min(best, time.perf_counter() - t0)
        times.append(best)
    return times[1] > 1.5 * times[0]


_probe_lock = threading.Lock()


def band_slow() -> bool:
    """Is this CPU slow in the band? (Timed once, by one thread: two timing at once would
    skew each other.)"""
    global _slow
    if _slow is None:
        with _probe_lock:
            if _slow is None:
                _slow = _probe()
    return _slow


def bounced() -> int:
    """Transfers that went through a bounce buffer (tests)."""
    return _count[0]


def verdict() -> int:
    """1: this CPU is slow in the band (transfers there bounce), 0: it is not, -1: not
    timed yet (no transfer met the band)."""
    return -1 if _slow is None else int(_slow)


def move(pid: int, local: int, remote: int, nbytes: int, write: bool = False) -> int:
    """:func:`direct`, but through a bounce buffer where the destination lies 1-63 bytes
    past the source modulo 4 KiB and this CPU is slow there: 0, or an errno."""
    if nbytes < MIN_BYTES or not _in_band(local, remote, write) or not band_slow():
        return direct(pid, local, remote, nbytes, write)
    buf = getattr(_local, "bounce", None)
    if buf is None:
        buf = _local.bounce = np.empty(STEP + 2 * 4096, np.uint8)
    base = buf.__array_interface__["data"][0]
    _count[0] += 1
    done = 0
    while done < nbytes:
        at = remote + done
        step = min(nbytes - done, STEP)
        mid = base + ((at + 2048 - base) & 4095)     # 2 KiB past the remote page offset
        if write:
            ctypes.memmove(mid, local + done, step)
        err = direct(pid, mid, at, step, write)
        if err:
            return err
        if not write:
            ctypes.memmove(local + done, mid, step)
        done += step
    return 0
