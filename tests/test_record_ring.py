"""The flight recorder's ring and records in C (native/_record_ring.c, _record_rec.c) and
its clock (native/_rec_clock.c): the ring behaves as the bounded deque it replaces, C's
records read as the tuples and lists the Python observer appends, a record is refilled
in place only when nothing else holds it, and the clock reads time.perf_counter()'s
values, never going back."""
from __future__ import annotations

import operator
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from collcomm import native
from tests.harness import run_ranks

pytestmark = pytest.mark.skipif(native.core is None, reason=f"native core: {native.reason}")


def test_the_ring_is_a_bounded_deque() -> None:
    ring = native.core.Ring(3)
    assert len(ring) == 0 and list(ring) == [] and ring.maxlen == 3
    for i in range(2):
        ring.append(i)
    assert list(ring) == [0, 1] and len(ring) == 2
    for i in range(2, 7):
        ring.append(i)
    assert list(ring) == [4, 5, 6] and len(ring) == 3
    it = iter(ring)              # a snapshot: appending after does not change it
    ring.append(7)
    assert list(it) == [4, 5, 6] and list(ring) == [5, 6, 7]
    held = [object()]
    ring.append(held)
    assert list(ring)[-1] is held
    with pytest.raises(ValueError, match="at least one"):
        native.core.Ring(0)
    one = native.core.Ring(1)
    one.append("a")
    one.append("b")
    assert list(one) == ["b"]


def test_the_recorder_uses_it_where_the_core_is_built() -> None:
    from collcomm.core import recorder_ring

    assert type(recorder_ring.new_ring(4)) is native.core.Ring
    code = ("from collcomm.core import recorder_ring as r; import collections; "
            "print(type(r.new_ring(4)) is collections.deque)")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "COLLCOMM_NATIVE": "0"},
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "True", out.stderr


def _records() -> dict:
    """C's records of a collective and of a batch, read back; a held record kept as it
    was while the ring refills the others in place."""
    import collcomm as dist
    from collcomm.core import recorder
    from collcomm.core.recorder_records import R_ALGO, R_OP, R_PSTATE, R_PT1, R_SEQ, R_SIG, R_T0

    me, n = dist.get_rank(), dist.get_world_size()
    x = np.ones(2, np.float32)
    rec = recorder.recorder()
    dist.all_reduce(x)                   # (the first call makes the arena: the fast call after)
    dist.all_reduce(x)
    coll = rec.records()[-1]
    ops = [dist.P2POp(dist.isend, x, (me + 1) % n), dist.P2POp(dist.irecv, x.copy(), (me - 1) % n)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    sent, got = rec.records()[-2:]
    out = {"coll_type": type(coll).__name__, "coll_len": len(coll), "coll_tuple": tuple(v if i != 5 else type(v).__name__ for i, v in enumerate(coll)),
           "coll_repr_is_tuple": repr(coll) == repr(tuple(coll)),
           "neg": coll[-1] == coll[R_T0] and coll[-8] == coll[0],
           "p2p": [(type(r).__name__, len(r), r[R_OP], r[R_PSTATE], r[R_PT1] >= r[R_T0]) for r in (sent, got)],
           "p2p_repr_is_list": repr(sent) == repr(list(sent))}
    for bad in (lambda: operator.setitem(coll, R_SEQ, 1), lambda: operator.setitem(sent, R_OP, "x")):
        try:
            bad()
            out.setdefault("writable", []).append(True)
        except TypeError:
            out.setdefault("writable", []).append(False)
    try:
        sent[R_PSTATE] = "lost"
    except ValueError:
        out["state_checked"] = True
    try:
        coll[8]
    except IndexError:
        out["bounded"] = True
    kept, kept_copy = coll, tuple(coll)
    del sent, got
    for _ in range(rec.size):            # every slot a C record nothing else holds (kept: out)
        dist.all_reduce(x)
    refilled = rec.ring.refilled
    for _ in range(2 * rec.size):        # twice round: every slot refilled in place
        dist.all_reduce(x)
    out["kept"] = tuple(kept) == kept_copy
    out["refilled"] = rec.ring.refilled - refilled == 2 * rec.size   # (no reference leaked)
    last = rec.records()
    out["seqs_rise"] = all(a[R_SEQ] < b[R_SEQ] for a, b in zip(last, last[1:]))
    out["times_rise"] = all(a[R_T0] <= b[R_T0] for a, b in zip(last, last[1:]))
    out["coll_sig"] = all(r[R_SIG] != 0 and r[R_ALGO] != 0 for r in last)
    del last
    for w in dist.batch_isend_irecv(ops):  # two point-to-point records in collectives' slots
        w.wait()
    pair = rec.records()[-2:]
    out["p2p_over_coll"] = [(r[R_OP], r[R_SEQ], r[R_SIG], r[R_ALGO], r[R_PSTATE]) for r in pair]
    return out


@pytest.mark.timeout(90)
def test_c_records_read_as_the_python_ones_and_a_held_one_is_kept() -> None:
    for res in run_ranks(_records, 2, transport="shm", env={"COLLCOMM_FR_SIZE": "8"}, timeout=75):
        assert res["coll_type"] == "Record" and res["coll_len"] == 8, res
        t = res["coll_tuple"]
        assert t[2] == "all_reduce" and t[5] == "code" and isinstance(t[7], float), res
        assert res["coll_repr_is_tuple"] and res["p2p_repr_is_list"] and res["neg"], res
        assert res["p2p"] == [("Record", 11, "isend", "completed", True),
                              ("Record", 11, "irecv", "completed", True)], res
        assert res["writable"] == [False, False] and res.get("state_checked") and res.get("bounded"), res
        assert res["kept"] and res["refilled"] and res["seqs_rise"] and res["times_rise"], res
        assert res["coll_sig"], res
        assert res["p2p_over_coll"] == [("isend", 0, 0, 0, "completed"),
                                         ("irecv", 0, 0, 0, "completed")], res


def test_the_clock_reads_perf_counter_and_never_goes_back() -> None:
    tsc, per_tick, anchors, last = native.core.record_clock()
    pc = time.perf_counter
    outside = 0
    for i in range(50_000):
        if i % 5000 == 0:
            time.sleep(0.002)          # (past the window: a new anchor)
        a = pc()
        now = native.core.record_clock()[3]
        b = pc()
        outside += not (a - 2e-7 <= now <= b + 2e-7)
        assert now >= last
        last = now
    assert outside == 0
    with open("/sys/devices/system/clocksource/clocksource0/current_clocksource") as f:
        source = f.read().strip()
    tsc, per_tick, anchors_after, _ = native.core.record_clock()
    if source == "tsc" and os.uname().machine == "x86_64":
        assert tsc == 1 and per_tick > 0 and anchors_after > anchors
    else:
        assert tsc == 0


def test_the_counter_can_be_turned_off() -> None:
    code = "from collcomm.native import core; print(core.record_clock()[0])"
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "COLLCOMM_REC_TSC": "0"},
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "0", out.stderr
