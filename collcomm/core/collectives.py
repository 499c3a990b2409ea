"""The collectives of the core: the one place every front end calls.

The functional API (``collcomm.all_reduce``), ``collcomm.MPI``, the torch backend and the
helpers all turn their arguments into numpy arrays and call these functions; none calls
another front end. Each function takes a :class:`~collcomm.core.group.ProcessGroup` this
rank belongs to, 1-D C-contiguous numpy arrays (counts in elements), local ranks for
roots, and:

* checks what the core is responsible for (root in range, sizes that fit together, one
  dtype, an op that suits the dtype) and raises :class:`InvalidArgumentError` naming the
  call and the group before any traffic;
* looks up the family function and the combiner in the group's :class:`CallPlan`;
* packs the call's signature (collective, dtype, count, root, op) so the ranks can check
  they agree (:mod:`collcomm.algorithms.signature`);
* runs the call in program order through :meth:`ProcessGroup.run`: inline, or on the
  group's worker when ``async_op`` (then it returns the :class:`Work`; else ``None``).

``dtype`` overrides the logical dtype of the arrays (``"bfloat16"`` data travels as a
``uint16`` view). ``after`` runs inside the call, after the algorithm, in the same thread
(front ends copy results out of temporaries there, so async calls finish completely).
``name`` is the call's name in errors (e.g. ``"all_gather_into_tensor"``, ``"Allreduce"``).
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from .. import ops
from ..algorithms import signature
from ..algorithms.registry import REDUCE_IN_PLACE_OK
from ..errors import InvalidArgumentError
from .call_comm import GroupComm
from .group import ProcessGroup
from .work import Work

After = Callable[[], None] | None
#: the same call through the group's fast call (core/fastpath.py), which a queued
#: asynchronous call tries first (True: done; None: declined, the regular path runs)
FastCall = Callable[[Any], Any] | None

__all__ = ["all_gather", "all_reduce", "all_to_all", "barrier", "broadcast", "gather", "reduce",
           "reduce_scatter", "scatter"]


def _fail(g: ProcessGroup, name: str, text: str, kind: str = "") -> InvalidArgumentError:
    return InvalidArgumentError(f"{name} on {g.describe()}: {text}", kind)


def _root(g: ProcessGroup, name: str, root: int) -> int:
    if not 0 <= root < g.size:
        raise _fail(g, name, f"root must be a rank of the group in [0, {g.size}), got {root}", "root")
    return root


def _same_dtype(g: ProcessGroup, name: str, a: np.ndarray, b: np.ndarray) -> None:
    if a.dtype != b.dtype:
        raise _fail(g, name, f"the send buffer holds {a.dtype} and the receive buffer {b.dtype}; "
                             "they must be the same dtype", "dtype")


def _plain(algorithm: str, dtype: Any, arr: np.ndarray, *extra: Any) -> bool:
    """Whether an asynchronous call may try the fast call: the plan's algorithm, the
    arrays' own dtype, nothing to do after the family (no AVG, no ``after``)."""
    return (algorithm == "auto" and (dtype is None or dtype is arr.dtype
                                     or (isinstance(dtype, np.dtype) and dtype == arr.dtype))
            and not any(extra))


def _size(g: ProcessGroup, name: str, what: str, arr: np.ndarray, expected: int) -> None:
    if arr.size != expected:
        raise _fail(g, name, f"{what} has {arr.size} elements, expected {expected}", "count")


def _run(g: ProcessGroup, name: str, body: Callable[[GroupComm], None], async_op: bool,
         sig: int, nbytes: int, fast_call: FastCall = None, start: FastCall = None) -> Work | None:
    """The call run (or queued: ``async_op``); ``start(fast)``, if given, first offers an
    async call to the fast call's entry in two parts (native/_fastcall_parts.c), which
    starts it at once and queues its second part, or declines."""
    fast = g.fast
    if start is not None and fast is not None and (work := start(fast)) is not None:
        return work
    work = g.run(name, body, async_op, sig=sig, nbytes=nbytes, fast_call=fast_call)
    return work if async_op else None  # type: ignore[return-value]


