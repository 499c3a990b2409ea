"""Another process of this host, seen from this one: is it alive or stopped (its /proc
state), and may this process read its memory (cross-memory attach, ``process_vm_readv``:
:func:`probe_address` publishes a word for peers to try, :func:`can_read` tries a peer's).
The shared-memory channels read PRIVATE messages this way (shm.py), the arena its peers'
buffers (arena.py; arena_cma.py sets PR_SET_PTRACER under Yama so peers may read us).
"""
from __future__ import annotations

import ctypes
import os

import numpy as np

_PROBE_MAGIC = 0x636F6C6C2D70726F
_PROBE = np.full(1, _PROBE_MAGIC, dtype=np.uint64)   # read by local peers to test cross-memory attach


def buffer_address(buf: memoryview) -> int:
    return np.frombuffer(buf, dtype=np.uint8).ctypes.data if len(buf) else 0


def cpus() -> int:
    """How many CPUs this process may run on (``COLLCOMM_CORES`` says instead: e.g. where
    a container's CPU quota is smaller than its CPU set)."""
    given = os.environ.get("COLLCOMM_CORES", "").strip()
    if given.isdigit() and int(given) > 0:
        return int(given)
    if given:
        from .shm_segments import warn_once
        warn_once("cores", f"COLLCOMM_CORES={given!r} is not a positive count; using the CPU "
                           "affinity instead")
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def pid_stopped(pid: int) -> bool:
    """True while ``pid`` is stopped (SIGSTOP, a debugger: /proc state T or t)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2:][:1] in (b"T", b"t")


def pid_alive(pid: int) -> bool:
    """False once ``pid`` has exited (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    state = stat[stat.rfind(b")") + 2:][:1]
    return state not in (b"Z", b"X")


def probe_address() -> int:
    """Address of this process's cross-memory-attach probe word (see :func:`can_read`).
    Peers may read us from now on (arena_cma's import sets PR_SET_PTRACER under Yama)."""
    from . import arena_cma  # noqa: F401

    return int(_PROBE.ctypes.data)


def can_read(pid: int, address: int) -> bool:
    """Can this process read process ``pid``'s memory (``process_vm_readv``)? Tried on the
    peer's probe word (``COLLCOMM_CMA=0``: no)."""
    from .arena_cma import _IoVec, _READV   # arena_cma sets PR_SET_PTRACER so peers may read us

    if _READV is None or not address or os.environ.get("COLLCOMM_CMA", "1") == "0":
        return False
    got = np.zeros(1, dtype=np.uint64)
    local, remote = _IoVec(got.ctypes.data, 8), _IoVec(address, 8)
    return (_READV(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0) == 8
            and int(got[0]) == _PROBE_MAGIC)
