"""``collcomm trace analyze DIR`` and ``collcomm trace merge DIR``.

``analyze`` reads the flight-recorder dumps ``rank<R>.json`` that the ranks of a job wrote
to ``DIR`` (``COLLCOMM_FR_DIR``: on a timeout, a lost peer, a mismatch or SIGUSR1; they
stay after a crash) and prints the cross-rank picture per group: the last call each rank
entered, the first sequence number at which the ranks diverge (a rank never entered it,
or entered a different call), which ranks are behind, and the calls at that number side
by side with their file:line.

``merge`` joins the per-rank Chrome trace files ``trace-rank<R>.json`` that
``COLLCOMM_TRACE=DIR`` wrote (timestamps already on rank 0's clock, see
:mod:`collcomm.core.tracing`) into one ``DIR/trace.json`` for Perfetto or chrome://tracing.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys
from typing import Any

__all__ = ["analyze", "format_analysis", "load_dumps", "merge", "main", "launcher_summary"]


def load_dumps(folder: str) -> dict[int, dict[str, Any]]:
    """rank -> its dump (files that do not parse are skipped, with a note on stderr)."""
    dumps: dict[int, dict[str, Any]] = {}
    for path in sorted(glob.glob(os.path.join(folder, "rank*.json"))):
        m = re.fullmatch(r"rank(\d+)\.json", os.path.basename(path))
        if not m:
            continue
        try:
            with open(path) as f:
                dumps[int(m.group(1))] = json.load(f)
        except (OSError, ValueError) as exc:
            print(f"collcomm trace: skipping {path}: {exc}", file=sys.stderr)
    return dumps


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a["op"] == b["op"] and (not a.get("sig") or not b.get("sig") or a["sig"] == b["sig"])


def analyze(folder: str) -> dict[str, Any]:
    """The cross-rank picture of the dumps in ``folder`` (see the module docstring)."""
    dumps = load_dumps(folder)
    world = max([d.get("world_size", 1) for d in dumps.values()] + [len(dumps)])
    # ranks that left no dump: what a failing rank learnt of them through the store
    partial: dict[int, dict[str, Any]] = {}
    for d in dumps.values():
        for r, st in d.get("peer_states", {}).items():
            r = int(r)
            if r in dumps or r in partial:
                continue
            entries = [dict(e, ctx=int(key, 16)) for key, g in st.get("groups", {}).items()
                       for e in g.get("recent", [])]
            partial[r] = {"rank": r, "reason": "no dump; its last calls as it told rank "
                          f"{d.get('rank')} through the store", "entries": entries,
                          "groups": {k: {"name": g["name"], "ranks": g["ranks"]}
                                     for k, g in st.get("groups", {}).items()}}
    groups: dict[str, dict[str, Any]] = {}
    for rank, d in dumps.items():
        for key, g in d.get("groups", {}).items():
            groups.setdefault(key, {"name": g["name"], "ranks": g["ranks"]})
    result: dict[str, Any] = {"folder": folder, "ranks": sorted(dumps), "world_size": world,
                              "missing_dumps": [r for r in range(world) if r not in dumps],
                              "reasons": {r: d.get("reason", "") for r, d in dumps.items()},
                              "groups": []}
    for r, d in partial.items():
        result["reasons"][r] = d["reason"]
    result["silent"] = [r for r in result["missing_dumps"] if r not in partial]
    dumps = {**dumps, **partial}
    for key, g in groups.items():
        calls: dict[int, dict[int, dict[str, Any]]] = {}
        for rank, d in dumps.items():
            if rank not in g["ranks"]:
                continue
            calls[rank] = {e["seq"]: e for e in d.get("entries", [])
                           if e.get("ctx") is not None and f"{e['ctx']:x}" == key and "peer" not in e}
        present = [r for r in g["ranks"] if r in calls]
        if not any(calls[r] for r in present):
            continue
        last = {r: max(calls[r]) if calls[r] else 0 for r in present}
        first = {r: min(calls[r]) if calls[r] else 0 for r in present}
        lo = max([first[r] for r in present if calls[r]] + [1])
        hi = max(last.values())
        divergent = None
        for seq in range(lo, hi + 1):
            at = [calls[r].get(seq) for r in present]
            if any(e is None for e in at) or any(not _same(at[0], e) for e in at[1:]):   # type: ignore[arg-type]
                divergent = seq
                break
        behind = sorted(r for r in present if last[r] < hi)
        side = []
        if divergent is not None:
            for r in g["ranks"]:
                if r not in calls:
                    side.append({"rank": r, "text": "no dump and no answer (dead, killed, or gone)"})
                    continue
                e = calls[r].get(divergent)
                if e is not None:
                    side.append({"rank": r, "entry": e,
                                 "text": f"{e['call']} at {e['where']} [{e['state']}]"})
                else:
                    prev = calls[r].get(last[r])
                    side.append({"rank": r, "entry": None, "text":
                                 f"never entered; last: #{last[r]} {prev['call']} at {prev['where']} "
                                 f"[{prev['state']}]" if prev else "never entered; no calls recorded"})
        result["groups"].append({
            "key": key, "name": g["name"], "ranks": g["ranks"], "last_entered": last,
            "last_state": {r: calls[r][last[r]]["state"] for r in present if calls[r]},
            "first_divergent": divergent, "behind": behind, "side_by_side": side})
    return result


def format_analysis(a: dict[str, Any]) -> str:
    lines = [f"flight recorder dumps in {a['folder']}: ranks {a['ranks']} of {a['world_size']}"]
    if a.get("silent"):
        lines.append(f"  nothing from ranks {a['silent']} (no dump, no answer through the store: "
                     "dead, or killed before dumping)")
    for r, why in sorted(a["reasons"].items()):
        lines.append(f"  rank {r}: {why}")
    if not a["groups"]:
        lines.append("no collective calls recorded")
    for g in a["groups"]:
        lines.append(f"group {g['name']} (ranks {g['ranks']}):")
        lines.append("  last entered: " + ", ".join(
            f"rank {r} #{s} ({g['last_state'].get(r, '-')})" for r, s in sorted(g["last_entered"].items())))
        if g["first_divergent"] is None:
            lines.append("  all ranks made the same calls (no divergence in the recorded window)")
            continue
        lines.append(f"  first divergent call: #{g['first_divergent']}")
        if g["behind"]:
            lines.append(f"  behind: ranks {g['behind']}")
        width = max(len(str(x["rank"])) for x in g["side_by_side"])
        for x in g["side_by_side"]:
            lines.append(f"    rank {x['rank']:>{width}}: {x['text']}")
    return "\n".join(lines)


def launcher_summary(folder: str) -> str | None:
    """What ``collcomm run`` prints once after a failed job (None when there are no dumps)."""
    if not folder or not glob.glob(os.path.join(folder, "rank*.json")):
        return None
    return format_analysis(analyze(folder))


# ------------------------------------------------------------------------------ merge
def merge(folder: str, out: str | None = None) -> str:
    """Join ``trace-rank*.json`` in ``folder`` into one file (default ``folder/trace.json``)."""
    events: list[Any] = []
    for path in sorted(glob.glob(os.path.join(folder, "trace-rank*.json"))):
        with open(path) as f:
            events.extend(json.load(f).get("traceEvents", []))
    out = out or os.path.join(folder, "trace.json")
    with open(out + ".tmp", "w") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ns"}, f)
    os.replace(out + ".tmp", out)
    return out


# ------------------------------------------------------------------------------ command
def add_command(subparsers: Any) -> None:
    """``collcomm trace analyze DIR`` / ``collcomm trace merge DIR`` (for tools/cli.py)."""
    p = subparsers.add_parser("trace", help="analyze flight-recorder dumps, merge traces",
                              description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="trace_command", required=True, metavar="action")
    a = sub.add_parser("analyze", help="cross-rank picture of the flight-recorder dumps in DIR")
    a.add_argument("dir", help="the dump folder (COLLCOMM_FR_DIR)")
    a.add_argument("--json", action="store_true", help="print the analysis as JSON")
    m = sub.add_parser("merge", help="merge per-rank Chrome traces of DIR into DIR/trace.json")
    m.add_argument("dir")
    m.add_argument("-o", "--out", default=None)
    p.set_defaults(func=run_command)


def run_command(args: argparse.Namespace) -> int:
    if args.trace_command == "merge":
        print(merge(args.dir, args.out))
        return 0
    if not glob.glob(os.path.join(args.dir, "rank*.json")):
        print(f"collcomm trace analyze: no flight-recorder dumps (rank*.json) in {args.dir}",
              file=sys.stderr)
        return 1
    a = analyze(args.dir)
    print(json.dumps(a, indent=1) if args.json else format_analysis(a))
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m collcomm.tools.trace analyze|merge DIR`` (what ``collcomm trace`` runs)."""
    parser = argparse.ArgumentParser(prog="collcomm")
    add_command(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["trace", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