def broadcast(g: ProcessGroup, buf: np.ndarray, root: int, *, dtype: Any = None,
              async_op: bool = False, algorithm: str = "auto", name: str = "broadcast",
              after: After = None) -> Work | None:
    """``buf`` of ``root`` into ``buf`` of every rank (in place)."""
    fast = g.fast
    if async_op and fast is not None and _plain(algorithm, dtype, buf, after):
        work = fast.broadcast_async(buf, root, name)   # (it checks root)
        if work is not None:
            return work
    _root(g, name, root)
    family = g.plan.algorithm("broadcast", buf.nbytes, algorithm)
    sig = signature.make("broadcast", dtype or buf.dtype, buf.size, root)
    if not (after or async_op):
        g.call(name, family, sig, buf, root)
        return None

    def body(comm: GroupComm) -> None:
        family(comm, buf, root)
        if after is not None:
            after()

    fast_call = ((lambda f: f.broadcast(buf, root, name))
                 if async_op and _plain(algorithm, dtype, buf, after) else None)
    return _run(g, name, body, async_op, sig, buf.nbytes, fast_call)


def all_reduce(g: ProcessGroup, buf: np.ndarray, op: Any = ops.ReduceOp.SUM, *,
               dtype: Any = None, async_op: bool = False, algorithm: str = "auto",
               name: str = "all_reduce", after: After = None) -> Work | None:
    """Every rank's ``buf`` becomes the elementwise ``op`` over all ranks (in place)."""
    fast = g.fast
    if async_op and fast is not None and _plain(algorithm, dtype, buf, after):
        # small: started at once, its second part queued (native/_fastcall_parts.c)
        work = fast.all_reduce_async(buf, buf, op, name)
        if work is not None:
            return work
    if dtype is None:
        dtype = buf.dtype
    family, fn, avg, base = g.plan.reducing("all_reduce", op, dtype, buf.nbytes, algorithm,
                                            name, g.describe())
    sig = signature.with_count(base, buf.size)
    if not (avg or after or async_op):        # the common case: one call, no closure
        g.call(name, family, sig, buf, fn)
        return None
    n = g.size

    def body(comm: GroupComm) -> None:
        family(comm, buf, fn)
        if avg:
            ops.finish_avg(buf, n, dtype)
        if after is not None:
            after()

    fast_call = ((lambda f: f.all_reduce(buf, buf, op, name))
                 if async_op and _plain(algorithm, dtype, buf, avg, after) else None)
    return _run(g, name, body, async_op, sig, buf.nbytes, fast_call)


def reduce(g: ProcessGroup, send: np.ndarray, recv: np.ndarray | None, op: Any, root: int, *,
           dtype: Any = None, async_op: bool = False, algorithm: str = "auto",
           name: str = "reduce", after: After = None) -> Work | None:
    """``recv`` on ``root`` (may be ``send``) gets the elementwise ``op`` of every rank's
    ``send``; ``send`` is never modified; other ranks pass ``recv=None``."""
    _root(g, name, root)
    if g.rank == root:
        if recv is None:
            raise _fail(g, name, "the root needs a receive buffer")
        _same_dtype(g, name, send, recv)
        _size(g, name, "the receive buffer", recv, send.size)
    dtype = dtype or send.dtype
    family, fn, avg, base = g.plan.reducing("reduce", op, dtype, send.nbytes, algorithm,
                                            name, g.describe())
    if (g.rank == root and g.size > 1 and (recv is not send or family not in REDUCE_IN_PLACE_OK)
            and np.shares_memory(send, recv)):
        send = send.copy()   # the family could overwrite data it has yet to read
    sig = signature.with_count(base, send.size, root)
    n, is_root = g.size, g.rank == root

    def body(comm: GroupComm) -> None:
        family(comm, send, recv if is_root else None, fn, root)
        if avg and is_root:
            ops.finish_avg(recv, n, dtype)  # type: ignore[arg-type]
        if after is not None:
            after()

    if not (async_op and _plain(algorithm, dtype, send, avg, after)):
        return _run(g, name, body, async_op, sig, send.nbytes)
    mine = recv if is_root else None
    return _run(g, name, body, async_op, sig, send.nbytes, lambda f: f.reduce(send, mine, op, root, name),
                lambda f: f.reduce_async(send, mine, op, root, name))


