"""The timing both MPI-side call benchmarks share (mpi_calls.py, mpi_small_calls.py): rows
timed in interleaved blocks, every rank switching at once, the order reversed every other
block; per block and row the slowest rank's µs per call."""
from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np


def timed_blocks(comm: Any, MPI: Any, rows: list[tuple[str, Callable[[], Any]]], blocks: int,
                 iters: int, warm: int) -> dict[str, list[float]]:
    """{row name: the slowest rank's µs per call in each block}; ``warm`` untimed calls first."""
    times: dict[str, list[float]] = {name: [] for name, _ in rows}
    mine, worst = np.zeros(1), np.zeros(1)
    for b in range(blocks):
        for name, call in (rows if b % 2 == 0 else rows[::-1]):
            comm.Barrier()
            for _ in range(warm):
                call()
            comm.Barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                call()
            mine[0] = (time.perf_counter() - t0) / iters * 1e6
            comm.Allreduce(mine, worst, MPI.MAX)
            times[name].append(float(worst[0]))
    return times
