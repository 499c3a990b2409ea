"""``collcomm bench``: nccl-tests / OSU style benchmarks of collcomm, side by side with
mpi4py + Open MPI and torch.distributed Gloo, and the alpha-beta cost-model calibration.

Modules: ``options`` (argument and size parsing), ``worker`` (the per-rank sweep, the
collcomm backend), ``peers`` (mpi4py and Gloo backends), ``report`` (busbw factors, rows,
tables, JSON), ``jobs`` (one library's ranks, started), ``turns`` (the libraries taking
turns at every size), ``runner`` (the parent: jobs, turns or whole sweeps, printing),
``calibrate``, ``plot``.

    collcomm bench -n 2 --op all_reduce -b 8 -e 64M --check
    collcomm bench -n 2 --op all --compare mpi,gloo --json out.json --plot out.png
    collcomm bench --calibrate --save
"""
from __future__ import annotations

from .options import Options, parse_size, size_sweep
from .report import busbw_factor, format_compare, format_latency, format_table, ratio

__all__ = ["Options", "busbw_factor", "format_compare", "format_latency", "format_table",
           "parse_size", "ratio", "size_sweep"]