def all_gather(g: ProcessGroup, send: np.ndarray, recv: np.ndarray, *, dtype: Any = None,
               async_op: bool = False, algorithm: str = "auto", name: str = "all_gather",
               after: After = None) -> Work | None:
    """``recv`` (n × send's elements) gets every rank's ``send`` in rank order. ``send`` may be
    ``recv``'s own block; any other overlap is copied first."""
    _same_dtype(g, name, send, recv)
    _size(g, name, "the receive buffer", recv, send.size * g.size)
    send = _unaliased(send, recv, g.rank * send.size)
    family = g.plan.algorithm("all_gather", recv.nbytes, algorithm)
    sig = signature.make("all_gather", dtype or send.dtype, send.size)

    def body(comm: GroupComm) -> None:
        family(comm, send, recv)
        if after is not None:
            after()

    if not (async_op and _plain(algorithm, dtype, send, after)):
        return _run(g, name, body, async_op, sig, recv.nbytes)
    return _run(g, name, body, async_op, sig, recv.nbytes, lambda f: f.all_gather(send, recv, name),
                lambda f: f.all_gather_async(send, recv, name))


def gather(g: ProcessGroup, send: np.ndarray, recv: np.ndarray | None, root: int, *,
           dtype: Any = None, async_op: bool = False, algorithm: str = "auto",
           name: str = "gather", after: After = None) -> Work | None:
    """``recv`` on ``root`` (n × send's elements) gets every rank's ``send``; others pass None."""
    _root(g, name, root)
    is_root = g.rank == root
    if is_root:
        if recv is None:
            raise _fail(g, name, "the root needs a receive buffer")
        _same_dtype(g, name, send, recv)
        _size(g, name, "the receive buffer", recv, send.size * g.size)
        send = _unaliased(send, recv, g.rank * send.size)
    family = g.plan.algorithm("gather", send.nbytes * g.size, algorithm)
    sig = signature.make("gather", dtype or send.dtype, send.size, root)

    def body(comm: GroupComm) -> None:
        family(comm, send, recv if is_root else None, root)
        if after is not None:
            after()

    if not (async_op and _plain(algorithm, dtype, send, after)):
        return _run(g, name, body, async_op, sig, send.nbytes * g.size)
    mine = recv if is_root else None
    return _run(g, name, body, async_op, sig, send.nbytes * g.size,
                lambda f: f.gather(send, mine, root, name), lambda f: f.gather_async(send, mine, root, name))


def scatter(g: ProcessGroup, send: np.ndarray | None, recv: np.ndarray, root: int, *,
            dtype: Any = None, async_op: bool = False, algorithm: str = "auto",
            name: str = "scatter", after: After = None) -> Work | None:
    """Block i of ``send`` on ``root`` (n × recv's elements) into ``recv`` of rank i."""
    _root(g, name, root)
    is_root = g.rank == root
    if is_root:
        if send is None:
            raise _fail(g, name, "the root needs a send buffer")
        _same_dtype(g, name, send, recv)
        _size(g, name, "the send buffer", send, recv.size * g.size)
        if g.size > 1 and np.shares_memory(send, recv):
            send = send.copy()
    family = g.plan.algorithm("scatter", recv.nbytes * g.size, algorithm)
    sig = signature.make("scatter", dtype or recv.dtype, recv.size, root)

    def body(comm: GroupComm) -> None:
        family(comm, send if is_root else None, recv, root)
        if after is not None:
            after()

    if not (async_op and _plain(algorithm, dtype, recv, after)):
        return _run(g, name, body, async_op, sig, recv.nbytes * g.size)
    mine = send if is_root else None
    return _run(g, name, body, async_op, sig, recv.nbytes * g.size,
                lambda f: f.scatter(mine, recv, root, name), lambda f: f.scatter_async(mine, recv, root, name))


def reduce_scatter(g: ProcessGroup, send: np.ndarray, recv: np.ndarray, op: Any = ops.ReduceOp.SUM,
                   *, dtype: Any = None, async_op: bool = False, algorithm: str = "auto",
                   name: str = "reduce_scatter", after: After = None) -> Work | None:
    """Reduce ``send`` (n × recv's elements) over all ranks; block i into ``recv`` of rank i."""
    _same_dtype(g, name, send, recv)
    _size(g, name, "the send buffer", send, recv.size * g.size)
    if g.size > 1 and np.shares_memory(send, recv):
        send = send.copy()
    dtype = dtype or recv.dtype
    family, fn, avg, base = g.plan.reducing("reduce_scatter", op, dtype, send.nbytes, algorithm,
                                            name, g.describe())
    sig = signature.with_count(base, recv.size)
    n = g.size

    def body(comm: GroupComm) -> None:
        family(comm, send, recv, fn)
        if avg:
            ops.finish_avg(recv, n, dtype)
        if after is not None:
            after()

    if not (async_op and _plain(algorithm, dtype, recv, avg, after)):
        return _run(g, name, body, async_op, sig, send.nbytes)
    return _run(g, name, body, async_op, sig, send.nbytes, lambda f: f.reduce_scatter(send, recv, op, name),
                lambda f: f.reduce_scatter_async(send, recv, op, name))


