#!/usr/bin/env python3
"""Soak: many randomized, verified operations per transport (issue 9, Proof).

For each transport (``shm``: every pair on shared memory, the group's arena and the native
core where built; ``tcp``: ``COLLCOMM_TRANSPORT=tcp``) this runs ``--ops`` operations on
``-n`` ranks: all_reduce (sync and async), reduce, broadcast, all_gather, reduce_scatter,
all_to_all, gather, scatter, barrier and a send/recv ring, in one random sequence (the
same on every rank: one seed), with random dtypes (float64/32, int64/32/16, uint8), element
counts log-uniform in [1, ``--max-count``] and random roots. Every result is compared
exactly with the value computed locally. Each rank samples its RSS every 500 ops.

Criterion: 0 wrong results, every rank done, nothing left in /dev/shm, and RSS flat: the
growth from the sample at 10 % of the run to the end at most 4 MiB + 2 %.

    python tools/soak.py                       # 30,000 ops per transport, 4 ranks
    python tools/soak.py --ops 2000 --transports tcp --json soak.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tests import reliability_work as work  # noqa: E402


def soak(transport: str, n: int, ops: int, seed: int, max_count: int, timeout: float) -> dict:
    t0 = time.monotonic()
    outcomes, leaked = work.spawn(work.soak, n, ops, seed, max_count,
                                  env={"COLLCOMM_TRANSPORT": transport, "COLLCOMM_TIMEOUT": "120"},
                                  timeout=timeout)
    wall = time.monotonic() - t0
    ranks = []
    for o in outcomes:
        if not o.ok:
            ranks.append({"rank": o.rank, "ok": False, "error": f"{o.error_type}: {o.error[:400]}"})
            continue
        rss = o.value["rss"]
        warm = next((kib for i, kib in rss if i >= ops // 10), rss[0][1])
        end = rss[-1][1]
        ranks.append({"rank": o.rank, "ok": True, "ops": o.value["ops"], "wrong": o.value["wrong"][:5],
                      "n_wrong": len(o.value["wrong"]), "rss_start_kib": rss[0][1],
                      "rss_after_warmup_kib": warm, "rss_end_kib": end, "rss_growth_kib": end - warm,
                      "rss_max_kib": max(k for _, k in rss), "seconds": round(o.value["seconds"], 1),
                      "counts": o.value["counts"]})
    good = [r for r in ranks if r["ok"]]
    flat = all(r["rss_growth_kib"] <= 4096 + r["rss_after_warmup_kib"] * 0.02 for r in good)
    wrong = sum(r["n_wrong"] for r in good)
    return {"transport": transport, "ranks": n, "ops_per_rank": ops, "seed": seed,
            "max_count": max_count, "wall_s": round(wall, 1),
            "ops_per_s": round(ops / max(r["seconds"] for r in good), 1) if good else 0,
            "wrong": wrong, "ranks_ok": len(good), "leaked_segments": len(leaked), "rss_flat": flat,
            "per_rank": ranks,
            "pass": len(good) == n and wrong == 0 and flat and not leaked}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=4)
    ap.add_argument("--ops", type=int, default=30000, help="operations per transport (30000)")
    ap.add_argument("--transports", default="shm,tcp")
    ap.add_argument("--max-count", type=int, default=1 << 18, help="largest element count (262144)")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--timeout", type=float, default=1800.0, help="per transport, s")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args(argv)
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    results = {}
    for t in args.transports.split(","):
        r = results[t] = soak(t, args.n, args.ops, seed, args.max_count, args.timeout)
        per = r["per_rank"]
        print(f"{t}: {'PASS' if r['pass'] else 'FAIL'} {args.n} ranks x {args.ops} ops (seed {seed}), "
              f"wrong {r['wrong']}, ranks ok {r['ranks_ok']}/{args.n}, {r['ops_per_s']} ops/s, "
              f"wall {r['wall_s']} s, leaked {r['leaked_segments']}")
        for p in per:
            if p["ok"]:
                print(f"    rank {p['rank']}: RSS {p['rss_start_kib'] // 1024} MiB at start, "
                      f"{p['rss_after_warmup_kib'] // 1024} MiB after 10 %, {p['rss_end_kib'] // 1024} MiB "
                      f"at the end (growth {p['rss_growth_kib']} KiB), max {p['rss_max_kib'] // 1024} MiB")
            else:
                print(f"    rank {p['rank']}: {p['error']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0 if all(r["pass"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
