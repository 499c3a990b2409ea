#!/usr/bin/env python3
"""Rendezvous and store under abuse (issue 9, item 4): the figures of RELIABILITY.md.

1. **init under a flood**: a TCP job of ``-n`` ranks (env://, rank 0 hosts the store);
   once rank 0's store and transport listener are up, ``--idle`` connections to each are
   opened and left idle (plus ``--half`` that send half a hello and stop), then the other
   ranks start. Their ``init_process_group`` time is compared with the same sequence
   without the flood, ``--reps`` times each. Criterion: median delay <= 1 s, every rank's
   all_reduce right.
2. **the store under a flood**: a TCPStoreServer gets ``--idle`` idle, ``--half``
   half-open and ``--garbage`` garbage connections; a client then connects and does
   set/get/add: its latency, the server's thread count (one thread, whatever the number
   of connections), and the server alive after the flood.
3. **the store out of file descriptors**: a TCPStoreServer in a process limited to 64
   descriptors is flooded with 300 connections (accept fails with EMFILE); after the
   flood a client must still be served.

    python tools/abuse.py                 # all three, default sizes
    python tools/abuse.py --reps 5 --idle 200 --half 50 --json abuse.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tests import reliability_work as work  # noqa: E402


def init_flood(n: int, idle: int, half: int, reps: int) -> dict:
    """Section 1: init time of ranks 1.. with and without the flood, alternating."""
    base, flood, errors = [], [], []
    for _ in range(reps):
        for count, into in ((0, base), (idle, flood)):
            r = work.abused_init(n, count, half if count else 0)
            if not r["ok"]:
                errors.append(r["errors"])
            into.append(max(t for t in r["init"][1:] if t is not None) if all(
                t is not None for t in r["init"][1:]) else float("inf"))
    delay = statistics.median(flood) - statistics.median(base)
    return {"ranks": n, "idle": idle, "half_open": half, "reps": reps,
            "init_s_without": [round(x, 3) for x in base], "init_s_with": [round(x, 3) for x in flood],
            "median_delay_s": round(delay, 3), "wrong_or_failed": len(errors), "errors": errors[:3],
            "pass": delay <= 1.0 and not errors}


def store_flood(idle: int, half: int, garbage: int) -> dict:
    """Section 2: a client's latency against a flooded store; thread count; alive after."""
    from collcomm.rendezvous import TCPStore, TCPStoreServer

    token = os.urandom(16)
    threads_before = threading.active_count()
    server = TCPStoreServer("127.0.0.1", 0, token=token, auth_timeout=30.0)
    try:
        flood = work.Flood("127.0.0.1", server.port, idle + half + garbage, half=half, garbage=garbage)
        time.sleep(0.5)                               # the server has seen them all
        threads = threading.active_count() - threads_before
        t0 = time.monotonic()
        client = TCPStore("127.0.0.1", server.port, token=token, timeout=10.0)
        client.set("k", b"v")
        got = client.get("k")
        n = client.add("c", 5)
        latency = time.monotonic() - t0
        flood.close()
        time.sleep(0.2)
        client.set("after", b"1")
        again = TCPStore("127.0.0.1", server.port, token=token, timeout=10.0)
        alive = again.get("after") == b"1" and server._thread.is_alive()
        again.close()
        client.close()
    finally:
        server.close()
    return {"idle": idle, "half_open": half, "garbage": garbage, "refused": flood.refused,
            "server_threads": threads, "client_connect_set_get_add_s": round(latency, 3),
            "answers_right": got == b"v" and n == 5, "alive_after": alive,
            "pass": latency <= 1.0 and got == b"v" and n == 5 and alive and threads == 1}


_SERVER = textwrap.dedent("""
    import resource, sys, time
    sys.path.insert(0, {root!r})
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    from collcomm.rendezvous import TCPStoreServer
    s = TCPStoreServer("127.0.0.1", 0, token=bytes.fromhex({token!r}), auth_timeout=2.0)
    print(s.port, flush=True)
    sys.stdin.readline()
    print(s.accept_failures, int(s._thread.is_alive()), flush=True)
    s.close()
""")


def store_out_of_fds(count: int = 300) -> dict:
    """Section 3: the store in a 64-descriptor process, flooded beyond that."""
    from collcomm.rendezvous import TCPStore

    token = os.urandom(16)
    proc = subprocess.Popen([sys.executable, "-c", _SERVER.format(root=ROOT, token=token.hex())],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        port = int(proc.stdout.readline())
        flood = work.Flood("127.0.0.1", port, count, wait=5.0)
        time.sleep(1.0)
        flood.close()
        t0 = time.monotonic()
        client = TCPStore("127.0.0.1", port, token=token, timeout=20.0)
        client.set("k", b"v")
        ok = client.get("k") == b"v"
        latency = time.monotonic() - t0
        client.close()
        proc.stdin.write("report\n")
        proc.stdin.flush()
        failures, alive = (int(x) for x in proc.stdout.readline().split())
    finally:
        proc.kill()
        proc.wait(timeout=10)
    return {"flood": count, "fd_limit": 64, "accept_failures": failures, "alive_after": bool(alive),
            "served_after": ok, "client_after_s": round(latency, 3),
            "pass": bool(alive) and ok and failures > 0}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=3, help="ranks of the flooded job (3)")
    ap.add_argument("--idle", type=int, default=200)
    ap.add_argument("--half", type=int, default=0, help="half-open connections in section 1 (0)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args(argv)
    results = {
        "init_flood": init_flood(args.n, args.idle, args.half, args.reps),
        "store_flood": store_flood(args.idle, 100, 100),
        "store_out_of_fds": store_out_of_fds(),
    }
    for name, r in results.items():
        print(f"{name}: {'PASS' if r['pass'] else 'FAIL'} {json.dumps(r)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0 if all(r["pass"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
