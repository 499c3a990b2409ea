"""The native core reads a numpy array's buffer from the array's fields (native/_ndarray.c)
and the point-to-point path reads the engine's health byte and the rings' own head and
tail words (session 14): the same results and errors as numpy's getbuffer and the
attribute reads gave.

The direct reading is trusted only after ``set_ndarray`` compared it with numpy's getbuffer
on probe arrays; here: it is on with this numpy, it refuses a type that is not laid out
like an ndarray, and arrays of every shape and flag the probes name travel right through
the native collectives and point-to-point calls, or are refused with the regular path's
error.
"""
from __future__ import annotations

import numpy as np
import pytest

from collcomm import native
from tests.harness import run_ranks

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(native.core is None, reason=f"native core: {native.reason}")]


def test_direct_reading_is_checked_and_on() -> None:
    assert native.ndarray_direct is True
    probes = native._ndarray_probes()
    kinds = {p.dtype.str for p in probes}
    assert {"|b1", "<f2", "<f4", "<f8", "<c8", "<c16", "<i8", "<u8", ">f4"} <= kinds
    assert any(not p.flags.writeable for p in probes)
    assert any(not p.flags.c_contiguous for p in probes)
    assert any(p.ndim == 0 for p in probes) and any(p.ndim == 2 for p in probes)
    try:
        # not laid out like an ndarray: refused before any field is read
        assert native.core.set_ndarray(bytearray, [bytearray(8)]) is False
        # nothing compared, or nothing read directly: not trusted
        assert native.core.set_ndarray(np.ndarray, []) is False
        assert native.core.set_ndarray(np.ndarray, [np.arange(4.0)[::2]]) is False
    finally:
        assert native.core.set_ndarray(np.ndarray, probes) is True


def _arrays() -> dict:
    import collcomm as dist
    from collcomm.core import p2p, runtime

    me, other = dist.get_rank(), 1 - dist.get_rank()
    out: dict = {}
    # collectives: 0-d, 2-D, int64 (numpy's 'l'), complex, float16
    for name, make in (("0d", lambda: np.array(3.0 + me, np.float64)),
                       ("2d", lambda: np.arange(12, dtype=np.int64).reshape(3, 4) * (me + 1)),
                       ("c8", lambda: np.arange(5, dtype=np.complex64) * (me + 1j)),
                       ("f2", lambda: np.arange(7, dtype=np.float16) + me)):
        x = make()
        dist.all_reduce(x)
        out[name] = x.tolist()
    # a read-only send buffer is fine, a read-only or strided receive buffer is refused
    frozen = np.full(4, 1.0 + me, np.float32)
    frozen.flags.writeable = False
    got = np.full(4, 1.0 + me, np.float32)
    dist.all_reduce(got)
    out["sum"] = got.tolist()
    recv = np.zeros(4, np.float32)
    if me == 0:
        dist.send(frozen, other)
        dist.send(np.arange(6, dtype=np.float32).reshape(2, 3), other, tag=3)
    else:
        dist.recv(recv, other)
        out["frozen_sent"] = recv.tolist()
        two = np.zeros((2, 3), np.float32)
        dist.recv(two, other, tag=3)
        out["2d_recv"] = two.tolist()
    dist.barrier()
    for bad in ("readonly", "strided"):
        buf = np.zeros(8, np.float32)
        if bad == "readonly":
            buf.flags.writeable = False
        else:
            buf = buf[::2]
        try:
            dist.irecv(buf, other, tag=9)
            out[bad] = "accepted"
        except Exception as exc:   # the regular path's error, whatever the type
            out[bad] = type(exc).__name__
    # the health byte: 0 while the engine is open with every peer
    eng = runtime.get_world("test").transport
    out["health"] = eng.health[0]
    ch = eng.channels[other]
    out["head_is_word"] = ch.head == ch.out.ctl[0] and ch.tail == ch.inp.ctl[8]
    out["native_sends"] = p2p.native(runtime.get_world("test")).sends
    dist.barrier()
    return out


def test_arrays_through_native_calls() -> None:
    res = run_ranks(_arrays, 2, timeout=90)
    for me, r in enumerate(res):
        assert r["0d"] == 7.0
        assert r["2d"] == (np.arange(12).reshape(3, 4) * 3).tolist()
        assert r["c8"] == (np.arange(5) * (1 + 2j)).tolist()
        assert r["f2"] == (np.arange(7, dtype=np.float16) * 2 + 1).astype(np.float16).tolist()
        assert r["sum"] == [3.0] * 4
        assert r["readonly"] != "accepted" and r["strided"] != "accepted"
        assert r["health"] == 0 and r["head_is_word"]
    assert res[1]["frozen_sent"] == [1.0] * 4
    assert res[1]["2d_recv"] == np.arange(6).reshape(2, 3).tolist()
    assert res[0]["native_sends"] >= 2          # the sends above went through C


def test_health_byte_follows_the_engine() -> None:
    from collcomm.errors import PeerLostError
    from collcomm.transport.engine import Engine

    eng = Engine(0, 2, 5.0)
    assert eng.health == bytearray(1)
    eng.peer_lost(1, PeerLostError("rank 1 died", peer=1), crashed=True)
    assert eng.health[0] == 1
    eng2 = Engine(0, 1, 5.0)
    eng2.close()
    assert eng2.health[0] == 1
    eng3 = Engine(0, 1, 5.0)
    eng3.abort(RuntimeError("stop"))
    assert eng3.health[0] == 1


def _list_held() -> dict:
    """all_gather into a list whose item another thread drops while the call waits for the
    peer with the GIL released: the call's views hold the arrays (else it would write
    into memory a new array has taken)."""
    import threading
    import time

    import collcomm as dist

    me, count = dist.get_rank(), 100
    out: dict = {}
    dist.barrier()
    if me == 0:
        lst = [np.zeros(count) for _ in range(2)]
        fresh: list = []

        def meddle() -> None:
            time.sleep(0.3)
            lst[1] = None                     # the list held the only reference
            fresh.extend(np.full(count, 7.0) for _ in range(4))
        t = threading.Thread(target=meddle)
        t.start()
        dist.all_gather(lst, np.full(count, 1.0))
        t.join()
        out["fresh_untouched"] = all(bool((v == 7.0).all()) for v in fresh)
    else:
        time.sleep(1.0)
        dist.all_gather([np.zeros(count) for _ in range(2)], np.full(count, 2.0))
    dist.barrier()
    return out


def test_list_call_holds_its_arrays() -> None:
    res = run_ranks(_list_held, 2, timeout=60)
    assert res[0]["fresh_untouched"]
