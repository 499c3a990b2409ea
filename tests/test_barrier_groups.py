"""``collcomm.barrier``'s group argument: the inline checks of api.barrier say what
``group_of`` says.

api.barrier resolves ``None`` (the world) and a live ProcessGroup itself, without the call
to ``group_of``; everything else still goes there. Here: a live subgroup's barrier runs
fast; a destroyed group, something that is not a group, and a call before
init_process_group raise ``group_of``'s errors; a rank outside the group skips it.
"""
from __future__ import annotations

from typing import Any

import pytest

from tests.harness import run_ranks


def _groups() -> dict[str, Any]:
    import collcomm as dist
    from collcomm.errors import InvalidArgumentError

    out: dict[str, Any] = {}
    me = dist.get_rank()
    both = dist.new_group([0, 1])
    dist.barrier(group=both)                       # (the group's arena and fast call start)
    fast = both.fast
    before = -1 if fast is None else fast.calls
    dist.barrier(group=both)
    out["fast"] = None if fast is None else fast.calls - before
    only0 = dist.new_group([0])
    out["outside"] = dist.barrier(group=only0) if me == 1 else "member"
    for name, arg in (("not a group", "WORLD"), ("an int", 3)):
        try:
            dist.barrier(group=arg)
            out[name] = "no error"
        except InvalidArgumentError as exc:
            out[name] = str(exc)
    dist.destroy_process_group(both)
    try:
        dist.barrier(group=both)
        out["destroyed"] = "no error"
    except InvalidArgumentError as exc:
        out["destroyed"] = str(exc)
    dist.barrier()
    return out


def _before_init() -> str:
    import collcomm as dist
    from collcomm.errors import InvalidArgumentError

    try:
        dist.barrier()
    except InvalidArgumentError as exc:
        return str(exc)
    return "no error"


@pytest.mark.timeout(90)
def test_barrier_group_argument() -> None:
    from collcomm import native

    for me, out in enumerate(run_ranks(_groups, 2, transport="shm", timeout=75)):
        if native.core is not None:
            assert out["fast"] == 1, out
        assert out["outside"] is None if me == 1 else out["outside"] == "member"
        for name in ("not a group", "an int"):
            assert "barrier: group must be a ProcessGroup or None" in out[name], out
        assert "barrier:" in out["destroyed"] and "was destroyed" in out["destroyed"], out


@pytest.mark.timeout(60)
def test_barrier_before_init() -> None:
    (text,) = run_ranks(_before_init, 1, init=False, timeout=45)
    assert "barrier: the default process group is not initialized" in text, text
