"""The first-part buffers of collcomm.MPI's object receives (:mod:`._pobj`).

An object travels as one message of at most ``EAGER`` bytes (an 8-byte length, then the
pickle) or a header and a body; a receive takes its first part into a ``EAGER``-byte
buffer. A completed receive's buffer goes back to ``SPARE`` (at most ``SPARE_MAX``) for
the next one (``np.empty`` of 64 KiB costs about a microsecond on the project's VM; list
append and pop are atomic). Here, apart from :mod:`._pobj`, so that
:mod:`._request`'s waits can hand the list to the native wait (native/_mpi_wait.c).
"""
from __future__ import annotations

import numpy as np

#: the largest message an object travels in whole (its first part's buffer)
EAGER = 64 * 1024
#: first-part buffers of completed receives, for the next ones
SPARE: list[np.ndarray] = []
SPARE_MAX = 8


def first_buffer() -> np.ndarray:
    """A spare first-part buffer, or a new one."""
    try:
        return SPARE.pop()
    except IndexError:
        return np.empty(EAGER, dtype=np.uint8)
