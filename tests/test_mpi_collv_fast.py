"""collcomm.MPI's vector collectives through the fast call (collcomm/MPI/_collv_fast.py,
native/_fastcall_v.c), a section of the shared MPI job (tests/mpi_checks.py) at 1-5 ranks
and over TCP (no fast call there: the same checks on the regular path).

``Gatherv``, ``Scatterv``, ``Allgatherv`` and ``Alltoallv`` with per-rank counts (zeros
among them), every root, several dtypes, each way of writing the spec (``[buf, counts]``,
``[buf, counts, displs]``, ``[buf, (counts, displs)]``, with and without a datatype), all
checked against values computed from the whole job; that the fast call took them (its
``calls`` counter) where there is one; specs it declines (a gap between blocks, numpy
counts, a typecode for the datatype, blocks over its limit)
on some ranks while the others take it, with the same results; split sizes that do not
pair up, refused on every rank, the next call fine.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tests.mpi_checks import SIZES, Checker, check, job

DTYPES = ("float64", "int32", "int8", "complex64", "bool")


def _count(src: int, dst: int, salt: int) -> int:
    """What rank ``src`` sends ``dst`` (elements): 0 to 3, zeros among them."""
    return (src * 3 + dst * 5 + salt) % 4


def _block(src: int, dst: int, salt: int, dtype: str) -> np.ndarray:
    vals = np.arange(_count(src, dst, salt)) + 10 * src + 100 * dst + salt
    return (vals % 2 == 1) if dtype == "bool" else vals.astype(dtype)


def _spec(buf: np.ndarray, counts: list[int], how: int, MPI) -> Any:
    displs = [sum(counts[:i]) for i in range(len(counts))]
    dt = {"float64": MPI.DOUBLE, "int32": MPI.INT32_T, "int8": MPI.INT8_T, "complex64": MPI.C_FLOAT_COMPLEX,
          "bool": MPI.C_BOOL}[buf.dtype.name]
    return [[buf, counts], [buf, counts, displs], [buf, (counts, displs)], [buf, counts, displs, dt],
            [buf, counts, dt]][how % 5]


class _Fast:
    """Counts the calls the group's fast call completed (None where there is none)."""

    def __init__(self, comm) -> None:
        g = comm._h.g
        self.fast = g.fast if g is not None else None
        self.start = self.fast.calls if self.fast is not None else 0

    def took(self) -> int | None:
        return None if self.fast is None else self.fast.calls - self.start


def _forms(c: Checker, MPI, comm, dtype: str, salt: int) -> None:
    r, n = comm.rank, comm.size
    how = salt + r                       # ranks write their specs differently
    # Alltoallv
    send = np.concatenate([_block(r, j, salt, dtype) for j in range(n)])
    want = np.concatenate([_block(j, r, salt, dtype) for j in range(n)])
    recv = np.zeros(want.size, dtype=dtype)
    sc, rc = [_count(r, j, salt) for j in range(n)], [_count(j, r, salt) for j in range(n)]
    comm.Alltoallv(_spec(send, sc, how, MPI), _spec(recv, rc, how + 1, MPI))
    c.eq(recv, want, f"Alltoallv {dtype} salt {salt}")
    for root in range(n):
        mine = _block(r, root, salt, dtype)
        counts = [_count(j, root, salt) for j in range(n)]
        whole = np.concatenate([_block(j, root, salt, dtype) for j in range(n)])
        # Gatherv
        out = np.zeros(whole.size, dtype=dtype)
        comm.Gatherv(mine, _spec(out, counts, how, MPI) if r == root else None, root)
        if r == root:
            c.eq(out, whole, f"Gatherv {dtype} root {root} salt {salt}")
        # Scatterv (the root scatters what the Gatherv gathered)
        got = np.zeros(mine.size, dtype=dtype)
        comm.Scatterv(_spec(whole, counts, how, MPI) if r == root else None, got, root)
        c.eq(got, mine, f"Scatterv {dtype} root {root} salt {salt}")
    # Allgatherv: unequal blocks, then equal ones
    counts = [_count(j, 0, salt) for j in range(n)]
    out = np.zeros(sum(counts), dtype=dtype)
    comm.Allgatherv(_block(r, 0, salt, dtype), _spec(out, counts, how, MPI))
    c.eq(out, np.concatenate([_block(j, 0, salt, dtype) for j in range(n)]), f"Allgatherv {dtype} salt {salt}")
    two = np.full(2, r + salt).astype(dtype)
    out = np.zeros(2 * n, dtype=dtype)
    comm.Allgatherv(two, _spec(out, [2] * n, how, MPI))
    c.eq(out, np.repeat(np.arange(n) + salt, 2).astype(dtype), f"Allgatherv equal blocks {dtype}")


