"""``--plot F.png``: bus bandwidth vs size, one line per library, one panel per op/mode."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def plot_busbw(rows: Sequence[dict[str, Any]], path: str) -> str | None:
    """Draw ``rows`` into ``path``; return a one-line message if it could not."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "collcomm bench: --plot needs matplotlib (pip install 'collcomm[plot]'); no plot written"
    panels: dict[tuple[str, str], dict[str, list[tuple[int, float]]]] = {}
    for r in rows:
        if r.get("time_us") is None or r["op"] == "barrier":
            continue
        panels.setdefault((r["op"], r["mode"]), {}).setdefault(r["lib"], []).append(
            (r["size"], r["busbw"]))
    if not panels:
        return "collcomm bench: nothing to plot"
    k = len(panels)
    cols = min(3, k)
    nrows = (k + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(5.5 * cols, 4 * nrows), squeeze=False)
    for ax, ((op, mode), libs) in zip(axes.flat, panels.items()):
        for lib, pts in libs.items():
            pts.sort()
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, label=lib)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("size (bytes)")
        ax.set_ylabel("busbw (GB/s)")
        n = next(r["nproc"] for r in rows)
        ax.set_title(f"{op} ({'in-place' if mode == 'ip' else 'out-of-place'}), n={n}")
        ax.grid(True, alpha=0.3)
        ax.legend()
    for ax in list(axes.flat)[k:]:
        ax.set_visible(False)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return None
