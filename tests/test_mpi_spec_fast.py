"""collcomm.MPI's buffer specs on the fast calls: ``[x, MPI.DOUBLE]``, ``[x, count, dt]``,
``[x, (count, displ), dt]``, ``[x, count, displ, dt]``, a datatype read over another
dtype's bytes, ``bytearray`` and ``array.array`` buffers (native/_mpi_plain.c gives the
array a spec stands for as it is; ``_msg.as_array`` a view of the message's elements for
the other forms), a section of the shared MPI job (tests/mpi_checks.py) at 1-5 ranks and
over TCP (there, and at one rank, the general path: the same checks, the results must
not differ).

- a reduction's datatype keeps its meaning: a user op is given the spec's datatype, a
  value-index pair reduces by MAXLOC and is refused by SUM, a derived contiguous type;
- every result of the spec forms equals the plain arrays' (the collectives with equal
  blocks, their ``I…`` and persistent forms, point to point, ``Sendrecv``), elements
  outside a spec's count or before its displacement untouched, statuses' counts;
- where the group has the fast call (and no more ranks than CPUs): the spec forms of
  ``Allreduce``, ``Bcast``, ``Gather`` and ``Send``/``Recv`` take it (its call and send
  counters move as for arrays);
- bad specs still raise the general path's errors (a count past the buffer, a read-only
  receive buffer, a bare ``None``); ``[None, datatype]`` is an empty message (mpi4py's).
"""
from __future__ import annotations

import array
import os
from typing import Any

import numpy as np
import pytest

from tests.mpi_checks import SIZES, Checker, check, job


