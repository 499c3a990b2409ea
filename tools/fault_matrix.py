#!/usr/bin/env python3
"""Fault matrix for ``collcomm run``: inject one fault into one rank of a running job and
check what everyone did about it.

    python tools/fault_matrix.py --trials 20                      # every cell, shm and tcp
    python tools/fault_matrix.py --trials 5 --cells sigstop,skip --transports tcp
    python tools/fault_matrix.py --trials 20 --json out.json --markdown

Each trial launches ``python -m collcomm run -n 4 --grace 1`` on a program looping over
verified ``all_reduce`` calls; at iteration ``--at`` the victim rank (trial % n, so every
rank is the victim in turn) does the cell's fault:

    sigkill  os.kill(self, SIGKILL)          sigterm  os.kill(self, SIGTERM)
    sigstop  os.kill(self, SIGSTOP)          exit1    sys.exit(1)
    skip     skips that one all_reduce and carries on to the end
    stuck    sleeps (stuck in its own code) instead of calling all_reduce

Per trial it records: did every survivor raise (a collcomm error, caught in the program and
re-raised), which rank the launcher's summary names ("rank R (...) failed first"), the time
from the fault to the last survivor's raise (detection) and to the launcher's exit, the
launcher's exit code, processes of the job still alive after the launcher exited
(orphans), and ``/dev/shm/collcomm-<job>-*`` files left. Per cell it prints the aggregate.
Times come from ``time.monotonic()`` (one clock for every process of this machine).

Timeouts used (override with the environment): COLLCOMM_TIMEOUT=5 (what a stopped or stuck
rank costs the others over shared memory), COLLCOMM_HEARTBEAT_TIMEOUT=3 (TCP). Every trial
has a hard limit (--trial-timeout) after which everything of it is SIGKILLed and the trial
counts as a hang.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CELLS = ["sigkill", "sigterm", "sigstop", "exit1", "skip", "stuck"]
TRANSPORTS = ["shm", "tcp"]

PROGRAM = textwrap.dedent('''
    import json, os, signal, sys, time
    import numpy as np
    import collcomm as dist

    out, rank = os.environ["FM_DIR"], int(os.environ["RANK"])
    with open(f"{out}/pid-{rank}.json", "w") as f:
        json.dump({"pid": os.getpid(), "job": os.environ["COLLCOMM_JOB_ID"]}, f)
    dist.init_process_group()
    n = dist.get_world_size()
    fault, victim, at = os.environ["FM_FAULT"], int(os.environ["FM_VICTIM"]), int(os.environ["FM_AT"])
    x = np.empty(1024)
    expect = n * (n + 1) / 2
    try:
        for i in range(at + 30):
            if i == at and rank == victim:
                with open(f"{out}/fault.json", "w") as f:
                    json.dump({"t": time.monotonic()}, f)
                if fault == "sigkill":
                    os.kill(os.getpid(), signal.SIGKILL)
                elif fault == "sigterm":
                    os.kill(os.getpid(), signal.SIGTERM)
                elif fault == "sigstop":
                    os.kill(os.getpid(), signal.SIGSTOP)
                elif fault == "exit1":
                    sys.exit(1)
                elif fault == "skip":
                    continue
                elif fault == "stuck":
                    time.sleep(3600)
            x[:] = rank + 1
            dist.all_reduce(x)
            if not (x == expect).all():
                raise AssertionError(f"rank {rank}: wrong all_reduce result {x[:4]} at {i}")
        dist.barrier()
    except Exception as exc:
        with open(f"{out}/raised-{rank}.json", "w") as f:
            json.dump({"t": time.monotonic(), "type": type(exc).__name__,
                       "peer": getattr(exc, "peer", None), "message": str(exc)[:600]}, f)
        raise
    dist.destroy_process_group()
''')

_NAMED = re.compile(r"collcomm run: rank (\d+) \((?:pid \d+|on another node)\) failed first: (.*)")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            text = fh.read()
    except OSError:
        return False
    return text[text.rfind(")") + 2:].split(" ", 1)[0] != "Z"


def _load(path: str) -> dict[str, Any] | None:
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def run_trial(cell: str, transport: str, victim: int, n: int = 4, at: int = 20,
              trial_timeout: float = 60.0, env_extra: dict[str, str] | None = None
              ) -> dict[str, Any]:
    """One trial; returns what was observed (see the module docstring)."""
    with tempfile.TemporaryDirectory(prefix="collcomm-fm-") as tmp:
        prog = os.path.join(tmp, "prog.py")
        with open(prog, "w") as fh:
            fh.write(PROGRAM)
        env = dict(os.environ)
        for name in ("RANK", "WORLD_SIZE", "COLLCOMM_STORE", "COLLCOMM_TOKEN", "COLLCOMM_JOB_ID"):
            env.pop(name, None)
        env.setdefault("COLLCOMM_TIMEOUT", "5")
        env.setdefault("COLLCOMM_HEARTBEAT_TIMEOUT", "3")
        env.update({"FM_DIR": tmp, "FM_FAULT": cell, "FM_VICTIM": str(victim), "FM_AT": str(at),
                    "COLLCOMM_TRANSPORT": transport,
                    "PYTHONPATH": os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)})
        env.update(env_extra or {})
        launcher = subprocess.Popen(
            [sys.executable, "-m", "collcomm", "run", "-n", str(n), "--grace", "1", prog],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True)
        hung = False
        try:
            out, err = launcher.communicate(timeout=trial_timeout)
        except subprocess.TimeoutExpired:
            hung = True
            os.killpg(launcher.pid, signal.SIGKILL)
            out, err = launcher.communicate()
        t_exit = time.monotonic()
        pids = {r: _load(os.path.join(tmp, f"pid-{r}.json")) for r in range(n)}
        job = next((p["job"] for p in pids.values() if p), "")
        orphans = [p["pid"] for p in pids.values() if p and _alive(p["pid"])]
        for pid in orphans:  # never leave them running, even when counting them
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        segments = glob.glob(f"/dev/shm/collcomm-{job}-*") if job else []
        for path in segments:
            os.unlink(path)
        fault = _load(os.path.join(tmp, "fault.json"))
        raised = {r: _load(os.path.join(tmp, f"raised-{r}.json")) for r in range(n) if r != victim}
        match = _NAMED.search(err)
        t_fault = fault["t"] if fault else None
        raise_times = [v["t"] - t_fault for v in raised.values() if v and t_fault is not None]
        return {
            "cell": cell, "transport": transport, "victim": victim, "hung": hung,
            "exit_code": launcher.returncode,
            "faulted": fault is not None,
            "survivors_raised": all(v is not None for v in raised.values()),
            "survivor_errors": sorted({v["type"] for v in raised.values() if v}),
            "survivor_peers": [v.get("peer") for v in raised.values() if v],
            "named": int(match.group(1)) if match else None,
            "named_how": match.group(2) if match else None,
            "detect_s": max(raise_times) if raise_times and len(raise_times) == n - 1 else None,
            "launcher_exit_s": t_exit - t_fault if t_fault is not None else None,
            "orphans": len(orphans), "shm_left": len(segments),
            "stderr_tail": err.splitlines()[-12:] if match is None or hung else [],
        }


def _fmt(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.2f} / {max(values):.2f}"


def summarize(trials: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    keys = sorted({(t["transport"], t["cell"]) for t in trials},
                  key=lambda k: (TRANSPORTS.index(k[0]), CELLS.index(k[1])))
    for transport, cell in keys:
        ts = [t for t in trials if t["cell"] == cell and t["transport"] == transport]
        right = sum(t["named"] == t["victim"] for t in ts)
        rows.append({
            "transport": transport, "cell": cell, "trials": len(ts),
            "survivors_raised": sum(t["survivors_raised"] for t in ts),
            "named_right": right, "named_right_pct": 100.0 * right / len(ts),
            "detect_s": _fmt([t["detect_s"] for t in ts if t["detect_s"] is not None]),
            "launcher_exit_s": _fmt([t["launcher_exit_s"] for t in ts
                                     if t["launcher_exit_s"] is not None]),
            "exit_codes": sorted({t["exit_code"] for t in ts}),
            "hangs": sum(t["hung"] for t in ts),
            "orphans": sum(t["orphans"] for t in ts), "shm_left": sum(t["shm_left"] for t in ts),
            "survivor_errors": sorted({e for t in ts for e in t["survivor_errors"]}),
        })
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    head = ("| transport | fault | trials | survivors raised | launcher named the victim | "
            "detection s (median / max) | launcher exit s (median / max) | exit codes | "
            "hangs | orphans | /dev/shm left | survivors' errors |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    body = "".join(
        f"| {r['transport']} | {r['cell']} | {r['trials']} | {r['survivors_raised']}/{r['trials']} "
        f"| {r['named_right']}/{r['trials']} ({r['named_right_pct']:.0f} %) | {r['detect_s']} "
        f"| {r['launcher_exit_s']} | {', '.join(map(str, r['exit_codes']))} | {r['hangs']} "
        f"| {r['orphans']} | {r['shm_left']} | {', '.join(r['survivor_errors'])} |\n"
        for r in rows)
    return head + body


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=20, help="trials per cell (default 20)")
    p.add_argument("--cells", default=",".join(CELLS))
    p.add_argument("--transports", default=",".join(TRANSPORTS))
    p.add_argument("-n", type=int, default=4, help="ranks (default 4)")
    p.add_argument("--at", type=int, default=20, help="iteration of the fault (default 20)")
    p.add_argument("--trial-timeout", type=float, default=60.0)
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                   help="extra environment for every rank (repeatable), e.g. COLLCOMM_FR_SIZE=0")
    p.add_argument("--json", help="write every trial and the summary here")
    p.add_argument("--markdown", action="store_true", help="print the summary as a table")
    args = p.parse_args(argv)
    cells = [c for c in args.cells.split(",") if c]
    transports = [t for t in args.transports.split(",") if t]
    bad = [c for c in cells if c not in CELLS] + [t for t in transports if t not in TRANSPORTS]
    if bad:
        p.error(f"unknown cell/transport {bad}")
    extra = dict(item.split("=", 1) for item in args.env)
    trials: list[dict[str, Any]] = []
    started = time.monotonic()
    for i in range(args.trials):
        for transport in transports:
            for cell in cells:
                t = run_trial(cell, transport, victim=i % args.n, n=args.n, at=args.at,
                              trial_timeout=args.trial_timeout, env_extra=extra)
                trials.append(t)
                ok = (t["named"] == t["victim"] and t["survivors_raised"] and not t["hung"]
                      and not t["orphans"] and not t["shm_left"])
                print(f"[{time.monotonic() - started:7.1f}s] {transport:3s} {cell:7s} "
                      f"victim {t['victim']} named {t['named']} exit {t['exit_code']} "
                      f"detect {t['detect_s'] if t['detect_s'] is None else round(t['detect_s'], 3)} "
                      f"{'ok' if ok else 'WRONG'}", flush=True)
                if not ok and t["stderr_tail"]:
                    print("    " + "\n    ".join(t["stderr_tail"]), flush=True)
    rows = summarize(trials)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"trials": trials, "summary": rows,
                       "env": {**{k: os.environ.get(k) for k in
                                  ("COLLCOMM_TIMEOUT", "COLLCOMM_HEARTBEAT_TIMEOUT")}, **extra}},
                      fh, indent=1)
    print(markdown(rows) if args.markdown else json.dumps(rows, indent=1))
    return 0 if all(r["named_right"] == r["trials"] and r["hangs"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
