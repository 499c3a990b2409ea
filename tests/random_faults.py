"""A rank killed in the middle of random traffic: the survivors' side.

Every rank runs the steps of tests/random_overlap.py (messages and collectives
overlapping, optionally through collcomm.MPI or torch.distributed: ``RANDOM_FRONT``) from
one seed, over and over, until the library reports the loss of a rank; the harness
SIGKILLs one rank meanwhile (tests/harness.py ``kill``). A survivor returns when it
noticed (``time.monotonic()``, comparable with the harness's ``killed_at``: one clock per
host), the error's class and text. What must hold: every survivor raises, within a few
seconds of the kill, an error that names a lost rank (never a hang until the timeout,
never a wrong answer before it).
"""
from __future__ import annotations

import os
import time
from typing import Any

#: a survivor gives up looking for the loss after this long (the harness kills well before)
LIMIT_SECONDS = float(os.environ.get("RANDOM_LIMIT", "60"))


def until_lost(seed: int, steps: int) -> tuple[Any, ...]:
    """Rounds of ``steps`` random steps from ``seed`` until an error: (when, its class
    name, its text, rounds done, wrong lines seen before); ("no error", rounds) if none
    came within LIMIT_SECONDS."""
    if os.environ.get("RANDOM_FRONT") == "torch":      # (one torch job around all the rounds)
        from tests.random_jobs import in_torch_job
        return in_torch_job(lambda td: _rounds(seed, steps))
    return _rounds(seed, steps)


def _rounds(seed: int, steps: int) -> tuple[Any, ...]:
    from collcomm.errors import CollcommError

    from tests import random_overlap
    start = time.monotonic()
    rounds, wrong = 0, []
    try:
        while time.monotonic() - start < LIMIT_SECONDS:
            wrong += random_overlap.run(seed + rounds, steps)
            rounds += 1
    except Exception as exc:  # noqa: BLE001 - torch wraps ours; the class is checked by the caller
        if not isinstance(exc, CollcommError) and os.environ.get("RANDOM_FRONT") != "torch":
            raise
        return time.monotonic(), type(exc).__name__, str(exc), rounds, wrong
    return "no error", rounds