def _taken(c: Checker, MPI, comm) -> None:
    """Where the group has a fast call, each form is one fast call (Gatherv / Scatterv and
    their I forms through its own entries, native/_fastcall_vroot.c; 2-D blocks too)."""
    r, n = comm.rank, comm.size
    ones = np.ones(n)
    for name, call in (("Alltoallv", lambda: comm.Alltoallv([ones, [1] * n], [np.zeros(n), [1] * n])),
                       ("Gatherv", lambda: comm.Gatherv(ones[:1], [np.zeros(n), [1] * n] if r == 0 else None, 0)),
                       ("Scatterv", lambda: comm.Scatterv([ones, [1] * n] if r == 0 else None, np.zeros(1), 0)),
                       ("Allgatherv", lambda: comm.Allgatherv(ones[:1], [np.zeros(n), [1] * n])),
                       ("Igatherv", lambda: comm.Igatherv(ones[:1], [np.zeros(n), [1] * n] if r == 0 else None,
                                                          0).Wait()),
                       ("Iscatterv", lambda: comm.Iscatterv([ones, [1] * n] if r == 0 else None, np.zeros(1),
                                                            0).Wait()),
                       ("Gatherv of 2-D blocks", lambda: comm.Gatherv(np.ones((2, 3)), [np.zeros((2 * n, 3)),
                                                                                         [6] * n] if r == 0 else None, 0)),
                       ("Scatterv into 2-D blocks", lambda: comm.Scatterv([np.ones((2 * n, 3)), [6] * n]
                                                                          if r == 0 else None, np.zeros((2, 3)), 0))):
        call()                           # (the first call on a group builds its arena)
        f = _Fast(comm)
        call()
        took = f.took()
        if took is not None:
            c.eq(took, 1, f"{name} of numpy arrays is one fast call")
    fast = _Fast(comm).fast
    if fast is not None:      # the C entries themselves (every rank calls them: collectives)
        counts = [k % 3 + 1 for k in range(n)]
        out = np.zeros(sum(counts))
        mine = np.full(counts[r], float(r))
        want = np.repeat(np.arange(n, dtype=np.float64), counts)
        c.eq(fast.allgatherv(mine, [out, counts], "Allgatherv", MPI.Datatype, False, np.tile), True,
             "fast.allgatherv, split sizes, done in C")
        c.eq(out, want, "fast.allgatherv, split sizes")
        out = np.zeros(n + 3)
        c.eq(fast.allgatherv(ones[:1] * r, [out, [1] * n, None, MPI.DOUBLE], "Allgatherv", MPI.Datatype,
                             False, np.tile), True, "fast.allgatherv, equal blocks, done in C")
        c.eq(out[:n], np.arange(n, dtype=np.float64), "fast.allgatherv, equal blocks into a larger array")
        out = np.zeros(sum(counts))
        c.eq(fast.gatherv(mine, [out, (counts, None)] if r == 0 else None, 0, "Gatherv", MPI.Datatype, False),
             True, "fast.gatherv, done in C")
        if r == 0:
            c.eq(out, want, "fast.gatherv")
        got = np.zeros(counts[r])
        c.eq(fast.scatterv([want, counts, MPI.DOUBLE] if r == 0 else None, got, 0, "Scatterv", MPI.Datatype,
                           False), True, "fast.scatterv, done in C")
        c.eq(got, mine, "fast.scatterv")
        # a registered datatype that is not the array's own dtype (its bytes read as int64;
        # native/_fastcall_vroot.c vr_type_fits, whose quick answer is for the array's own
        # dtype only): declined by the entry, done right by the method's general way
        mine_f, got_f = np.arange(n, dtype=np.float64) + 10 * r, np.zeros(n)
        spec_s, spec_r = [mine_f, [1] * n, None, MPI.INT64_T], [got_f, [1] * n, None, MPI.INT64_T]
        c.eq(fast.alltoallv(spec_s, spec_r, "Alltoallv", MPI.Datatype, False), None,
             "fast.alltoallv of float64 arrays as INT64_T declined")
        comm.Alltoallv(spec_s, spec_r)
        c.eq(got_f, np.arange(n, dtype=np.float64) * 10 + r, "Alltoallv of float64 arrays as INT64_T: the bytes")
        send, out = np.arange(n, dtype=np.int32) + 10 * r, np.zeros(n, dtype=np.int32)
        c.eq(fast.alltoallv([send, ([1] * n, list(range(n))), MPI.INT], [out, [1] * n], "Alltoallv",
                            MPI.Datatype, False), True, "fast.alltoallv (the pair form; no displacements), done in C")
        c.eq(out, np.arange(n, dtype=np.int32) * 10 + r, "fast.alltoallv")
        byte_displs = [4 * j for j in range(n)]
        c.eq(fast.alltoallw([send, ([1] * n, byte_displs), MPI.INT], [out, [1] * n, byte_displs, [MPI.INT] * n],
                            "Alltoallw", MPI.Datatype, False, np.dtype(np.uint8)), True,
             "fast.alltoallw (one datatype; counts and displacements as a pair), done in C")
        c.eq(out, np.arange(n, dtype=np.int32) * 10 + r, "fast.alltoallw")
        # blocks of different predefined datatypes (their extents known to the core without
        # asking them: native/_mpi_plain_types.c pl_size_of) back to back in bytes: block j
        # is INT16 for even j, DOUBLE for odd j, one element each way
        kinds = [MPI.INT16_T if j % 2 == 0 else MPI.DOUBLE for j in range(n)]
        sizes = [2 if j % 2 == 0 else 8 for j in range(n)]
        at = [sum(sizes[:j]) for j in range(n)]
        raw_s = np.zeros(sum(sizes), dtype=np.uint8)
        for j in range(n):
            raw_s[at[j]:at[j] + sizes[j]] = np.array([100 * r + j], dtype="<i2" if j % 2 == 0 else "<f8").view(np.uint8)
        rk = MPI.INT16_T if r % 2 == 0 else MPI.DOUBLE
        rsz = 2 if r % 2 == 0 else 8
        raw_r = np.full(rsz * n + 3, 255, dtype=np.uint8)
        c.eq(fast.alltoallw([raw_s, [1] * n, at, kinds], [raw_r[:rsz * n], [1] * n, [rsz * j for j in range(n)], rk],
                            "Alltoallw", MPI.Datatype, False, np.dtype(np.uint8)), True,
             "fast.alltoallw of INT16_T and DOUBLE blocks, done in C")
        got_w = raw_r[:rsz * n].view("<i2" if r % 2 == 0 else "<f8")
        c.eq(got_w, np.array([100 * j + r for j in range(n)], dtype=got_w.dtype), "fast.alltoallw, mixed datatypes")
        c.eq(raw_r[rsz * n:], np.full(3, 255, dtype=np.uint8), "fast.alltoallw: nothing past the receive blocks")
        # displacements that are not back to back, or too large an int: declined (None)
        if n > 1:
            gap = [0] + [4 * j + 4 for j in range(1, n)]
            c.eq(fast.alltoallw([np.zeros(4 * n + 4, np.uint8), [1] * n, gap, MPI.INT], [out, [1] * n, byte_displs,
                                MPI.INT], "Alltoallw", MPI.Datatype, False, np.dtype(np.uint8)), None,
                 "fast.alltoallw with a gap between blocks declined")
        c.eq(fast.alltoallw([send, [1] * n, [2 ** 70] * n, MPI.INT], [out, [1] * n, byte_displs, MPI.INT],
                            "Alltoallw", MPI.Datatype, False, np.dtype(np.uint8)), None,
             "fast.alltoallw with a displacement past 2**63 declined")


