"""collcomm.MPI buffer collectives, in the style of mpi4py's test_cco_buf: every root,
every buffer kind and spec form, IN_PLACE, I-forms and persistent forms, v and w variants,
scan/exscan, MAXLOC/MINLOC, user ops (commutative or not), error classes; world sizes 1–5.

Expected values are computed here from MPI's definitions, never by collcomm.
"""
from __future__ import annotations

import numpy as np
import pytest

from tests.mpi_checks import SIZES, Checker, check, job, kinds, specs, values


def blocks_checks(c: Checker, MPI, comm) -> None:
    r, n = comm.rank, comm.size
    k = 3
    for kind in kinds():
        for code in kind.codes:
            for root in range(n):
                # Bcast through every spec form
                for i, _ in enumerate(specs(MPI, kind.make(values(code, k, 0)), code, k)):
                    buf = kind.make(values(code, k, root) if r == root else np.zeros(k, dtype=code))
                    comm.Bcast(specs(MPI, buf, code, k)[i], root=root)
                    c.eq(kind.read(buf), values(code, k, root), f"Bcast {kind}/{code} spec {i} root {root}")
                # Gather: recvbuf as a block spec (explicit count is one rank's block)
                send = kind.make(values(code, k, r))
                recv = kind.make(np.zeros(n * k, dtype=code)) if r == root else None
                comm.Gather(send, [recv, k, MPI.Datatype.fromcode(code) if code != "B" else MPI.BYTE]
                            if r == root else None, root=root)
                if r == root:
                    c.eq(kind.read(recv), np.concatenate([values(code, k, p) for p in range(n)]),
                         f"Gather {kind}/{code} root {root}")
                # Scatter
                send = kind.make(np.concatenate([values(code, k, p) for p in range(n)])) if r == root else None
                recv = kind.make(np.zeros(k, dtype=code))
                comm.Scatter(send, recv, root=root)
                c.eq(kind.read(recv), values(code, k, r), f"Scatter {kind}/{code} root {root}")
            # Allgather and Alltoall (no root)
            recv = kind.make(np.zeros(n * k, dtype=code))
            comm.Allgather(kind.make(values(code, k, r)), recv)
            c.eq(kind.read(recv), np.concatenate([values(code, k, p) for p in range(n)]), f"Allgather {kind}/{code}")
            send = kind.make(np.concatenate([values(code, k, 10 * r + p) for p in range(n)]))
            recv = kind.make(np.zeros(n * k, dtype=code))
            comm.Alltoall(send, recv)
            c.eq(kind.read(recv), np.concatenate([values(code, k, 10 * p + r) for p in range(n)]), f"Alltoall {kind}/{code}")


def in_place_checks(c: Checker, MPI, comm) -> None:
    r, n = comm.rank, comm.size
    for root in range(n):
        full = np.full(2 * n, -1.0)
        full[2 * r:2 * r + 2] = r
        comm.Gather(MPI.IN_PLACE if r == root else np.full(2, float(r)), full if r == root else None, root=root)
        if r == root:
            c.eq(full, np.repeat(np.arange(n, dtype=float), 2), f"Gather IN_PLACE root {root}")
        src = np.repeat(np.arange(n, dtype=float), 2)
        mine = np.full(2, -1.0)
        comm.Scatter(src if r == root else None, MPI.IN_PLACE if r == root else mine, root=root)
        c.eq(mine, np.full(2, -1.0) if r == root else np.full(2, float(r)), f"Scatter IN_PLACE root {root}")
        x = np.full(2, r + 1.0)
        comm.Reduce(MPI.IN_PLACE if r == root else x, x if r == root else None, op=MPI.SUM, root=root)
        c.eq(x, np.full(2, n * (n + 1) / 2) if r == root else np.full(2, r + 1.0), f"Reduce IN_PLACE root {root}")
    x = np.full(n, -1.0)
    x[r] = r
    comm.Allgather(MPI.IN_PLACE, x)
    c.eq(x, np.arange(n, dtype=float), "Allgather IN_PLACE")
    x = np.arange(n, dtype=float) + 10 * r
    comm.Alltoall(MPI.IN_PLACE, x)
    c.eq(x, np.arange(n) * 10.0 + r, "Alltoall IN_PLACE")
    x = np.full(3, r + 1, dtype="i")
    comm.Allreduce(MPI.IN_PLACE, x, op=MPI.MAX)
    c.eq(x, np.full(3, n, dtype="i"), "Allreduce IN_PLACE MAX")
    x = np.arange(2.0 * n) + r
    comm.Reduce_scatter_block(MPI.IN_PLACE, x)
    c.eq(x[:2], n * np.arange(2 * r, 2 * r + 2.0) + n * (n - 1) / 2, "Reduce_scatter_block IN_PLACE")
    x = np.arange(2.0 * n) + r
    comm.Reduce_scatter(MPI.IN_PLACE, x, [2] * n)
    c.eq(x[:2], n * np.arange(2 * r, 2 * r + 2.0) + n * (n - 1) / 2, "Reduce_scatter IN_PLACE")
    x = np.full(2, r + 1.0)
    comm.Scan(MPI.IN_PLACE, x)
    c.eq(x, np.full(2, (r + 1) * (r + 2) / 2), "Scan IN_PLACE")


