"""torch.distributed on backend "collcomm" around its calls: importing collcomm does not
import torch, and a peer lost mid-job makes the next collective fail fast with a
DistBackendError (a PeerLostError) naming it and the call.
"""
from __future__ import annotations

import datetime
import os
import time

import pytest

torch = pytest.importorskip("torch")

from tests.harness import TORCH, run_ranks  # noqa: E402


def test_import_collcomm_does_not_import_torch() -> None:
    import subprocess
    import sys

    code = "import sys, collcomm, collcomm.helpers, collcomm.mesh; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


def lose_a_peer() -> dict:
    """Rank 1 dies right after init; rank 0's next collective fails fast, naming it."""
    import collcomm.torch  # noqa: F401
    import torch.distributed as dist

    dist.init_process_group("collcomm", timeout=datetime.timedelta(seconds=30))
    dist.barrier()
    if dist.get_rank() == 1:
        os._exit(3)
    start = time.monotonic()
    try:
        dist.all_reduce(torch.ones(1000))
        return {"raised": None}
    except Exception as exc:  # noqa: BLE001 - inspected by the test
        from collcomm import PeerLostError

        return {"raised": type(exc).__name__, "msg": str(exc), "s": time.monotonic() - start,
                "dist": isinstance(exc, dist.DistBackendError),
                "peer_lost": isinstance(exc, PeerLostError), "peer": getattr(exc, "peer", None)}


@pytest.mark.timeout(90)
def test_lost_peer_is_a_dist_backend_error_naming_it() -> None:
    out = run_ranks(lose_a_peer, 2, init=False, timeout=80, expect_failure=True, preload=TORCH)
    got = out[0].value
    assert out[0].ok and got["raised"], out[0]
    assert got["dist"] and got["peer_lost"] and got["peer"] == 1, got
    assert "all_reduce" in got["msg"] and "rank 1" in got["msg"], got
    assert got["s"] < 15, got        # well before the 30 s timeout
