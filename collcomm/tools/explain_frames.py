"""The frames of ``collcomm explain``: from every rank's recorded steps to one timeline.

:func:`build` aligns the ranks' local steps into global frames (a step that receives a
message is not earlier than the step that sent it: a fixed point over the sends and
receives), labels every cell with the ranks whose contributions it holds (rank r
contributes ``2**r``), checks the last frame against the collective's expected result, and
adds the α-β cost model's figures and the text the page shows beside the algorithm.
"""
from __future__ import annotations

from typing import Any

__all__ = ["FINAL_TEXT", "FORMULA_TEXT", "build", "expected_final", "label"]


def _global_steps(ranks: list[dict[str, Any]]) -> dict[tuple[int, int], int]:
    """Frame of each (rank, local step): not before the rank's previous step + 1, not
    before the step that sent any message it receives (fixed point)."""
    g = {(r["rank"], s): s for r in ranks for s in range(1, r["steps"] + 1)}
    sent = {m["flow"]: (r["rank"], m["step"]) for r in ranks for m in r["msgs"] if m["kind"] == "send"}
    recvs = [((r["rank"], m["step"]), sent.get(m["flow"])) for r in ranks for m in r["msgs"]
             if m["kind"] == "recv"]
    for _ in range(1000):
        changed = False
        for r in ranks:
            for s in range(2, r["steps"] + 1):
                if g[(r["rank"], s)] < g[(r["rank"], s - 1)] + 1:
                    g[(r["rank"], s)] = g[(r["rank"], s - 1)] + 1
                    changed = True
        for at, src in recvs:
            if src is not None and src in g and g[at] < g[src]:
                g[at] = g[src]
                changed = True
        if not changed:
            break
    return g


def label(op: str, value: int, n: int) -> str:
    """What a cell shows: the ranks whose contributions it holds (digits; ``·`` none)."""
    if op == "all_to_all":
        return "·" if value <= 0 else f"{(value - 1) // n}→{(value - 1) % n}"
    if op == "broadcast":
        return "■" if value else "·"
    if value <= 0:
        return "·"
    bits = [i for i in range(n) if value >> i & 1]
    if len(bits) == n and n > 1:
        return "all" if n > 10 else "".join(str(b) for b in bits)
    if n <= 10:
        return "".join(str(b) for b in bits)
    return f"{len(bits)}r"


def expected_final(op: str, n: int, rank: int, chunks: int) -> list[int] | None:
    full = (1 << n) - 1
    if op in ("all_reduce",):
        return [full] * chunks
    if op == "reduce_scatter":
        return [full]
    if op == "reduce":
        return [full] * chunks if rank == 0 else None
    if op == "broadcast":
        return [1] * chunks
    if op == "all_gather":
        return [1 << j for j in range(n)]
    if op == "gather":
        return [1 << j for j in range(n)] if rank == 0 else None
    if op == "scatter":
        return [1 << rank]
    if op == "all_to_all":
        return [j * n + rank + 1 for j in range(n)]
    return None


