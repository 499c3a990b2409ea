"""``algorithm=`` on every public collective reaches the family it names."""
from __future__ import annotations

import numpy as np
import pytest

import collcomm as dist
from collcomm.algorithms import available
from tests.harness import run_ranks

NEEDS = {"shm_direct": "shm", "hierarchical": "hosts"}


def every_family(transport):
    r, n = dist.get_rank(), dist.get_world_size()
    bad: list[str] = []

    def usable(family):
        need = NEEDS.get(family)
        return need is None or (need == "shm" and transport == "shm")

    def run(collective, family, call):
        try:
            call(family)
        except dist.InvalidArgumentError:
            if usable(family):
                bad.append(f"{collective}/{family} refused")
            return
        if not usable(family):
            bad.append(f"{collective}/{family} accepted")

    k = 5
    for fam in available("all_reduce"):
        x = np.full(k, r + 1.0)
        run("all_reduce", fam, lambda a: dist.all_reduce(x, algorithm=a))
        if usable(fam) and not (x == n * (n + 1) / 2).all():
            bad.append(f"all_reduce/{fam} wrong")
    for fam in available("broadcast"):
        b = np.full(k, float(r))
        run("broadcast", fam, lambda a: dist.broadcast(b, 1, algorithm=a))
        if usable(fam) and not (b == 1).all():
            bad.append(f"broadcast/{fam} wrong")
    for fam in available("all_gather"):
        out = np.empty(n * k)
        run("all_gather", fam, lambda a: dist.all_gather_into_tensor(out, np.full(k, float(r)), algorithm=a))
        if usable(fam) and not np.array_equal(out, np.repeat(np.arange(n, dtype=float), k)):
            bad.append(f"all_gather/{fam} wrong")
    for fam in available("reduce_scatter"):
        o = np.empty(k)
        run("reduce_scatter", fam, lambda a: dist.reduce_scatter_tensor(o, np.ones(n * k), algorithm=a))
        if usable(fam) and not (o == n).all():
            bad.append(f"reduce_scatter/{fam} wrong")
    for fam in available("all_to_all"):
        o = np.empty(n * 2)
        run("all_to_all", fam, lambda a: dist.all_to_all_single(o, np.arange(n * 2.0) + 100 * r, algorithm=a))
        want = np.array([100 * s + 2 * r + j for s in range(n) for j in range(2)], dtype=float)
        if usable(fam) and not np.array_equal(o, want):
            bad.append(f"all_to_all/{fam} wrong")
    for fam in available("reduce"):
        x = np.full(k, r + 1.0)
        run("reduce", fam, lambda a: dist.reduce(x, 0, algorithm=a))
        if usable(fam) and r == 0 and not (x == n * (n + 1) / 2).all():
            bad.append(f"reduce/{fam} wrong")
    for fam in available("gather"):
        lst = [np.empty(k) for _ in range(n)] if r == 0 else None
        run("gather", fam, lambda a: dist.gather(np.full(k, float(r)), lst, 0, algorithm=a))
    for fam in available("scatter"):
        s = np.empty(k)
        src = [np.full(k, float(i)) for i in range(n)] if r == 0 else None
        run("scatter", fam, lambda a: dist.scatter(s, src, 0, algorithm=a))
        if usable(fam) and not (s == r).all():
            bad.append(f"scatter/{fam} wrong")
    for fam in available("barrier"):
        run("barrier", fam, lambda a: dist.barrier(algorithm=a))
    try:
        dist.all_reduce(np.ones(1), algorithm="no-such-family")
        bad.append("unknown name accepted")
    except dist.InvalidArgumentError as exc:
        if "no-such-family" not in str(exc) or "ring" not in str(exc):
            bad.append(f"bad message: {exc}")
    return bad


@pytest.mark.timeout(90)
@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_algorithm_keyword(transport):
    assert run_ranks(every_family, 3, transport, transport=transport) == [[]] * 3
