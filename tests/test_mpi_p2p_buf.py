"""collcomm.MPI point to point with buffers, in the style of mpi4py's test_p2p_buf: every
buffer kind and spec form, statuses (source, tag, Get_count), ANY_SOURCE/ANY_TAG, Ssend
(really synchronous), Sendrecv(_replace), Isendrecv, Probe/Iprobe/Mprobe/Improbe,
PROC_NULL, persistent requests, Cancel, truncation and bad ranks/tags; sizes 1–5 on a ring
(a rank of one talks to itself).
"""
from __future__ import annotations

import numpy as np
import pytest

from tests.mpi_checks import SIZES, Checker, check, job, kinds, specs, values


def p2p_buf(c: Checker, MPI, comm) -> None:
    r, n = comm.rank, comm.size
    nxt, prv = (r + 1) % n, (r - 1) % n
    st = MPI.Status()
    # every kind and spec form, one tag each
    for kind in kinds():
        for code in kind.codes:
            for i in range(6):
                tag = 100 + i
                out = kind.make(np.zeros(4, dtype=code))
                req = comm.Isend(specs(MPI, kind.make(values(code, 4, r)), code, 4)[i], nxt, tag)
                comm.Recv(specs(MPI, out, code, 4)[i], prv, tag, st)
                req.Wait()
                c.eq(kind.read(out), values(code, 4, prv), f"Send/Recv {kind}/{code} spec {i}")
                c.eq((st.source, st.tag, st.Get_count(), st.count), (prv, tag, 4 * np.dtype(code).itemsize,
                     4 * np.dtype(code).itemsize), f"status {kind}/{code}")
    # counts through datatypes, partial receives, empty messages, big messages
    st2 = MPI.Status()
    comm.Sendrecv(np.arange(3.0), nxt, 7, np.zeros(5), prv, 7, st2)
    c.eq((st2.Get_count(MPI.DOUBLE), st2.Get_count(MPI.INT), st2.Get_count(MPI.DOUBLE_INT), st2.Get_elements(MPI.DOUBLE)),
         (3, 6, MPI.UNDEFINED, 3), "Get_count per datatype")
    comm.Sendrecv(np.empty(0), nxt, 8, np.zeros(1), prv, 8, st2)
    c.eq(st2.Get_count(MPI.DOUBLE), 0, "empty message")
    big = np.arange(700_000, dtype="d") + r
    out = np.empty_like(big)
    comm.Sendrecv(big, nxt, 9, out, prv, 9)
    c.eq(out[[0, -1]], [prv, 699_999 + prv], "5.6 MB message")
    # ANY_SOURCE / ANY_TAG: everyone sends rank 0 one message with its own tag
    reqs = [comm.Isend(np.array([r], dtype="i"), 0, 1000 + r)]
    if r == 0:
        seen = set()
        for _ in range(n):
            x = np.zeros(1, dtype="i")
            comm.Recv(x, MPI.ANY_SOURCE, MPI.ANY_TAG, st2)
            seen.add((st2.source, st2.tag, int(x[0])))
        c.eq(sorted(seen), [(p, 1000 + p, p) for p in range(n)], "ANY_SOURCE/ANY_TAG statuses")
    MPI.Request.Waitall(reqs)
    comm.Barrier()
    # Ssend is synchronous: it cannot complete before the receiver has matched it
    req = comm.Issend(np.array([r], dtype="i"), nxt, 11)
    c.true(not req.Test(), "Issend completes only when received")
    c.true(not comm.Iprobe(prv, 12), "Iprobe before anything was sent")
    comm.Barrier()
    x = np.zeros(1, dtype="i")
    comm.Recv(x, prv, 11)
    req.Wait()
    c.eq(x, [prv], "Issend/Recv")
    if n == 1:                        # a blocking Ssend to oneself would wait forever, as in MPI
        req = comm.Issend(np.array([r], dtype="i"), nxt, 12)
        comm.Recv(x, prv, 12)
        req.Wait()
    elif r % 2 == 0:
        comm.Ssend(np.array([r], dtype="i"), nxt, 12)
        comm.Recv(x, prv, 12)
    else:
        comm.Recv(x, prv, 12)
        comm.Ssend(np.array([r], dtype="i"), nxt, 12)
    c.eq(x, [prv], "Ssend/Recv")
    # an Irecv started natively, matched by an Issend: its wait acks the synchronous send
    rq = comm.Irecv(x, prv, 17)
    sq = comm.Issend(np.array([r + 40], dtype="i"), nxt, 17)
    rq.Wait(st2)
    sq.Wait()
    c.eq(x, [prv + 40], "Issend/Irecv")
    c.eq((st2.source, st2.tag, st2.Get_count(MPI.INT)), (prv, 17, 1), "Issend/Irecv status")
    rq = comm.Irecv(x, prv, 18)         # and a plain Isend, waited for together
    MPI.Request.Waitall([rq, comm.Isend(np.array([r + 50], dtype="i"), nxt, 18)])
    c.eq(x, [prv + 50], "Isend/Irecv Waitall")
    # Irecv's native start takes plain 1-D numeric arrays; the rest goes the general way
    arrays = [np.zeros(3, "?"), np.zeros(3, "c16"), np.zeros(3, "f2"), np.zeros(3, ">i4"),
             np.zeros((3, 2)), np.zeros(6)[::2], np.zeros(3, "u1")]
    for k, want in enumerate(arrays):
        got = np.zeros_like(want)
        rq = comm.Irecv(got, prv, 60 + k)
        comm.Send(np.full(want.shape, r + 1).astype(want.dtype), nxt, 60 + k)
        rq.Wait(st2)
        c.eq(got.tolist(), np.full(want.shape, prv + 1).astype(want.dtype).tolist(),
             f"Irecv into {want.dtype}{list(want.shape)} (strided: {not want.flags.c_contiguous})")
        c.eq((st2.source, st2.tag), (prv, 60 + k), f"Irecv status, case {k}")
    ro = np.zeros(3)
    ro.flags.writeable = False
    try:
        comm.Irecv(ro, prv, 70)
        c.true(False, "Irecv into a read-only array raises")
    except BufferError:       # (as mpi4py raises it)
        pass
    # Sendrecv_replace, Isendrecv, Isendrecv_replace
    y = np.full(3, float(r))
    comm.Sendrecv_replace(y, nxt, 13, prv, 13)
    c.eq(y, np.full(3, float(prv)), "Sendrecv_replace")
    # (a small array is written into the peer's ring, then received in place; a large one,
    # lent, goes through a copy): statuses, ANY_TAG, 1 MiB, an int16 array
    st3 = MPI.Status()
    y = np.arange(5, dtype=np.int16) + r
    comm.Sendrecv_replace(y, nxt, 16, prv, MPI.ANY_TAG, st3)
    c.eq((y.tolist(), st3.Get_source(), st3.Get_tag(), st3.Get_count(MPI.SHORT)),
         ((np.arange(5) + prv).tolist(), prv, 16, 5), "Sendrecv_replace: ANY_TAG, status")
    big = np.full(1 << 17, float(r))
    comm.Sendrecv_replace(big, nxt, 17, prv, 17, st3)
    c.eq((float(big[0]), float(big[-1]), st3.Get_count(MPI.DOUBLE)), (float(prv), float(prv), 1 << 17),
         "Sendrecv_replace of 1 MiB")
    out = np.zeros(2)
    comm.Isendrecv(np.full(2, r * 2.0), nxt, 14, out, prv, 14).Wait(st2)
    c.eq(out, np.full(2, prv * 2.0), "Isendrecv data")
    c.eq(st2.source, prv, "Isendrecv status")
    y = np.full(2, float(r))
    comm.Isendrecv_replace(y, nxt, 15, prv, 15).Wait()
    c.eq(y, np.full(2, float(prv)), "Isendrecv_replace")
    # probes: look, then receive what the status says
    comm.Isend(np.arange(r + 2, dtype="f"), nxt, 16)
    comm.Probe(MPI.ANY_SOURCE, MPI.ANY_TAG, st2)
    cnt = st2.Get_count(MPI.FLOAT)
    c.eq((st2.source, st2.tag, cnt), (prv, 16, prv + 2), "Probe status")
    got = np.zeros(cnt, dtype="f")
    c.true(comm.Iprobe(prv, 16), "Iprobe sees the probed message")
    comm.Recv(got, st2.source, st2.tag)
    c.eq(got, np.arange(prv + 2, dtype="f"), "Recv after Probe")
    comm.Isend(np.full(2, r, dtype="i"), nxt, 17)
    msg = comm.Mprobe(prv, 17, st2)
    c.true(not comm.Iprobe(prv, 17), "a matched-probed message is invisible to Iprobe")
    got = np.zeros(2, dtype="i")
    msg.Recv(got)
    c.eq(got, [prv, prv], "Mprobe + Message.Recv")
    c.true(comm.Improbe(prv, 18) is None, "Improbe with nothing pending")
    comm.Barrier()
    comm.Isend(np.full(1, r, dtype="i"), nxt, 18)
    comm.Barrier()
    msg = comm.Improbe(prv, 18)
    got = np.zeros(1, dtype="i")
    msg.Irecv(got).Wait()
    c.eq(got, [prv], "Improbe + Message.Irecv")
    # PROC_NULL completes at once
    comm.Send(np.ones(2), MPI.PROC_NULL)
    comm.Recv(np.ones(2), MPI.PROC_NULL, 5, st2)
    c.eq((st2.source, st2.tag, st2.Get_count()), (MPI.PROC_NULL, MPI.ANY_TAG, 0), "PROC_NULL status")
    c.true(comm.Isend(np.ones(1), MPI.PROC_NULL).Test(), "Isend to PROC_NULL is complete")
    # persistent requests
    sbuf, rbuf = np.zeros(2), np.zeros(2)
    ps = [comm.Recv_init(rbuf, prv, 19), comm.Send_init(sbuf, nxt, 19)]
    for it in range(3):
        sbuf[:] = r * 10 + it
        MPI.Prequest.Startall(ps)
        MPI.Request.Waitall(ps)
        c.eq(rbuf, np.full(2, prv * 10.0 + it), f"persistent round {it}")
    # Cancel: an unmatched receive is withdrawn; a send completes anyway
    req = comm.Irecv(np.zeros(1), prv, 20)
    req.Cancel()
    req.Wait(st2)
    c.true(st2.Is_cancelled(), "cancelled Irecv")
    c.eq((st2.source, st2.tag), (MPI.ANY_SOURCE, MPI.ANY_TAG), "cancelled Irecv status")
    req = comm.Isend(np.ones(1), nxt, 21)
    req.Cancel()
    req.Wait(st2)
    comm.Recv(np.zeros(1), prv, 21)
    # Waitany / Waitsome / Testany over several tags
    outs = [np.zeros(1) for _ in range(3)]
    reqs = [comm.Irecv(outs[i], prv, 30 + i) for i in range(3)]
    for i in (2, 0, 1):
        comm.Isend(np.array([r * 1.0 + i]), nxt, 30 + i)
    done = set()
    while len(done) < 3:
        idx = MPI.Request.Waitsome(reqs)
        done.update(idx)
    c.eq(MPI.Request.Waitsome(reqs), None, "Waitsome of completed requests")
    c.eq([o[0] for o in outs], [prv * 1.0 + i for i in range(3)], "Waitsome data")
    c.eq(MPI.Request.Waitany(reqs), MPI.UNDEFINED, "Waitany of null requests")
    # Bsend with an attached buffer; Rsend
    MPI.Attach_buffer(bytearray(1 << 16))
    comm.Bsend(np.full(1, r, dtype="i"), nxt, 22)
    comm.Recv(x, prv, 22)
    c.eq(x, [prv], "Bsend")
    c.eq(len(MPI.Detach_buffer()), 1 << 16, "Detach_buffer returns the buffer")
    # errors
    c.raises(lambda: comm.Recv(np.zeros(1), n), MPI.Exception, "Recv from rank n", MPI.ERR_RANK)
    c.raises(lambda: comm.Send(np.zeros(1), nxt, -3), MPI.Exception, "negative tag", MPI.ERR_TAG)
    c.raises(lambda: comm.Send(np.zeros(1), nxt, MPI.COMM_WORLD.Get_attr(MPI.TAG_UB) + 1), MPI.Exception,
             "tag above TAG_UB", MPI.ERR_TAG)
    comm.Isend(np.arange(3.0), nxt, 23)
    c.raises(lambda: comm.Recv(np.zeros(2), prv, 23), MPI.Exception, "truncation", MPI.ERR_TRUNCATE)
    c.raises(lambda: comm.Recv(b"readonly", prv, 24), BufferError, "read-only receive buffer")
    comm.Barrier()


@pytest.mark.timeout(160)
@pytest.mark.parametrize("n", SIZES)
def test_p2p_buf(n):
    check(job(n), "p2p_buf")


@pytest.mark.timeout(160)
def test_p2p_buf_tcp():
    check(job(3, "tcp"), "p2p_buf")
