"""The α-β cost model behind algorithm="auto"."""
from __future__ import annotations

import json

import pytest

from collcomm.algorithms import cost, registry


@pytest.fixture(autouse=True)
def _restore_model():
    saved = cost.active()
    yield
    cost.set_active(saved)


def test_latency_bound_picks_few_rounds_bandwidth_bound_picks_least_data():
    cost.set_active(cost.CostModel({"shm": 1e-3, "tcp": 1e-3}, {"shm": 1e-12, "tcp": 1e-12}, 1e-12))
    assert registry.auto("all_reduce", 1 << 20, 8) == "recursive_doubling"   # 3 rounds
    assert registry.auto("barrier", 0, 8) == "dissemination"
    cost.set_active(cost.CostModel({"shm": 0.0, "tcp": 0.0}, {"shm": 1e-9, "tcp": 1e-9}, 1e-9))
    assert registry.auto("all_reduce", 1 << 20, 8) in ("ring", "rabenseifner")
    assert registry.auto("all_to_all", 1 << 20, 8) == "pairwise"


def test_predictions_follow_the_formulas():
    m = cost.CostModel({"shm": 2.0, "tcp": 3.0}, {"shm": 0.5, "tcp": 0.25}, 0.125)
    n, K = 4, 8.0
    ring = cost.predict("all_reduce", "ring", n, int(K), "tcp", m)
    assert ring == pytest.approx(2 * 3 * 3.0 + 2 * 0.75 * K * 0.25 + 0.75 * K * 0.125)
    assert cost.predict("broadcast", "tree", n, 8, "shm", m) == pytest.approx(2 * (2.0 + 8 * 0.5))
    assert cost.predict("barrier", "dissemination", 5, 0, "tcp", m) == pytest.approx(3 * 3.0)
    assert cost.predict("all_reduce", "shm_direct", n, 8, "tcp", m) is None


def test_load_both_layouts_and_defaults(tmp_path, monkeypatch):
    bench_style = {"shm": {"alpha": 1e-6, "beta": 2e-10}, "tcp": {"alpha": 3e-5, "beta": 5e-10},
                   "gamma": 1e-10, "measured": "today"}
    path = tmp_path / "m.json"
    path.write_text(json.dumps(bench_style))
    monkeypatch.setenv("COLLCOMM_COST_MODEL", str(path))
    m = cost.load()
    assert m.alpha == {"shm": 1e-6, "tcp": 3e-5} and m.gamma == 1e-10
    assert cost.CostModel.from_json(m.to_json()) == m
    monkeypatch.setenv("COLLCOMM_COST_MODEL", str(tmp_path / "missing.json"))
    assert cost.load() == cost.CostModel()
