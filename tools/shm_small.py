#!/usr/bin/env python3
"""Jobs in a small /dev/shm (issue 9, item 2): the figures of RELIABILITY.md.

For each ``--sizes`` (default 64m and 16m; Docker's default is 64 MB) this mounts a tmpfs
of that size over /dev/shm in a private mount namespace (``unshare -m``, as root: the
host's /dev/shm is untouched) and runs, in it, ``-n`` ranks through every collective
(all_reduce, reduce, broadcast, all_gather, reduce_scatter, all_to_all, gather, scatter,
barrier) at each of ``--coll`` bytes per rank, a ring and a burst of send/recv at each of
``--p2p`` bytes, and a shared allocation (``collcomm.zeros``) with an all_reduce on it; every
result is checked. It does so for each configuration in ``--configs``:

* ``default``: what a user gets;
* ``arena0``: ``COLLCOMM_ARENA=0`` (collectives over the rings and staging segments);
* ``cma0``: ``COLLCOMM_CMA=0`` (no cross-memory attach: the arena stages everything; a
  message that fits no staging segment cannot go through private memory either, so it
  must be refused with a ShmSpaceError naming the sizes: counted as ``refused``);
* ``lend0``: ``COLLCOMM_LEND=0`` (non-blocking sends copy their large bodies, as blocking
  ones do, instead of lending them: see transport/shm_lent.py).

A rank killed by SIGBUS counts in ``sigbus``; the criterion is 0 SIGBUS, 0 wrong results,
0 hangs, nothing left in /dev/shm, and every rank of ``default``/``arena0``/``lend0`` done.

    python tools/shm_small.py                           # 4 ranks, 64m and 16m, all configs
    python tools/shm_small.py --sizes 16m -n 2 --configs default --coll 1K,8M --p2p 64M
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

CONFIGS = {"default": {}, "arena0": {"COLLCOMM_ARENA": "0"}, "cma0": {"COLLCOMM_CMA": "0"},
           "lend0": {"COLLCOMM_LEND": "0"}}
UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    text = text.strip().upper().rstrip("B")
    if text and text[-1] in UNITS:
        return int(float(text[:-1]) * UNITS[text[-1]])
    return int(text)


def unshare_problem() -> str | None:
    """Why a private tmpfs cannot be mounted over /dev/shm here (None: it can)."""
    if os.geteuid() != 0:
        return "needs root (unshare -m and mount)"
    try:
        out = subprocess.run(["unshare", "-m", "sh", "-c",
                              "mount -t tmpfs -o size=1m tmpfs /dev/shm && df -k /dev/shm"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unshare failed: {exc}"
    if out.returncode != 0:
        return f"unshare -m / mount not permitted: {out.stderr.strip()[-200:]}"
    return None


def inner(args: argparse.Namespace) -> dict:
    """Runs inside the namespace: every configuration, in this /dev/shm."""
    from tests import reliability_work as work

    coll = [parse_size(s) for s in args.coll.split(",") if s]
    p2p = [parse_size(s) for s in args.p2p.split(",") if s]
    st = os.statvfs("/dev/shm")
    results = {"shm_bytes": st.f_blocks * st.f_frsize, "ranks": args.n, "configs": {}}
    for name in args.configs.split(","):
        t0 = time.monotonic()
        env = dict(CONFIGS[name], COLLCOMM_TIMEOUT=str(args.timeout))
        outcomes, leaked = work.spawn(work.sizes_sweep, args.n, coll, p2p, env=env,
                                      timeout=args.timeout * 3)
        done = [o.value["done"] for o in outcomes if o.ok]
        wrong = [w for o in outcomes if o.ok for w in o.value["wrong"]]
        warnings = sorted({line.split("RuntimeWarning: ", 1)[1][:160]
                           for o in outcomes for line in o.output.splitlines()
                           if "RuntimeWarning: collcomm:" in line})
        results["configs"][name] = {
            "seconds": round(time.monotonic() - t0, 1),
            "ranks_ok": sum(o.ok for o in outcomes),
            "checks_done": sum(done), "wrong": wrong,
            "sigbus": sum(o.exitcode == -signal.SIGBUS for o in outcomes),
            "hangs": sum(o.error_type == "Hang" for o in outcomes),
            "refused": sum(o.error_type == "ShmSpaceError" for o in outcomes),
            "errors": sorted({f"{o.error_type}: {o.error[:300]}" for o in outcomes if not o.ok}),
            "leaked_segments": len(leaked),
            "left_in_dev_shm": sorted(os.listdir("/dev/shm")),
            "warnings": warnings,
        }
    return results


def verdict(r: dict, name: str) -> bool:
    c = r["configs"][name]
    clean = not c["sigbus"] and not c["hangs"] and not c["wrong"] and not c["left_in_dev_shm"]
    if name == "cma0":   # all done, or refused with a ShmSpaceError (the others: lost it)
        reactions = all(e.split(":")[0] in ("ShmSpaceError", "PeerLostError", "ClosedError")
                        for e in c["errors"])
        return clean and (c["ranks_ok"] == r["ranks"] or (c["refused"] > 0 and reactions))
    return clean and c["ranks_ok"] == r["ranks"] and not c["leaked_segments"]


def run(size: str, n: int, configs: str, coll: str, p2p: str, timeout: float) -> dict | None:
    """One tmpfs size: the inner run's results (None if it gave none)."""
    import tempfile

    fd, out = tempfile.mkstemp(prefix="collcomm-shm-small-", suffix=".json")
    os.close(fd)
    os.unlink(out)
    cmd = [sys.executable, os.path.abspath(__file__), "--inner", out, "-n", str(n),
           "--configs", configs, "--coll", coll, "--p2p", p2p, "--timeout", str(timeout)]
    script = f"mount -t tmpfs -o size={size} tmpfs /dev/shm && exec " + " ".join(f"'{c}'" for c in cmd)
    proc = subprocess.Popen(["unshare", "-m", "sh", "-c", script], cwd=ROOT, start_new_session=True)
    try:
        proc.wait(timeout=timeout * 3 * len(configs.split(",")) + 60)
    except subprocess.TimeoutExpired:
        pass
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)     # nothing of it may outlive the run
        except ProcessLookupError:
            pass
        proc.wait()
    if not os.path.exists(out):
        return None
    with open(out) as f:
        r = json.load(f)
    os.unlink(out)
    return r


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=4)
    ap.add_argument("--sizes", default="64m,16m", help="tmpfs sizes for /dev/shm (64m,16m)")
    ap.add_argument("--configs", default="default,arena0,cma0")
    ap.add_argument("--coll", default="8,1K,64K,1M,4M,16M,64M", help="bytes per rank per collective")
    ap.add_argument("--p2p", default="64K,1M,16M,64M", help="send/recv message sizes")
    ap.add_argument("--timeout", type=float, default=120.0, help="COLLCOMM_TIMEOUT of the ranks")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--inner", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.inner:
        with open(args.inner, "w") as f:
            json.dump(inner(args), f)
        return 0
    problem = unshare_problem()
    if problem:
        print(f"SKIP: {problem}")
        return 0
    all_results, ok = {}, True
    for size in args.sizes.split(","):
        r = run(size, args.n, args.configs, args.coll, args.p2p, args.timeout)
        if r is None:
            print(f"/dev/shm {size}: FAIL (no result)")
            ok = False
            continue
        all_results[size] = r
        for name, c in r["configs"].items():
            good = verdict(r, name)
            ok &= good
            print(f"/dev/shm {size} n={r['ranks']} {name}: {'PASS' if good else 'FAIL'} "
                  f"checks={c['checks_done']} wrong={len(c['wrong'])} sigbus={c['sigbus']} "
                  f"hangs={c['hangs']} refused={c['refused']} leaked={c['leaked_segments']} "
                  f"{c['seconds']} s")
            for line in c["errors"] + c["warnings"]:
                print(f"    {line}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(all_results, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