def reduction_checks(c: Checker, MPI, comm) -> None:
    r, n = comm.rank, comm.size
    # PROD in int32 wraps past n = 12, as C's ints do (the device runs this at n = 16)
    ints = {"SUM": n * (n + 1) // 2, "PROD": int(np.prod(np.arange(1, n + 1), dtype="i")), "MAX": n, "MIN": 1,
            "BAND": int(np.bitwise_and.reduce(np.arange(1, n + 1))), "BOR": int(np.bitwise_or.reduce(np.arange(1, n + 1))),
            "BXOR": int(np.bitwise_xor.reduce(np.arange(1, n + 1))), "LAND": 1, "LOR": 1, "LXOR": n % 2}
    for name, want in ints.items():
        op = getattr(MPI, name)
        for kind in kinds():
            if "i" not in kind.codes:
                continue
            out = kind.make(np.zeros(4, dtype="i"))
            comm.Allreduce(kind.make(np.full(4, r + 1, dtype="i")), out, op=op)
            c.eq(kind.read(out), np.full(4, want, dtype="i"), f"Allreduce {name} {kind}")
        for root in range(n):
            out = np.zeros(4, dtype="i")
            comm.Reduce(np.full(4, r + 1, dtype="i"), out if r == root else None, op=op, root=root)
            if r == root:
                c.eq(out, np.full(4, want), f"Reduce {name} root {root}")
    # Reduce_scatter_block, Reduce_scatter with unequal and gathered counts
    out = np.zeros(2)
    comm.Reduce_scatter_block(np.arange(2.0 * n) * (r + 1), out, op=MPI.SUM)
    c.eq(out, np.arange(2 * r, 2 * r + 2.0) * n * (n + 1) / 2, "Reduce_scatter_block")
    counts = [p % 3 + 1 for p in range(n)]
    out = np.full(counts[r], -1.0)
    comm.Reduce_scatter(np.arange(float(sum(counts))) + r, out, counts, op=MPI.SUM)
    start = sum(counts[:r])
    c.eq(out, n * np.arange(start, start + counts[r], dtype=float) + n * (n - 1) / 2, "Reduce_scatter uneven")
    out = np.full(counts[r], -1.0)
    comm.Reduce_scatter(np.arange(float(sum(counts))) + r, out, None, op=MPI.SUM)
    c.eq(out, n * np.arange(start, start + counts[r], dtype=float) + n * (n - 1) / 2, "Reduce_scatter counts=None")
    # Scan / Exscan
    out = np.zeros(3, dtype="l")
    comm.Scan(np.full(3, r + 1, dtype="l"), out)
    c.eq(out, np.full(3, (r + 1) * (r + 2) // 2), "Scan SUM")
    out = np.full(3, -7, dtype="l")
    comm.Exscan(np.full(3, r + 1, dtype="l"), out, op=MPI.PROD)
    c.eq(out, np.full(3, -7 if r == 0 else int(np.prod(np.arange(1, r + 1)))), "Exscan PROD")
    # value-index pairs
    for dt, vt in ((MPI.FLOAT_INT, "f4"), (MPI.DOUBLE_INT, "f8"), (MPI.TWOINT, "i4"), (MPI.LONG_INT, "i8")):
        pair = np.dtype([("v", vt), ("i", "i4")], align=True)
        mine = np.array([((r * 7) % 3, r), (-(r % 2), r)], dtype=pair)
        out = np.zeros(2, dtype=pair)
        comm.Allreduce([mine, dt], [out, dt], op=MPI.MAXLOC)
        vals = [(p * 7) % 3 for p in range(n)]
        c.eq([tuple(x) for x in out.tolist()][0], (max(vals), vals.index(max(vals))), f"MAXLOC {dt.Get_name()}")
        comm.Allreduce([mine, dt], [out, dt], op=MPI.MINLOC)
        c.eq([tuple(x) for x in out.tolist()][1], (-(1 if n > 1 else 0), 1 if n > 1 else 0), f"MINLOC {dt.Get_name()}")
    # user ops: commutative (any order) and not (rank order: "in" is the lower ranks)
    def times10_plus(inbuf, inoutbuf, datatype):    # decimal concatenation: associative, not commutative
        a = np.frombuffer(inbuf, dtype="d")
        b = np.frombuffer(inoutbuf, dtype="d")
        b[:] = a * 10.0 ** (np.floor(np.log10(b)) + 1) + b

    def addmul(inbuf, inoutbuf, datatype):
        b = np.frombuffer(inoutbuf, dtype="d")
        b[:] = np.frombuffer(inbuf, dtype="d") + b

    ordered = MPI.Op.Create(times10_plus, commute=False)
    comm_op = MPI.Op.Create(addmul, commute=True)
    # one digit a rank (1-9, then 1 again): every partial result is an integer below 2**53
    # up to n = 16 (the device runs this at n = 16), exact in any grouping
    d = r % 9 + 1.0
    digits = float("".join(str(p % 9 + 1) for p in range(n)))
    out = np.zeros(2)
    comm.Allreduce(np.full(2, d), out, op=ordered)
    c.eq(out, np.full(2, digits), "Allreduce non-commutative user op")
    comm.Allreduce(np.full(2, r + 1.0), out, op=comm_op)
    c.eq(out, np.full(2, n * (n + 1) / 2), "Allreduce commutative user op")
    for root in range(n):
        out = np.zeros(2)
        comm.Reduce(np.full(2, d), out if r == root else None, op=ordered, root=root)
        if r == root:
            c.eq(out, np.full(2, digits), f"Reduce non-commutative root {root}")
    out = np.zeros(1)
    comm.Scan(np.array([d]), out, op=ordered)
    c.eq(out, [float("".join(str(p % 9 + 1) for p in range(r + 1)))], "Scan non-commutative")
    out = np.zeros(1)
    comm.Reduce_scatter_block(np.full(n, d), out, op=ordered)
    c.eq(out, [digits], "Reduce_scatter_block non-commutative")
    ordered.Free()
    c.true(ordered == MPI.OP_NULL, "Op.Free makes OP_NULL")


def vector_checks(c: Checker, MPI, comm) -> None:
    r, n = comm.rank, comm.size
    counts = [p % 3 + 1 for p in range(n)]
    displs = [2 * sum(counts[:p]) + 1 for p in range(n)]            # gaps: not packed
    size = 2 * sum(counts) + 2
    want = np.full(size, -1.0)
    for p in range(n):
        want[displs[p]:displs[p] + counts[p]] = p
    packed = np.concatenate([np.full(counts[p], float(p)) for p in range(n)])
    for root in range(n):
        for form in range(3):
            rb = np.full(size, -1.0)
            spec = ([rb, counts, displs, MPI.DOUBLE], [rb, (counts, displs), MPI.DOUBLE], [rb, (counts, displs)])[form]
            comm.Gatherv(np.full(counts[r], float(r)), spec if r == root else None, root=root)
            if r == root:
                c.eq(rb, want, f"Gatherv form {form} root {root}")
        sb = want.copy() if r == root else None
        out = np.full(counts[r], -1.0)
        comm.Scatterv([sb, counts, displs, MPI.DOUBLE] if r == root else None, out, root=root)
        c.eq(out, np.full(counts[r], float(r)), f"Scatterv root {root}")
        rb = np.full(sum(counts), -1.0)
        if r == root:
            rb[sum(counts[:r]):sum(counts[:r]) + counts[r]] = r
        comm.Gatherv(MPI.IN_PLACE if r == root else np.full(counts[r], float(r)), [rb, counts] if r == root else None, root=root)
        if r == root:
            c.eq(rb, packed, f"Gatherv IN_PLACE root {root}")
    rb = np.full(size, -1.0)
    comm.Allgatherv(np.full(counts[r], float(r)), [rb, counts, displs, MPI.DOUBLE])
    c.eq(rb, want, "Allgatherv")
    rb = np.full(2 * n, -1.0)
    comm.Allgatherv(np.full(2, float(r)), [rb, 2])
    c.eq(rb, np.repeat(np.arange(n, dtype=float), 2), "Allgatherv equal counts")
    # Alltoallv: rank r sends (r + j) % 3 + 1 values r*100 + j to rank j
    scounts = [(r + j) % 3 + 1 for j in range(n)]
    rcounts = [(p + r) % 3 + 1 for p in range(n)]
    send = np.concatenate([np.full(scounts[j], 100.0 * r + j) for j in range(n)])
    rdispls = [2 * sum(rcounts[:p]) for p in range(n)]
    rb = np.full(2 * sum(rcounts), -1.0)
    comm.Alltoallv([send, scounts], [rb, (rcounts, rdispls), MPI.DOUBLE])
    want = np.full(2 * sum(rcounts), -1.0)
    for p in range(n):
        want[rdispls[p]:rdispls[p] + rcounts[p]] = 100.0 * p + r
    c.eq(rb, want, "Alltoallv")
    # Alltoallw: byte displacements, one datatype per peer
    sb = np.arange(n, dtype="i") + 10 * r
    rb = np.full(2 * n, -1, dtype="i")
    comm.Alltoallw([sb, ([1] * n, [4 * j for j in range(n)]), [MPI.INT] * n],
                   [rb, [1] * n, [8 * p for p in range(n)], [MPI.INT] * n])
    want = np.full(2 * n, -1, dtype="i")
    want[::2] = np.arange(n) * 10 + r
    c.eq(rb, want, "Alltoallw")


def request_checks(c: Checker, MPI, comm) -> None:
    r, n = comm.rank, comm.size
    a, b = np.full(3, r + 1.0), np.zeros(3)
    reqs = [comm.Iallreduce(a, b), comm.Ibarrier()]
    gathered = np.zeros(n)
    reqs.append(comm.Iallgather(np.array([float(r)]), gathered))
    MPI.Request.Waitall(reqs)
    c.eq(b, np.full(3, n * (n + 1) / 2), "Iallreduce")
    c.eq(gathered, np.arange(n, dtype=float), "Iallgather")
    c.true(all(q == MPI.REQUEST_NULL for q in reqs), "completed requests are REQUEST_NULL")
    x = np.zeros(2)
    q = comm.Ibcast(x if r else np.array([5.0, 6.0]), root=0)
    while not q.Test():
        pass
    c.eq(x if r else [5.0, 6.0], [5.0, 6.0], "Ibcast + Test")
    # persistent collectives: start twice with new data
    buf, out = np.zeros(2), np.zeros(2)
    p = comm.Allreduce_init(buf, out, op=MPI.SUM)
    for it in range(2):
        buf[:] = r + it
        p.Start()
        p.Wait()
        c.eq(out, np.full(2, n * (n - 1) / 2 + n * it), f"Allreduce_init round {it}")
    c.true(p != MPI.REQUEST_NULL, "a completed persistent request stays")
    p.Free()
    out = np.zeros(n)
    q = comm.Ialltoallv([np.arange(n, dtype=float) + 10 * r, [1] * n], [out, [1] * n])
    q.Wait()
    c.eq(out, np.arange(n) * 10.0 + r, "Ialltoallv")


def read_only_checks(c: Checker, MPI, comm) -> None:
    """Send buffers that cannot be written (bytes, frozen arrays) are fine where MPI only reads."""
    r, n = comm.rank, comm.size
    buf = b"abcd" if r == 0 else bytearray(4)
    comm.Bcast(buf, root=0)
    c.eq(bytes(buf), b"abcd", "Bcast of bytes at the root")
    frozen = np.full(2, float(r))
    frozen.flags.writeable = False
    rb = np.zeros(2 * n)
    comm.Gatherv(frozen, [rb, [2] * n] if r == 0 else None)
    if r == 0:
        c.eq(rb, np.repeat(np.arange(n, dtype=float), 2), "Gatherv of a read-only array")
    rb = np.zeros(2 * n)
    comm.Alltoallv([np.repeat(frozen, n), [2] * n], [rb, [2] * n])
    c.eq(rb, np.repeat(np.arange(n, dtype=float), 2), "Alltoallv of a read-only array")
    out = np.zeros(2)
    comm.Allreduce(frozen, out)
    c.eq(out, np.full(2, n * (n - 1) / 2), "Allreduce of a read-only array")


def error_checks(c: Checker, MPI, comm) -> None:
    n = comm.size
    x = np.zeros(2)
    c.raises(lambda: comm.Bcast(x, root=n), MPI.Exception, "Bcast root out of range", MPI.ERR_ROOT)
    c.raises(lambda: comm.Gatherv(x, None, root=-1), MPI.Exception, "Gatherv root -1", MPI.ERR_ROOT)
    c.raises(lambda: comm.Allreduce(np.ones(2), x, op=MPI.BAND), MPI.Exception, "BAND on doubles", MPI.ERR_OP)
    c.raises(lambda: comm.Allreduce(np.ones(2), x, op=MPI.MAXLOC), MPI.Exception, "MAXLOC on DOUBLE", MPI.ERR_OP)
    c.raises(lambda: comm.Allreduce([np.ones(2), MPI.DOUBLE_INT], [np.ones(2), MPI.DOUBLE_INT], op=MPI.SUM),
             MPI.Exception, "SUM on a pair", MPI.ERR_OP)
    c.raises(lambda: comm.Allreduce(np.ones(3), x), ValueError, "Allreduce size mismatch")
    c.raises(lambda: comm.Allreduce(np.ones(2), b"0123456789abcdef"), BufferError, "read-only recvbuf")
    c.raises(lambda: comm.Allreduce(np.ones(4)[::2], x), BufferError, "non-contiguous sendbuf")
    c.raises(lambda: comm.Allreduce(MPI.BOTTOM, x), NotImplementedError, "MPI.BOTTOM")
    c.raises(lambda: comm.Bcast([x, -1, MPI.DOUBLE]), ValueError, "negative count")
    c.raises(lambda: comm.Bcast([x, 3, MPI.DOUBLE]), ValueError, "count past the buffer")
    c.raises(lambda: comm.Bcast(np.zeros(2, dtype=object)), KeyError, "object dtype without a datatype")
    c.raises(lambda: comm.Allreduce(np.ones(2), x, op=lambda a, b: a), TypeError, "a function as Allreduce's op")
    comm.Barrier()


def cco_buf(c: Checker, MPI, comm) -> None:
    for section in (blocks_checks, in_place_checks, reduction_checks, vector_checks, request_checks,
                    read_only_checks, error_checks):
        section(c, MPI, comm)
    c.true(c.count > 200, f"only {c.count} checks ran")


@pytest.mark.timeout(160)
@pytest.mark.parametrize("n", SIZES)
def test_cco_buf(n):
    check(job(n), "cco_buf")


@pytest.mark.timeout(160)
def test_cco_buf_tcp():
    check(job(3, "tcp"), "cco_buf")
