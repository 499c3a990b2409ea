#!/usr/bin/env python3
"""Fuzz the TCP frame decoder and the store protocol long (issue 9, Proof).

Runs tests/test_fuzz.py with ``COLLCOMM_FUZZ_EXAMPLES`` examples per property (random,
not the CI's fixed seed) under a hard timeout, and prints one line per property plus the
total. A crash, an exception escaping a decoder, a dead I/O or server thread or a hang
fails the property; a hang beyond ``--timeout`` kills the run (and counts as a failure).

    python tools/fuzz.py --examples 5000
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--examples", type=int, default=2000, help="examples per property (2000)")
    ap.add_argument("--timeout", type=float, default=1800.0, help="hard limit of the run, s")
    args = ap.parse_args(argv)
    env = dict(os.environ, COLLCOMM_FUZZ_EXAMPLES=str(args.examples), PYTHONPATH=ROOT)
    cmd = [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider",
           "-o", f"timeout={int(args.timeout)}", "tests/test_fuzz.py", "--hypothesis-show-statistics"]
    t0 = time.monotonic()
    try:
        out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=args.timeout + 60)
        text, rc = out.stdout + out.stderr, out.returncode
    except subprocess.TimeoutExpired as exc:
        text, rc = f"HANG: the run passed {args.timeout} s\n{exc.stdout or ''}", 1
    took = time.monotonic() - t0
    for line in text.splitlines():
        if re.match(r"^(PASSED|FAILED|ERROR) ", line) or "passing examples" in line \
                or re.match(r"^tests/test_fuzz.py::\w+:$", line) \
                or "Falsifying" in line or line.startswith(("HANG", "E  ")):
            print(line)
    print(f"examples per property: {args.examples}; {took:.0f} s; "
          f"{'PASS' if rc == 0 else 'FAIL'}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