def _collectives(c: Checker, MPI: Any, comm: Any) -> None:
    r, n = comm.rank, comm.size
    D, I32 = MPI.DOUBLE, MPI.INT
    x, y = np.full(3, r + 1.0), np.full(3, -1.0)
    total = n * (n + 1) / 2
    comm.Allreduce([x, D], [y, D])
    c.eq(y.tolist(), [total] * 3, "Allreduce([x, DOUBLE], [y, DOUBLE])")
    y[:] = -1
    comm.Allreduce([x, 3, D], [y, 3, D], op=MPI.MAX)
    c.eq(y.tolist(), [float(n)] * 3, "Allreduce with the whole count, MAX")
    y[:] = -1
    comm.Allreduce([x, 2, D], [y, 2, D])
    c.eq(y.tolist(), [total, total, -1.0], "Allreduce of 2 of 3: the third untouched")
    y[:] = -1
    comm.Allreduce([x, (2, 1), D], [y, (2, 1), D])
    c.eq(y.tolist(), [-1.0, total, total], "Allreduce of (count, displ) = (2, 1)")
    y[:] = -1
    comm.Allreduce([x, 1, 2, D], [y, 1, 2, D])
    c.eq(y.tolist(), [-1.0, -1.0, total], "Allreduce of [buf, count, displ, datatype]")
    bits = np.arange(2, dtype=np.float64) + r
    got = np.zeros(2)
    comm.Allreduce([bits, MPI.INT64_T], [got, MPI.INT64_T])
    want = sum((np.arange(2, dtype=np.float64) + k).view(np.int64) for k in range(n)).view(np.float64)
    c.eq(got.tobytes(), want.tobytes(), "Allreduce of doubles' bytes read as INT64_T")
    inplace = np.full(2, r + 1, dtype=np.int32)
    comm.Allreduce(MPI.IN_PLACE, [inplace, I32])
    c.eq(inplace.tolist(), [int(total)] * 2, "Allreduce(IN_PLACE, [buf, INT])")
    q = comm.Iallreduce([x, D], [y, D])
    q.Wait()
    c.eq(y.tolist(), [total] * 3, "Iallreduce of specs")
    b = np.arange(4, dtype=np.int32) if r == 0 else np.zeros(4, dtype=np.int32)
    comm.Bcast([b, I32], root=0)
    c.eq(b.tolist(), [0, 1, 2, 3], "Bcast([b, INT])")
    raw = bytearray(b"abcd") if r == n - 1 else bytearray(4)
    comm.Bcast(raw, root=n - 1)
    c.eq(bytes(raw), b"abcd", "Bcast of a bytearray")
    ints = array.array("i", [7, 8]) if r == 0 else array.array("i", [0, 0])
    comm.Bcast([ints, I32], 0)
    c.eq(ints.tolist(), [7, 8], "Bcast of an array.array spec")
    q = comm.Ibcast([b, 2, I32], 0)
    q.Wait()
    c.eq(b.tolist(), [0, 1, 2, 3], "Ibcast of [b, 2, INT]")
    send = np.full(2, r, dtype=np.int32)
    recv = np.full(2 * n, -1, dtype=np.int32)
    comm.Gather([send, I32], [recv, I32] if r == 0 else None, root=0)
    if r == 0:
        c.eq(recv.tolist(), [k for k in range(n) for _ in range(2)], "Gather of specs")
    recv[:] = -1
    comm.Gather([send, 1, I32], [recv, 1, I32] if r == 0 else None, root=0)
    if r == 0:
        c.eq(recv.tolist(), list(range(n)) + [-1] * n, "Gather of one element each: the rest untouched")
    whole = np.arange(2 * n, dtype=np.float64)
    part = np.zeros(2)
    comm.Scatter([whole, D] if r == 0 else None, [part, D], root=0)
    c.eq(part.tolist(), [2.0 * r, 2.0 * r + 1], "Scatter of specs")
    every = np.zeros(2 * n, dtype=np.int32)
    comm.Allgather([send, I32], [every, I32])
    c.eq(every.tolist(), [k for k in range(n) for _ in range(2)], "Allgather of specs")
    out = np.arange(n, dtype=np.int32) + 10 * r
    into = np.zeros(n, dtype=np.int32)
    comm.Alltoall([out, I32], [into, I32])
    c.eq(into.tolist(), [10 * k + r for k in range(n)], "Alltoall of specs")
    red = np.zeros(2)
    comm.Reduce([np.full(2, 1.0), D], [red, D] if r == 0 else None, op=MPI.SUM, root=0)
    if r == 0:
        c.eq(red.tolist(), [float(n)] * 2, "Reduce of specs")
    blocks = np.full(n, r + 1.0)
    mine = np.zeros(1)
    comm.Reduce_scatter_block([blocks, D], [mine, D])
    c.eq(mine[0], total, "Reduce_scatter_block of specs")
    seen: list[Any] = []

    def add(a: Any, b: Any, datatype: Any) -> None:
        seen.append(datatype)
        np.frombuffer(b, dtype=np.int64)[:] += np.frombuffer(a, dtype=np.int64)

    user = MPI.Op.Create(add, commute=True)
    ints = np.full(2, r + 1.0)
    into = np.zeros(2)
    comm.Allreduce([ints, MPI.INT64_T], [into, MPI.INT64_T], op=user)
    user.Free()
    want = sum(np.full(2, k + 1.0).view(np.int64) for k in range(n)).view(np.float64)
    c.eq(into.tobytes(), want.tobytes(), "a user op on doubles read as INT64_T")
    c.true(all(d == MPI.INT64_T for d in seen), "... given the spec's datatype")
    pair = np.zeros(1, dtype=np.dtype([("v", np.float64), ("i", np.int32)], align=True))
    pair["v"], pair["i"] = float(r % 2), r
    best = np.zeros_like(pair)
    comm.Allreduce([pair, MPI.DOUBLE_INT], [best, MPI.DOUBLE_INT], op=MPI.MAXLOC)
    c.eq((float(best["v"][0]), int(best["i"][0])), (1.0 if n > 1 else 0.0, 1 if n > 1 else 0),
         "MAXLOC of a DOUBLE_INT spec")
    c.raises(lambda: comm.Allreduce([pair, MPI.DOUBLE_INT], [best, MPI.DOUBLE_INT], op=MPI.SUM), MPI.Exception,
             "SUM of a pair type: refused as before", MPI.ERR_OP)
    two = MPI.DOUBLE.Create_contiguous(2).Commit()
    y[:] = -1
    comm.Allreduce([x, 1, two], [y, 1, two])
    two.Free()
    c.eq(y.tolist(), [total] * 2 + [-1.0], "Allreduce of one contiguous pair of doubles")
    one_bf16 = np.full(4, 0x3F80, dtype=np.uint16)                 # (1.0 as bfloat16 bits)
    want_bf16 = int(np.float32(n).view(np.uint32) >> 16)
    for spec_dt in (MPI.BFLOAT16_T, "bf16", MPI.BFLOAT16_T):       # (the third: after the first built it all)
        got_bf16 = np.zeros(4, dtype=np.uint16)
        comm.Allreduce([one_bf16, spec_dt], [got_bf16, spec_dt])
        c.eq(got_bf16.tolist(), [want_bf16] * 4, f"Allreduce of bfloat16 bits ({spec_dt!r}): bfloat16 sums")
    if n > 1:
        blocks_in = np.ones(2 * n)
        c.raises(lambda: comm.Reduce_scatter_block(MPI.IN_PLACE, [blocks_in, 2 * n, D]), ValueError,
                 "Reduce_scatter_block(IN_PLACE, [buf, count, dt]): the count is a rank's (n blocks)")
    p = comm.Allreduce_init([x, D], [y, D])
    ok = True
    for k in range(5):
        x[:] = k + r
        p.Start()
        p.Wait()
        ok = ok and y.tolist() == [n * k + n * (n - 1) / 2] * 3
    p.Free()
    c.true(ok, "Allreduce_init of specs, 5 rounds")


