"""The engine's MPI matching extensions, on both transports: tag masks on receives (the
status reports the tag that arrived), probe (non-destructive), matched probe + mrecv.

One rank body per transport checks everything, so each transport costs one job.
"""
from __future__ import annotations

import numpy as np
import pytest

import collcomm.core.runtime as rt
from collcomm.errors import ClosedError, CommTimeoutError
from collcomm.transport.base import ANY_SOURCE
from tests.harness import run_ranks

TRANSPORTS = ["shm", "tcp"]
BASE = 0x5 << 40             # the "tag space" of these tests
LOW = (1 << 16) - 1          # the bits a wildcard receive ignores
WILD = ((1 << 64) - 1) & ~LOW
BIG = 3 << 20                # bytes: a TCP body still arriving when probed


def _mv(a: np.ndarray) -> memoryview:
    return memoryview(a.reshape(-1).view(np.uint8))


def matching() -> list[str]:
    t = rt.get_world("test").transport
    r, n = t.rank, t.size
    bad: list[str] = []

    def expect(ok: bool, what: str) -> None:
        if not ok:
            bad.append(f"rank {r}: {what}")

    if r == 0:
        # 1. masked receives: tags 5 and 7 of the space, then one of another space
        hs = [t.isend(_mv(np.array([5], dtype=np.int64)), 1, BASE | 5),
              t.isend(_mv(np.array([7], dtype=np.int64)), 1, BASE | 7),
              t.isend(_mv(np.array([9], dtype=np.int64)), 1, (BASE + (1 << 20)) | 5)]
        # 2./3. probe and matched probe: a small and a big message, then two of one tag
        hs.append(t.isend(_mv(np.arange(3, dtype=np.int32)), 1, BASE | 20))
        hs.append(t.isend(_mv(np.full(BIG, 1, dtype=np.uint8)), 1, BASE | 21))
        hs += [t.isend(_mv(np.array([k], dtype=np.int64)), 1, BASE | 30) for k in (1, 2)]
        for h in hs:
            h.wait()
        t.irecv(_mv(np.zeros(1, dtype=np.int64)), 1, BASE | 41).wait()
        t.isend(_mv(np.array([40], dtype=np.int64)), 1, BASE | 40).wait()
        t.irecv(_mv(np.zeros(1, dtype=np.int64)), 1, BASE | 100).wait()   # rank 1 is done
    if r == 1:
        a = np.zeros(1, dtype=np.int64)
        got = []
        for _ in range(2):
            st = t.irecv(_mv(a), 0, BASE, WILD).wait()
            got.append((int(a[0]), st.tag, st.source, st.nbytes))
        expect(got == [(5, BASE | 5, 0, 8), (7, BASE | 7, 0, 8)], f"masked receives {got}")
        st = t.irecv(_mv(a), ANY_SOURCE, (BASE + (1 << 20)) | 5).wait()
        expect(int(a[0]) == 9 and st.tag == (BASE + (1 << 20)) | 5, "exact receive after masked ones")
        # probe: blocking, then non-destructive (a normal receive still gets the message)
        inc = t.probe(ANY_SOURCE, BASE, WILD, block=True, timeout=30)
        expect((inc.source, inc.tag, inc.nbytes) == (0, BASE | 20, 12), f"probe saw {inc.source, inc.tag, inc.nbytes}")
        again = t.probe(0, BASE | 20)
        expect(again is inc, "a second probe sees the same message")
        b = np.zeros(3, dtype=np.int32)
        st = t.irecv(_mv(b), 0, BASE | 20).wait()
        expect(b.tolist() == [0, 1, 2] and st.tag == BASE | 20, "receive after probe")
        # matched probe of the big message (on TCP possibly still arriving), then mrecv
        m = t.probe(0, BASE | 21, block=True, take=True, timeout=30)
        expect(m.nbytes == BIG, f"mprobe nbytes {m.nbytes}")
        expect(t.probe(0, BASE | 21) is None, "a taken message is invisible to probe")
        big = np.zeros(BIG, dtype=np.uint8)
        st = t.mrecv(m, _mv(big)).wait()
        expect(st.nbytes == BIG and st.tag == BASE | 21 and bool((big == 1).all()), "mrecv of the big message")
        # take the first of two same-tag messages: a receive posted meanwhile gets the second
        m = t.probe(0, BASE | 30, block=True, take=True, timeout=30)
        c = np.zeros(1, dtype=np.int64)
        t.irecv(_mv(c), 0, BASE | 30).wait()
        d = np.zeros(1, dtype=np.int64)
        t.mrecv(m, _mv(d)).wait()
        expect((int(d[0]), int(c[0])) == (1, 2), f"matched message keeps its place: {d[0]}, {c[0]}")
        # cancel: a withdrawn receive fails its wait and does not take the next message
        pending = t.irecv(_mv(np.zeros(1, dtype=np.int64)), 0, BASE | 40)
        expect(t.cancel(pending) is True, "cancel of an unmatched receive")
        try:
            pending.wait(5)
            bad.append("a cancelled receive completed")
        except ClosedError:
            pass
        t.isend(_mv(np.zeros(1, dtype=np.int64)), 0, BASE | 41).wait()   # rank 0: send tag 40 now
        f = np.zeros(1, dtype=np.int64)
        done = t.irecv(_mv(f), 0, BASE | 40)
        done.wait()
        expect(int(f[0]) == 40 and t.cancel(done) is False, "receive after a cancel; cancel of a done one")
        # nothing more: a non-blocking probe says so, a blocking one times out
        expect(t.probe(ANY_SOURCE, BASE, WILD) is None, "probe with nothing pending")
        try:
            t.probe(0, BASE | 99, block=True, timeout=0.3)
            bad.append("blocking probe did not time out")
        except CommTimeoutError:
            pass
        t.isend(_mv(np.zeros(1, dtype=np.int64)), 0, BASE | 100).wait()
    if r == 2:
        # self-messages are probed and matched like any other
        t.isend(_mv(np.array([42], dtype=np.int64)), 2, BASE | 3).wait()
        inc = t.probe(2, BASE, WILD)
        e = np.zeros(1, dtype=np.int64)
        st = t.mrecv(t.probe(ANY_SOURCE, BASE | 3, take=True), _mv(e)).wait()
        expect(inc is not None and int(e[0]) == 42 and st.source == 2 and st.tag == BASE | 3, "self message")
    return bad


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_masks_probe_mprobe(transport):
    results = run_ranks(matching, 3, transport=transport, timeout=45)
    assert results == [[], [], []]
