"""Rows, bandwidth factors and the printed tables (nccl-tests, OSU latency, side by side).

A *row* is a dict: ``lib op size count dtype redop root mode nproc time_us algbw busbw
wrong iters lat_avg_us lat_min_us lat_max_us error`` (``mode`` is ``"oop"`` or ``"ip"``;
``wrong`` is -1 when not checked; ``time_us`` None and ``error`` set when the library
could not run it). Everything here is pure formatting, testable without ranks.
"""
from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Sequence
from typing import Any

from .options import DTYPES

DTYPE_NAMES = DTYPES


def busbw_factor(op: str, n: int) -> float:
    """nccl-tests bus-bandwidth factor (SPEC.md section 5)."""
    if op == "barrier" or n < 1:
        return 0.0
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter"):
        return (n - 1) / n
    if op in ("broadcast", "reduce", "sendrecv"):
        return 1.0
    raise ValueError(f"unknown op {op!r}")


def bandwidths(op: str, size: int, n: int, time_us: float | None) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (1e9 bytes/s) for ``size`` bytes in ``time_us``."""
    if not time_us or time_us <= 0:
        return 0.0, 0.0
    algbw = size / (time_us * 1e-6) / 1e9
    return algbw, algbw * busbw_factor(op, n)


def make_row(*, lib: str, op: str, size: int, count: int, dtype: str, redop: str, root: int,
             mode: str, nproc: int, time_us: float | None, wrong: int = -1, iters: int = 0,
             lat_avg_us: float | None = None, lat_min_us: float | None = None,
             lat_max_us: float | None = None, error: str | None = None) -> dict[str, Any]:
    algbw, busbw = bandwidths(op, size, nproc, time_us)
    return dict(lib=lib, op=op, size=size, count=count, dtype=dtype, redop=redop, root=root,
                mode=mode, nproc=nproc, time_us=time_us, algbw=algbw, busbw=busbw,
                wrong=wrong, iters=iters, lat_avg_us=lat_avg_us, lat_min_us=lat_min_us,
                lat_max_us=lat_max_us, error=error)


def merge_rounds(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (lib, op, size, mode): times are medians over rounds, wrong the max,
    bandwidths recomputed from the median time; ``rounds`` says how many were merged."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in sorted(rows, key=lambda r: r.get("round", 0)):
        groups.setdefault((r["lib"], r["op"], r["size"], r["mode"]), []).append(r)
    out = []
    for rs in groups.values():
        ok = [r for r in rs if r.get("time_us") is not None]
        first = dict(rs[0])
        first.pop("facts", None)      # (the collcomm job's machine facts: a note, facts.py)
        if not ok:
            first["rounds"] = len(rs)
            out.append(first)
            continue

        def med(key: str) -> float | None:
            vals = [r[key] for r in ok if r.get(key) is not None]
            return statistics.median(vals) if vals else None

        merged = make_row(
            lib=first["lib"], op=first["op"], size=first["size"], count=first["count"],
            dtype=first["dtype"], redop=first["redop"], root=first["root"], mode=first["mode"],
            nproc=first["nproc"], time_us=med("time_us"),
            wrong=max(r["wrong"] for r in ok), iters=int(sum(r["iters"] for r in ok)),
            lat_avg_us=med("lat_avg_us"), lat_min_us=med("lat_min_us"),
            lat_max_us=med("lat_max_us"))
        merged["rounds"] = len(ok)
        merged["round_times_us"] = [r["time_us"] for r in ok]
        merged["round_ids"] = [r.get("round", 0) for r in ok]
        out.append(merged)
    return out


def ratio(collcomm_time_us: float | None, peer_time_us: float | None) -> float | None:
    """collcomm busbw / peer busbw = peer time / collcomm time (> 1: collcomm faster)."""
    if not collcomm_time_us or not peer_time_us:
        return None
    return peer_time_us / collcomm_time_us


def paired_ratio(cc: dict[str, Any], peer: dict[str, Any]) -> float | None:
    """The middle over rounds of (peer time / collcomm time) within each round both ran
    (the median of the ratios taken on a log scale: two rounds give their geometric mean),
    when the rows carry their rounds: a machine whose speed drifts slows both libraries of
    a round alike, while the ratio of two medians may pair a fast round with a slow one.
    Else the ratio of the two times."""
    ids_cc, ids_peer = cc.get("round_ids"), peer.get("round_ids")
    if ids_cc and ids_peer:
        mine = dict(zip(ids_cc, cc["round_times_us"]))
        pairs = [ratio(mine[i], t) for i, t in zip(ids_peer, peer["round_times_us"]) if i in mine]
        logs = [math.log(x) for x in pairs if x]
        if logs:
            return math.exp(statistics.median(logs))
    return ratio(cc.get("time_us"), peer.get("time_us"))


# --------------------------------------------------------------------------- nccl-tests table

def _time_str(t: float | None) -> str:
    if t is None:
        return "N/A"
    if t < 1e4:
        return f"{t:.2f}"
    if t < 1e5:
        return f"{t:.1f}"
    return f"{t:.0f}"


NCCL_HEADER = (
    "#                                                              out-of-place                       in-place          \n"
    "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n"
    "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)       ")


def _mode_cols(r: dict[str, Any] | None) -> str:
    if r is None or r.get("time_us") is None:
        return f"  {'N/A':>7}  {'N/A':>6}  {'N/A':>6}  {'N/A':>5}"
    wrong = "N/A" if r["wrong"] < 0 else str(r["wrong"])
    return f"  {_time_str(r['time_us']):>7}  {r['algbw']:6.2f}  {r['busbw']:6.2f}  {wrong:>5}"


def _by_key(rows: Iterable[dict[str, Any]]) -> dict[tuple[str, int], dict[str, dict[str, Any]]]:
    table: dict[tuple[str, int], dict[str, dict[str, Any]]] = {}
    for r in rows:
        table.setdefault((r["op"], r["size"]), {})[r["mode"]] = r
    return table


def format_table(rows: Sequence[dict[str, Any]], title: str | None = None) -> str:
    """nccl-tests style: one line per (op, size) with out-of-place and in-place columns,
    a ``# op`` line before each op, the ``# Avg bus bandwidth`` footer."""
    lines = [title] if title else []
    table = _by_key(rows)
    current = None
    busbws = []
    errors = []
    for (op, size), modes in table.items():
        if op != current:
            lines.append(f"# {op}")
            lines.append(NCCL_HEADER)
            current = op
        any_row = next(iter(modes.values()))
        dtype = DTYPES.get(any_row["dtype"], any_row["dtype"])
        lines.append(f"{size:12d}  {any_row['count']:12d}  {dtype:>8}  {any_row['redop']:>6}  "
                     f"{any_row['root']:6d}" + _mode_cols(modes.get("oop")) + _mode_cols(modes.get("ip")))
        for r in modes.values():
            if r.get("time_us") is not None:
                busbws.append(r["busbw"])
            elif r.get("error") and not r["error"].startswith("sendrecv has no in-place"):
                errors.append(f"# {r['lib']} {op} {r['mode']} {size}: {r['error']}")
    wrong = sum(r["wrong"] for r in rows if r.get("wrong", -1) > 0)
    checked = any(r.get("wrong", -1) >= 0 for r in rows)
    lines.extend(dict.fromkeys(errors))
    if checked:
        lines.append(f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}")
    avg = sum(busbws) / len(busbws) if busbws else 0.0
    lines.append(f"# Avg bus bandwidth    : {avg:.4g}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- OSU latency

OSU_HEADER = "# Size       Avg Latency(us)   Min Latency(us)   Max Latency(us)  Iterations"


def format_latency(rows: Sequence[dict[str, Any]], title: str | None = None) -> str:
    """OSU style, one block per (op, mode): Avg/Min/Max over ranks of per-rank mean."""
    lines = [title] if title else []
    blocks: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in rows:
        blocks.setdefault((r["lib"], r["op"], r["mode"]), []).append(r)
    for (lib, op, mode), rs in blocks.items():
        place = "in-place" if mode == "ip" else "out-of-place"
        lines.append(f"# {lib} {op} latency test ({place}, n={rs[0]['nproc']})")
        lines.append(OSU_HEADER)
        for r in rs:
            if r.get("lat_avg_us") is None:
                lines.append(f"{r['size']:<10d}{'N/A':>18}{'N/A':>18}{'N/A':>18}{0:>12d}")
                continue
            lines.append(f"{r['size']:<10d}{r['lat_avg_us']:>18.2f}{r['lat_min_us']:>18.2f}"
                         f"{r['lat_max_us']:>18.2f}{r['iters']:>12d}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- side by side

def compare_rows(rows: Sequence[dict[str, Any]], libs: Sequence[str]) -> list[dict[str, Any]]:
    """Per (op, mode, size): each lib's time/busbw and ratio vs every peer."""
    table: dict[tuple[str, str, int], dict[str, Any]] = {}
    for r in rows:
        key = (r["op"], r["mode"], r["size"])
        entry = table.setdefault(key, {"op": r["op"], "mode": r["mode"], "size": r["size"],
                                       "count": r["count"], "nproc": r["nproc"], "libs": {}})
        entry["libs"][r["lib"]] = r
    out = []
    for entry in table.values():
        cc = entry["libs"].get("collcomm", {})
        entry["ratios"] = {lib: paired_ratio(cc, entry["libs"].get(lib, {}))
                           for lib in libs if lib != "collcomm"}
        out.append(entry)
    return out


def format_compare(rows: Sequence[dict[str, Any]], libs: Sequence[str], rounds: int,
                   interleave: str = "size") -> str:
    """One table per (op, mode): size, count, per-lib time(us)/busbw, collcomm/peer ratios."""
    peers = [lib for lib in libs if lib != "collcomm"]
    checked = any(r.get("wrong", -1) >= 0 for r in rows)
    lines = []
    current = None
    for e in compare_rows(rows, libs):
        if (e["op"], e["mode"]) != current:
            current = (e["op"], e["mode"])
            place = "in-place" if e["mode"] == "ip" else "out-of-place"
            turns = ("libraries taking turns at each size" if interleave == "size"
                     else "whole sweeps alternated")
            lines.append(f"# {e['op']}  n={e['nproc']}  {place}  time = median over {rounds} "
                         f"round(s) ({turns}) of max-over-ranks median(op); "
                         f"ratio = median over rounds of peer time / collcomm time in the same round "
                         f"(>1: collcomm faster)")
            head = f"#{'size':>11}  {'count':>12}"
            for lib in libs:
                head += f"  {lib + '(us)':>13}  {'busbw':>6}"
            for p in peers:
                head += f"  {'cc/' + p:>9}"
            if checked:
                head += f"  {'#wrong':>8}"
            lines.append(head)
        line = f"{e['size']:12d}  {e['count']:12d}"
        for lib in libs:
            r = e["libs"].get(lib)
            if r is None or r.get("time_us") is None:
                line += f"  {'N/A':>13}  {'N/A':>6}"
            else:
                line += f"  {_time_str(r['time_us']):>13}  {r['busbw']:6.2f}"
        for p in peers:
            x = e["ratios"].get(p)
            line += f"  {'N/A' if x is None else f'{x:.2f}x':>9}"
        if checked:
            wrongs = [e["libs"].get(lib, {}).get("wrong", -1) for lib in libs]
            line += f"  {'/'.join('-' if w is None or w < 0 else str(w) for w in wrongs):>8}"
        lines.append(line)
    for lib in peers:
        errs = {r["error"] for r in rows if r["lib"] == lib and r.get("error")}
        for err in sorted(errs):
            lines.append(f"# {lib}: {err}")
    return "\n".join(lines)


def write_json(path: str, rows: Sequence[dict[str, Any]], meta: dict[str, Any]) -> None:
    with open(path, "w") as fh:
        json.dump({"meta": meta, "rows": list(rows)}, fh, indent=1)
        fh.write("\n")
