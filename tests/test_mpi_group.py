"""collcomm.MPI groups, in the style of mpi4py's test_group: Get_group, sizes and ranks,
Incl/Excl/Range_incl/Range_excl, Union/Intersection/Difference (MPI's order),
Translate_ranks, Compare (IDENT/SIMILAR/UNEQUAL), GROUP_EMPTY, bad ranks; sizes 1–5.
"""
from __future__ import annotations

import pytest

from tests.mpi_checks import SIZES, Checker, check, job


def group_checks(c: Checker, MPI, comm) -> None:
    r, n = comm.rank, comm.size
    g = comm.Get_group()
    c.eq((g.Get_size(), g.Get_rank(), g.size, g.rank), (n, r, n, r), "world group")
    rev = g.Incl(list(range(n))[::-1])
    c.eq((rev.rank, rev.Translate_ranks([0], g)), (n - 1 - r, [n - 1]), "Incl reversed")
    c.eq((g.Compare(rev), g.Compare(g.Incl(list(range(n)))), g.Compare(g.Dup())),
         (MPI.SIMILAR if n > 1 else MPI.IDENT, MPI.IDENT, MPI.IDENT), "Compare")
    evens = g.Incl(list(range(0, n, 2)))
    odds = g.Excl(list(range(0, n, 2)))
    c.eq((evens.size, odds.size), ((n + 1) // 2, n // 2), "Incl/Excl sizes")
    c.eq(evens.rank, r // 2 if r % 2 == 0 else MPI.UNDEFINED, "rank in a group this process is (not) in")
    c.eq(MPI.Group.Union(odds, evens).Translate_ranks(None, g), list(range(1, n, 2)) + list(range(0, n, 2)),
         "Union keeps the first group's order, then the second's new members")
    c.eq(MPI.Group.Intersection(rev, evens).Translate_ranks(None, g), [p for p in range(n)[::-1] if p % 2 == 0],
         "Intersection in the first group's order")
    c.eq(MPI.Group.Difference(g, evens).Translate_ranks(None, g), list(range(1, n, 2)), "Difference")
    c.eq(g.Range_incl([(0, n - 1, 2)]).Translate_ranks(None, g), list(range(0, n, 2)), "Range_incl")
    c.eq(g.Range_excl([(0, n - 1, 2)]).size, n // 2, "Range_excl")
    c.eq(g.Translate_ranks(list(range(n)), evens), [p // 2 if p % 2 == 0 else MPI.UNDEFINED for p in range(n)],
         "Translate_ranks into a subgroup")
    c.eq(g.Translate_ranks([MPI.PROC_NULL], evens), [MPI.PROC_NULL], "Translate_ranks keeps PROC_NULL")
    empty = g.Excl(list(range(n)))
    c.true(empty == MPI.GROUP_EMPTY and MPI.GROUP_EMPTY.size == 0, "an empty group equals GROUP_EMPTY")
    c.eq(MPI.GROUP_EMPTY.rank, MPI.UNDEFINED, "GROUP_EMPTY rank")
    c.eq(MPI.Group.Union(MPI.GROUP_EMPTY, g).rank, r, "Union with GROUP_EMPTY")
    c.raises(lambda: g.Incl([n]), MPI.Exception, "Incl of rank n", MPI.ERR_RANK)
    c.raises(lambda: g.Incl([0, 0]), MPI.Exception, "Incl of a repeated rank", MPI.ERR_RANK)
    c.raises(lambda: MPI.GROUP_NULL.Get_size(), MPI.Exception, "GROUP_NULL", MPI.ERR_GROUP)
    sub = comm.Split(r % 2)
    c.eq(sub.Get_group().Translate_ranks(None, g), [p for p in range(n) if p % 2 == r % 2], "a Split's group")
    g.Free()
    c.true(g == MPI.GROUP_NULL, "Free gives GROUP_NULL")


@pytest.mark.timeout(160)
@pytest.mark.parametrize("n", SIZES)
def test_group(n):
    check(job(n), "group")
