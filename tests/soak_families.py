"""Soak: repeat a sequence of tests/test_families.py (default ``alternating``) on ranks of
one host until a case fails or the rounds run out: the way to reproduce a rare race
that one suite run only hits now and then.

    python -m tests.soak_families --ranks 5 --reps 10 --rounds 14 [--sequence alternating]

Each round is one job (``tests.harness.run_ranks``, shared memory) running the sequence
``--reps`` times per rank; it stops at the first round with a failure and prints them.
Races need ranks descheduled mid-call: run two soaks at once and a busy loop beside them
on a 2-core machine (session 7 found the pooled-staging race that way: about one wrong
result per 100-200 repetitions of ``alternating`` at 5 ranks before the fix).
Not collected by pytest (no ``test_`` prefix).
"""
from __future__ import annotations

import argparse
import time
from typing import Any


def soak_rank(sequence: str, reps: int) -> dict[str, Any]:
    """One rank: the sequence ``reps`` times, stopping at the first failure."""
    import collcomm.core.runtime as rt
    import tests.test_families as families

    ctx = families.Ctx(rt.get_world("soak"), "shm")
    run = families.SEQUENCES[sequence]
    done = 0
    while done < reps and not ctx.failures:
        run(ctx)
        done += 1
    return {"failures": ctx.failures[:8], "reps": done}


def main() -> int:
    from tests.harness import run_ranks
    from tests.soak_families import soak_rank as rank_fn   # by its module's name, not __main__'s

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=5)
    ap.add_argument("--reps", type=int, default=10, help="repetitions per job")
    ap.add_argument("--rounds", type=int, default=10, help="jobs, one after the other")
    ap.add_argument("--sequence", default="alternating")
    a = ap.parse_args()
    start, total = time.monotonic(), 0
    for _ in range(a.rounds):
        res = run_ranks(rank_fn, a.ranks, a.sequence, a.reps, transport="shm",
                        timeout=600, env={"COLLCOMM_TIMEOUT": "30"})
        total += min(r["reps"] for r in res)
        bad = [f for r in res for f in r["failures"]]
        if bad:
            print(f"FAILED after {total} repetitions ({time.monotonic() - start:.0f} s):")
            for f in bad:
                print("  ", f)
            return 1
    print(f"ok: {total} repetitions of {a.sequence!r} on {a.ranks} ranks, "
          f"{time.monotonic() - start:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
