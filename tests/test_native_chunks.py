"""The native core reads its peers' data a chunk of ranks at a time (``peers_at``, PEERS
ranks, 64 in the build): every peer's offset of a chunk before any data. No machine here
has 65 ranks, so this test builds the core with ``-DPEERS=2`` and runs, at 5 ranks (chunks
of 2, 2 and 1), the calls that read that way: all_reduce and reduce (the rank-order fold),
gather at every root as a list and as one buffer, all_gather as a list and as one buffer.
The list forms also hold their views on the heap past PEERS (here: past 2).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sysconfig

import numpy as np
import pytest

from collcomm import native
from tests.harness import run_ranks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _chunked_rank(so_path: str) -> list[str]:
    import collcomm as dist
    from collcomm import MPI
    from collcomm import native as nat
    from collcomm.core import runtime

    fails: list[str] = []
    n, me = dist.get_world_size(), dist.get_rank()
    if os.path.realpath(nat.core.__file__) != os.path.realpath(so_path):
        return [f"rank {me}: the core came from {nat.core.__file__}, not the chunked build"]

    def eq(got, want, what):
        if not np.array_equal(np.asarray(got), np.asarray(want)):
            fails.append(f"rank {me}: {what}: got {got!r}, want {want!r}")

    for count in (1, 3, 1000):
        x = np.arange(count, dtype=np.float64) + me
        dist.all_reduce(x)
        eq(x, n * np.arange(count) + n * (n - 1) / 2, f"all_reduce float64 x{count}")
        y = np.full(count, me + 1, dtype=np.int32)
        dist.all_reduce(y, op=dist.ReduceOp.PRODUCT)
        eq(y, np.full(count, np.prod(np.arange(1, n + 1)), np.int32), f"all_reduce PRODUCT x{count}")
    for root in range(n):
        r = np.full(4, float(me + 1))
        dist.reduce(r, dst=root, op=dist.ReduceOp.MAX)
        if me == root:
            eq(r, np.full(4, float(n)), f"reduce MAX root {root}")
        outs = [np.full(3, -1, np.int16) for _ in range(n)] if me == root else None
        dist.gather(np.full(3, me, np.int16), outs, dst=root)
        if outs is not None:
            eq(np.stack(outs), np.repeat(np.arange(n, dtype=np.int16)[:, None], 3, 1), f"gather list root {root}")
        flat = np.full(2 * n, -1.0, np.float32) if me == root else None
        MPI.COMM_WORLD.Gather(np.array([me, 10 * me], np.float32), flat, root)
        if flat is not None:
            eq(flat, np.array([[j, 10 * j] for j in range(n)], np.float32).ravel(), f"Gather root {root}")
    lst = [np.zeros(2, np.int64) for _ in range(n)]
    dist.all_gather(lst, np.array([me, -me]))
    eq(np.stack(lst), np.array([[j, -j] for j in range(n)]), "all_gather list")
    ag = np.empty(2 * n, np.int64)
    dist.all_gather_into_tensor(ag, np.array([me, 7 * me]))
    eq(ag, np.array([[j, 7 * j] for j in range(n)]).ravel(), "all_gather_into_tensor")
    core = runtime.get_world("chunks")._arena.native_core
    if core.done < 20:
        fails.append(f"rank {me}: only {core.done} calls done natively")
    return fails


@pytest.mark.timeout(120)
def test_peers_read_in_chunks(tmp_path) -> None:
    if native.core is None:
        pytest.skip(f"no native core: {native.reason}")
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    so = tmp_path / f"_shmcore{sysconfig.get_config_var('EXT_SUFFIX')}"
    # (-O0: the same code, built in half the time: ~7 s of the CI's suite at -O1)
    subprocess.run([cc, "-shared", "-fPIC", "-O0", "-DPEERS=2", "-ffp-contract=off", "-fno-fast-math",
                    f"-I{sysconfig.get_paths()['include']}", os.path.join(ROOT, "collcomm/native/_shmcore.c"),
                    "-o", str(so)], check=True, timeout=90)
    (tmp_path / "sitecustomize.py").write_text(
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('collcomm.native._shmcore', {str(so)!r})\n"
        "mod = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(mod)\n"
        "sys.modules['collcomm.native._shmcore'] = mod\n")
    env = {"PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}", "COLLCOMM_NATIVE": "1"}
    results = run_ranks(_chunked_rank, 5, str(so), transport="shm", timeout=90, env=env)
    fails = [f for per_rank in results for f in per_rank]
    assert not fails, "\n".join(fails)
