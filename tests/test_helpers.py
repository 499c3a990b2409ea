"""The seed-004 helper layer, distributed and in a single non-distributed process."""
from __future__ import annotations

import numpy as np
import pytest

import collcomm as dist
from collcomm import helpers
from tests.harness import run_ranks

LOSSES = [0.5, 0.3, 0.7, 0.4]


def seed004() -> dict:
    r = helpers.get_rank()
    loss = LOSSES[r]
    arr = np.full(3, loss)
    out = {
        "distributed": helpers.is_distributed(), "main": helpers.is_main_process(),
        "size": helpers.get_world_size(), "device": helpers.get_device(),
        "sum": helpers.reduce_tensor(loss, op="sum"), "mean": helpers.reduce_tensor(loss, op="mean"),
        "arr_mean": helpers.reduce_tensor(arr, op="mean").tolist(), "arr_after": arr.tolist(),
        "int_mean": helpers.reduce_tensor(np.array([r]), op="mean").tolist(),
        "gather": helpers.gather_tensor(loss, dst=0),
        "gather_arr": helpers.gather_tensor(arr[:1], dst=1),
        "bcast": helpers.broadcast_tensor(loss, src=0),
    }
    b = np.full(2, float(r))
    same = helpers.broadcast_tensor(b, src=3)
    out["bcast_inplace"] = same is b and b.tolist() == [3.0, 3.0]
    helpers.barrier()
    return out


@pytest.mark.timeout(60)
def test_seed004_four_ranks():
    res = run_ranks(seed004, 4)
    assert all(x["distributed"] and x["size"] == 4 and x["device"] == "cpu" for x in res)
    assert [x["main"] for x in res] == [True, False, False, False]
    assert all(abs(x["sum"] - 1.9) < 1e-12 and abs(x["mean"] - 0.475) < 1e-12 for x in res)
    assert all(isinstance(x["sum"], float) for x in res)
    assert all(np.allclose(x["arr_mean"], 0.475) for x in res)
    assert [x["arr_after"] for x in res] == [[v] * 3 for v in LOSSES]   # input untouched
    assert all(x["int_mean"] == [1.5] for x in res)
    assert res[0]["gather"] == LOSSES and all(x["gather"] is None for x in res[1:])
    assert [g[0] for g in res[1]["gather_arr"]] == LOSSES and res[0]["gather_arr"] is None
    assert all(x["bcast"] == 0.5 and x["bcast_inplace"] for x in res)


def test_not_distributed_identity():
    assert not dist.is_initialized()
    assert not helpers.is_distributed()
    assert helpers.get_rank() == 0 and helpers.get_world_size() == 1 and helpers.is_main_process()
    assert helpers.get_device() == "cpu"
    a = np.array([1.0, 2.0])
    m = helpers.reduce_tensor(a, op="mean")
    assert m is not a and np.array_equal(m, a)
    assert helpers.reduce_tensor(0.5, op="sum") == 0.5
    assert helpers.gather_tensor(0.5) == [0.5]
    assert helpers.broadcast_tensor(a) is a
    helpers.barrier()
    with pytest.raises(dist.InvalidArgumentError):
        helpers.reduce_tensor(a, op="median")


def test_helpers_warn_once_when_a_launched_rank_never_joined(monkeypatch):
    """A rank started by a launcher (WORLD_SIZE=4) that forgot init_process_group() runs the
    helpers as a world of one: it is told once, not silently given one-process answers."""
    import warnings

    import numpy as np

    import collcomm.core.runtime as rt
    from collcomm import helpers

    monkeypatch.setattr(rt, "_world", None)     # as if this process never joined a job
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setattr(rt, "_warned_world_of_one", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert helpers.reduce_tensor(np.array([2.0]), op="sum") == 2.0
        assert helpers.get_world_size() == 1
    texts = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(texts) == 1 and "WORLD_SIZE=4" in texts[0] and "reduce_tensor" in texts[0], texts
