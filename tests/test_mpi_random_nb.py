"""collcomm.MPI's non-blocking and persistent collectives in random sequences, a section of
the shared MPI job (tests/mpi_checks.py) at 1-5 ranks and over TCP.

The same seeded sequence on every rank (which call, count, dtype, root), completed in an
order of each rank's own (``Wait`` one by one, ``Test`` until done, ``Waitall``, in a
shuffled order), with blocking calls between and persistent ``Allreduce_init`` requests
started in each rank's own order (MPI lets persistent collectives start in different
orders): the I-forms' requests made in C (native/_mpi_request.c) or in Python, their
calls in two parts or queued, every result checked against numpy.
"""
from __future__ import annotations

import random
from typing import Any, Callable

import numpy as np
import pytest

from tests.mpi_checks import SIZES, Checker, check, job

DTYPES = [np.float64, np.float32, np.int32, np.int64, np.uint8]
KINDS = ["Iallreduce", "Igather", "Igatherv", "Ibcast", "Ibarrier", "Iallgather", "Ireduce",
         "Ialltoall", "Allreduce", "Bcast", "persistent"]


def _val(rank: int, k: int, dt: Any, salt: int) -> np.ndarray:
    return ((np.arange(k) + rank * 3 + salt) % 5).astype(dt)


def _start(MPI: Any, comm: Any, kind: str, k: int, dt: Any, root: int, salt: int) -> tuple[Any, Callable[[], bool]]:
    """Start one non-blocking call: (its request, the check of its result)."""
    r, n = comm.rank, comm.size
    every = [_val(j, k, dt, salt) for j in range(n)]
    joined = np.concatenate(every)
    if kind == "Iallreduce":
        d = np.zeros(k, dt)
        want = np.sum(every, axis=0, dtype=dt) if k else d.copy()
        return comm.Iallreduce(every[r], d, MPI.SUM), lambda: np.array_equal(d, want)
    if kind in ("Igather", "Igatherv"):
        d = np.zeros(n * k, dt)
        spec = d if kind == "Igather" else [d, [k] * n, [k * j for j in range(n)],
                                            MPI._typedict[np.dtype(dt).char]]
        q = comm.Igather(every[r], spec, root) if kind == "Igather" else comm.Igatherv(every[r], spec, root)
        return q, lambda: r != root or np.array_equal(d, joined)
    if kind == "Ibcast":
        d = every[root].copy() if r == root else np.zeros(k, dt)
        return comm.Ibcast(d, root), lambda: np.array_equal(d, every[root])
    if kind == "Ibarrier":
        return comm.Ibarrier(), lambda: True
    if kind == "Iallgather":
        d = np.zeros(n * k, dt)
        return comm.Iallgather(every[r], d), lambda: np.array_equal(d, joined)
    if kind == "Ireduce":
        d = np.zeros(k, dt)
        want = np.max(every, axis=0) if k else d.copy()
        return comm.Ireduce(every[r], d, MPI.MAX, root), lambda: r != root or np.array_equal(d, want)
    # Ialltoall: block j of rank i is _val(10 i + j)
    s = np.concatenate([_val(r * 10 + j, k, dt, salt) for j in range(n)])
    d = np.zeros(n * k, dt)
    want = np.concatenate([_val(j * 10 + r, k, dt, salt) for j in range(n)])
    return comm.Ialltoall(s, d), lambda: np.array_equal(d, want)


def _complete(MPI: Any, pending: list, own: random.Random) -> None:
    """Complete the pending requests in this rank's own order and way."""
    own.shuffle(pending)
    if own.random() < 0.4:
        MPI.Request.Waitall([q for q, _, _ in pending])
        return
    for q, _, _ in pending:
        if own.random() < 0.3:
            while not q.Test():
                pass
        else:
            q.Wait()


def _sequence(c: Checker, MPI: Any, comm: Any, seed: int, steps: int) -> None:
    r, n = comm.rank, comm.size
    same, own = random.Random(seed), random.Random(seed * 1000 + r)
    pers = []
    for i in range(4):
        k = same.choice([1, 2, 7])
        s, d = _val(r, k, np.float64, i), np.zeros(k)
        pers.append((comm.Allreduce_init(s, d), d, sum(_val(j, k, np.float64, i) for j in range(n))))
    pending: list[tuple[Any, Callable[[], bool], str]] = []
    for step in range(steps):
        kind, k, dt = same.choice(KINDS), same.choice([0, 1, 3, 17, 600]), same.choice(DTYPES)
        root = same.randrange(n)
        what = f"seed {seed} step {step}: {kind} count={k} {np.dtype(dt).name} root={root}"
        if kind == "Allreduce":
            d = np.zeros(k, dt)
            comm.Allreduce(_val(r, k, dt, step), d)
            c.true(np.array_equal(d, np.sum([_val(j, k, dt, step) for j in range(n)], axis=0, dtype=dt)
                                  if k else d), what)
        elif kind == "Bcast":
            d = _val(root, k, dt, step) if r == root else np.zeros(k, dt)
            comm.Bcast(d, root)
            c.true(np.array_equal(d, _val(root, k, dt, step)), what)
        elif kind == "persistent":
            pick = same.sample(range(len(pers)), 3)    # the same requests on every rank,
            own.shuffle(pick)                          # started in this rank's own order
            for i in pick:
                pers[i][0].Start()
            own.shuffle(pick)
            for i in pick:
                p, d, want = pers[i]
                p.Wait()
                c.true(np.array_equal(d, want), f"{what} (request {i})")
        else:
            q, ok = _start(MPI, comm, kind, k, dt, root, step)
            pending.append((q, ok, what))
        if len(pending) > 3 or same.random() < 0.3:
            _complete(MPI, pending, own)
            for q, ok, what in pending:
                c.true(ok() and q == MPI.REQUEST_NULL, what)
            pending = []
    _complete(MPI, pending, own)
    for q, ok, what in pending:
        c.true(ok(), what)
    for p, _, _ in pers:
        p.Free()


def random_nb_checks(c: Checker, MPI: Any, comm: Any) -> None:
    for seed in (11, 12):
        _sequence(c, MPI, comm, seed, 60)
    comm.Barrier()


@pytest.mark.timeout(160)
@pytest.mark.parametrize("n", SIZES)
def test_random_nb(n):
    check(job(n), "random_nb")


@pytest.mark.timeout(160)
def test_random_nb_over_tcp():
    check(job(3, "tcp"), "random_nb")
