"""What an algorithm sees: a group-local point-to-point view and a reduction function.

Algorithms are plain functions ``f(comm, ...)`` over :class:`Comm` (the rest of what a
family may use of its comm is listed in :mod:`.contract`). A ``Comm`` is bound to
one collective call: its ranks are the group's local ranks ``0..size-1`` and all its
messages carry that call's private tag, so concurrent collectives never mix. Between two
ranks, messages of one call are matched in the order they were sent and posted, so an
algorithm needs no tags of its own: post receives in the order the peer sends.

Arrays handed to ``isend``/``irecv`` are 1-D C-contiguous numpy arrays (any dtype, length
0 allowed); a receive array must be at least as large as the matching send.
A ``ReduceFn`` combines in place: ``fn(acc, other)`` leaves ``acc ⊕ other`` in ``acc``.
Ops must be treated as commutative and associative (as MPI assumes for its built-in ops);
AVG is handled above the algorithms (SUM, then divide).
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from ..transport.base import Handle, Status
from .contract import Comm

__all__ = ["Comm", "ReduceFn", "scratch", "sendrecv", "wait_all"]

ReduceFn = Callable[[np.ndarray, np.ndarray], None]


def scratch(comm: Comm, count: int, dtype: np.dtype, slot: int = 0) -> np.ndarray:
    """``count`` elements of temporary space. A comm that offers ``scratch(nbytes, slot)``
    (a process group's) reuses one buffer per slot across calls, so big temporaries are
    page-faulted once, not every call; distinct slots never overlap.

    :class:`.contract.Scratch` is optional (a bare point-to-point comm has none): this is
    the one place that probes for it."""
    dt = np.dtype(dtype)
    get: Callable[[int, int], np.ndarray] | None = getattr(comm, "scratch", None)
    if get is None:
        return np.empty(count, dtype=dt)
    return get(count * dt.itemsize, slot)[:count * dt.itemsize].view(dt)


def wait_all(handles: Sequence[Handle]) -> list[Status]:
    """Wait for every handle in order (each under the transport's timeout)."""
    return [h.wait() for h in handles]


def sendrecv(comm: Comm, send: np.ndarray, dst: int, recv: np.ndarray, src: int) -> None:
    """Exchange: post the receive first, then send, then wait for both."""
    r = comm.irecv(recv, src)
    s = comm.isend(send, dst)
    r.wait()
    s.wait()
