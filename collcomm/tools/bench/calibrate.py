"""``collcomm bench --calibrate``: the alpha-beta-gamma cost model constants.

For each transport (``shm``, ``tcp``; COLLCOMM_TRANSPORT for a 2-rank job) rank 0 and
rank 1 ping-pong one numpy message per size over 8 B .. 4 MiB (x4 steps); the one-way
time is half the median round trip. ``alpha`` (s) and ``beta`` (s/byte) fit
``t = alpha + beta * bytes`` by least squares weighted by 1/t (relative error, so the
small sizes still pin alpha). ``gamma`` is s/byte of ``np.add(a, b, out=a)`` on a
32 MiB float32 vector (bytes of one operand; beyond the L3 cache, like the large messages
where gamma matters), measured in the parent process.

Saved JSON (``--save``; default ``$COLLCOMM_COST_MODEL`` or
``~/.cache/collcomm/cost_model.json``)::

    {"shm": {"alpha": a, "beta": b}, "tcp": {"alpha": a, "beta": b}, "gamma": g,
     "measured": "<date>, <host>, nproc <cpus>"}
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from typing import Any

import numpy as np

SIZES = [8 * 4 ** k for k in range(10)]  # 8 B .. 2 MiB
SIZES.append(4 * 1024 * 1024)


def default_path() -> str:
    return os.environ.get("COLLCOMM_COST_MODEL") or os.path.join(
        os.path.expanduser("~"), ".cache", "collcomm", "cost_model.json")


def fit_alpha_beta(sizes: list[int], times: list[float]) -> tuple[float, float]:
    """Least squares ``t = alpha + beta * s`` with weights 1/t; alpha, beta clamped >= 0."""
    s = np.asarray(sizes, dtype=np.float64)
    t = np.asarray(times, dtype=np.float64)
    w = 1.0 / np.maximum(t, 1e-12)
    a = np.stack([np.ones_like(s), s], axis=1) * w[:, None]
    (alpha, beta), *_ = np.linalg.lstsq(a, t * w, rcond=None)
    return max(0.0, float(alpha)), max(0.0, float(beta))


def measure_gamma(nbytes: int = 32 * 1024 * 1024, reps: int = 10) -> float:
    a = np.ones(nbytes // 4, dtype=np.float32)
    b = np.ones_like(a)
    for _ in range(3):
        np.add(a, b, out=a)
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        np.add(a, b, out=a)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) / a.nbytes


def pingpong(out_path: str | None) -> None:
    """The rank program: ranks 0 and 1 ping-pong; rank 0 writes {size: one-way s}."""
    import collcomm as dist

    dist.init_process_group()
    rank = dist.get_rank()
    res = {}
    warm = np.zeros(64, dtype=np.uint8)
    t_end = time.perf_counter() + 0.2  # settle both ranks (imports, first-touch, spin state)
    go = np.ones(1, dtype=np.int8)
    while go[0]:
        if rank == 0:
            dist.send(warm, dst=1)
            dist.recv(warm, src=1)
            go[0] = time.perf_counter() < t_end
            dist.send(go, dst=1)
        elif rank == 1:
            dist.recv(warm, src=0)
            dist.send(warm, dst=0)
            dist.recv(go, src=0)
    for size in SIZES:
        buf = np.zeros(size, dtype=np.uint8)
        reps = None
        times = []
        for i in range(3 + 200):
            if rank == 0:
                t0 = time.perf_counter()
                dist.send(buf, dst=1)
                dist.recv(buf, src=1)
                dt = time.perf_counter() - t0
                if i >= 3:
                    times.append(dt)
                if i == 3:  # decide the repetitions: ~0.05 s per size, 5..200
                    reps = int(max(5, min(200, 0.05 / max(dt, 1e-7))))
                stop = reps is not None and len(times) >= reps
                flag = np.array([1 if stop else 0], dtype=np.int8)
                dist.send(flag, dst=1)
                if stop:
                    break
            elif rank == 1:
                dist.recv(buf, src=0)
                dist.send(buf, dst=0)
                flag = np.zeros(1, dtype=np.int8)
                dist.recv(flag, src=0)
                if flag[0]:
                    break
        if rank == 0:
            res[size] = statistics.median(times) / 2
    dist.barrier()
    if rank == 0 and out_path:
        with open(out_path, "w") as fh:
            json.dump(res, fh)
    dist.destroy_process_group()


def calibrate(save: str | None = None, err: Any = None) -> dict[str, Any]:
    """Measure both transports and gamma; write JSON to ``save`` (``""``: default path)."""
    from ..launcher import LaunchConfig, launch
    from .runner import _environ

    err = err if err is not None else sys.stderr
    model: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="collcomm-calibrate-") as tmp:
        for transport in ("shm", "tcp"):
            out = os.path.join(tmp, f"{transport}.json")
            cfg = LaunchConfig(nproc=2, program="collcomm.tools.bench.calibrate",
                               args=["pingpong", out], module=True, prefix=False)
            with _environ({"COLLCOMM_TRANSPORT": transport}):
                code = launch(cfg)
            if code != 0 or not os.path.exists(out):
                print(f"# calibrate: {transport}: ping-pong failed (exit {code}); skipped", file=err)
                continue
            with open(out) as fh:
                pts = {int(k): float(v) for k, v in json.load(fh).items()}
            alpha, beta = fit_alpha_beta(list(pts), list(pts.values()))
            model[transport] = {"alpha": alpha, "beta": beta}
            for size, t in sorted(pts.items()):
                print(f"# calibrate {transport}: {size:>8d} B  one-way {t * 1e6:10.2f} us  "
                      f"fit {(alpha + beta * size) * 1e6:10.2f} us", file=err)
    model["gamma"] = measure_gamma()
    model["measured"] = (f"{datetime.datetime.now().isoformat(timespec='seconds')}, "
                         f"{platform.node()}, nproc {os.cpu_count()}")
    if save is not None:
        path = save or default_path()
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as fh:
            json.dump(model, fh, indent=1)
            fh.write("\n")
        model["saved_to"] = path
    return model


def format_model(model: dict[str, Any]) -> str:
    lines = ["# collcomm cost model: t(msg) = alpha + beta*bytes; reduce = gamma*bytes",
             f"# {'transport':<10}{'alpha(us)':>12}{'beta(ns/B)':>14}{'1/beta(GB/s)':>14}"]
    for tr in ("shm", "tcp"):
        if tr in model:
            a, b = model[tr]["alpha"], model[tr]["beta"]
            bw = f"{1 / b / 1e9:.2f}" if b > 0 else "inf"
            lines.append(f"  {tr:<10}{a * 1e6:>12.2f}{b * 1e9:>14.4f}{bw:>14}")
    g = model["gamma"]
    lines.append(f"  gamma: {g * 1e9:.4f} ns/B ({1 / g / 1e9:.2f} GB/s np.add)")
    lines.append(f"# measured: {model['measured']}")
    if "saved_to" in model:
        lines.append(f"# saved to {model['saved_to']}")
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "pingpong":
        pingpong(sys.argv[2] if len(sys.argv) > 2 else None)
    else:
        print(format_model(calibrate(sys.argv[1] if len(sys.argv) > 1 else None)))
