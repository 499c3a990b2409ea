"""POSIX shared-memory segments under /dev/shm, and the space they may take.

Space: a tmpfs page that cannot be backed when first touched kills the process with
SIGBUS, so every segment is backed when it is created (``posix_fallocate`` of every byte
it will use, after a ``statvfs`` check), never on first touch. When /dev/shm is short
(``shm_budget``: free space less a margin, ``COLLCOMM_SHM_MARGIN``), each user takes a
smaller share and says so once (a RuntimeWarning, :func:`warn_once`): inbox rings shrink
(down to 32 KiB; without even that, the rank's local peers talk to it over TCP: see
shm_ring.make_inbox), the arena's slots shrink (arena.py), staging segments are used only
while they fit, else the message goes through private memory read by cross-memory attach
(shm.ShmChannel), and shared allocations (``collcomm.empty``) fall back to private memory.
What fits nowhere is a :class:`ShmSpaceError` naming the bytes needed and the bytes free.

Segment names all start with ``collcomm-<job id>-`` and are unlinked as soon as every user
has mapped them (see shm.py).
"""
from __future__ import annotations

import errno
import mmap
import os
import sys
import warnings

from ..errors import CollcommError

SHM_DIR = "/dev/shm"
PAGE = 4096
MiB = 1 << 20


class ShmSpaceError(CollcommError):
    """/dev/shm has no room for a segment: ``needed`` and ``free`` bytes."""

    def __init__(self, message: str, needed: int = 0, free: int = 0) -> None:
        super().__init__(message)
        self.needed, self.free = needed, free


def shm_space() -> tuple[int, int]:
    """(free, total) bytes of the file system under /dev/shm."""
    try:
        st = os.statvfs(SHM_DIR)
    except OSError:
        return 0, 0
    return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize


def shm_margin(total: int) -> int:
    """Bytes of /dev/shm collcomm leaves free: ``COLLCOMM_SHM_MARGIN``, else 1/32 of the
    file system, between 1 and 64 MiB."""
    env = os.environ.get("COLLCOMM_SHM_MARGIN", "")
    if env.strip():
        return max(0, int(float(env)))
    return min(64 * MiB, max(MiB, total // 32))


def shm_budget() -> int:
    """Bytes collcomm may still take from /dev/shm (free space less the margin)."""
    free, total = shm_space()
    return max(0, free - shm_margin(total))


def mib(n: int) -> str:
    return f"{n / MiB:.1f} MiB" if n >= MiB // 10 else f"{n / 1024:.0f} KiB"


def space_text() -> str:
    free, total = shm_space()
    return f"{mib(free)} free of {mib(total)} in {SHM_DIR}"


_warned: set[str] = set()


def warn_once(key: str, message: str) -> None:
    """One RuntimeWarning per process and ``key``: what collcomm chose instead, and why."""
    if key in _warned:
        return
    _warned.add(key)
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
    frame = sys._getframe(1)
    while frame.f_back is not None and (frame.f_code.co_filename.startswith(package)
                                        or frame.f_code.co_filename.startswith("<frozen ")):
        frame = frame.f_back      # attribute it to the user's line that led here
    warnings.warn_explicit(f"collcomm: {message}", RuntimeWarning, frame.f_code.co_filename,
                           frame.f_lineno, module=frame.f_globals.get("__name__", "collcomm"),
                           registry=frame.f_globals.setdefault("__warningregistry__", {}))


def reserve(fd: int, size: int, what: str, ranges: "list[tuple[int, int]] | None" = None) -> None:
    """Back ``ranges`` (default: all ``size`` bytes) of the file ``fd`` with memory now
    (``posix_fallocate``), so touching them later can never SIGBUS. ShmSpaceError when
    the file system is full; where it cannot reserve (no fallocate), a statvfs check."""
    for off, length in ranges or [(0, size)]:
        if length <= 0:
            continue
        try:
            os.posix_fallocate(fd, off, length)
        except OSError as exc:
            free, total = shm_space()
            if exc.errno in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS) and free >= size:
                return
            if exc.errno not in (errno.ENOSPC, errno.EFBIG, errno.ENOMEM, errno.EOPNOTSUPP,
                                 errno.EINVAL, errno.ENOSYS):
                raise
            raise ShmSpaceError(f"{what} needs {mib(size)} of shared memory but {SHM_DIR} has "
                                f"{mib(free)} free (of {mib(total)}); give it more room (e.g. "
                                "docker run --shm-size=1g) or use COLLCOMM_TRANSPORT=tcp",
                                needed=size, free=free) from exc

def create_segment(name: str, size: int, populate: bool = False, what: str = "",
                   ranges: "list[tuple[int, int]] | None" = None) -> mmap.mmap:
    """Create segment ``name`` of ``size`` bytes, its memory reserved (``ranges`` of it, by
    default all: see :func:`reserve`); ShmSpaceError, and no file left, when it does not fit."""
    path = os.path.join(SHM_DIR, name)
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
        free, _ = shm_space()
        raise ShmSpaceError(f"{what or 'segment ' + name}: {SHM_DIR} is full ({exc})",
                            needed=size, free=free) from exc
    try:
        os.ftruncate(fd, size)
        try:
            reserve(fd, size, what or f"segment {name}", ranges)
        except BaseException:
            unlink_quietly(name)
            raise
        flags = mmap.MAP_SHARED | (getattr(mmap, "MAP_POPULATE", 0) if populate else 0)
        return mmap.mmap(fd, size, flags=flags)
    finally:
        os.close(fd)


def open_segment(name: str, unlink: bool = False, populate: bool = False) -> mmap.mmap:
    path = os.path.join(SHM_DIR, name)
    fd = os.open(path, os.O_RDWR)
    try:
        if unlink:
            os.unlink(path)
        flags = mmap.MAP_SHARED | (getattr(mmap, "MAP_POPULATE", 0) if populate else 0)
        return mmap.mmap(fd, os.fstat(fd).st_size, flags=flags)
    finally:
        os.close(fd)


#: madvise advice that maps a range's pages now (Linux 5.14+; mmap has no names for them)
MADV_POPULATE_READ, MADV_POPULATE_WRITE = 22, 23


def populate(mm: mmap.mmap, start: int, length: int, write: bool) -> bool:
    """Map ``length`` bytes of ``mm`` from ``start`` (a reserved range) into this process now,
    for reading or writing, instead of one page fault per page on first use (measured: a
    fresh 1 MiB ring's first pass cost 2 KiB messages twice their time once it wrapped).
    The pages were reserved when the segment was made, so this takes no more space. False
    where the kernel cannot (older than 5.14): the pages then fault in as they are used."""
    lo = start // mmap.PAGESIZE * mmap.PAGESIZE   # (the kernel's page: 64 KiB on some)
    try:
        mm.madvise(MADV_POPULATE_WRITE if write else MADV_POPULATE_READ, lo, start + length - lo)
    except (OSError, ValueError):
        return False
    return True


def unlink_quietly(name: str) -> None:
    try:
        os.unlink(os.path.join(SHM_DIR, name))
    except FileNotFoundError:
        pass
