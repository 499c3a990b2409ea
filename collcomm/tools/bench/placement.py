"""Where the benchmark's buffers start in memory: every library's alike.

A copy's speed can hang on where its buffers lie: on some CPUs (the AMD EPYC VM of
BENCHMARKS.md, session 31) glibc's memcpy and the kernel's cross-memory copies run a copy
10-30x slower when the destination lies 1-31 bytes past the source modulo 4 KiB, and a
numpy array starts wherever malloc's heap puts it (16-byte aligned). Each library's job
allocates in its own heap, so left to the allocator one library can draw a slow placement
and another a fast one in the same cell. The bench therefore places every buffer of every
library ``--offset`` bytes past a 4 KiB page (default 0), plus ``--skew`` bytes for each
rank number (rank r: offset + r x skew, mod 4 KiB); ``--offset any`` keeps np.empty's own
placement (what a program gets). ``--alloc shared`` (collcomm.empty) places collcomm's
buffers itself.
"""
from __future__ import annotations

import numpy as np

PAGE = 4096
ALIGN = 16     # numpy's own alignment: every dtype's


def rank_offset(offset: int | None, skew: int, rank: int) -> int | None:
    """Where rank ``rank``'s buffers start past a page (None: where np.empty puts them)."""
    return None if offset is None else (offset + rank * skew) % PAGE


def placed_empty(count: int, dtype: str, offset: int | None) -> np.ndarray:
    """``np.empty(count, dtype)``, its data ``offset`` bytes past a 4 KiB page (a view of a
    larger array, which it keeps alive); None: np.empty's own."""
    if offset is None:
        return np.empty(count, dtype)
    dt = np.dtype(dtype)
    nbytes = count * dt.itemsize
    raw = np.empty(nbytes + 2 * PAGE, np.uint8)
    start = (-raw.ctypes.data) % PAGE + offset
    return raw[start:start + nbytes].view(dt)


def parse_offset(text: str) -> int | None:
    """``--offset``: 'any', or bytes past a page, a multiple of 16 below 4096."""
    if text.strip().lower() == "any":
        return None
    return check_bytes(text, "--offset")


def check_bytes(text: str | int, flag: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{flag} takes a number of bytes (or 'any' for --offset), got {text!r}") from None
    if not 0 <= value < PAGE or value % ALIGN:
        raise ValueError(f"{flag} must be below {PAGE} bytes and a multiple of {ALIGN} "
                         f"(0, 16, ..., {PAGE - ALIGN}), got {value}")
    return value