def _point_to_point(c: Checker, MPI: Any, comm: Any) -> None:
    r, n = comm.rank, comm.size
    nxt, prv = (r + 1) % n, (r - 1) % n
    D = MPI.DOUBLE
    out, into = np.full(2, r + 0.5), np.zeros(2)
    st = MPI.Status()
    if n == 1:
        comm.Sendrecv([out, D], 0, 3, [into, D], 0, 3, st)
    else:
        q = comm.Irecv([into, D], prv, 3)
        comm.Send([out, D], nxt, 3)
        q.Wait(st)
    c.eq((into.tolist(), st.Get_count(D)), ([prv + 0.5] * 2, 2), "Send/Irecv of [x, DOUBLE]: data, count")
    big = np.zeros(64, dtype=np.uint8)
    big[:8] = np.arange(8) + r
    got = np.full(64, 255, dtype=np.uint8)
    comm.Sendrecv([big, 8, MPI.BYTE], nxt, 4, [got, 8, MPI.BYTE], prv, 4, st)
    c.eq((got[:9].tolist(), st.Get_count(MPI.BYTE)), (list(np.arange(8) + prv) + [255], 8),
         "Sendrecv of [buf, 8, BYTE] in larger buffers")
    words = np.zeros(4, dtype=np.int32)
    q = comm.Isend([np.array([r, r], dtype=np.int32), MPI.INT], nxt, 5)
    comm.Recv([words, (2, 1), MPI.INT], prv, 5, st)
    q.Wait()
    c.eq((words.tolist(), st.Get_count(MPI.INT)), ([0, prv, prv, 0], 2), "Recv into [buf, (2, 1), INT]")
    raw = bytearray(3)
    comm.Sendrecv(bytearray(b"xyz"), nxt, 6, raw, prv, 6)
    c.eq(bytes(raw), b"xyz", "Sendrecv of bytearrays")
    s_init = comm.Send_init([out, D], nxt, 7)
    r_init = comm.Recv_init([into, D], prv, 7)
    ok = True
    for k in range(5):
        out[:] = 10.0 * k + r
        MPI.Prequest.Startall([r_init, s_init])
        MPI.Request.Waitall([r_init, s_init])
        ok = ok and into.tolist() == [10.0 * k + prv] * 2
    s_init.Free()
    r_init.Free()
    c.true(ok, "Send_init/Recv_init of specs, 5 rounds")


