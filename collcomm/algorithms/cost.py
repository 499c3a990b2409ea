"""The α-β(-γ) cost model that ``algorithm="auto"`` uses to pick a point-to-point family.

A message of m bytes costs ``α + m·β`` on a transport (α: per-message latency, β: seconds
per byte), and reducing m bytes locally costs ``m·γ``. With ``n`` ranks, ``L = ⌈log2 n⌉``,
``K`` the per-rank buffer of all_reduce/broadcast/reduce and ``T`` the total of
all_gather/reduce_scatter/gather/scatter/all_to_all (n × the per-rank block), each family
is predicted as below (``f`` = 1 when n is not a power of two: the fold-in/fold-out steps):

================  ===================  ================================================
collective        family               predicted time
================  ===================  ================================================
all_reduce        ring                 2(n-1)α + 2(n-1)/n·Kβ + (n-1)/n·Kγ
                  recursive_doubling   (L+2f)α + (L+2f)·Kβ + (L+f)·Kγ
                  rabenseifner         (2L+2f)α + (2(n-1)/n + 2f)·Kβ + (n-1)/n·Kγ
                  tree                 2L(α + Kβ) + L·Kγ
                  linear               2(n-1)(α + Kβ) + (n-1)·Kγ
all_gather        ring                 (n-1)α + (n-1)/n·Tβ
                  recursive_doubling   (L+2f)α + ((n-1)/n + f)·Tβ
                  bruck                Lα + (n-1)/n·Tβ + Tβ/4 (the final rotation)
                  linear               2(n-1)α + (n-1)·Tβ
reduce_scatter    ring                 (n-1)α + (n-1)/n·T(β+γ)
                  recursive_halving    (L+2f)α + ((n-1)/n + f)·T(β+γ)
                  linear               2(n-1)α + (n-1)/n·T(2β+γ)·n/2
broadcast         tree                 L(α + Kβ)
                  linear               (n-1)(α + Kβ)
reduce            tree                 L(α + Kβ + Kγ)
                  linear               (n-1)(α + Kβ + Kγ)
gather, scatter   tree                 Lα + (n-1)/n·Tβ·(1 + L/8)
                  linear               (n-1)α + (n-1)/n·Tβ
all_to_all        pairwise             (n-1)α + (n-1)/n·Tβ
                  bruck                Lα + (L/2 + 1)·Tβ
                  linear               2(n-1)α + 2(n-1)/n·Tβ
barrier           dissemination        Lα
                  linear               2(n-1)α
================  ===================  ================================================

The constants come from ``collcomm bench --calibrate --save`` (a JSON file named by
``COLLCOMM_COST_MODEL``, default ``~/.cache/collcomm/cost_model.json``), else the built-in
defaults below (measured on the 2-core development VM). Rank 0's model is handed to every
rank at ``init_process_group`` so all ranks always pick the same family.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from typing import Callable

DEFAULT_PATH = os.path.join(os.path.expanduser("~"), ".cache", "collcomm", "cost_model.json")


@dataclass(frozen=True)
class CostModel:
    alpha: dict[str, float] = field(default_factory=lambda: {"shm": 12e-6, "tcp": 45e-6})
    beta: dict[str, float] = field(default_factory=lambda: {"shm": 1 / 3.0e9, "tcp": 1 / 1.5e9})
    gamma: float = 1 / 6.0e9
    source: str = "built-in defaults"

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str, source: str = "") -> "CostModel":
        raw = json.loads(text)
        # accept both this class's layout and the bench's {"shm": {"alpha", "beta"}, ...}
        if "alpha" in raw:
            return cls(dict(raw["alpha"]), dict(raw["beta"]), float(raw["gamma"]),
                       raw.get("source", source))
        alpha = {t: float(raw[t]["alpha"]) for t in ("shm", "tcp") if t in raw}
        beta = {t: float(raw[t]["beta"]) for t in ("shm", "tcp") if t in raw}
        base = cls()
        return cls({**base.alpha, **alpha}, {**base.beta, **beta},
                   float(raw.get("gamma", base.gamma)), source or str(raw.get("measured", "")))


def load(path: str | None = None) -> CostModel:
    """The model saved by ``collcomm bench --calibrate --save``, else the defaults."""
    path = path or os.environ.get("COLLCOMM_COST_MODEL") or DEFAULT_PATH
    try:
        with open(path) as f:
            return CostModel.from_json(f.read(), source=path)
    except (OSError, ValueError, KeyError, TypeError):
        return CostModel()


_active: CostModel | None = None


def active() -> CostModel:
    global _active
    if _active is None:
        _active = load()
    return _active


def set_active(model: CostModel) -> None:
    global _active
    _active = model


def _formulas(n: int, size: float, a: float, b: float, g: float) -> dict[str, dict[str, float]]:
    L = math.ceil(math.log2(n)) if n > 1 else 0
    f = 0 if n & (n - 1) == 0 else 1
    q = (n - 1) / n
    K = T = size
    return {
        "all_reduce": {
            "ring": 2 * (n - 1) * a + 2 * q * K * b + q * K * g,
            "recursive_doubling": (L + 2 * f) * a + (L + 2 * f) * K * b + (L + f) * K * g,
            "rabenseifner": (2 * L + 2 * f) * a + (2 * q + 2 * f) * K * b + q * K * g,
            "tree": 2 * L * (a + K * b) + L * K * g,
            "linear": 2 * (n - 1) * (a + K * b) + (n - 1) * K * g,
        },
        "all_gather": {
            "ring": (n - 1) * a + q * T * b,
            "recursive_doubling": (L + 2 * f) * a + (q + f) * T * b,
            "bruck": L * a + q * T * b + T * b / 4,
            "linear": 2 * (n - 1) * a + (n - 1) * T * b,
        },
        "reduce_scatter": {
            "ring": (n - 1) * a + q * T * (b + g),
            "recursive_halving": (L + 2 * f) * a + (q + f) * T * (b + g),
            "linear": 2 * (n - 1) * a + q * T * (2 * b + g) * n / 2,
        },
        "broadcast": {"tree": L * (a + K * b), "linear": (n - 1) * (a + K * b)},
        "reduce": {"tree": L * (a + K * b + K * g), "linear": (n - 1) * (a + K * b + K * g)},
        "gather": {"tree": L * a + q * T * b * (1 + L / 8), "linear": (n - 1) * a + q * T * b},
        "scatter": {"tree": L * a + q * T * b * (1 + L / 8), "linear": (n - 1) * a + q * T * b},
        "all_to_all": {
            "pairwise": (n - 1) * a + q * T * b,
            "bruck": L * a + (L / 2 + 1) * T * b,
            "linear": 2 * (n - 1) * a + 2 * q * T * b,
        },
        "barrier": {"dissemination": L * a, "linear": 2 * (n - 1) * a},
    }


def predict(collective: str, family: str, n: int, nbytes: int, transport: str = "tcp",
            model: CostModel | None = None) -> float | None:
    """Predicted seconds, or None when the model has no formula for that family."""
    m = model or active()
    table = _formulas(n, float(nbytes), m.alpha[transport], m.beta[transport], m.gamma)
    return table.get(collective, {}).get(family)


def cheapest(collective: str, n: int, nbytes: int, families: list[str], transport: str = "tcp",
             usable: Callable[[str], bool] = lambda name: True) -> str:
    """The family with the lowest predicted time (ties: the earlier in ``families``)."""
    m = active()
    table = _formulas(n, float(nbytes), m.alpha[transport], m.beta[transport], m.gamma).get(collective, {})
    scored = [(table[f], i, f) for i, f in enumerate(families) if f in table and usable(f)]
    if not scored:
        raise KeyError(collective)
    return min(scored)[2]
