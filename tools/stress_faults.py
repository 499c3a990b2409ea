#!/usr/bin/env python3
"""Stress the fault tests under CPU load (issue 12). Not part of the normal CI run.

Runs the selected fault tests (default: the SIGKILL tests of tests/test_faults.py and the
rank-failure tests of tests/test_launcher.py, both transports) ``-n`` times while
busy-loop processes keep every core loaded. Each repetition is a fresh pytest process
with a hard timeout. A repetition counts as

* ``hang`` when ranks did not finish (the harness SIGUSR1s them and their stacks are in
  the output), pytest-timeout fired (it prints the stacks), or the hard timeout killed it;
* ``fail`` when a test failed otherwise;
* ``pass`` when every selected test passed.

Hangs and failures are printed with the stacks found in the output, and every
repetition's whole output is kept under ``--log-dir``. The last line is the summary.

    python tools/stress_faults.py -n 50 -k "sigkill_mid_all_reduce and 3-1-tcp or every_survivor and tcp"
"""
from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FILES = ["tests/test_faults.py", "tests/test_launcher.py"]
DEFAULT_K = "sigkill or stops_everything or stops_all or exit_code_propagates"
HANG_MARKS = ("ranks did not finish within", "+++ Timeout +++", "Failed: Timeout")


@dataclass
class Rep:
    index: int
    verdict: str          # pass | hang | fail
    seconds: float
    tests: int            # how many tests pytest reported (passed + failed + errors)
    log: str
    why: str = ""


