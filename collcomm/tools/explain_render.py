"""Drawing an explanation (see :mod:`collcomm.tools.explain`): terminal grids, an animated
self-contained HTML page, a static SVG."""
from __future__ import annotations

import html as _html
import json
from typing import Any


def frame_title(ex: dict[str, Any], f: dict[str, Any]) -> str:
    """The heading of one frame: ``initial state`` or ``step F of S``."""
    return "initial state" if f["frame"] == 0 else f"step {f['frame']} of {ex['steps']}"


def cell_kind(label: str, n: int) -> str:
    """How a cell is coloured: ``none`` (``·``), ``all`` (every rank's contribution) or
    ``some`` (as the HTML page's ``isFull``)."""
    if label == "·":
        return "none"
    full = n > 1 and "→" not in label and (label == "all" or len(label) >= min(n, 10))
    return "all" if full else "some"


def _fmt_time(s: float | None) -> str:
    return "n/a" if s is None else f"{s * 1e6:.1f} us"


def summary(ex: dict[str, Any]) -> str:
    """The figures beside the frames: bytes per rank against the cost model, times."""
    n, m = ex["n"], ex["model"]
    lines = [f"{ex['op']} with {ex['algorithm']} on {n} ranks, {ex['count']} int64 elements per "
             f"rank ({ex['count'] * ex['itemsize']} B), link {m['link']}"]
    steps = ex["steps"]
    lines.append(f"steps: {steps} (per rank: {ex['local_steps']}); messages sent per rank: "
                 f"{ex['messages']}" + (f"; arena syncs per rank: {ex['syncs']}" if any(ex["syncs"]) else ""))
    if m["formula"]:
        lines.append(f"formula: {m['formula']}")
    if m["rounds"] is not None:
        ok = "=" if round(m["rounds"]) == steps else "≠"
        lines.append(f"cost model rounds (α coefficient): {m['rounds']:g}  {ok} measured steps {steps}")
    sent = ex["bytes_sent"]
    lines.append(f"bytes sent per rank: {sent} (total {sum(sent)})")
    if ex["algorithm"] == "shm_direct":
        lines.append("(shm_direct sends no messages: every rank writes its arena slot, syncs, and "
                     "reads the others' slots; the dashed arrows are those reads)")
    if m["bytes_per_rank"] is not None:
        b = m["bytes_per_rank"]
        ok = "=" if abs(max(sent) - b) < 1e-9 else ("≈" if abs(max(sent) - b) <= ex["itemsize"] * n else "≠")
        lines.append(f"cost model bytes on the critical path (β coefficient): {b:g}  {ok} max "
                     f"measured {max(sent)}")
    else:
        lines.append("cost model: no formula for this family (it is chosen by topology, not by cost)")
    lines.append(f"time: α-β-γ estimate {_fmt_time(m['time_s'])}, measured {_fmt_time(ex['measured_time_s'])} "
                 f"(median of untraced runs, slowest rank; constants: {m['constants']['source']})")
    lines.append(f"final state: {ex['final_text']} — {'yes' if ex['final_ok'] else 'NO'}")
    return "\n".join(lines)


def terminal(ex: dict[str, Any]) -> str:
    """A grid per step: rows are ranks, columns chunks; ``*`` marks a cell that changed;
    below, the messages of the step (``r0 → r1  chunk 2 [01] 16 B``)."""
    out = []
    n = ex["n"]
    width = max([len(lab) for f in ex["frames"] for row in f["rows"] for lab in row["labels"]] + [3]) + 1
    for f in ex["frames"]:
        title = frame_title(ex, f)
        out.append(f"── {title} " + "─" * max(0, 40 - len(title)))
        for row in f["rows"]:
            changed = set(row.get("changed", []))
            cells = " ".join((lab + ("*" if i in changed else "")).ljust(width)
                             for i, lab in enumerate(row["labels"]))
            sync = "  (arena sync)" if row.get("sync") else ""
            out.append(f"  rank {row['rank']:>{len(str(n - 1))}} │ {cells}{sync}")
        for a in f["arrows"]:
            if a.get("read"):
                out.append(f"    r{a['to']} reads r{a['from']}'s arena slot  {a['bytes']} B")
                continue
            what = f"chunk {a['chunk']}" if a["chunk"] is not None else "scratch"
            content = f" [{a['label']}]" if a["label"] else ""
            out.append(f"    r{a['from']} → r{a['to']}  {what}{content}  {a['bytes']} B")
    out.append("")
    out.append(summary(ex))
    return "\n".join(out)


def html(ex: dict[str, Any]) -> str:
    """One self-contained page (no network): the frames animated, play/pause/step."""
    from .explain_template import PAGE as page

    data = json.dumps(ex).replace("</", "<\\/")
    title = f"collcomm explain: {ex['op']} / {ex['algorithm']} on {ex['n']} ranks"
    return (page.replace("__TITLE__", _html.escape(title))
                .replace("__SUMMARY__", _html.escape(summary(ex)))
                .replace("__DATA__", data))


def svg(ex: dict[str, Any]) -> str:
    """Every frame stacked vertically in one SVG."""
    n = ex["n"]
    cols = max(len(r["labels"]) for f in ex["frames"] for r in f["rows"]) or 1
    cw, ch, left, gap = 46, 22, 70, 34
    panel = n * ch + gap + 20
    width = left + cols * cw + 40
    height = panel * len(ex["frames"]) + 20
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'font-family="monospace" font-size="12">',
             f'<rect width="{width}" height="{height}" fill="white"/>']
    for fi, f in enumerate(ex["frames"]):
        y0 = fi * panel + 20
        title = frame_title(ex, f)
        parts.append(f'<text x="4" y="{y0 - 4}" font-weight="bold">{_html.escape(title)}</text>')
        for row in f["rows"]:
            y = y0 + row["rank"] * ch
            parts.append(f'<text x="4" y="{y + 15}">rank {row["rank"]}</text>')
            changed = set(row.get("changed", []))
            for i, lab in enumerate(row["labels"]):
                x = left + i * cw
                fill = {"all": "#4caf50", "some": "#cfe8ff", "none": "#f2f2f2"}[cell_kind(lab, n)]
                stroke = "#d32f2f" if i in changed else "#888"
                parts.append(f'<rect x="{x}" y="{y}" width="{cw - 4}" height="{ch - 4}" fill="{fill}" '
                             f'stroke="{stroke}"/>')
                parts.append(f'<text x="{x + 3}" y="{y + 13}">{_html.escape(lab)}</text>')
        for a in f["arrows"]:
            ya, yb = y0 + a["from"] * ch + 9, y0 + a["to"] * ch + 9
            x = left + cols * cw + 8 + (a["from"] % 4) * 6
            parts.append(f'<path d="M{x},{ya} C{x + 24},{ya} {x + 24},{yb} {x},{yb}" fill="none" '
                         f'stroke="#1565c0" stroke-width="1.2" marker-end="url(#h)"/>')
    parts.insert(2, '<defs><marker id="h" markerWidth="6" markerHeight="6" refX="5" refY="3" '
                    'orient="auto"><path d="M0,0 L6,3 L0,6 z" fill="#1565c0"/></marker></defs>')
    parts.append("</svg>")
    return "\n".join(parts)