def _mixed_ways(c: Checker, MPI, comm) -> None:
    """Some ranks' specs are declined (regular path), the others' taken: same results."""
    r, n = comm.rank, comm.size
    send = np.arange(n, dtype=np.float64) + 10 * r
    want = np.arange(n, dtype=np.float64) * 10 + r
    recv = np.zeros(2 * n)                # room for the gapped layout
    declined = [                          # (the spec, where its blocks land)
        ([recv, np.array([1] * n)], lambda: recv[:n]),                        # numpy counts
        ([recv, [1] * n, "d"], lambda: recv[:n]),                             # a typecode
        ([recv, [1] * n, [2 * i for i in range(n)]], lambda: recv[::2]),      # gaps between blocks
    ]
    for k, (spec, landed) in enumerate(declined):
        recv[:] = 0
        if r % 2 == k % 2:
            comm.Alltoallv([send, [1] * n], spec)
            c.eq(landed(), want, f"Alltoallv declined way {k} (rank {r})")
        else:
            comm.Alltoallv([send, [1] * n], [recv, [1] * n])
            c.eq(recv[:n], want, f"Alltoallv beside declined way {k}")
    # a datatype that is not the array's: the regular path converts nothing, reads bytes
    ints = np.arange(2 * n, dtype=np.int32) + 100 * r
    got = np.zeros(2 * n, dtype=np.int32)
    comm.Alltoallv([ints, [2] * n, MPI.INT], [got, [2] * n, MPI.INT])
    c.eq(got, np.concatenate([np.arange(2 * r, 2 * r + 2) + 100 * j for j in range(n)]).astype(np.int32),
         "Alltoallv int32 with MPI.INT")
    # equal blocks into a Fortran-ordered receive buffer larger than they need: the fast
    # call declines it (a flat view of it would be a copy) and the regular path fills it
    fortran = np.full((2 * n + 1, 2), -1, dtype=np.int32, order="F")
    comm.Allgatherv(np.full(2, r, dtype=np.int32), [fortran, [2] * n])
    flat = fortran.ravel(order="K")
    c.eq(flat[:2 * n], np.repeat(np.arange(n), 2).astype(np.int32), "Allgatherv into a Fortran-ordered buffer")
    # blocks over the fast call's limit (a slot): the regular path
    big = 1 << 20
    src = np.full(big * n, float(r))
    dst = np.zeros(big * n)
    comm.Alltoallv([src, [big] * n], [dst, [big] * n])
    c.eq(dst[::big], np.arange(n, dtype=float), "Alltoallv of 8 MiB blocks")


