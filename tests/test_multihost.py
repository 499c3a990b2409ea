"""Multi-host jobs for real (issue 9, item 7): 2 and 3 hosts built from network namespaces
(tests/netns.py), 2 ranks per host started by one ``collcomm run`` per host through the
multi-node flags; shared memory inside a host, TCP across, hierarchical algorithms. Every
collective is checked; then a host's link is cut mid-run: every rank must raise within the
heartbeat bound and every launcher must exit non-zero naming the cause within that bound + 5 s.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests import netns
from tests.test_launcher import _env

pytestmark = pytest.mark.skipif(netns.unavailable() is not None,
                                reason=f"multi-host tests: {netns.unavailable()}")

RANKS_PER_HOST = 2
MASTER_PORT = 29500
HEARTBEAT_S = 3.0
#: the heartbeat bound: silence for HEARTBEAT_S, noticed at the next 1 s heartbeat tick
DETECT_BOUND_S = HEARTBEAT_S + 1.0 + 1.0

COLLECTIVES = textwrap.dedent('''
    import json, os, sys
    import numpy as np
    import collcomm as dist
    from collcomm.algorithms import available

    dist.init_process_group()
    r, n = dist.get_rank(), dist.get_world_size()
    channels = {}
    checks = []

    def check(name, got, want):
        got, want = np.asarray(got), np.asarray(want)
        if got.shape != want.shape or not np.array_equal(got, want):
            raise AssertionError(f"{name}: rank {r} got {got!r}, want {want!r}")
        checks.append(name)

    for op in ("all_reduce", "broadcast", "reduce", "barrier"):
        assert "hierarchical" in available(op), op
    for algo in ("auto", "hierarchical"):
        x = np.arange(5.0) + r
        dist.all_reduce(x, algorithm=algo)
        check(f"all_reduce/{algo}", x, np.arange(5.0) * n + n * (n - 1) / 2)
        x = np.full(3, float(r))
        dist.all_reduce(x, op=dist.ReduceOp.MAX, algorithm=algo)
        check(f"all_reduce_max/{algo}", x, np.full(3, n - 1.0))
        x = np.full(1 << 18, 1.0, dtype=np.float32)        # 1 MiB: the large-message path
        dist.all_reduce(x, algorithm=algo)
        check(f"all_reduce_1MiB/{algo}", x, np.full(1 << 18, float(n), dtype=np.float32))
        for root in range(n):
            x = np.full(4, r * 10.0)
            dist.broadcast(x, src=root, algorithm=algo)
            check(f"broadcast/{root}/{algo}", x, np.full(4, root * 10.0))
            x = np.full(4, r + 1.0)
            dist.reduce(x, dst=root, algorithm=algo)
            if r == root:
                check(f"reduce/{root}/{algo}", x, np.full(4, n * (n + 1) / 2))
        dist.barrier(algorithm=algo)
        checks.append(f"barrier/{algo}")

    chunks = [np.empty(3) for _ in range(n)]
    dist.all_gather(chunks, np.full(3, float(r)))
    check("all_gather", np.stack(chunks), np.repeat(np.arange(n, dtype=float), 3).reshape(n, 3))
    out = np.empty(2 * n)
    dist.all_gather_into_tensor(out, np.full(2, float(r)))
    check("all_gather_into_tensor", out, np.repeat(np.arange(n, dtype=float), 2))
    out = np.empty(2)
    dist.reduce_scatter(out, [np.full(2, float(r + i)) for i in range(n)])
    check("reduce_scatter", out, np.full(2, n * (n - 1) / 2 + n * r))
    out = np.empty(2)
    dist.reduce_scatter_tensor(out, np.repeat(np.arange(n, dtype=float), 2) + r)
    check("reduce_scatter_tensor", out, np.full(2, n * r + n * (n - 1) / 2))
    outs = [np.empty(2) for _ in range(n)]
    dist.all_to_all(outs, [np.full(2, r * 100.0 + i) for i in range(n)])
    check("all_to_all", np.stack(outs), np.stack([np.full(2, j * 100.0 + r) for j in range(n)]))
    out = np.empty(n)
    dist.all_to_all_single(out, np.arange(n, dtype=float) + 10 * r)
    check("all_to_all_single", out, np.arange(n) * 10.0 + r)
    for root in range(n):
        gl = [np.empty(2) for _ in range(n)] if r == root else None
        dist.gather(np.full(2, float(r)), gather_list=gl, dst=root)
        if r == root:
            check(f"gather/{root}", np.stack(gl), np.repeat(np.arange(n, dtype=float), 2).reshape(n, 2))
        x = np.empty(2)
        sl = [np.full(2, float(i)) for i in range(n)] if r == root else None
        dist.scatter(x, scatter_list=sl, src=root)
        check(f"scatter/{root}", x, np.full(2, float(r)))
    x = np.empty(3)
    req = dist.isend(np.full(3, float(r)), dst=(r + 1) % n)
    dist.recv(x, src=(r - 1) % n)
    req.wait()
    check("send/recv ring", x, np.full(3, float((r - 1) % n)))
    objs = [None] * n
    dist.all_gather_object(objs, {"rank": r, "host": os.uname().nodename})
    check("all_gather_object", [o["rank"] for o in objs], list(range(n)))
    lst = [{"k": r}] if r == 0 else [None]
    dist.broadcast_object_list(lst, src=0)
    check("broadcast_object_list", lst[0]["k"], 0)
    hosts = [o["host"] for o in objs]
    from collcomm.core import runtime
    kinds = {str(p): k for p, k in runtime._job.transport.kinds().items()}  # channel per peer
    print("RESULT " + json.dumps({"rank": r, "checks": len(checks), "hosts": hosts,
                                  "kinds": kinds}), flush=True)
    dist.destroy_process_group()
''')

LOOP = textwrap.dedent('''
    import json, os, time
    import numpy as np
    import collcomm as dist

    out = os.environ["MH_DIR"]
    dist.init_process_group()
    r, n = dist.get_rank(), dist.get_world_size()
    x = np.empty(256)
    i = 0
    try:
        while True:
            x[:] = r + 1
            dist.all_reduce(x)
            if not (x == n * (n + 1) / 2).all():
                raise AssertionError(f"rank {r}: wrong result {x[:3]}")
            i += 1
            if i == 20:
                open(os.path.join(out, f"ready-{r}"), "w").close()
            time.sleep(0.002)
    except Exception as exc:
        with open(os.path.join(out, f"raised-{r}.json"), "w") as f:
            json.dump({"t": time.monotonic(), "type": type(exc).__name__,
                       "peer": getattr(exc, "peer", None), "message": str(exc)[:500]}, f)
        raise
''')


def _start(cluster: netns.Cluster, tmp: Path, prog: str, extra_env: dict[str, str]) -> list:
    token = secrets.token_hex(16)
    env = _env()
    env.update({"COLLCOMM_TOKEN": token, "COLLCOMM_HEARTBEAT_TIMEOUT": str(HEARTBEAT_S),
                # the dumps of a failed job (one folder, as by default): not in /tmp
                "COLLCOMM_FR_DIR": str(tmp / "fr"), **extra_env})
    env.pop("COLLCOMM_HOST_ID", None)
    env.pop("COLLCOMM_TRANSPORT", None)
    procs = []
    for h in range(cluster.hosts):
        argv = [sys.executable, "-m", "collcomm", "run", "-n", str(RANKS_PER_HOST),
                "--nnodes", str(cluster.hosts), "--node-rank", str(h),
                "--master-addr", cluster.addr(0), "--master-port", str(MASTER_PORT),
                "--grace", "1", prog]
        procs.append(cluster.popen(h, argv, env, str(tmp / f"out{h}.txt"),
                                   str(tmp / f"err{h}.txt")))
    return procs


def _wait(procs: list, timeout: float) -> list[float]:
    """Exit times (monotonic) of every process; raises if one is still running at timeout."""
    deadline = time.monotonic() + timeout
    done: dict[int, float] = {}
    while len(done) < len(procs):
        for i, p in enumerate(procs):
            if i not in done and p.poll() is not None:
                done[i] = time.monotonic()
        if time.monotonic() > deadline:
            raise AssertionError(f"launchers {sorted(set(range(len(procs))) - set(done))} "
                                 f"still running after {timeout} s")
        time.sleep(0.02)
    return [done[i] for i in range(len(procs))]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("hosts", [2, 3])
def test_every_collective_across_hosts(tmp_path, hosts):
    prog = tmp_path / "collectives.py"
    prog.write_text(COLLECTIVES)
    with netns.Cluster(hosts) as cluster:
        procs = _start(cluster, tmp_path, str(prog), {"COLLCOMM_TIMEOUT": "60"})
        _wait(procs, timeout=180)
        outs = [(tmp_path / f"out{h}.txt").read_text() for h in range(hosts)]
        errs = [(tmp_path / f"err{h}.txt").read_text() for h in range(hosts)]
        for h, p in enumerate(procs):
            assert p.returncode == 0, f"host {h}:\n{errs[h][-3000:]}"
        assert cluster.pids() == []
    assert not set(cluster.names) & set(netns.namespaces())
    results = [json.loads(line.split("RESULT ", 1)[1])
               for out in outs for line in out.splitlines() if "RESULT " in line]
    n = hosts * RANKS_PER_HOST
    assert sorted(r["rank"] for r in results) == list(range(n))
    assert len({r["checks"] for r in results}) <= 2 and min(r["checks"] for r in results) > 20
    # ranks 2h and 2h+1 share host h: its own hostname; hosts differ
    names = results[0]["hosts"]
    assert names == [f"h{r // RANKS_PER_HOST}" for r in range(n)]
    for res in results:  # shared memory inside a host, TCP across
        for peer, kind in res["kinds"].items():
            same = int(peer) // RANKS_PER_HOST == res["rank"] // RANKS_PER_HOST
            assert kind == ("shm" if same else "tcp"), (res["rank"], peer, kind)
    for err in errs:
        assert "netns: /dev/shm collcomm files left: 0" in err


@pytest.mark.timeout(240)
@pytest.mark.parametrize("hosts,cut", [(2, 1), (3, 2)])
def test_cut_link_every_rank_raises_and_launchers_name_the_cause(tmp_path, hosts, cut):
    prog = tmp_path / "loop.py"
    prog.write_text(LOOP)
    n = hosts * RANKS_PER_HOST
    with netns.Cluster(hosts) as cluster:
        procs = _start(cluster, tmp_path, str(prog),
                       {"COLLCOMM_TIMEOUT": "120", "MH_DIR": str(tmp_path)})
        deadline = time.monotonic() + 120
        while not all((tmp_path / f"ready-{r}").exists() for r in range(n)):
            dead = [h for h, p in enumerate(procs) if p.poll() is not None]
            assert not dead, (f"launchers {dead} ended before the cut:\n" +
                              (tmp_path / f"err{dead[0]}.txt").read_text()[-3000:])
            assert time.monotonic() < deadline, "the job never got going"
            time.sleep(0.05)
        t_cut = time.monotonic()
        cluster.cut(cut)
        exits = _wait(procs, timeout=DETECT_BOUND_S + 5 + 30)
        errs = [(tmp_path / f"err{h}.txt").read_text() for h in range(hosts)]
        for h, p in enumerate(procs):
            assert p.returncode != 0, f"host {h} exited 0:\n{errs[h][-2000:]}"
            assert exits[h] - t_cut <= DETECT_BOUND_S + 5, (h, exits[h] - t_cut, errs[h][-2000:])
        assert cluster.pids() == []
    assert not set(cluster.names) & set(netns.namespaces())
    raised = {r: json.loads((tmp_path / f"raised-{r}.json").read_text())
              for r in range(n) if (tmp_path / f"raised-{r}.json").exists()}
    assert sorted(raised) == list(range(n)), f"ranks that never raised: {set(range(n)) - set(raised)}"
    for r, rec in raised.items():
        assert rec["t"] - t_cut <= DETECT_BOUND_S, (r, rec)
        assert rec["type"] in ("PeerLostError", "CommTimeoutError"), rec
    cut_ranks = set(range(cut * RANKS_PER_HOST, (cut + 1) * RANKS_PER_HOST))
    for h, err in enumerate(errs):
        m = re.search(r"collcomm run: rank (\d+) \((pid \d+|on another node)\) failed first: (.*)",
                      err)
        assert m, err[-2000:]
        named = int(m.group(1))
        if h == cut:   # the isolated host blames a rank it lost, on another host
            assert named not in cut_ranks and m.group(2) == "on another node", m.group(0)
        else:          # the others blame a rank of the isolated host
            assert named in cut_ranks and m.group(2) == "on another node", m.group(0)
        assert "heartbeat" in err, err[-2000:]
        assert "netns: /dev/shm collcomm files left: 0" in err
