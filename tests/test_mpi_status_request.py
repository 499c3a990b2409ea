"""collcomm.MPI Status and Request, in the style of mpi4py's test_status / test_request:
Status defaults, setters, copies, Get_count/Get_elements, pickling; REQUEST_NULL and
empty lists in the completion functions; Waitany/Testany/Waitsome/Testsome/Testall;
persistent requests (inactive after Wait, errors when started twice, Free); Get_status;
the errors of a non-blocking or persistent collective whose ranks disagree, raised by its
Wait (the two-part call's short way in ``Request.Wait``); generalized requests out of
scope; sizes 1–5.
"""
from __future__ import annotations

import pickle

import numpy as np
import pytest

from tests.mpi_checks import SIZES, Checker, check, job


def status_request(c: Checker, MPI, comm) -> None:
    r, n = comm.rank, comm.size
    nxt, prv = (r + 1) % n, (r - 1) % n
    st = MPI.Status()
    c.eq((st.source, st.tag, st.error, st.Get_count(), st.Is_cancelled()),
         (MPI.ANY_SOURCE, MPI.ANY_TAG, MPI.SUCCESS, 0, False), "Status defaults")
    st.Set_source(3)
    st.Set_tag(4)
    st.Set_elements(MPI.DOUBLE, 5)
    c.eq((st.Get_source(), st.Get_tag(), st.Get_count(MPI.DOUBLE), st.Get_count(), st.Get_elements(MPI.INT)),
         (3, 4, 5, 40, 10), "Status setters")
    copy = MPI.Status(st)
    c.true(copy == st and pickle.loads(pickle.dumps(st)) == st, "Status copy and pickle")
    # Waitall / Waitsome with a truncated receive: ERR_IN_STATUS, every request completed,
    # the statuses' error fields say which failed (as Open MPI); a failed Wait frees its request
    for how in ("Waitall", "Waitall without statuses", "Waitsome", "Wait"):
        q = [comm.Irecv(np.zeros(2), prv, 41), comm.Irecv(np.zeros(4), prv, 42)]
        comm.Send(np.arange(4.0), nxt, 41)
        comm.Send(np.arange(4.0), nxt, 42)
        sts = [MPI.Status(), MPI.Status()]
        try:
            if how == "Waitall":
                MPI.Request.Waitall(q, sts)
            elif how == "Waitall without statuses":
                MPI.Request.Waitall(q)
            elif how == "Waitsome":
                MPI.Request.Waitsome(q, sts)
                MPI.Request.Waitall(q)
            else:
                q[0].Wait()
            c.true(False, f"{how} of a truncated receive raised nothing")
        except MPI.Exception as exc:
            want = MPI.ERR_TRUNCATE if how == "Wait" else MPI.ERR_IN_STATUS
            c.eq(exc.Get_error_class(), want, f"{how}: the error class")
        if how == "Waitall":
            c.eq([x.Get_error() for x in sts], [MPI.ERR_TRUNCATE, MPI.SUCCESS], "Waitall: the statuses' errors")
        c.eq(q[0] == MPI.REQUEST_NULL, True, f"{how}: the failed request is freed")
        MPI.Request.Waitall(q)
    c.eq(st.Get_elements(MPI.FLOAT_INT), 5, "Get_elements of a pair counts it once (predefined)")
    ct = MPI.INT.Create_contiguous(3).Commit()
    st.Set_elements(ct, 6)
    c.eq((st.Get_count(ct), st.Get_elements(ct), st.Get_count()), (2, 6, 24),
         "Set_elements counts basic elements")
    # REQUEST_NULL and empty lists
    null = MPI.REQUEST_NULL
    c.true(null.Wait() and null.Test() and not null, "REQUEST_NULL completes at once")
    c.eq((MPI.Request.Waitany([]), MPI.Request.Testany([]), MPI.Request.Waitsome([]), MPI.Request.Testsome([]),
          MPI.Request.Testall([]), MPI.Request.waitall([])), (MPI.UNDEFINED, (MPI.UNDEFINED, True), None, None, True, []),
         "completion functions on empty lists")
    c.eq(MPI.Request.Waitany([MPI.REQUEST_NULL, MPI.Request()]), MPI.UNDEFINED, "Waitany of nulls")
    c.eq(null.wait(), None, "REQUEST_NULL.wait()")
    # Testany / Testsome while nothing has arrived, then after
    bufs = [np.zeros(1) for _ in range(2)]
    reqs = [comm.Irecv(bufs[i], prv, 40 + i) for i in range(2)]
    c.eq(MPI.Request.Testany(reqs), (MPI.UNDEFINED, False), "Testany before any message")
    c.eq(MPI.Request.Testsome(reqs), [], "Testsome before any message")
    c.true(not MPI.Request.Testall(reqs), "Testall before any message")
    c.true(not reqs[0].Get_status(), "Get_status before the message")
    comm.Barrier()
    comm.Isend(np.array([r + 0.5]), nxt, 41)
    statuses: list = []
    i = MPI.Request.Waitany(reqs, st)
    c.eq((i, st.source, st.tag, bufs[1][0]), (1, prv, 41, prv + 0.5), "Waitany")
    comm.Barrier()                       # nobody sends tag 40 before every Waitany returned
    comm.Isend(np.array([r + 0.25]), nxt, 40)
    while not reqs[0].Get_status(st):
        pass
    c.true(reqs[0] != MPI.REQUEST_NULL, "Get_status leaves the request")
    c.true(MPI.Request.Testall(reqs, statuses) and statuses[0].tag == 40, "Testall with statuses")
    c.true(all(q == MPI.REQUEST_NULL for q in reqs), "completed requests become REQUEST_NULL")
    # persistent requests
    buf = np.zeros(1)
    p = comm.Recv_init(buf, prv, 42)
    c.true(p.Test() and p != MPI.REQUEST_NULL, "an inactive persistent request tests complete")
    p.Start()
    c.raises(lambda: p.Start(), MPI.Exception, "Start of an active request", MPI.ERR_REQUEST)
    comm.Send(np.array([7.0]), nxt, 42)
    p.Wait()
    c.eq(buf, [7.0], "persistent receive")
    p.Free()
    c.true(p == MPI.REQUEST_NULL, "Free makes it null")
    c.raises(lambda: p.Start(), MPI.Exception, "Start after Free", MPI.ERR_REQUEST)
    c.raises(lambda: MPI.Grequest.Start(lambda *a: None), NotImplementedError, "Grequest.Start")
    _disagreeing(c, MPI, comm)
    comm.Barrier()


