"""Collective algorithms over the point-to-point :class:`~collcomm.algorithms.base.Comm`.

One module per family, each opening with a description of its steps and costs:

* :mod:`.linear` — root-based reference (every collective);
* :mod:`.ring` — ring all_reduce / all_gather / reduce_scatter;
* :mod:`.tree` — binomial tree broadcast / reduce / gather / scatter (and all_reduce);
* :mod:`.recursive` — recursive doubling (all_reduce, all_gather), recursive halving
  (reduce_scatter) and Rabenseifner all_reduce;
* :mod:`.bruck` — Bruck all_gather and all_to_all;
* :mod:`.pairwise` — pairwise exchange all_to_all(v);
* :mod:`.dissemination` — dissemination barrier;
* :mod:`.shm_direct` — every collective through one shared-memory arena (one host; its
  code in :mod:`.shm_stage`, :mod:`.shm_reduce`, :mod:`.shm_move`, :mod:`.shm_a2a`,
  :mod:`.shm_scatter` and :mod:`.shm_large`);
* :mod:`.hierarchical` — shared memory inside hosts, TCP between host leaders;
* :mod:`.cost` — the α-β cost model behind ``algorithm="auto"``;
* :mod:`.registry` — ``ALGORITHMS``, :func:`available`, :func:`select` (the auto rule).
* :mod:`.contract` — the typed protocols of what a family may use of its ``comm`` (the
  arena, scratch, topology, hierarchy beyond point-to-point).

The entry points below take 1-D C-contiguous arrays, counts in elements, and
``algorithm="auto"`` (or a family name, see :func:`available`). With ``k`` the per-rank
element count and ``n = comm.size``:

* ``broadcast(comm, buf, root)`` — in place on every rank.
* ``reduce(comm, send, recv, fn, root)`` — ``recv`` (k) on the root only, ``None``
  elsewhere; ``send`` is never modified; ``recv`` may be ``send`` on the root.
* ``all_reduce(comm, buf, fn)`` — in place.
* ``all_gather(comm, send, recv)`` — send k, recv n·k; ``send`` may be
  ``recv[rank*k:(rank+1)*k]``.
* ``reduce_scatter(comm, send, recv, fn)`` — send n·k (not modified), recv k.
* ``gather(comm, send, recv, root)`` / ``scatter(comm, send, recv, root)`` — the n·k buffer
  on the root only (``None`` elsewhere).
* ``all_to_all(comm, send, send_counts, recv, recv_counts)`` — block j of ``send`` (at the
  prefix sum of ``send_counts``) goes to rank j; equal counts are plain all_to_all.
* ``barrier(comm)``.

AVG is not handled here: reduce with SUM, then :func:`collcomm.ops.finish_avg`.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .base import Comm, ReduceFn, sendrecv, wait_all
from .registry import ALGORITHMS, SMALL, auto, available, best, select, topology

__all__ = [
    "ALGORITHMS",
    "SMALL",
    "Comm",
    "ReduceFn",
    "all_gather",
    "all_reduce",
    "all_to_all",
    "auto",
    "available",
    "barrier",
    "broadcast",
    "gather",
    "reduce",
    "reduce_scatter",
    "scatter",
    "select",
    "sendrecv",
    "wait_all",
]


def broadcast(comm: Comm, buf: np.ndarray, root: int, *, algorithm: str = "auto") -> None:
    select("broadcast", buf.nbytes, comm.size, algorithm, **topology(comm))(comm, buf, root)


def reduce(comm: Comm, send: np.ndarray, recv: np.ndarray | None, fn: ReduceFn, root: int,
           *, algorithm: str = "auto") -> None:
    select("reduce", send.nbytes, comm.size, algorithm, **topology(comm))(comm, send, recv, fn, root)


def all_reduce(comm: Comm, buf: np.ndarray, fn: ReduceFn, *, algorithm: str = "auto") -> None:
    select("all_reduce", buf.nbytes, comm.size, algorithm, **topology(comm))(comm, buf, fn)


def all_gather(comm: Comm, send: np.ndarray, recv: np.ndarray, *, algorithm: str = "auto") -> None:
    select("all_gather", recv.nbytes, comm.size, algorithm, **topology(comm))(comm, send, recv)


def reduce_scatter(comm: Comm, send: np.ndarray, recv: np.ndarray, fn: ReduceFn,
                   *, algorithm: str = "auto") -> None:
    select("reduce_scatter", send.nbytes, comm.size, algorithm, **topology(comm))(comm, send, recv, fn)


def gather(comm: Comm, send: np.ndarray, recv: np.ndarray | None, root: int,
           *, algorithm: str = "auto") -> None:
    nbytes = send.nbytes * comm.size
    select("gather", nbytes, comm.size, algorithm, **topology(comm))(comm, send, recv, root)


def scatter(comm: Comm, send: np.ndarray | None, recv: np.ndarray, root: int,
            *, algorithm: str = "auto") -> None:
    nbytes = recv.nbytes * comm.size
    select("scatter", nbytes, comm.size, algorithm, **topology(comm))(comm, send, recv, root)


def all_to_all(comm: Comm, send: np.ndarray, send_counts: Sequence[int], recv: np.ndarray,
               recv_counts: Sequence[int], *, algorithm: str = "auto") -> None:
    select("all_to_all", send.nbytes, comm.size, algorithm, **topology(comm))(
        comm, send, send_counts, recv, recv_counts)


def barrier(comm: Comm, *, algorithm: str = "auto") -> None:
    select("barrier", 0, comm.size, algorithm, **topology(comm))(comm)
