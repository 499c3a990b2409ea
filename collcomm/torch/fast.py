"""The torch backend's fast calls: a blocking call of plain CPU tensors in one C call.

Each function here offers one torch call to the group's fast call
(:mod:`collcomm.core.fastpath`) and says whether it was done. It is, only when every
tensor is a dense, contiguous CPU tensor of a numpy dtype (``call_array``), the op a
plain one (:func:`fast_op`: no AVG, no PREMUL_SUM), the sizes the even ones the fast call
takes, and the fast call itself accepts the call (it declines anything unusual by doing
nothing). Otherwise nothing has happened and the backend's regular path runs, and raises
every argument error with its own text: the fast call checks the full call signature
across ranks as the regular path does, so a rank on one path and a rank on the other
meet in the same native call.

The names given to the fast call are the regular path's, so the flight recorder's records
and the error texts are the same either way. The arrays are ``call_array``'s (no
``tensor.numpy()`` per call), which may not outlive the call: every call here has ended
when it returns.
"""
from __future__ import annotations

from typing import Any, Sequence

from ..errors import CollcommError
from .errors import translate
from .tensors import call_array, fast_op

__all__ = ["all_gather", "all_reduce", "all_to_all_single", "barrier", "broadcast", "gather",
           "reduce", "reduce_scatter_single", "scatter"]


def _arrays(tensors: Any) -> list[Any] | None:
    """The numpy arrays of a list of tensors the fast call can take as they are, else None."""
    if type(tensors) is not list:
        return None
    arrays = []
    for t in tensors:
        a = call_array(t)
        if a is None:
            return None
        arrays.append(a)
    return arrays


def _done(call: Any, *args: Any) -> bool:
    try:
        return bool(call(*args))
    except CollcommError as exc:
        raise translate(exc) from None


def all_reduce(fast: Any, tensors: Sequence[Any], op: Any) -> bool:
    if len(tensors) != 1:
        return False
    a, rop = call_array(tensors[0]), fast_op(op)
    if a is None or rop is None:
        return False
    try:                                    # _done inline: this is the most frequent call
        return bool(fast.all_reduce(a, a, rop, "all_reduce"))
    except CollcommError as exc:
        raise translate(exc) from None


def broadcast(fast: Any, tensors: Sequence[Any], root: int) -> bool:
    if len(tensors) != 1:
        return False
    a = call_array(tensors[0])
    if a is None:
        return False
    try:
        return bool(fast.broadcast(a, root, "broadcast"))
    except CollcommError as exc:
        raise translate(exc) from None


def reduce(fast: Any, tensors: Sequence[Any], op: Any, root: int, rank: int) -> bool:
    """In place on the root; the other ranks' tensors stay as they are (gloo's reduce)."""
    if len(tensors) != 1:
        return False
    a, rop = call_array(tensors[0]), fast_op(op)
    return (a is not None and rop is not None
            and _done(fast.reduce, a, a if rank == root else None, rop, root, "reduce"))


def all_gather(fast: Any, outputs: Sequence[Any], inputs: Sequence[Any]) -> bool:
    """torch's list form: one input tensor, one output tensor per rank."""
    if len(inputs) != 1 or len(outputs) != 1:
        return False
    a, outs = call_array(inputs[0]), _arrays(outputs[0])
    return a is not None and outs is not None and _done(fast.all_gather, a, outs, "all_gather")


def all_gather_single(fast: Any, output: Any, input: Any) -> bool:  # noqa: A002 - torch's name
    a, b = call_array(input), call_array(output)
    if a is None or b is None:
        return False
    try:
        return bool(fast.all_gather(a, b, "all_gather_into_tensor"))
    except CollcommError as exc:
        raise translate(exc) from None


def reduce_scatter_single(fast: Any, output: Any, input: Any, op: Any) -> bool:  # noqa: A002
    a, b, rop = call_array(input), call_array(output), fast_op(op)
    if a is None or b is None or rop is None:
        return False
    try:
        return bool(fast.reduce_scatter(a, b, rop, "reduce_scatter_tensor"))
    except CollcommError as exc:
        raise translate(exc) from None


def all_to_all_single(fast: Any, output: Any, input: Any, out_splits: Sequence[int],  # noqa: A002
                      in_splits: Sequence[int]) -> bool:
    """Only the even split (no split sizes given): uneven ones are all_to_all_v."""
    if out_splits or in_splits:
        return False
    a, b = call_array(input), call_array(output)
    return a is not None and b is not None and _done(fast.all_to_all, a, b, "all_to_all_single")


def _rooted(singles: Sequence[Any], lists: Sequence[Any], root: int,
            rank: int) -> tuple[Any, list[Any] | None] | None:
    """gather's / scatter's arrays: (this rank's one tensor, the root's list of one tensor
    per rank, None elsewhere), or None when the fast call cannot take them (torch passes
    ``[tensor]`` and ``[list]`` on the root, ``[]`` elsewhere)."""
    if len(singles) != 1:
        return None
    one = call_array(singles[0])
    if one is None:
        return None
    if rank != root:
        return None if lists else (one, None)
    items = _arrays(lists[0]) if len(lists) == 1 else None
    return None if items is None else (one, items)


def gather(fast: Any, outputs: Sequence[Any], inputs: Sequence[Any], root: int, rank: int) -> bool:
    """The root gives one output tensor per rank; the others give none."""
    got = _rooted(inputs, outputs, root, rank)
    return got is not None and _done(fast.gather, got[0], got[1], root, "gather")


def scatter(fast: Any, outputs: Sequence[Any], inputs: Sequence[Any], root: int, rank: int) -> bool:
    """The root gives one input tensor per rank; the others give none."""
    got = _rooted(outputs, inputs, root, rank)
    return got is not None and _done(fast.scatter, got[1], got[0], root, "scatter")


def barrier(fast: Any, limit: float | None) -> bool:
    """Only without a per-call timeout (the fast call waits for the group's)."""
    if limit is not None:
        return False
    try:
        return bool(fast.barrier("barrier"))
    except CollcommError as exc:
        raise translate(exc) from None