def _on_the_fast_calls(c: Checker, MPI: Any, comm: Any) -> None:
    """Where the group has the fast call: the spec forms take it as the arrays do."""
    from collcomm import native
    r, n = comm.rank, comm.size
    g = comm._h.g
    if native.core is None or not 1 < n <= (os.cpu_count() or 1) or g.fast is None:
        return
    x, y = np.ones(2), np.zeros(2)
    comm.Allreduce(x, y)
    before = g.fast.calls
    comm.Allreduce([x, MPI.DOUBLE], [y, MPI.DOUBLE])
    comm.Bcast([y, 1, MPI.DOUBLE], root=0)                # (a view of the first element)
    comm.Gather([x, MPI.DOUBLE], [np.zeros(2 * n), MPI.DOUBLE] if r == 0 else None, 0)
    raw, out = bytearray(16), MPI.Alloc_mem(16)
    comm.Allreduce([raw, MPI.DOUBLE], [out, 2, MPI.DOUBLE])           # (numpy views of the memory)
    comm.Bcast(array.array("i", [1, 2]), 0)
    c.eq(g.fast.calls - before, 5, "Allreduce, Bcast, Gather of specs, of a bytearray, an array.array: fast calls")
    f = g._p2p_native
    if f is None:
        return
    nxt, prv = (r + 1) % n, (r - 1) % n
    sends, recvs = f.sends, f.recvs
    comm.Send([x, 1, MPI.DOUBLE], nxt, 8)                 # (views of one element)
    comm.Recv([y, (1, 1), MPI.DOUBLE], prv, 8)
    c.eq((f.sends - sends, f.recvs - recvs), (1, 1), "Send/Recv of specs: in C")


def _errors(c: Checker, MPI: Any, comm: Any) -> None:
    r, n = comm.rank, comm.size
    x = np.ones(2)
    c.raises(lambda: comm.Allreduce([x, 3, MPI.DOUBLE], [np.zeros(3), MPI.DOUBLE]), ValueError,
             "a count past the buffer")
    ro = np.zeros(2)
    ro.flags.writeable = False
    c.raises(lambda: comm.Allreduce([x, MPI.DOUBLE], [ro, MPI.DOUBLE]), BufferError, "a read-only receive buffer")
    c.raises(lambda: comm.Bcast(None, 0), TypeError, "a bare None buffer")
    c.raises(lambda: comm.Bcast([None, 2, MPI.DOUBLE], 0), ValueError, "a None buffer of 2 elements")
    comm.Bcast([None, MPI.DOUBLE], 0)           # (mpi4py: no buffer, an empty message)
    nxt, prv = (r + 1) % n, (r - 1) % n
    st = MPI.Status()
    q = comm.Irecv([None, MPI.INT], prv, 9)
    comm.Send([None, 0, MPI.INT], nxt, 9)
    q.Wait(st)
    c.eq((st.Get_source(), st.Get_tag(), st.Get_count(MPI.INT)), (prv, 9, 0), "Send/Irecv of [None, INT]")
    comm.Sendrecv([None, "B"], nxt, 10, [None, "B"], prv, 10, st)
    c.eq(st.Get_count(MPI.BYTE), 0, "Sendrecv of [None, 'B']")
    for call in (comm.Sendrecv, comm.Isendrecv):       # (a wrong send leaves no receive posted)
        c.raises(lambda: call([bytearray(5), -1, "i"], nxt, 11, bytearray(3), prv, 11), ValueError,
                 f"{call.__name__} of a send spec with a negative count")
    got = bytearray(3)
    comm.Sendrecv(bytearray(b"abc"), nxt, 11, got, prv, 11)
    c.eq(bytes(got), b"abc", "... the next Sendrecv of that tag gets its own message")
    after = np.zeros(2)
    comm.Allreduce([x, MPI.DOUBLE], [after, MPI.DOUBLE])
    c.eq(after.tolist(), [float(n)] * 2, "the ranks in step after the errors")


def spec_fast_checks(c: Checker, MPI: Any, comm: Any) -> None:
    _collectives(c, MPI, comm)
    _point_to_point(c, MPI, comm)
    _on_the_fast_calls(c, MPI, comm)
    _errors(c, MPI, comm)
    comm.Barrier()


@pytest.mark.timeout(160)
@pytest.mark.parametrize("n", SIZES)
def test_spec_fast(n):
    check(job(n), "spec_fast")


@pytest.mark.timeout(160)
def test_spec_fast_over_tcp():
    check(job(3, "tcp"), "spec_fast")
