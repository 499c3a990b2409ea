"""What the random-call and random-traffic programs share (tests/random_calls*.py,
tests/random_p2p*.py): a torch job around a run, the command line of a rank run by hand,
and the suite's way of running one fixed-seed case."""
from __future__ import annotations

import os
import sys
from typing import Any, Callable

Run = Callable[[int, int], list[str]]


def in_torch_job(body: Callable[[Any], list[str]]) -> list[str]:
    """``body(torch.distributed)`` with the default group initialised on the collcomm
    backend (unless it already is: then left as it is), destroyed afterwards."""
    import warnings

    import torch.distributed as td

    import collcomm.torch  # noqa: F401 - registers the backend
    warnings.filterwarnings("ignore", category=FutureWarning)   # (all_gather_into_tensor's new name)
    here = not td.is_initialized()
    if here:
        td.init_process_group("collcomm")
    try:
        return body(td)
    finally:
        if here:
            td.destroy_process_group()


def main(run: Run, init: bool = True) -> None:
    """A rank run by hand: ``argv``: SEED COUNT; ``RANDOM_PYTHON_RANKS``: these ranks on
    the pure-Python path; ``init``: initialise collcomm's world first (not for a torch
    run, which initialises torch.distributed itself)."""
    if os.environ.get("RANK", "0") in os.environ.get("RANDOM_PYTHON_RANKS", "").split(","):
        os.environ["COLLCOMM_NATIVE"] = "0"
    import collcomm
    if init:
        collcomm.init_process_group()
    wrong = run(int(sys.argv[1]), int(sys.argv[2]))
    print(f"rank {os.environ.get('RANK', '0')}: {len(wrong)} wrong", *wrong[:10], sep="\n", flush=True)
    if init:
        collcomm.destroy_process_group()
    sys.exit(1 if wrong else 0)


def run_case(c: dict[str, Any], plain: Run, mpi: Run, torch: Run, count: int, env: dict[str, str]) -> list[str]:
    """One fixed-seed case of the suite: ``c`` names n, seed and, optionally, env,
    rank_env, transport, mpi / torch (which front end) and count; what went wrong."""
    import pytest

    from tests.harness import TORCH, run_ranks
    if c.get("torch"):
        pytest.importorskip("torch")
    run = torch if c.get("torch") else mpi if c.get("mpi") else plain
    outs = run_ranks(run, c["n"], c["seed"], c.get("count", count), env={**env, **c.get("env", {})},
                     rank_env=c.get("rank_env"), transport=c.get("transport", "shm"), timeout=200,
                     init=not c.get("torch"), preload=TORCH if c.get("torch") else ())
    return [bad for out in outs for bad in out]
