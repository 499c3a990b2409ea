"""The functional API's ``isend`` / ``irecv`` on the world group in one C call (P2P.one,
native/_p2p_one.c), and ``send`` / ``recv`` with a few type tests before theirs: a plain array to or from a rank of this host starts there with no
Python-level check; everything C does not take (another group, any source, a bad peer or
tag, a buffer C cannot use) falls through to the Python path, which gives the same results
and raises the same errors as when the native path is paused.
"""
from __future__ import annotations

import numpy as np
import pytest

from collcomm import native
from tests.harness import run_ranks

pytestmark = [pytest.mark.timeout(90),
              pytest.mark.skipif(native.core is None, reason=f"native core: {native.reason}")]


def _cases() -> dict:
    import collcomm as dist
    from collcomm import api_p2p
    from collcomm.core import p2p, runtime

    me = dist.get_rank()
    other = 1 - me
    g = runtime.get_world("test")
    f = p2p.native(g)
    slow = {"n": 0}
    real_native = api_p2p._native

    def counted(*a, **k):        # the Python-level checks: reached only when C declined
        slow["n"] += 1
        return real_native(*a, **k)

    api_p2p._native = counted
    out: dict = {}
    for paused in (0, 1):
        f.paused = paused
        slow["n"] = 0
        got: list = []
        dist.barrier()
        # plain: one C call each, the works the batch makes (from the second call of a
        # dtype: its signature is made and cached by the first, on the Python path)
        s = np.arange(5, dtype=np.int32) + 10 * me
        r = np.zeros(5, np.int32)
        dist.isend(s, other, tag=7).wait()
        dist.irecv(r, other, tag=7).wait()
        slow["n"] = 0
        a = dist.isend(s, other, tag=7)
        b = dist.irecv(r, other, tag=7)
        got.append((type(a).__name__, type(b).__name__))
        a.wait()
        b.wait()
        got.append(r.tolist())
        for i in range(2):               # blocking, in turns (ping-pong)
            if me == 0:
                dist.send(s + i, other, tag=9)
                dist.recv(r, other, tag=9)
            else:
                dist.recv(r, other, tag=9)
                dist.send(s + i, other, tag=9)
        got.append(r.tolist())
        plain_slow = slow["n"]
        # what C leaves to Python: results the same either way
        strided = np.arange(10, dtype=np.float64)[::2] + me       # not contiguous
        rr = np.zeros(5, np.float64)
        ws = [dist.isend(strided, other), dist.irecv(rr, None)]    # any source
        for w in ws:
            w.wait()
        got.append((rr.tolist(), ws[1].source_rank()))
        x = np.zeros(3, np.float32)
        ws = [dist.isend(np.ones(3, np.float32) * me, group=dist.GroupMember.WORLD, group_dst=other),
              dist.irecv(x, group=dist.GroupMember.WORLD, group_src=other)]
        for w in ws:
            w.wait()
        got.append(x.tolist())
        # blocking calls C declines: a numpy integer peer, a strided send
        y = np.zeros(5, np.float64)
        if me == 0:
            dist.send(np.arange(10.0)[::2], np.int64(other))
            dist.recv(y, other)
        else:
            dist.recv(y, np.int64(other))
            dist.send(np.arange(5.0) * 2, other)
        got.append(y.tolist())
        errors = []
        ro = np.zeros(2, np.float32)
        ro.flags.writeable = False
        for call in (lambda: dist.isend(np.ones(2), me),               # this rank
                     lambda: dist.isend(np.ones(2), 7),                # no such rank
                     lambda: dist.irecv(np.ones(2), other, tag=-1),    # bad tag
                     lambda: dist.irecv(ro, other),                    # read-only
                     lambda: dist.isend(np.array(["a"], object), other),
                     lambda: dist.isend([1.0, 2.0], other, tag="x"),
                     lambda: dist.send(np.ones(2), me),
                     lambda: dist.send(np.ones(2), 9),
                     lambda: dist.send(np.ones(2), other, tag=1 << 40),
                     lambda: dist.recv(ro, other),
                     lambda: dist.recv(np.zeros(10)[::2], other),
                     lambda: dist.recv(np.ones(2), other, tag=-3)):
            try:
                call()
                errors.append("no error")
            except Exception as exc:  # noqa: BLE001 - compared
                errors.append(f"{type(exc).__name__}: {exc}")
        got.append(errors)
        out[paused] = (got, plain_slow)
    f.paused = 0
    dist.barrier()
    return out


def test_world_p2p_in_one_call_and_fallbacks() -> None:
    res = run_ranks(_cases, 2, transport="shm", timeout=80)
    for rank, out in enumerate(res):
        native_got, native_slow = out[0]
        paused_got, _ = out[1]
        assert native_got[0] == ("SentWork", "RecvWork"), native_got[0]
        assert native_slow == 0, "p2p calls of plain arrays reached the Python checks"
        other = 1 - rank
        assert native_got[1] == [i + 10 * other for i in range(5)], native_got[1]
        assert native_got[2] == [i + 10 * other + 1 for i in range(5)], native_got[2]  # ping-pong
        assert native_got[3] == ([float(2 * i + other) for i in range(5)], other)
        assert native_got[4] == [float(other)] * 3
        assert native_got[5] == [2.0 * i for i in range(5)], native_got[5]     # numpy peer
        assert native_got[1:] == paused_got[1:], (native_got, paused_got)
        assert all(e != "no error" for e in native_got[6]), native_got[6]


def _after_a_peer_is_lost() -> list:
    """Rank 0 marks rank 1 lost (as the engine does when a peer dies), then isend, send
    and irecv + wait to it, native and paused: the same error each way (the native entry
    declines on an engine with a peer lost; the ring to that peer is still open)."""
    import time

    import collcomm as dist
    from collcomm.core import p2p, runtime
    from collcomm.errors import PeerLostError

    me = dist.get_rank()
    g = runtime.get_world("test")
    f = p2p.native(g)
    s = np.arange(4, dtype=np.int32)
    r = np.zeros(4, np.int32)
    if me == 0:                    # (the int32 signature cached: the native entry takes it)
        dist.isend(s, 1, tag=3).wait()
    else:
        dist.irecv(r, 0, tag=3).wait()
    dist.barrier()
    out: list = []
    if me == 1:
        time.sleep(1.0)
        return out
    g.transport.peer_lost(1, PeerLostError("rank 1 lost (simulated)", peer=1), crashed=False)
    for paused in (0, 1):
        f.paused = paused
        for call in (lambda: dist.isend(s, 1, tag=5).wait(), lambda: dist.send(s, 1, tag=5),
                     lambda: dist.irecv(r, 1, tag=5).wait()):
            try:
                call()
                out.append((paused, "no error"))
            except Exception as exc:  # noqa: BLE001 - compared
                out.append((paused, f"{type(exc).__name__}: {exc}"[:160]))
    return out


def test_world_p2p_after_a_peer_is_lost() -> None:
    res = run_ranks(_after_a_peer_is_lost, 2, transport="shm", timeout=40)
    native = [text for paused, text in res[0] if not paused]
    regular = [text for paused, text in res[0] if paused]
    assert len(native) == len(regular) == 3
    assert native == regular, (native, regular)
    assert all(text.startswith("PeerLostError") for text in native), native
