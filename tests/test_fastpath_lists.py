"""The fast call's list forms: torch's ``all_gather(tensor_list, tensor)``,
``gather(tensor, gather_list, dst)`` and ``scatter(tensor, scatter_list, src)`` run as one C
call straight between the list's buffers and the arena (collcomm/native/_fastcall_lists.c).

Every root, world sizes 1-4, odd counts, several dtypes, lists and tuples, against the
expected values; fast and regular ranks in one job; every wrong list refused with the
regular path's text, word for word (the same call made with the fast call paused); a
gather list whose buffers alias each other left to the regular path with its result.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from collcomm import native
from tests.harness import run_ranks

pytestmark = pytest.mark.skipif(native.core is None, reason=f"native core: {native.reason}")

DTYPES = ["float32", "int8", "uint16", "int64", "float16", "float64", "complex64", "bool"]


def _value(dt: str, rank: int, k: int, salt: int) -> np.ndarray:
    v = (np.arange(k) * 3 + rank * 7 + salt) % 11
    x = v.astype(dt) if dt != "bool" else (v % 2).astype(bool)
    if dt.startswith("complex"):
        x = x + 1j * x[::-1]
    return x


def _lists() -> dict[str, Any]:
    """gather and scatter list forms: every root, counts 1 and 5, the dtypes; results checked
    here against the values every rank can compute. Returns the fast calls made (and, in a
    world of two, the wrong lists' texts: _wrong_lists)."""
    import collcomm as dist
    from collcomm.core import runtime

    n, me = dist.get_world_size(), dist.get_rank()
    dist.barrier()       # the arena (and with it the Fast) exists from here on
    fast = runtime.get_world("test").fast
    before = -1 if fast is None else fast.calls
    bad = []
    for i, dt in enumerate(DTYPES):
        for k in (1, 5):
            for root in range(n):
                kind = list if (i + k + root) % 2 else tuple
                # gather to root
                mine = _value(dt, me, k, k)
                glist = kind(np.empty(k, dt) for _ in range(n)) if me == root else None
                dist.gather(mine, glist, dst=root)
                if me == root:
                    for r in range(n):
                        if not np.array_equal(glist[r], _value(dt, r, k, k)):
                            bad.append(("gather", dt, k, root, r))
                # scatter from root (2-D blocks on the root: shape needs not match, numel does)
                got = np.empty(k, dt)
                slist = (kind(_value(dt, r, k, 2 * k).reshape(k, 1) for r in range(n))
                         if me == root else None)
                dist.scatter(got, slist, src=root)
                if not np.array_equal(got, _value(dt, me, k, 2 * k)):
                    bad.append(("scatter", dt, k, root))
            # all_gather: a list on every rank
            alist = kind(np.empty(k, dt) for _ in range(n))
            dist.all_gather(alist, _value(dt, me, k, 3 * k))
            if not all(np.array_equal(alist[r], _value(dt, r, k, 3 * k)) for r in range(n)):
                bad.append(("all_gather", dt, k))
    # in place: the root's tensor is its own entry of the list
    glist = [np.full(2, -1.0) for _ in range(n)] if me == 0 else None
    dist.gather(glist[0] if me == 0 else np.full(2, float(me)), glist, dst=0)
    if me == 0 and [g.tolist() for g in glist] != [[float(r)] * 2 if r else [-1.0] * 2 for r in range(n)]:
        bad.append(("gather in place", [g.tolist() for g in glist]))
    slist = [np.full(2, 10.0 * r) for r in range(n)] if me == 0 else None
    got = slist[0] if me == 0 else np.empty(2)
    dist.scatter(got, slist, src=0)
    if got.tolist() != [10.0 * me] * 2:
        bad.append(("scatter in place", got.tolist()))
    alist = [np.full(3, -1, np.int32) for _ in range(n)]
    alist[me][:] = me * 5
    dist.all_gather(alist, alist[me])
    if [a.tolist() for a in alist] != [[5 * r] * 3 for r in range(n)]:
        bad.append(("all_gather in place", [a.tolist() for a in alist]))
    # a gather list whose buffers alias: the regular path's result (the last copy wins)
    shared = np.zeros(2)
    glist = [shared] * n if me == 0 else None
    dist.gather(np.full(2, float(me + 1)), glist, dst=0)
    if me == 0 and shared.tolist() != [float(n)] * 2:
        bad.append(("aliased", shared.tolist()))
    calls = -1 if fast is None else fast.calls - before
    # sends in the shared heap: a regular rank publishes its buffer in place, the fast root
    # (or every fast rank, all_gather) hands the call back and Hooks.finish reads the rest
    from collcomm.core import fastpath

    handed: list[str] = []
    finish = fastpath.Hooks._finish_list
    fastpath.Hooks._finish_list = lambda self, comm, status, collective, *rest: (    # type: ignore
        handed.append(collective), finish(self, comm, status, collective, *rest))[1]
    send = dist.empty(4, np.float64)
    send[:] = me + 0.5
    glist = [np.zeros(4) for _ in range(n)] if me == 0 else None
    dist.gather(send, glist, dst=0)
    if me == 0 and [g.tolist() for g in glist] != [[r + 0.5] * 4 for r in range(n)]:
        bad.append(("gather heap", [g.tolist() for g in glist]))
    alist = tuple(np.zeros(4) for _ in range(n))
    dist.all_gather(alist, send)
    if [a.tolist() for a in alist] != [[r + 0.5] * 4 for r in range(n)]:
        bad.append(("all_gather heap", [a.tolist() for a in alist]))
    fastpath.Hooks._finish_list = finish    # type: ignore
    return {"bad": bad, "calls": calls, "handed": handed, "wrong": _wrong_lists() if n == 2 and fast is not None else None}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n, regular", [(1, ()), (2, ()), (3, (2,)), (4, (1, 3))])
def test_list_forms_every_root_size_and_dtype(n: int, regular: tuple[int, ...]) -> None:
    """A world of n; the ranks in ``regular`` take the regular path (COLLCOMM_FAST=0)."""
    res = run_ranks(_lists, n, transport="shm", timeout=90,
                    rank_env={r: {"COLLCOMM_FAST": "0"} for r in regular})
    calls = len(DTYPES) * 2 * (2 * n + 1) + 4
    for r, out in enumerate(res):
        assert out["bad"] == [], (r, out["bad"])
        if r in regular:
            assert out["calls"] == -1
        else:   # all fast but the aliased list's gather on the root (rank 0)
            assert out["calls"] == calls - (1 if r == 0 and n > 1 else 0), (r, out["calls"])
    if regular:   # the heap sends: the fast root's gather and every fast rank's all_gather
        assert res[0]["handed"] == ["gather", "all_gather"], res[0]["handed"]
        assert all(res[r]["handed"] == ["all_gather"] for r in range(1, n) if r not in regular), res
    if n == 2:
        _check_wrong(res[0]["wrong"], res[1]["wrong"])


def _wrong_lists() -> list[Any]:
    """Each wrong list on the root (rank 0; the other ranks skip the call: it raises before
    any traffic), fast then with the fast call paused: the two texts."""
    import collcomm as dist
    from collcomm.core import runtime
    from collcomm.errors import InvalidArgumentError

    n, me = dist.get_world_size(), dist.get_rank()
    dist.barrier()
    fast = runtime.get_world("test").fast
    x = np.ones(3, np.float32)
    ro = np.ones(3, np.float32)
    ro.flags.writeable = False
    cases = {
        "gather short": lambda: dist.gather(x, [np.empty(3, np.float32)] * (n - 1), dst=0),
        "gather long": lambda: dist.gather(x, [np.empty(3, np.float32) for _ in range(n + 1)], dst=0),
        "gather dtype": lambda: dist.gather(x, [np.empty(3, np.float32)] + [np.empty(3, np.float64)] * (n - 1), dst=0),
        "gather numel": lambda: dist.gather(x, [np.empty(3, np.float32)] * (n - 1) + [np.empty((2, 2), np.float32)], dst=0),
        "gather strided": lambda: dist.gather(x, [np.empty(6, np.float32)[::2] for _ in range(n)], dst=0),
        "gather read-only": lambda: dist.gather(x, [np.empty(3, np.float32) for _ in range(n - 1)] + [ro], dst=0),
        "gather not a list": lambda: dist.gather(x, np.empty((n, 3), np.float32), dst=0),
        "all_gather short": lambda: dist.all_gather([np.empty(3, np.float32)] * (n - 1), x),
        "all_gather dtype": lambda: dist.all_gather([np.empty(3, np.float32)] * (n - 1) + [np.empty(3, np.int64)], x),
        "all_gather read-only": lambda: dist.all_gather([np.empty(3, np.float32)] * (n - 1) + [ro], x),
        "all_gather not a list": lambda: dist.all_gather(np.empty(3 * n, np.float32), x),
        "scatter short": lambda: dist.scatter(x, [x] * (n - 1), src=0),
        "scatter dtype": lambda: dist.scatter(x, [x] * (n - 1) + [np.ones(3, np.int32)], src=0),
        "scatter numel": lambda: dist.scatter(x, [x] * (n - 1) + [np.ones(4, np.float32)], src=0),
        "scatter read-only out": lambda: dist.scatter(ro, [x] * n, src=0),
        "scatter bad dst": lambda: dist.scatter(x, [x] * n, src=n),
        "scatter not a list": lambda: dist.scatter(x, np.ones((n, 3), np.float32), src=0),
    }
    texts = []
    if me == 0:
        for name, call in cases.items():
            pair = []
            for paused in (0, 1):
                fast.paused = paused
                try:
                    call()
                    pair.append("no error")
                except (InvalidArgumentError, ValueError, TypeError) as exc:
                    pair.append(f"{type(exc).__name__}: {exc}")
            fast.paused = 0
            texts.append((name, *pair))
    else:     # a list given on a rank that is not the root
        for paused in (0, 1):
            fast.paused = paused
            pair = []
            for call in (lambda: dist.gather(x, [x] * n, dst=0),
                         lambda: dist.scatter(x, [x] * n, src=0)):
                try:
                    call()
                    pair.append("no error")
                except InvalidArgumentError as exc:
                    pair.append(str(exc))
            texts.append(("non-root", paused, *pair))
        fast.paused = 0
    y = np.full(2, float(me))
    dist.all_reduce(y)          # the ranks still agree on their sequence
    return texts + [y.tolist()]


def _check_wrong(root: list[Any], other: list[Any]) -> None:
    """Every wrong list refused, fast or not, with the same text (_wrong_lists)."""
    *root, total = root
    assert total == [1.0, 1.0]
    assert len(root) == 17
    for name, fast_text, regular_text in root:
        assert fast_text.startswith("InvalidArgumentError") and "rank 0" in fast_text, (name, fast_text)
        assert fast_text == regular_text, (name, fast_text, regular_text)
    *other, total = other
    assert total == [1.0, 1.0]
    assert other[0][2:] == other[1][2:] and all("must not be given" in t for t in other[0][2:]), other


def _list_mismatch() -> str:
    import collcomm as dist
    from collcomm.errors import MismatchError

    me = dist.get_rank()
    try:                 # rank 0 scatters a list of 3-element blocks, rank 1 expects 4
        dist.scatter(np.empty(3 + me), [np.ones(3)] * 2 if me == 0 else None, src=0)
    except MismatchError as exc:
        return str(exc)
    return "no error"


@pytest.mark.timeout(120)
def test_a_list_form_mismatch_is_named_on_every_rank() -> None:
    """(A list-form gather against a barrier: test_fastpath.py's mismatches.)"""
    res = run_ranks(_list_mismatch, 2, transport="shm", timeout=60,
                    rank_env={1: {"COLLCOMM_FAST": "0"}})
    for text in res:
        assert "rank 0" in text and "rank 1" in text and "scatter" in text, text
