"""collcomm.MPI neighbourhood collectives in seeded random sequences (the section
``neighbor_random`` of the shared MPI job, tests/mpi_checks.py: 1-5 ranks and TCP).

Every rank draws the same sequence of calls from a shared seed: the topology (a periodic
ring, a line with ``PROC_NULL`` ends, random distributed multigraphs with edges to
itself), the call (``Neighbor_alltoall``, ``Neighbor_allgather``, ``Neighbor_alltoallv``
and ``Neighbor_allgatherv`` with uneven counts and gaps between receive blocks), its form (blocking, ``I…``, a
persistent request started again with new values), the block size (empty to above the
native inline limit) and dtype. Each rank then completes its outstanding requests in its
own random order and way (``Wait``, ``Test`` polling, ``Waitall``, ``Testany`` polling),
up to three at a time, and checks every receive block against values computed from the
whole topology (the n-th edge from a peer meets the n-th to it; on a line a receive block
from ``PROC_NULL`` stays untouched). Layouts repeat, so the kept-layout quick ways, the C
exchange, its partial runs and the regular way all run, beside one another.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tests.mpi_checks import SIZES, Checker, check, job
from tests.test_mpi_neighbor import _pairings
from tests.test_mpi_neighbor_quick import HOW, complete_by

SIZES_M = (0, 1, 1, 3, 3, 17, 40_000)          # elements a block (40,000 float64: above the inline limit)
DTYPES = (np.float64, np.int32, np.uint8)


def _value(call: int, p: int, i: int, m: int, dtype: Any) -> np.ndarray:
    """Block i of rank p's send in call ``call``."""
    return ((np.arange(m) + 7 * i + 100 * p + 1000 * call) % 251).astype(dtype)


def _vcount(seed: int, call: int, p: int, i: int) -> int:
    """Rank p's send count for block i in a v call (every rank computes it): one of two
    layouts per rank and block, so layouts repeat (the kept-layout ways run)."""
    return int(np.random.default_rng([seed, call % 2, p, i]).choice([0, 1, 2, 5, 9, 40_000], p=[.2, .2, .2, .2, .15, .05]))


class _Topo:
    """A topology communicator and, for this rank, each receive slot's (sender, its block)."""

    def __init__(self, MPI: Any, comm: Any, kind: str, rng: np.random.Generator) -> None:
        r, n = comm.rank, comm.size
        self.kind = kind
        if kind in ("ring", "line"):
            self.t = comm.Create_cart([n], [kind == "ring"])
            down, up = self.t.Shift(0, 1)
            self.fills = [(down, 1), (up, 0)]       # (down sent its block 1 up; up its block 0 down)
            self.outdeg = 2
        else:
            dests = [[int(q) for q in rng.integers(0, n, rng.integers(0, 4))] for _ in range(n)]
            srcs = [[p for p in range(n) for q in dests[p] if q == me] for me in range(n)]
            for me in range(n):
                rng.shuffle(srcs[me])
            self.t = comm.Create_dist_graph_adjacent(srcs[r], dests[r])
            self.fills = _pairings(srcs, dests, r)
            self.outdeg = len(dests[r])
        self.null = MPI.PROC_NULL


