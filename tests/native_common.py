"""What tests of the native core's settings share: a ``Core`` that is never called into."""
from __future__ import annotations

import mmap
from typing import Any

from collcomm import native
from collcomm.transport import arena_layout


def lone_core(**kw: Any) -> Any:
    """A Core of rank 0 of 2 over a private mapping (never called into), made with the
    keyword settings ``kw``."""
    page, slot = 4096, 1 << 16
    mapping = mmap.mmap(-1, page + 4 * (slot + page))
    return native.core.Core(mapping, 2, 0, page, slot, slot + page, page, arena_layout.ONE_SHOT,
                            arena_layout.NATIVE, 0, 0, False, **kw)