def _mismatch(c: Checker, MPI, comm) -> None:
    """Split sizes that do not pair up: refused on every rank in shared memory (no hang),
    on the rank expecting more over TCP; then a good call."""
    r, n = comm.rank, comm.size
    if n == 1:
        return
    sc = [1] * n
    rc = [2 if (r == 0 and j == 1) else 1 for j in range(n)]    # rank 0 expects 2 from rank 1
    recv = np.zeros(sum(rc))
    if r == 0 or comm._h.g.link == "shm":   # (over TCP only rank 0 can tell)
        c.raises(lambda: comm.Alltoallv([np.ones(n), sc], [recv, rc]), MPI.Exception,
                 "Alltoallv whose split sizes do not pair up")
    else:
        try:
            comm.Alltoallv([np.ones(n), sc], [recv, rc])
        except MPI.Exception:
            pass
    recv = np.zeros(n)
    comm.Alltoallv([np.full(n, float(r)), [1] * n], [recv, [1] * n])
    c.eq(recv, np.arange(n, dtype=float), "the Alltoallv after a refused one")


class _Clears(int):
    """A count (an int) whose comparison empties the list it is in (the program's code
    runs while C reads the list)."""

    home: list

    def __eq__(self, other: Any) -> bool:
        self.home.clear()
        return int(self) == other

    __hash__ = int.__hash__


class _Unequal:
    def __eq__(self, other: Any) -> bool:
        raise ValueError("this displacement cannot be compared")

    __hash__ = None  # type: ignore[assignment]


def _hazards(c: Checker, MPI, comm) -> None:
    """What the C spec readers must survive (the same on every rank): a count whose
    comparison empties its list (was a crash), displacements whose comparison raises
    (raised, not a SystemError), an Alltoallw of 0-d arrays (was a ValueError), an
    Allgatherv of empty blocks with displacements (was a ValueError)."""
    r, n = comm.rank, comm.size
    comm.Barrier()                    # (the fast call exists from here on)
    counts: list = [3] * n
    counts[0] = _Clears(3)
    counts[0].home = counts
    out = np.zeros(3 * n)
    try:
        comm.Allgatherv(np.full(3, float(r)), [out, counts])
        c.eq(out, np.repeat(np.arange(n, dtype=np.float64), 3), "Allgatherv, a count that empties its list")
    except (MPI.Exception, ValueError, TypeError) as exc:      # (the regular path then reads the empty list)
        c.true("counts" in str(exc), f"Allgatherv, a count that empties its list: refused ({exc})")
    c.raises(lambda: comm.Allgatherv(np.zeros(3), [np.zeros(3 * n), [3] * n, [_Unequal()] * n]),
             (ValueError, TypeError, MPI.Exception), "Allgatherv, displacements that do not compare")
    empty = np.zeros(0)                   # (was a ValueError: range()'s step of 0)
    comm.Allgatherv(empty, [np.zeros(0), [0] * n, [0] * n, MPI.DOUBLE])
    c.true(True, "Allgatherv of nothing from anybody, displacements given")
    comm.Barrier()
    mine = [1 if j == r else 0 for j in range(n)]
    got = np.zeros(())
    comm.Alltoallw([np.full((), 1.0 + r), mine, [0] * n, [MPI.DOUBLE] * n], [got, mine, [0] * n, [MPI.DOUBLE] * n])
    c.eq(float(got), 1.0 + r, "Alltoallw of 0-d arrays")


def collv_fast_checks(c: Checker, MPI, comm) -> None:
    for salt, dtype in enumerate(DTYPES):
        _forms(c, MPI, comm, dtype, salt)
    _taken(c, MPI, comm)
    _mixed_ways(c, MPI, comm)
    _mismatch(c, MPI, comm)
    _hazards(c, MPI, comm)
    comm.Barrier()


@pytest.mark.timeout(160)
@pytest.mark.parametrize("n", SIZES)
def test_collv_fast(n):
    check(job(n), "collv_fast")


@pytest.mark.timeout(160)
def test_collv_fast_over_tcp():
    check(job(3, "tcp"), "collv_fast")