def _disagreeing(c: Checker, MPI, comm) -> None:
    """An Iallreduce / Allreduce_init whose ops differ across ranks (8 bytes: the fast
    call's two parts where it has them): MPI.Exception on every rank, from the call or its
    Wait, the request null (inactive for the persistent one) afterwards; the next calls right."""
    r, n = comm.rank, comm.size
    if n == 1:
        return
    x, y = np.ones(1), np.zeros(1)
    op = MPI.MAX if r == n - 1 else MPI.SUM
    for form in ("Iallreduce", "Allreduce_init"):
        q = None
        try:
            if form == "Iallreduce":
                q = comm.Iallreduce(x, y, op)
            else:
                q = comm.Allreduce_init(x, y, op)
                q.Start()
            q.Wait()
            c.true(False, f"{form} with ops differing across ranks raised nothing")
        except MPI.Exception as exc:
            c.true("SUM" in str(exc) or "MAX" in str(exc) or "op" in str(exc).lower(),
                   f"{form}: the error names the op: {exc}")
        if q is not None:
            c.true(q != MPI.REQUEST_NULL if form == "Allreduce_init" else q == MPI.REQUEST_NULL,
                   f"{form}: the request after the failed Wait")
        y[0] = 0
        comm.Allreduce(x, y, MPI.SUM)
        c.eq(y, [float(n)], f"the Allreduce after a refused {form}")
        if form == "Allreduce_init" and q is not None:
            q.Free()


@pytest.mark.timeout(160)
@pytest.mark.parametrize("n", SIZES)
def test_status_request(n):
    check(job(n), "status_request")