def _start(MPI: Any, tp: _Topo, seed: int, call: int, what: str, form: str, m: int, dtype: Any,
           persistent: dict[Any, Any], r: int) -> tuple[Any, Any, np.ndarray, np.ndarray]:
    """Begin one call: (request or None when done, its refill for persistent, recv, want)."""
    t, fills, outdeg = tp.t, tp.fills, tp.outdeg
    indeg = len(fills)
    if what == "alltoallv":
        scounts = [_vcount(seed, call, r, i) for i in range(outdeg)]
        rcounts = [2 if p == tp.null else _vcount(seed, call, p, i) for p, i in fills]
        send = np.concatenate([_value(call, r, i, c, dtype) for i, c in enumerate(scounts)] + [np.zeros(0, dtype)])
        rdispls = [sum(rcounts[:j]) + j for j in range(indeg)]          # (a gap of one after each)
        recv = np.full(sum(rcounts) + indeg, 77, dtype)
        want = recv.copy()
        for j, (p, i) in enumerate(fills):
            if p != tp.null:
                want[rdispls[j]:rdispls[j] + rcounts[j]] = _value(call, p, i, rcounts[j], dtype)
        sspec = [send, scounts, [sum(scounts[:i]) for i in range(outdeg)], MPI._typedict[np.dtype(dtype).char]]
        rspec = [recv, rcounts, rdispls, MPI._typedict[np.dtype(dtype).char]]
        if form == "blocking":
            t.Neighbor_alltoallv(sspec, rspec)
            return None, None, recv, want
        return t.Ineighbor_alltoallv(sspec, rspec), None, recv, want
    if what == "allgatherv":
        size = _vcount(seed, call, r, 0)
        rcounts = [2 if p == tp.null else _vcount(seed, call, p, 0) for p, _ in fills]
        rdispls = [sum(rcounts[:j]) + j for j in range(indeg)]
        recv = np.full(sum(rcounts) + indeg, 77, dtype)
        want = recv.copy()
        for j, (p, _) in enumerate(fills):
            if p != tp.null:
                want[rdispls[j]:rdispls[j] + rcounts[j]] = _value(call, p, 0, rcounts[j], dtype)
        rspec = [recv, rcounts, rdispls, MPI._typedict[np.dtype(dtype).char]]
        send = _value(call, r, 0, size, dtype)
        if form == "blocking":
            t.Neighbor_allgatherv(send, rspec)
            return None, None, recv, want
        if form == "I":
            return t.Ineighbor_allgatherv(send, rspec), None, recv, want
        key = (id(tp), what, tuple(rcounts), size, np.dtype(dtype).char, call % 2)
        if key not in persistent:
            ps, pr = np.zeros_like(send), np.zeros_like(recv)
            persistent[key] = (t.Neighbor_allgatherv_init(ps, [pr, rcounts, rdispls, rspec[3]]), ps, pr)
        req, ps, pr = persistent[key]
        ps[:] = send
        pr[:] = 77
        req.Start()
        return req, None, pr, want
    if what == "alltoall":
        send = np.concatenate([_value(call, r, i, m, dtype) for i in range(outdeg)] + [np.zeros(0, dtype)])
        blocks = [(p, i) for p, i in fills]
    else:
        send = _value(call, r, 0, m, dtype)
        blocks = [(p, 0) for p, _ in fills]
    recv = np.full(m * indeg, 77, dtype)
    want = recv.copy()
    for j, (p, i) in enumerate(blocks):
        if p != tp.null:
            want[j * m:(j + 1) * m] = _value(call, p, i, m, dtype)
    if form == "blocking":
        (t.Neighbor_alltoall if what == "alltoall" else t.Neighbor_allgather)(send, recv)
        return None, None, recv, want
    if form == "I":
        return (t.Ineighbor_alltoall if what == "alltoall" else t.Ineighbor_allgather)(send, recv), None, recv, want
    key = (id(tp), what, m, np.dtype(dtype).char)    # persistent: one request per layout, started again
    if key not in persistent:
        ps, pr = np.zeros_like(send), np.zeros_like(recv)
        make = t.Neighbor_alltoall_init if what == "alltoall" else t.Neighbor_allgather_init
        persistent[key] = (make(ps, pr), ps, pr)
    req, ps, pr = persistent[key]
    ps[:] = send
    pr[:] = 77
    req.Start()
    return req, None, pr, want


def _complete(MPI: Any, c: Checker, rng: np.random.Generator, pending: list[Any], keep: int) -> None:
    """Complete pending (request, recv, want, label) until ``keep`` remain, in a random order
    and way; check each one's receive buffer once it is complete."""
    while len(pending) > keep:
        k = int(rng.integers(0, len(pending)))
        req, recv, want, label = pending.pop(k)
        how = int(rng.integers(0, 4))
        others = [p[0] for p in pending[:int(rng.integers(0, len(pending) + 1))]] if how == 2 else []
        complete_by(MPI, req, how, others)
        for p in pending[:len(others)]:
            c.eq(p[1], p[2], f"{p[3]} (completed by another's Waitall)")
        del pending[:len(others)]
        c.eq(recv, want, f"{label} completed by {HOW[how]}")


def neighbor_random_checks(c: Checker, MPI: Any, comm: Any) -> None:
    r, n = comm.rank, comm.size
    for seed in (1, 2, 3):
        shared = np.random.default_rng([seed, n])             # the same on every rank
        mine = np.random.default_rng([seed, n, r, 99])        # this rank's completion order and ways
        topos = [_Topo(MPI, comm, kind, shared) for kind in ("ring", "line", "graph", "graph")]
        persistent: dict[Any, Any] = {}
        pending: list[Any] = []
        for call in range(120):
            tp = topos[int(shared.integers(0, len(topos)))]
            what = ("alltoall", "allgather", "alltoallv", "allgatherv")[int(shared.integers(0, 4))]
            form = ("blocking", "I", "persistent")[int(shared.integers(0, 3))]
            if what == "alltoallv" and form == "persistent":
                form = "I"
            m = SIZES_M[int(shared.integers(0, len(SIZES_M)))]
            dtype = DTYPES[int(shared.integers(0, len(DTYPES)))]
            label = f"seed {seed} call {call}: {form} {what} on the {tp.kind} m={m} {np.dtype(dtype)}"
            if form == "persistent":        # (the active persistent requests first: one may be restarted)
                preqs = {id(preq) for preq, _, _ in persistent.values()}
                for p in [p for p in pending if id(p[0]) in preqs]:
                    pending.remove(p)
                    p[0].Wait()
                    c.eq(p[1], p[2], f"{p[3]} (waited for before a persistent start)")
            req, _, recv, want = _start(MPI, tp, seed, call, what, form, m, dtype, persistent, r)
            if req is None:
                c.eq(recv, want, label)
            else:
                pending.append((req, recv, want, label))
                _complete(MPI, c, mine, pending, 3)
        _complete(MPI, c, mine, pending, 0)
        for req, _, _ in persistent.values():
            req.Free()
        for tp in topos:
            tp.t.Free()


@pytest.mark.timeout(160)
@pytest.mark.parametrize("n", SIZES)
def test_neighbor_random(n):
    check(job(n), "neighbor_random")


@pytest.mark.timeout(160)
def test_neighbor_random_over_tcp():
    check(job(3, "tcp"), "neighbor_random")
