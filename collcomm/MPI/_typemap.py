"""Derived datatypes' memory layouts, and packing a message of one to and from memory.

A derived datatype (vector, indexed, subarray, struct, resized …) may describe data that
is not contiguous. collcomm moves a message as a contiguous array of one numpy dtype, so
a message of such a type is *packed*: its basic elements are copied, in the type map's
order, into a contiguous array (what a send reads), or received into one and then
*unpacked* into the caller's memory (what a receive writes). A receive's array starts as
a packed copy of the memory, so whatever the call does not write keeps its value.

A :class:`Layout` is one element's type map, compressed: ``runs``, an (R, 2) int64 array
of (byte offset, byte length) in type-map order with adjacent pieces merged; its bounds
(``lb``/``ub``: the extent ``ub - lb`` is the stride between consecutive elements, and a
bound set by ``Create_resized`` sticks through later constructors, as MPI's markers do;
otherwise the extent is padded to the largest alignment of its basic types, as Open MPI
pads) and true bounds (where the data lies). A value-index pair is one basic element of
its padded size (``DOUBLE_INT``: 16 bytes), so a packed pair stays whole for MAXLOC.

Packing ``count`` elements at byte ``first`` of a buffer (:func:`pack`, :func:`unpack`)
uses the widest unit (8, 4, 2 or 1 bytes) that divides every offset and length, one
strided copy when the runs are equally long and equally spaced (a column, a 2-D
subarray), else one gather through an index array; plans are kept per count.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
from numpy.lib.stride_tricks import as_strided

_UNITS = {8: np.uint64, 4: np.uint32, 2: np.uint16, 1: np.uint8}


class Layout:
    """One element of a derived datatype in memory (see the module docstring)."""

    __slots__ = ("runs", "lb", "ub", "true_lb", "true_ub", "lb_marked", "ub_marked", "align",
                 "packed", "_plans")

    def __init__(self, runs: np.ndarray, lb: int, ub: int, lb_marked: bool, ub_marked: bool,
                 align: int) -> None:
        self.runs = _merge(runs)
        self.lb, self.ub, self.lb_marked, self.ub_marked, self.align = lb, ub, lb_marked, ub_marked, align
        if self.runs.size:
            self.true_lb = int(self.runs[:, 0].min())
            self.true_ub = int((self.runs[:, 0] + self.runs[:, 1]).max())
        else:
            self.true_lb = self.true_ub = 0
        self.packed = int(self.runs[:, 1].sum())      # bytes of one element, packed
        self._plans: dict[int, tuple[Any, ...]] = {}

    @property
    def extent(self) -> int:
        return self.ub - self.lb

    def contiguous(self) -> bool:
        """True when an element is one run from its lower bound to its upper bound: the
        memory is the packed message and nothing needs copying."""
        return (self.lb == 0 and self.runs.shape[0] <= 1 and self.packed == self.extent
                and (self.packed == 0 or int(self.runs[0, 0]) == 0))


def plain(extent: int, align: int) -> Layout:
    """The layout of a predefined type (or a contiguous run of one): one run."""
    return Layout(np.array([[0, extent]], dtype=np.int64), 0, extent, False, False, align)


def combine(displs: np.ndarray, counts: np.ndarray, olds: Layout | Sequence[Layout]) -> Layout:
    """The layout of pieces in order: piece i is ``counts[i]`` consecutive elements of the
    old type (one extent apart) at byte ``displs[i]``; ``olds`` is one layout for every
    piece or one per piece (a struct)."""
    displs, counts = np.asarray(displs, dtype=np.int64), np.asarray(counts, dtype=np.int64)
    if isinstance(olds, Layout):
        keep = counts > 0
        displs, counts = displs[keep], counts[keep]
        if not displs.size:
            return Layout(np.zeros((0, 2), dtype=np.int64), 0, 0, False, False, olds.align)
        ext = olds.extent
        if (counts == counts[0]).all():
            starts = (displs[:, None] + np.arange(counts[0], dtype=np.int64)[None, :] * ext).reshape(-1)
        else:
            firsts = np.cumsum(counts) - counts
            starts = np.repeat(displs, counts) + (np.arange(int(counts.sum()), dtype=np.int64)
                                                  - np.repeat(firsts, counts)) * ext
        lo_hi = np.stack((displs + olds.lb, displs + (counts - 1) * ext + olds.ub))
        return _bounded(_shifted(olds.runs, starts), int(lo_hi.min()), int(lo_hi.max()),
                        olds.lb_marked, olds.ub_marked, olds.align)
    runs, lbs, ubs, align = [], [], [], 1
    for disp, count, old in zip(displs.tolist(), counts.tolist(), olds):
        if count <= 0:
            continue
        runs.append(_shifted(old.runs, disp + np.arange(count, dtype=np.int64) * old.extent))
        ends = (disp + old.lb, disp + (count - 1) * old.extent + old.ub)
        lbs.append((min(ends), old.lb_marked))
        ubs.append((max(ends), old.ub_marked))
        align = max(align, old.align)
    if not runs:
        return Layout(np.zeros((0, 2), dtype=np.int64), 0, 0, False, False, align)
    lb_marked, ub_marked = any(m for _, m in lbs), any(m for _, m in ubs)
    lb = min(v for v, m in lbs if m or not lb_marked)      # a set bound wins over data's
    ub = max(v for v, m in ubs if m or not ub_marked)
    return _bounded(np.concatenate(runs), lb, ub, lb_marked, ub_marked, align)


def _bounded(runs: np.ndarray, lb: int, ub: int, lb_marked: bool, ub_marked: bool, align: int) -> Layout:
    if not ub_marked and ub - lb > 0:
        ub = lb + -(-(ub - lb) // align) * align       # MPI's epsilon: pad to the alignment
    return Layout(runs, lb, ub, lb_marked, ub_marked, align)


def resized(old: Layout, lb: int, extent: int) -> Layout:
    return Layout(old.runs, lb, lb + extent, True, True, old.align)


def _shifted(runs: np.ndarray, starts: np.ndarray) -> np.ndarray:
    out = np.empty((starts.size, runs.shape[0], 2), dtype=np.int64)
    out[:, :, 0] = starts[:, None] + runs[None, :, 0]
    out[:, :, 1] = runs[None, :, 1]
    return out.reshape(-1, 2)


def _merge(runs: np.ndarray) -> np.ndarray:
    """Runs with the empty ones dropped and each one that starts where the last ends joined to it."""
    runs = np.asarray(runs, dtype=np.int64).reshape(-1, 2)
    runs = runs[runs[:, 1] > 0]
    if runs.shape[0] <= 1:
        return runs
    joins = runs[1:, 0] == runs[:-1, 0] + runs[:-1, 1]
    if not joins.any():
        return runs
    heads = np.concatenate(([True], ~joins))
    group = np.cumsum(heads) - 1
    out = np.empty((int(heads.sum()), 2), dtype=np.int64)
    out[:, 0] = runs[heads, 0]
    out[:, 1] = np.bincount(group, weights=runs[:, 1]).astype(np.int64)
    return out


# ----------------------------------------------------------------------------- packing
def span(layout: Layout, count: int, first: int) -> tuple[int, int]:
    """The bytes [lo, hi) that ``count`` elements at byte ``first`` touch (0, 0 if none)."""
    if count <= 0 or not layout.packed:
        return 0, 0
    ext = layout.extent
    lo = first + layout.true_lb + min(0, (count - 1) * ext)
    hi = first + layout.true_ub + max(0, (count - 1) * ext)
    return lo, hi


def _plan(layout: Layout, count: int) -> tuple[Any, ...]:
    """``(kind, unit, …)`` for ``count`` elements at byte 0: kind "one" (a single run),
    "strided" (equal runs equally spaced) or "index" (anything else); the unit divides
    every offset and length (8 at most)."""
    plan = layout._plans.get(count)
    if plan is not None:
        return plan
    runs = _merge(_shifted(layout.runs, np.arange(count, dtype=np.int64) * layout.extent))
    starts, lengths = runs[:, 0], runs[:, 1]
    g = math.gcd(int(np.gcd.reduce(runs, axis=None)), 8) if runs.size else 8
    if runs.shape[0] == 1:
        plan = ("one", g, int(starts[0]), int(lengths[0]))
    elif (lengths == lengths[0]).all() and (np.diff(starts) == starts[1] - starts[0]).all():
        plan = ("strided", g, int(starts[0]), int(starts[1] - starts[0]), runs.shape[0], int(lengths[0]))
    else:
        packed_at = np.concatenate(([0], np.cumsum(lengths)[:-1]))
        plan = ("index", g, starts, lengths, packed_at, {})
    if len(layout._plans) >= 8:
        layout._plans.clear()
    layout._plans[count] = plan
    return plan


def _view(raw: np.ndarray, layout: Layout, count: int, first: int, writable: bool
          ) -> tuple[np.ndarray, np.ndarray | None]:
    """(the message's memory as units: a view, or the whole buffer with an index array)."""
    plan = _plan(layout, count)
    g = math.gcd(plan[1], first)
    units = raw[:raw.size - raw.size % g].view(_UNITS[g])
    kind = plan[0]
    if kind == "one":
        at = (first + plan[2]) // g
        return units[at:at + plan[3] // g], None
    if kind == "strided":
        _, _, start, stride, nruns, length = plan
        return as_strided(units[(first + start) // g:], shape=(nruns, length // g), strides=(stride, g),
                          writeable=writable), None
    _, _, starts, lengths, packed_at, indexes = plan
    idx = indexes.get((first, g))
    if idx is None:
        if len(indexes) >= 4:
            indexes.clear()
        idx = indexes[first, g] = (np.repeat((starts + first - packed_at) // g, lengths // g)
                                   + np.arange(int(lengths.sum()) // g, dtype=np.int64))
    return units, idx


def pack(raw: np.ndarray, layout: Layout, count: int, first: int) -> np.ndarray:
    """The packed bytes of ``count`` elements at byte ``first`` of ``raw`` (uint8, a copy)."""
    out = np.empty(count * layout.packed, dtype=np.uint8)
    if out.size:
        src, idx = _view(raw, layout, count, first, False)
        dst = out.view(src.dtype)
        if idx is None:
            dst.reshape(src.shape)[...] = src
        else:
            np.take(src, idx, out=dst)
    return out


def unpack(raw: np.ndarray, layout: Layout, count: int, first: int, data: np.ndarray) -> None:
    """Write packed ``data`` (uint8) into ``count`` elements at byte ``first`` of ``raw``."""
    if not data.size:
        return
    dst, idx = _view(raw, layout, count, first, True)
    src = data.view(dst.dtype)
    if idx is None:
        dst[...] = src.reshape(dst.shape)
    else:
        dst[idx] = src