def busy_loops(n: int) -> list[subprocess.Popen]:
    """``n`` processes spinning forever (killed by :func:`stop`)."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


def descendants(p: subprocess.Popen) -> list:
    """Every process pytest started (ranks run in their own sessions, so killpg misses them)."""
    try:
        import psutil

        return psutil.Process(p.pid).children(recursive=True)
    except Exception:  # noqa: BLE001 - psutil missing or the process already gone
        return []


def kill_tree(p: subprocess.Popen, kids: list) -> None:
    """Kill pytest and ``kids`` (collected before pytest could die and orphan them)."""
    for proc in kids:
        try:
            proc.kill()
        except Exception:  # noqa: BLE001 - already gone
            pass
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    p.wait()


def rank_outputs(kids: list) -> str:
    """The output files (with the SIGUSR1 stacks) of the hung ranks among ``kids``: the
    harness runs ``python -m tests.rank_main <dir>`` and the rank writes ``<dir>/out-<r>.txt``."""
    dirs = set()
    for proc in kids:
        try:
            cmd = proc.cmdline()
        except Exception:  # noqa: BLE001 - gone
            continue
        if "tests.rank_main" in cmd:
            dirs.add(cmd[-1])
    parts = []
    for d in sorted(dirs):
        for name in sorted(n for n in os.listdir(d) if n.startswith("out-")):
            with open(os.path.join(d, name), errors="replace") as f:
                parts.append(f"\n--- {d}/{name} ---\n{f.read()}")
    return "".join(parts)


def stuck_in(out: str) -> str:
    """Where the hung processes' main threads were, counted: per faulthandler "Current
    thread" block, the innermost frame in collcomm's core/transport/algorithms or in the
    tests (the store's socket helpers below them say little), else the innermost project
    frame; e.g. "3x collcomm/core/joinwatch.py:130 store_barrier"."""
    where: dict[str, int] = {}
    lines = out.splitlines()
    telling = ("collcomm/core/", "collcomm/transport/", "collcomm/algorithms/", "tests/")
    for i, line in enumerate(lines):
        if "Current thread" not in line:
            continue
        frames = []
        for frame in lines[i + 1:i + 80]:
            m = re.search(r'File "([^"]+)", line (\d+) in (\S+)', frame)
            if not m:
                break
            path = os.path.relpath(m.group(1), ROOT)
            if path.startswith(("collcomm/", "tests/")):
                frames.append(f"{path}:{m.group(2)} {m.group(3)}")
        if frames:
            key = next((f for f in frames if f.startswith(telling)), frames[0])
            where[key] = where.get(key, 0) + 1
    return ", ".join(f"{n}x {k}" for k, n in sorted(where.items(), key=lambda kv: -kv[1]))


def count_tests(out: str) -> int:
    tail = out.strip().splitlines()[-1] if out.strip() else ""
    return sum(int(n) for n, _ in re.findall(r"(\d+) (passed|failed|error)", tail))


def excerpt(out: str, limit: int = 400) -> str:
    """The failure sections of pytest's output (with the stacks), at most ``limit`` lines."""
    lines = out.splitlines()
    marks = ("= FAILURES =", "+++ Timeout", "Fatal Python error")
    start = next((i for i, line in enumerate(lines) if any(m in line for m in marks)), 0)
    chosen = lines[start:]
    if len(chosen) > limit:
        chosen = chosen[:limit // 2] + [f"... ({len(chosen) - limit} lines cut; see the log) ..."] + chosen[-limit // 2:]
    return "\n".join(chosen)


def run_once(i: int, args: argparse.Namespace) -> Rep:
    log = os.path.join(args.log_dir, f"rep-{i:03d}.txt")
    cmd = [sys.executable, "-X", "faulthandler", "-m", "pytest", "-q", "-p", "no:cacheprovider",
           "-rfE", *args.files, "-k", args.k]
    start = time.monotonic()
    with open(log, "w") as f:
        p = subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = p.wait(timeout=args.rep_timeout)
            hard = False
        except subprocess.TimeoutExpired:
            kids = descendants(p)
            for proc in kids:               # ranks: tests/rank_main.py dumps its stacks on SIGUSR1
                try:
                    proc.send_signal(signal.SIGUSR1)
                except Exception:  # noqa: BLE001 - already gone
                    pass
            p.send_signal(signal.SIGABRT)   # faulthandler: pytest's stacks into the log
            time.sleep(2)
            kill_tree(p, kids + descendants(p))
            f.write(rank_outputs(kids))
            rc, hard = -9, True
    seconds = time.monotonic() - start
    with open(log) as f:
        out = f.read()
    tests = count_tests(out)
    if hard:
        where = stuck_in(out)
        return Rep(i, "hang", seconds, tests, log, f"hard timeout ({args.rep_timeout:g} s): killed"
                   + (f"; stuck in: {where}" if where else ""))
    if rc == 5 or (rc == 0 and tests == 0):
        raise SystemExit(f"no test matched -k {args.k!r} in {args.files}")
    mark = next((m for m in HANG_MARKS if m in out), None)
    if mark:
        where = stuck_in(out)
        return Rep(i, "hang", seconds, tests, log, mark + (f"; stuck in: {where}" if where else ""))
    if rc != 0:
        failed = re.findall(r"^FAILED (\S+)", out, re.M)
        return Rep(i, "fail", seconds, tests, log, ", ".join(failed) or f"pytest exit code {rc}")
    return Rep(i, "pass", seconds, tests, log)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", "--reps", type=int, default=50, help="repetitions (default 50)")
    ap.add_argument("-k", default=DEFAULT_K, help=f"pytest -k expression (default {DEFAULT_K!r})")
    ap.add_argument("--files", nargs="+", default=FILES, help=f"test files (default {' '.join(FILES)})")
    ap.add_argument("--load", type=int, default=os.cpu_count() or 1,
                    help="busy-loop processes (default: one per CPU)")
    ap.add_argument("--rep-timeout", type=float, default=300.0,
                    help="hard timeout of one repetition, seconds (default 300)")
    ap.add_argument("--log-dir", default=None, help="where each repetition's output goes")
    args = ap.parse_args()
    args.log_dir = args.log_dir or f"/tmp/stress_faults-{time.strftime('%Y%m%d-%H%M%S')}"
    os.makedirs(args.log_dir, exist_ok=True)

    print(f"stress_faults: {args.reps} reps of {' '.join(args.files)} -k {args.k!r}; "
          f"{args.load} busy loops on {os.cpu_count()} CPUs; hard timeout {args.rep_timeout:g} s/rep; "
          f"logs in {args.log_dir}", flush=True)
    loops = busy_loops(args.load)
    reps: list[Rep] = []
    start = time.monotonic()
    try:
        for i in range(1, args.reps + 1):
            rep = run_once(i, args)
            reps.append(rep)
            note = f" — {rep.why}" if rep.why else ""
            print(f"rep {i}/{args.reps}: {rep.verdict} ({rep.tests} tests, {rep.seconds:.1f} s){note}",
                  flush=True)
            if rep.verdict != "pass":
                with open(rep.log) as f:
                    print(f"----- rep {i} ({rep.log}) -----\n{excerpt(f.read())}\n----- end of rep {i} -----",
                          flush=True)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    finally:
        stop(loops)
    total = time.monotonic() - start
    counts = {v: sum(r.verdict == v for r in reps) for v in ("pass", "hang", "fail")}
    tests = sum(r.tests for r in reps)
    print(f"SUMMARY: {len(reps)} reps ({tests} test runs) of -k {args.k!r} under {args.load} busy loops "
          f"on {os.cpu_count()} CPUs: {counts['pass']} passed, {counts['hang']} hung, {counts['fail']} failed; "
          f"{total:.0f} s total, {total / max(1, len(reps)):.1f} s/rep", flush=True)
    return 0 if reps and counts["pass"] == len(reps) == args.reps else 1


if __name__ == "__main__":
    sys.exit(main())