def all_to_all(g: ProcessGroup, send: np.ndarray, send_counts: Sequence[int], recv: np.ndarray,
               recv_counts: Sequence[int], *, dtype: Any = None, async_op: bool = False,
               algorithm: str = "auto", name: str = "all_to_all",
               after: After = None) -> Work | None:
    """Block j of ``send`` (``send_counts[j]`` elements, packed in rank order) goes to rank j;
    ``recv`` gets rank j's block at the prefix sum of ``recv_counts``. Every pair of ranks
    must agree on the size of the block between them (checked; MismatchError otherwise)."""
    _same_dtype(g, name, send, recv)
    send_counts, recv_counts = _counts(g, name, "send", send_counts, send), _counts(g, name, "recv", recv_counts, recv)
    if send_counts[g.rank] != recv_counts[g.rank]:
        raise _fail(g, name, f"this rank sends itself {send_counts[g.rank]} elements but expects "
                             f"{recv_counts[g.rank]} from itself; its own send and receive counts "
                             "must be equal", "count")
    if g.size > 1 and np.shares_memory(send, recv):
        send = send.copy()
    family = g.plan.algorithm("all_to_all", send.nbytes, algorithm)
    sig = signature.make("all_to_all", dtype or send.dtype)

    def body(comm: GroupComm) -> None:
        family(comm, send, send_counts, recv, recv_counts)
        if after is not None:
            after()

    if not (async_op and _plain(algorithm, dtype, send, after)):
        return _run(g, name, body, async_op, sig, send.nbytes + recv.nbytes)
    # started in two parts by the fast call when it takes it; else queued, run through its
    # all_to_all with split sizes when it takes it then
    return _run(g, name, body, async_op, sig, send.nbytes + recv.nbytes,
                lambda f: f.all_to_all_v(send, send_counts, None, recv, recv_counts, None, name),
                lambda f: f.all_to_all_v_async(send, send_counts, None, recv, recv_counts, None, name))


def barrier(g: ProcessGroup, *, async_op: bool = False, algorithm: str = "auto",
            name: str = "barrier", timeout: float | None = None) -> Work | None:
    """Return only when every rank of the group has entered."""
    fast = g.fast
    if async_op and fast is not None and algorithm == "auto" and timeout is None:
        work = fast.barrier_async(name)    # arrives at once, its wait queued (as all_reduce's)
        if work is not None:
            return work
    family = g.plan.algorithm("barrier", 0, algorithm)
    fast_call = (lambda f: f.barrier(name)) if async_op and algorithm == "auto" else None
    work = g.run(name, family, async_op, timeout, sig=signature.make("barrier"), nbytes=0,
                 fast_call=fast_call)
    return work if async_op else None  # type: ignore[return-value]


# ----------------------------------------------------------------------------- helpers
def _counts(g: ProcessGroup, name: str, what: str, counts: Sequence[int], arr: np.ndarray) -> list[int]:
    out = [int(c) for c in counts]
    if len(out) != g.size:
        raise _fail(g, name, f"{what} counts must have one entry per rank: expected {g.size}, "
                             f"got {len(out)}", "count")
    if any(c < 0 for c in out) or sum(out) > arr.size:
        raise _fail(g, name, f"{what} counts {out} must be non-negative and sum to at most the "
                             f"{arr.size} elements of the {what} buffer", "count")
    return out


def _unaliased(send: np.ndarray, recv: np.ndarray, own_offset: int) -> np.ndarray:
    """``send``, copied if it overlaps ``recv`` anywhere but exactly at ``recv[own_offset:]``."""
    if send.size == 0 or not np.shares_memory(send, recv):
        return send
    own = recv[own_offset:own_offset + send.size]
    if own.size == send.size and own.__array_interface__["data"][0] == send.__array_interface__["data"][0]:
        return own
    return send.copy()
