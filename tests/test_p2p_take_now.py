"""A native receive whose message is already there when it starts (``batch_isend_irecv``,
``irecv``, ``collcomm.MPI`` ``Irecv``) is taken at once (native/_p2p_batch.c
batch_take_now): no place in the engine's line, its record completed, its wait a formality.
Nothing else changes: a receive posted earlier and not yet waited for keeps its turn (the
later one waits in line), a size error or a mismatched dtype is raised by the wait with
the words the deferred path uses, and the results are those of the native path paused.
"""
from __future__ import annotations

import numpy as np
import pytest

from collcomm import native
from tests.harness import run_ranks
from tests.test_p2p_native import _err

pytestmark = [pytest.mark.timeout(90),
              pytest.mark.skipif(native.core is None, reason=f"native core: {native.reason}")]


def _cases() -> dict:
    import collcomm as dist
    from collcomm import MPI
    from collcomm.core import p2p, runtime

    me, other = dist.get_rank(), 1 - dist.get_rank()
    g = runtime.get_world("test")
    f, eng = p2p.native(g), g.transport
    comm = MPI.COMM_WORLD
    out: dict = {}
    for paused in (0, 1):
        if f is not None:              # (None: this rank runs the Python path)
            f.paused = paused
        got: list = []
        dist.barrier()
        if me == 1:
            dist.send(np.array([1.0, 2.0, 3.0], np.float32), 0, tag=1)
            dist.barrier()                     # (rank 0 takes it, then posts tag 2)
            dist.barrier()
            dist.send(np.array([4.0], np.float32), 0, tag=2)
            dist.send(np.array([5.0, 6.0], np.float32), 0, tag=3)      # 8 bytes, not 12
            dist.send(np.array([7, 8], np.int32), 0, tag=4)            # int32, not float32
            dist.barrier()
            dist.barrier()                     # rank 0 posts tag 5 first
            dist.send(np.array([9.0], np.float32), 0, tag=5)
            dist.send(np.array([10.0], np.float32), 0, tag=5)
            dist.barrier()
            dist.send(np.array([11], np.int64), 0, tag=6)
            dist.send(np.array([12.0], np.float32), 0, tag=7)
            dist.send(np.array([13.0], np.float32), 0, tag=7)
            dist.barrier()
        else:
            dist.barrier()                     # tag 1 is there: taken by the batch
            recvs = f.recvs if f is not None else 0
            r = np.zeros(3, np.float32)
            w = dist.batch_isend_irecv([dist.P2POp(dist.irecv, r, other, tag=1)])[0]
            taken = (f.recvs - recvs if f is not None else None, list(eng._deferred) == [],
                     w.is_success())
            done = w.wait()
            got.append((taken if not paused else None, r.tolist(), done, w.is_success(),
                        w.is_completed(), w.source_rank()))
            out[f"early{paused}"] = bool(getattr(w, "early", False))
            # not there yet: it waits in line, as before
            r2 = np.zeros(1, np.float32)
            w2 = dist.irecv(r2, other, tag=2)
            held = list(eng._deferred) == [w2] if not paused else None
            dist.barrier()
            w2.wait()
            got.append((held, r2.tolist()))
            dist.barrier()                     # tags 3 and 4 are there: errors at the wait
            r3 = np.zeros(3, np.float32)
            w3 = dist.batch_isend_irecv([dist.P2POp(dist.irecv, r3, other, tag=3)])[0]
            got.append((_err(w3.wait), _err(w3.wait)))
            r4 = np.zeros(2, np.float32)
            w4 = dist.irecv(r4, other, tag=4)
            got.append((_err(w4.wait), _err(w4.wait)))
            # a receive posted earlier keeps its turn: the later one, its message there,
            # waits in line behind it
            a, b = np.zeros(1, np.float32), np.zeros(1, np.float32)
            wa = dist.irecv(a, other, tag=5)
            dist.barrier()
            dist.barrier()
            wb = dist.batch_isend_irecv([dist.P2POp(dist.irecv, b, other, tag=5)])[0]
            wb.wait()
            wa.wait()
            got.append((a.tolist(), b.tolist(), bool(getattr(wb, "early", False))))
            dist.barrier()                     # collcomm.MPI: Irecv of a message that is there
            x = np.zeros(1, np.int64)
            st = MPI.Status()
            req = comm.Irecv(x, other, 6)
            got.append((req.Test(st), int(x[0]), st.Get_source(), st.Get_tag(),
                        st.Get_count(MPI.INT64_T)))
            c, d = np.zeros(1, np.float32), np.zeros(1, np.float32)   # two of one tag, in order
            ws = dist.batch_isend_irecv([dist.P2POp(dist.irecv, c, other, tag=7),
                                         dist.P2POp(dist.irecv, d, other, tag=7)])
            for w in ws:
                w.wait()
            got.append((c.tolist(), d.tolist()))
        out[f"got{paused}"] = got
    if f is not None:
        f.paused = 0
    dist.barrier()
    return out


@pytest.mark.parametrize("python_sender", [False, True])
def test_a_receive_whose_message_is_there_is_taken_when_it_starts(python_sender) -> None:
    env = {1: {"COLLCOMM_NATIVE": "0"}} if python_sender else None
    res = run_ranks(_cases, 2, transport="shm", timeout=80, rank_env=env)
    r0 = res[0]
    native_path, reference = r0["got0"], r0["got1"]
    taken, *first = native_path[0]
    assert first == [[1.0, 2.0, 3.0], True, True, True, 1], native_path[0]
    # its message there: taken by the native start, whoever sent it
    assert r0["early0"] and taken == (1, True, False), (r0["early0"], taken)
    assert not r0["early1"]                           # (paused: the Python path defers)
    assert native_path[1] == (True, [4.0]), native_path[1]
    size_err, size_again = native_path[2]
    assert size_err.startswith("MismatchError: irecv from global rank 1 on") and \
        "received 8 bytes, expected 12" in size_err and size_again == size_err, native_path[2]
    assert native_path[4][:2] == ([9.0], [10.0]) and native_path[4][2] is False, native_path[4]
    assert native_path[5] == (True, 11, 1, 6, 1), native_path[5]
    assert native_path[6] == ([12.0], [13.0]), native_path[6]
    # the same results and the same errors as with the native path paused
    assert [native_path[0][1:]] + native_path[2:] == [reference[0][1:]] + reference[2:], \
        (native_path, reference)
