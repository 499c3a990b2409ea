"""Shared-memory messages between the eager limit (always inline, behind a full ring queued)
and the inline limit (half the ring): inline while the ring has room for them at once,
staged otherwise (transport/shm_ring.py inline_limit), natively and on the Python path;
whichever way each went, a stream of them arrives whole and in order.
"""
from __future__ import annotations

import numpy as np
import pytest

from tests.harness import run_ranks

pytestmark = pytest.mark.timeout(90)

K = 100 << 10        # float32s: 400 KiB, above the eager limit of a 1 MiB ring, below inline


def _stream(count: int) -> dict:
    import collcomm as dist
    from collcomm.core import p2p, runtime

    me = dist.get_rank()
    g = runtime.get_world("test")
    f = p2p.native(g)
    ch = g.transport.channels[1 - me]
    out = {"limits": (ch.out.ring, ch.eager, ch.inline)}
    dist.barrier()
    if me == 0:
        sends = f.sends if f is not None else 0
        ws = [dist.isend(np.full(K, i, np.float32), 1, tag=4) for i in range(count)]
        for w in ws:                       # none waits for the receiver: staged past room
            w.wait()
        out["native inline"] = None if f is None else f.sends - sends
        dist.barrier()
    else:
        dist.barrier()                     # every send done before the first receive
        got = []
        for _ in range(count):
            r = np.zeros(K, np.float32)
            dist.recv(r, 0, tag=4)
            got.append(float(r[0]) if (r == r[0]).all() else -1.0)
        out["got"] = got
    x = np.zeros(K, np.float32)            # an exchange of one such message each way: inline
    y = np.full(K, 7 + me, np.float32)
    for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, y, 1 - me, tag=5),
                                     dist.P2POp(dist.irecv, x, 1 - me, tag=5)]):
        w.wait()
    out["exchange"] = bool((x == 8 - me).all())
    return out


@pytest.mark.parametrize("python_sender", [False, True])
def test_messages_past_the_eager_limit_go_inline_while_the_ring_has_room(python_sender) -> None:
    env = {0: {"COLLCOMM_NATIVE": "0"}} if python_sender else None
    res = run_ranks(_stream, 2, 6, transport="shm", timeout=80, rank_env=env)
    ring, eager, inline = res[0]["limits"]
    assert ring == 1 << 20 and eager == 256 << 10 and inline == 512 << 10, res[0]["limits"]
    assert res[1]["got"] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0], res[1]
    if not python_sender and res[0]["native inline"] is None:
        # no native sender: only where this whole run has no core (COLLCOMM_NATIVE=0, or
        # no C compiler at install), whose ranks inherit that
        from collcomm import native
        assert native.core is None, "the core is on here, yet the sender had no native P2P"
    elif not python_sender:  # two fit the empty 1 MiB ring; the rest, no room, are staged
        assert res[0]["native inline"] == 2, res[0]
    assert res[0]["exchange"] and res[1]["exchange"], res