def build(op: str, algo: str, n: int, count: int, ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """Frames, per-rank bytes and the cost model's figures from the ranks' records."""
    from ..algorithms import cost

    ranks = sorted(ranks, key=lambda r: r["rank"])
    g = _global_steps(ranks)
    n_frames = max(g.values(), default=0)
    frames = []
    for f in range(0, n_frames + 1):
        rows, arrows = [], []
        for r in ranks:
            rid = r["rank"]
            done = max([s for s in range(1, r["steps"] + 1) if g[(rid, s)] <= f] + [0])
            # the state when local step `done` ended (snapshots are labelled by that step)
            snap = [s for s in r["snaps"] if s["step"] <= done][-1]
            rows.append({"rank": rid, "cells": snap["cells"],
                         "labels": [label(op, v, n) for v in snap["cells"]]})
            if f:
                for m in r["msgs"]:
                    if m["kind"] == "send" and g.get((rid, m["step"])) == f:
                        arrows.append({"from": rid, "to": m["peer"], "bytes": m["bytes"],
                                       "chunk": m["chunk"],
                                       "label": label(op, m.get("value", 0), n) if m.get("value") is not None else ""})
                seen = set()
                for rd in r.get("reads", []):       # shm_direct: reads of a peer's arena slot
                    if g.get((rid, rd["step"])) == f and rd["from"] not in seen:
                        seen.add(rd["from"])
                        arrows.append({"from": rd["from"], "to": rid, "bytes": rd["bytes"],
                                       "chunk": None, "label": "", "read": True})
                syncs = sum(1 for s in r["syncs"] if g.get((rid, s["step"])) == f)
                if syncs:
                    rows[-1]["sync"] = True
        # cells that changed since the previous frame
        if frames:
            for row, prev in zip(rows, frames[-1]["rows"]):
                row["changed"] = [i for i, (a, b) in enumerate(zip(row["cells"], prev["cells"])) if a != b]
        frames.append({"frame": f, "rows": rows, "arrows": arrows})
    final_ok = True
    for row in frames[-1]["rows"] if frames else []:
        want = expected_final(op, n, row["rank"], len(row["cells"]))
        if want is not None and row["cells"] != want:
            final_ok = False
    sent = [sum(m["bytes"] for m in r["msgs"] if m["kind"] == "send") for r in ranks]
    itemsize = 8
    k_bytes = count * itemsize
    model_bytes = {"all_reduce": k_bytes, "broadcast": k_bytes, "reduce": k_bytes}.get(op, n * k_bytes)
    link = ranks[0]["link"] if ranks else "shm"
    m = cost.active()
    rounds = cost._formulas(n, model_bytes, 1.0, 0.0, 0.0).get(op, {}).get(algo)
    per_rank = cost._formulas(n, model_bytes, 0.0, 1.0, 0.0).get(op, {}).get(algo)
    predicted = cost.predict(op, algo, n, model_bytes, link if link in m.alpha else "tcp")
    times = sorted(max(r["times"][i] for r in ranks) for i in range(len(ranks[0]["times"]))) if ranks and ranks[0]["times"] else []
    measured = times[len(times) // 2] if times else None
    return {"op": op, "algorithm": algo, "n": n, "count": count, "itemsize": itemsize,
            "model_bytes": model_bytes, "frames": frames, "steps": n_frames,
            "local_steps": [r["steps"] for r in ranks], "bytes_sent": sent,
            "messages": [sum(1 for m in r["msgs"] if m["kind"] == "send") for r in ranks],
            "syncs": [len(r["syncs"]) for r in ranks],
            "model": {"rounds": rounds, "bytes_per_rank": per_rank, "time_s": predicted,
                      "formula": FORMULA_TEXT.get((op, algo)), "link": link,
                      "constants": {"alpha": m.alpha, "beta": m.beta, "gamma": m.gamma,
                                    "source": m.source}},
            "measured_time_s": measured, "final_ok": final_ok,
            "final_text": FINAL_TEXT.get(op, "")}


#: the seeds' formulas, as text (rounds; bytes sent per rank), mirroring algorithms/cost.py
FORMULA_TEXT = {
    ("all_reduce", "ring"): "2(N−1) rounds; 2(N−1)/N·K bytes per rank",
    ("all_reduce", "tree"): "2⌈log2 N⌉ rounds (reduce + broadcast); K per edge",
    ("all_reduce", "recursive_doubling"): "⌈log2 N⌉ (+2 fold/unfold) rounds; K per round",
    ("all_reduce", "rabenseifner"): "2⌈log2 N⌉ (+2) rounds; 2(N−1)/N·K (+2K fold) bytes",
    ("all_reduce", "linear"): "2(N−1) messages at the root; (N−1)·K bytes from the root",
    ("all_gather", "ring"): "N−1 rounds; (N−1)·k bytes per rank",
    ("all_gather", "recursive_doubling"): "⌈log2 N⌉ (+2) rounds; (N−1)·k bytes",
    ("all_gather", "bruck"): "⌈log2 N⌉ rounds; (N−1)·k bytes",
    ("all_gather", "linear"): "2(N−1) rounds (gather + broadcast)",
    ("reduce_scatter", "ring"): "N−1 rounds; (N−1)·k bytes per rank",
    ("reduce_scatter", "recursive_halving"): "⌈log2 N⌉ (+2) rounds; (N−1)·k bytes",
    ("reduce_scatter", "linear"): "reduce to 0 + scatter",
    ("broadcast", "tree"): "⌈log2 N⌉ rounds; K per edge",
    ("broadcast", "linear"): "N−1 sends of K from the root",
    ("reduce", "tree"): "⌈log2 N⌉ rounds; K per edge",
    ("reduce", "linear"): "N−1 receives of K at the root",
    ("gather", "tree"): "⌈log2 N⌉ rounds", ("gather", "linear"): "N−1 receives at the root",
    ("scatter", "tree"): "⌈log2 N⌉ rounds", ("scatter", "linear"): "N−1 sends from the root",
    ("all_to_all", "pairwise"): "N−1 rounds; (N−1)·k bytes per rank",
    ("all_to_all", "bruck"): "⌈log2 N⌉ rounds; ≈ k·N/2·log2 N bytes per rank",
    ("all_to_all", "linear"): "all receives and sends posted at once",
    ("barrier", "dissemination"): "⌈log2 N⌉ rounds of empty messages",
    ("barrier", "linear"): "2(N−1) empty messages via rank 0",
}
FINAL_TEXT = {
    "all_reduce": "every rank holds the sum of all ranks in every chunk",
    "reduce": "rank 0 holds the sum of all ranks",
    "reduce_scatter": "rank i holds the full sum of block i",
    "all_gather": "every rank holds block j from rank j",
    "gather": "rank 0 holds block j from rank j",
    "scatter": "rank j holds the root's block j",
    "broadcast": "every rank holds the root's data",
    "all_to_all": "rank i holds in block j what rank j sent to i",
    "barrier": "nobody left before everybody arrived",
}
