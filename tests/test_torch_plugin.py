"""`dist.init_process_group("collcomm")` is the only change a torch program needs: the
package's torch.backends entry point registers the backend at `import torch`."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.harness import free_port, shm_files

torch = pytest.importorskip("torch")

PROGRAM = """
import sys, torch, torch.distributed as dist
assert 'collcomm' not in sys.modules            # nothing of collcomm imported by the program
dist.init_process_group("collcomm")              # the one changed string
t = torch.full((3,), float(dist.get_rank() + 1))
dist.all_reduce(t)
print(dist.get_backend(), t.tolist(), flush=True)
dist.destroy_process_group()
"""


@pytest.mark.timeout(90)
def test_backend_string_is_the_only_change(tmp_path):
    port, n, job = free_port(), 2, f"plugin{os.getpid()}"
    procs = []
    for rank in range(n):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(n), LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE=str(n), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   COLLCOMM_JOB_ID=job)
        env.pop("COLLCOMM_STORE", None)
        procs.append(subprocess.Popen([sys.executable, "-c", PROGRAM], env=env, cwd=str(tmp_path),
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      start_new_session=True))
    try:
        outs = [p.communicate(timeout=80)[0].decode() for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.wait()
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out
        assert out.strip().splitlines()[-1] == "collcomm [3.0, 3.0, 3.0]", out
    assert not shm_files(job)
