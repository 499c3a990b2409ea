"""Helpers the fast call's tests share (tests/test_fastpath.py, test_fastpath_taken.py,
test_fastpath_errors.py, test_async_two_part.py, test_async_two_part_results.py), called
on the ranks: the job's default world and how many calls its fast call made (-1: it has
none).
"""
from __future__ import annotations

from typing import Any


def _world() -> Any:
    from collcomm.core import runtime

    return runtime.get_world("test")


def _calls() -> int:
    fast = _world().fast
    return -1 if fast is None else fast.calls
