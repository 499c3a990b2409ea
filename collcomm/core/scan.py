"""Prefix reductions in the core: ``scan`` (inclusive) and ``exscan`` (exclusive).

The same template as :mod:`collcomm.core.collectives` (which the lead owns; these live
apart so the two can change independently): check what the core is responsible for
(matching dtypes and sizes, an op that suits the dtype) before any traffic, resolve the
combiner through the group's call plan, sign the call, run it in program order through
:meth:`ProcessGroup.run` (inline, or on the group's worker with ``async_op``).

The op keeps rank order (:mod:`collcomm.algorithms.scan`: recursive doubling, or for
messages up to GATHERED_MAX bytes an all_gather and a fold), so a non-commutative user
function gives MPI's result. The way depends on the size alone, never on the transport: a
small scan folds ``((x0 ∘ x1) ∘ x2) ∘ …`` over shared memory and over TCP alike, so its
floating-point result is the same bit for bit whichever way the ranks are linked. AVG is refused: a running mean is not
what MPI_Scan computes.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .. import ops
from ..algorithms import scan as scan_algorithm
from ..algorithms import signature
from ..errors import InvalidArgumentError
from .call_comm import GroupComm
from .group import ProcessGroup
from .work import Work

__all__ = ["exscan", "scan"]

#: the largest message (bytes a rank) scanned by all_gather and fold (any transport)
GATHERED_MAX = 4096


def _prefix(g: ProcessGroup, send: np.ndarray, recv: np.ndarray, op: Any, exclusive: bool, *,
            dtype: Any, async_op: bool, name: str, after: Callable[[], None] | None) -> Work | None:
    def fail(text: str) -> InvalidArgumentError:
        return InvalidArgumentError(f"{name} on {g.describe()}: {text}")

    if send.dtype != recv.dtype:
        raise fail(f"the send buffer holds {send.dtype} and the receive buffer {recv.dtype}; "
                   "they must be the same dtype")
    if send.size != recv.size:
        raise fail(f"the receive buffer has {recv.size} elements, expected {send.size}")
    if dtype is None:
        dtype = send.dtype
    fn, avg, op_name = g.plan.reducer(op, dtype, f"{name} on {g.describe()}")
    if avg:
        raise fail("op AVG is not a prefix reduction; use SUM and divide by (rank + 1)")
    if recv is send or (send.size and np.shares_memory(send, recv)):
        send = send.copy()
    sig = signature.make("exscan" if exclusive else "scan", dtype, send.size, None, op_name)

    # small messages: all-gathered and folded in rank order (on one host one sync); the
    # choice depends on the size alone (sizes that differ between ranks: see sign_in below;
    # over TCP every message carries the signature, so the first one refuses the call)
    gathered = send.nbytes <= GATHERED_MAX
    fast = g.fast if gathered and not async_op else None
    if fast is not None:      # the all_gather in one C call, signed as this call
        parts = np.empty(g.size * send.size, dtype=send.dtype)
        if fast.all_gather(send, parts, name, sig):
            scan_algorithm.fold(parts, recv, fn, g.rank, exclusive)
            if after is not None:
                after()
            return None
    gather = g.plan.algorithm("all_gather", send.nbytes * g.size) if gathered else None
    # a larger scan on one host first signs in with a barrier of the arena (its signature
    # checked): a rank whose count put it on the gathered way (a mismatch) meets the others
    # there, and every rank raises the mismatch instead of waiting for the others
    sign_in = g.plan.algorithm("barrier", 0) if g.can_share_memory and not gathered else None

    def body(comm: GroupComm) -> None:
        if gather is not None:
            scan_algorithm.scan_gathered(comm, send, recv, fn, exclusive, gather)
        else:
            if sign_in is not None:
                sign_in(comm)
            scan_algorithm.scan(comm, send, recv, fn, exclusive)
        if after is not None:
            after()

    work = g.run(name, body, async_op, sig=sig, nbytes=send.nbytes)
    return work if async_op else None  # type: ignore[return-value]


def scan(g: ProcessGroup, send: np.ndarray, recv: np.ndarray, op: Any = ops.ReduceOp.SUM, *,
         dtype: Any = None, async_op: bool = False, name: str = "scan",
         after: Callable[[], None] | None = None) -> Work | None:
    """``recv`` of rank r gets ``send`` of ranks 0..r combined with ``op``, in rank order."""
    return _prefix(g, send, recv, op, False, dtype=dtype, async_op=async_op, name=name, after=after)


def exscan(g: ProcessGroup, send: np.ndarray, recv: np.ndarray, op: Any = ops.ReduceOp.SUM, *,
           dtype: Any = None, async_op: bool = False, name: str = "exscan",
           after: Callable[[], None] | None = None) -> Work | None:
    """``recv`` of rank r > 0 gets ``send`` of ranks 0..r-1 combined with ``op``, in rank
    order; rank 0's ``recv`` is left unchanged."""
    return _prefix(g, send, recv, op, True, dtype=dtype, async_op=async_op, name=name, after=after)
