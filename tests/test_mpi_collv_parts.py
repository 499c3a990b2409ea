"""collcomm.MPI's nonblocking and persistent all-to-all family through the fast call: the
``I…`` and ``…_init`` forms of ``Gatherv``, ``Scatterv``, ``Allgatherv``, ``Alltoallv``,
``Alltoallw`` and ``Alltoall`` started in two parts (``all_to_all_async`` /
``all_to_all_v_async``, native/_fastcall_a2a_parts.c), blocking ``Alltoallw`` and
``Reduce_scatter`` with equal counts (MPI/_collv_fast.py, MPI/_coll.py); a section of the
shared MPI job (tests/mpi_checks.py) at 1-5 ranks and over TCP (no fast call there: the
same checks on the regular path).

- every form, blocking, ``I…`` + ``Wait`` and ``…_init`` + ``Start``/``Wait`` twice,
  against values computed from the whole job, per-rank counts with zeros among them;
- one fast call each where the group has one (its ``calls`` counter);
- a started call does not wait for the others: rank 0 starts one, then receives what the
  last rank sends only after starting its own (a start that waited would hang: timeout);
- one rank's send too large to go eager (the others start in two parts and finish with it
  in the staged rounds) and one over the fast call's limit (the regular, queued path);
- split sizes that do not pair up, started in two parts: raised by ``Wait`` on every rank
  in shared memory, the next call fine;
- ``Alltoallw`` with a gapped datatype on some ranks (the regular path) beside fast ones;
- the program's lists of counts reused between an ``I…`` call and its ``Wait``, and changed after
  ``Alltoallv_init`` (bound there, as mpi4py binds them).
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest

from tests.mpi_checks import SIZES, Checker, check, job
from tests.test_mpi_collv_fast import _Fast


def _run(comm, name: str, way: str, *args: Any) -> None:
    """``name`` (a blocking method's) called the way ``way`` says."""
    if way == "blocking":
        getattr(comm, name)(*args)
    elif way == "i":
        getattr(comm, "I" + name.lower())(*args).Wait()
    else:
        req = getattr(comm, name + "_init")(*args)
        for _ in range(2):
            req.Start()
            req.Wait()
        req.Free()


def _count(src: int, dst: int, salt: int) -> int:
    return (src * 3 + dst * 5 + salt) % 4


def _block(src: int, dst: int, salt: int, dtype: str) -> np.ndarray:
    return (np.arange(_count(src, dst, salt)) + 10 * src + 100 * dst + salt).astype(dtype)


def _forms(c: Checker, MPI, comm, way: str, dtype: str, salt: int) -> None:
    r, n = comm.rank, comm.size
    tag = f"{way} {dtype} salt {salt}"
    send = np.concatenate([_block(r, j, salt, dtype) for j in range(n)])
    want = np.concatenate([_block(j, r, salt, dtype) for j in range(n)])
    sc, rc = [_count(r, j, salt) for j in range(n)], [_count(j, r, salt) for j in range(n)]
    recv = np.zeros(want.size, dtype=dtype)
    _run(comm, "Alltoallv", way, [send, sc], [recv, (rc, [sum(rc[:j]) for j in range(n)])])
    c.eq(recv, want, f"Alltoallv {tag}")
    # Alltoallw: the same blocks in bytes, one datatype a peer
    dt = MPI.DOUBLE if dtype == "float64" else MPI.INT32_T
    isz = send.itemsize
    recv = np.zeros(want.size, dtype=dtype)
    _run(comm, "Alltoallw", way, [send, sc, [isz * sum(sc[:j]) for j in range(n)], [dt] * n],
         [recv, (rc, [isz * sum(rc[:j]) for j in range(n)]), [dt] * n])
    c.eq(recv, want, f"Alltoallw {tag}")
    # Alltoall: two elements a peer
    two = (np.arange(2 * n) + 10 * r).astype(dtype)
    recv = np.zeros(2 * n, dtype=dtype)
    _run(comm, "Alltoall", way, two, recv)
    c.eq(recv, np.array([10 * j + 2 * r + k for j in range(n) for k in range(2)]).astype(dtype), f"Alltoall {tag}")
    for root in range(n):
        mine = _block(r, root, salt, dtype)
        counts = [_count(j, root, salt) for j in range(n)]
        whole = np.concatenate([_block(j, root, salt, dtype) for j in range(n)])
        out = np.zeros(whole.size, dtype=dtype)
        _run(comm, "Gatherv", way, mine, [out, counts] if r == root else None, root)
        if r == root:
            c.eq(out, whole, f"Gatherv {tag} root {root}")
        got = np.zeros(mine.size, dtype=dtype)
        _run(comm, "Scatterv", way, [whole, counts] if r == root else None, got, root)
        c.eq(got, mine, f"Scatterv {tag} root {root}")
    counts = [_count(j, 0, salt) for j in range(n)]
    out = np.zeros(sum(counts), dtype=dtype)
    _run(comm, "Allgatherv", way, _block(r, 0, salt, dtype), [out, counts])
    c.eq(out, np.concatenate([_block(j, 0, salt, dtype) for j in range(n)]), f"Allgatherv {tag}")
    # Reduce_scatter with equal counts (recvbuf longer than its block: the rest untouched)
    k = 1 + salt % 3
    src = (np.arange(n * k) * (r + 1)).astype(dtype)
    dst = np.full(k + 1, -1).astype(dtype)
    _run(comm, "Reduce_scatter", way, src, dst, [k] * n, MPI.SUM)
    total = sum(j + 1 for j in range(n))
    c.eq(dst, np.append(np.arange(r * k, (r + 1) * k) * total, -1).astype(dtype), f"Reduce_scatter {tag}")


def _taken(c: Checker, MPI, comm) -> None:
    r, n = comm.rank, comm.size
    ones, out = np.ones(n), np.zeros(n)
    calls: list[tuple[str, Callable[[], Any]]] = [
        ("Ialltoall", lambda: comm.Ialltoall(ones, out).Wait()),
        ("Ialltoallv", lambda: comm.Ialltoallv([ones, [1] * n], [out, [1] * n]).Wait()),
        ("Igatherv", lambda: comm.Igatherv(ones[:1], [out, [1] * n] if r == 0 else None, 0).Wait()),
        ("Iscatterv", lambda: comm.Iscatterv([ones, [1] * n] if r == 0 else None, out[:1], 0).Wait()),
        ("Iallgatherv", lambda: comm.Iallgatherv(ones[:1], [out, [1] * n]).Wait()),
        ("Alltoallw", lambda: comm.Alltoallw([ones, [1] * n, [8 * j for j in range(n)], [MPI.DOUBLE] * n],
                                             [out, [1] * n, [8 * j for j in range(n)], [MPI.DOUBLE] * n])),
        ("Reduce_scatter", lambda: comm.Reduce_scatter(ones, out[:1], [1] * n, MPI.SUM)),
        ("Ireduce_scatter", lambda: comm.Ireduce_scatter(ones, out[:1], [1] * n, MPI.SUM).Wait()),
    ]
    for name, call in calls:
        call()
        f = _Fast(comm)
        call()
        took = f.took()
        if took is not None:
            c.eq(took, 1, f"{name} of numpy arrays is one fast call")


def _no_wait_at_start(c: Checker, MPI, comm) -> None:
    """Rank 0 starts, then receives from the last rank, which sends only once it started
    its own: the start must not wait for the others."""
    r, n = comm.rank, comm.size
    if n == 1:
        return
    last, flag = n - 1, np.zeros(1)
    for name, start in (("Ialltoallv", lambda: comm.Ialltoallv([np.full(n, float(r)), [1] * n],
                                                                [recv, [1] * n])),
                        ("Ialltoall", lambda: comm.Ialltoall(np.full(n, float(r)), recv))):
        recv = np.zeros(n)
        if r == last:
            comm.Recv(flag, source=0, tag=7)       # (rank 0 started before this)
        req = start()
        if r == 0:
            comm.Send(flag, dest=last, tag=7)
        req.Wait()
        c.eq(recv, np.arange(n, dtype=float), f"{name} started before a peer's")


def _uneven(c: Checker, MPI, comm) -> None:
    """Rank 0 sends more than goes eager (128 KiB), then more than the fast call's limit
    (8 MiB: the regular path); the others start in two parts."""
    r, n = comm.rank, comm.size
    for per in (16 << 10, 1 << 20):                         # elements of float64 a peer
        sc = [per if r == 0 else 1] * n
        rc = [per if j == 0 else 1 for j in range(n)]
        send = np.concatenate([np.full(sc[j], 1000.0 * r + j) for j in range(n)])
        recv = np.zeros(sum(rc))
        comm.Ialltoallv([send, sc], [recv, rc]).Wait()
        want = np.concatenate([np.full(rc[j], 1000.0 * j + r) for j in range(n)])
        c.eq(recv, want, f"Ialltoallv with rank 0 sending {per * 8} B a peer")


def _mismatch(c: Checker, MPI, comm) -> None:
    r, n = comm.rank, comm.size
    if n == 1:
        return
    rc = [2 if (r == 0 and j == 1) else 1 for j in range(n)]
    recv = np.zeros(sum(rc))
    req = None
    try:
        req = comm.Ialltoallv([np.ones(n), [1] * n], [recv, rc])
        req.Wait()
        raised = False
    except MPI.Exception:
        raised = True
    if r == 0 or comm._h.g.link == "shm":     # (over TCP only rank 0 can tell)
        c.true(raised, "Ialltoallv whose split sizes do not pair up raised")
    recv = np.zeros(n)
    comm.Ialltoallv([np.full(n, float(r)), [1] * n], [recv, [1] * n]).Wait()
    c.eq(recv, np.arange(n, dtype=float), "the Ialltoallv after a refused one")


def _alltoallw_mixed(c: Checker, MPI, comm) -> None:
    """Odd ranks receive through a gapped vector type (regular path), even ones through
    DOUBLE (fast): the same results."""
    r, n = comm.rank, comm.size
    send = np.arange(n, dtype=np.float64) + 10 * r
    vec = MPI.DOUBLE.Create_vector(1, 1, 2).Create_resized(0, 16).Commit()
    for way in ("blocking", "i"):
        wide = np.zeros(2 * n)
        if r % 2:
            _run(comm, "Alltoallw", way, [send, [1] * n, [8 * j for j in range(n)], [MPI.DOUBLE] * n],
                 [wide, [1] * n, [16 * j for j in range(n)], [vec] * n])
            got = wide[::2]
        else:
            _run(comm, "Alltoallw", way, [send, [1] * n, [8 * j for j in range(n)], [MPI.DOUBLE] * n],
                 [wide, [1] * n, [8 * j for j in range(n)], [MPI.DOUBLE] * n])
            got = wide[:n]
        c.eq(got, np.arange(n, dtype=float) * 10 + r, f"Alltoallw {way} (rank {r}'s way)")
    vec.Free()


def _counts_reused(c: Checker, MPI, comm) -> None:
    """The program reuses its lists of counts between an I-call and its Wait: the call
    keeps the counts it was given (was: the second part read the changed lists and copied
    past the receive buffer)."""
    r, n = comm.rank, comm.size
    send = np.arange(4 * n, dtype=np.int64) + 100 * r
    whole = np.full(n + 8, -1, dtype=np.int64)
    recv = whole[:n]
    sc, rc = [1] * n, [1] * n
    req = comm.Ialltoallv([send, sc], [recv, rc])
    sc[:] = [4] * n
    rc[:] = [4] * n
    req.Wait()
    c.eq(recv, np.array([100 * j + r for j in range(n)]), "Ialltoallv with its counts reused before Wait")
    c.eq(whole[n:], np.full(8, -1), "Ialltoallv: nothing written past the receive buffer")
    counts = [1] * n
    out = np.full(n + 4, -1, dtype=np.int64)
    req = comm.Igatherv(np.full(1, r, dtype=np.int64), [out, counts] if r == 0 else None, 0)
    counts[:] = [3] * n
    req.Wait()
    if r == 0:
        c.eq(out, np.concatenate([np.arange(n), np.full(4, -1)]), "Igatherv with its counts reused")


def _init_bound(c: Checker, MPI, comm) -> None:
    """A persistent Alltoallv's counts and displacements are bound at ``Alltoallv_init``
    (mpi4py copies them there): the program's lists changed afterwards change nothing, on
    the fast call's prepared start (its counts worked out at ``…_init``) and on the regular
    path (TCP) alike; counts in a numpy array (the spec read at each start by the fast
    call's ``alltoallv`` entry) work too."""
    r, n = comm.rank, comm.size
    send = np.arange(4 * n, dtype=np.int64) + 100 * r
    whole = np.full(n + 8, -1, dtype=np.int64)
    sc, sd, rc = [1] * n, list(range(n)), [1] * n
    req = comm.Alltoallv_init([send, sc, sd, MPI.INT64_T], [whole[:n], rc, MPI.INT64_T])
    sc[:], sd[:], rc[:] = [4] * n, [4 * j for j in range(n)], [4] * n
    for it in range(2):
        req.Start()
        req.Wait()
        c.eq(whole[:n], np.array([100 * j + r for j in range(n)]), f"Alltoallv_init round {it}, its lists changed")
        c.eq(whole[n:], np.full(8, -1), "Alltoallv_init: nothing written past the receive buffer")
    req.Free()
    out = np.zeros(2 * n, dtype=np.int64)
    counts = np.full(n, 2, dtype=np.int32)
    req = comm.Alltoallv_init([np.repeat(send[:n], 2), counts], [out, counts])
    req.Start()
    req.Wait()
    c.eq(out, np.repeat(np.array([100 * j + r for j in range(n)]), 2), "Alltoallv_init with counts in an array")
    req.Free()


def _init_prepared(c: Checker, MPI, comm) -> None:
    """``Gatherv_init``, ``Scatterv_init``, ``Allgatherv_init`` and ``Alltoallv_init`` work
    their call out at their first start where the group has the fast call
    (MPI/_coll_persistent.py _Prepared, native/_fastcall_vroot.c vr_aop): uneven counts (zeros among them), the last rank the
    root, the send's contents changed between starts; the call each start makes is the
    worked-out one (``all_to_all_v_async``; equal blocks of Allgatherv ``all_gather_async``)."""
    r, n = comm.rank, comm.size
    root = n - 1
    counts = [j % 3 for j in range(n)]
    displs = [sum(counts[:j]) for j in range(n)]
    mine = np.zeros(counts[r])
    gathered, spread = np.full(sum(counts) + 2, -1.0), np.arange(sum(counts), dtype=np.float64)
    got = np.zeros(counts[r])
    block, every = np.zeros(1), np.zeros(n)
    swap, swapped = np.zeros(n), np.zeros(n)
    reqs = {"Gatherv_init": comm.Gatherv_init(mine, [gathered, counts, displs, MPI.DOUBLE], root),
            "Scatterv_init": comm.Scatterv_init([spread, counts, displs, MPI.DOUBLE], got, root),
            "Allgatherv_init": comm.Allgatherv_init(block, [every, [1] * n, None, MPI.DOUBLE]),
            "Alltoallv_init": comm.Alltoallv_init([swap, [1] * n], [swapped, [1] * n])}
    for it in range(3):
        mine[:] = 100 * it + r
        spread[:] = np.arange(sum(counts)) + 1000 * it
        block[:] = 10 * it + r
        swap[:] = np.arange(n) + 100 * r + 1000 * it
        for req in reqs.values():
            req.Start()
            req.Wait()
        if r == root:
            want = np.concatenate([np.full(counts[j], 100.0 * it + j) for j in range(n)] + [np.full(2, -1.0)])
            c.eq(gathered, want, f"Gatherv_init start {it}")
        c.eq(got, spread[displs[r]:displs[r] + counts[r]] if r == root else
             np.arange(displs[r], displs[r] + counts[r], dtype=np.float64) + 1000 * it, f"Scatterv_init start {it}")
        c.eq(every, np.arange(n, dtype=np.float64) + 10 * it, f"Allgatherv_init start {it}")
        c.eq(swapped, r + 100.0 * np.arange(n) + 1000 * it, f"Alltoallv_init start {it}")
    if comm._h.g.fast is not None:        # (the native core on one host: the requests' groups have theirs)
        entries = {name: req._persist.start.entry for name, req in reqs.items()}
        c.eq(entries, {"Gatherv_init": "all_to_all_v_async", "Scatterv_init": "all_to_all_v_async",
                       "Allgatherv_init": "all_gather_async", "Alltoallv_init": "all_to_all_v_async"},
             "the persistent v calls' worked-out entries")
    for req in reqs.values():
        req.Free()


def collv_parts_checks(c: Checker, MPI, comm) -> None:
    _counts_reused(c, MPI, comm)
    _init_bound(c, MPI, comm)
    _init_prepared(c, MPI, comm)
    for way in ("blocking", "i", "init"):
        for salt, dtype in enumerate(("float64", "int32")):
            _forms(c, MPI, comm, way, dtype, salt)
    _taken(c, MPI, comm)
    _no_wait_at_start(c, MPI, comm)
    _uneven(c, MPI, comm)
    _mismatch(c, MPI, comm)
    _alltoallw_mixed(c, MPI, comm)
    comm.Barrier()


@pytest.mark.timeout(160)
@pytest.mark.parametrize("n", SIZES)
def test_collv_parts(n):
    check(job(n), "collv_parts")


@pytest.mark.timeout(160)
def test_collv_parts_over_tcp():
    check(job(3, "tcp"), "collv_parts")
