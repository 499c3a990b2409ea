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

Packing ``count`` elements at byte ``first`` of a buffer (:func:`pack`, :func:`unpack`) is
one memcpy a run in C when the native core is there (``native/_pack_runs.c``). The numpy
path, the reference and the fallback, uses the widest unit (8, 4, 2 or 1 bytes) that
divides every offset and length: one strided copy when the runs are equally long and
equally spaced (a column, a 2-D subarray), one a run for a struct's few fields, else one
gather through an index array; plans are kept per count.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from .. import native

_UNITS = {8: np.uint64, 4: np.uint32, 2: np.uint16, 1: np.uint8}
_NATIVE = native.core       # pack_runs (native/_pack_runs.c), or None: numpy's plans below


class Layout:
    """One element of a derived datatype in memory (see the module docstring)."""

    __slots__ = ("runs", "lb", "ub", "true_lb", "true_ub", "lb_marked", "ub_marked", "align",
                 "packed", "_plans")

    def __init__(self, runs: np.ndarray, lb: int, ub: int, lb_marked: bool, ub_marked: bool,
                 align: int) -> None:
        self.runs = np.ascontiguousarray(_merge(runs))
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
    piece or one per piece (a struct). A piece of a type with no data and no bounds of its
    own adds its bounds but not its alignment, as in Open MPI."""
    displs, counts = np.asarray(displs, dtype=np.int64), np.asarray(counts, dtype=np.int64)
    if isinstance(olds, Layout):
        keep = counts > 0
        displs, counts = displs[keep], counts[keep]
        if not displs.size:
            return Layout(np.zeros((0, 2), dtype=np.int64), 0, 0, False, False, olds.align)
        ext = olds.extent
        lo_hi = np.stack((displs + olds.lb, displs + (counts - 1) * ext + olds.ub))
        return _bounded(_piece_runs(olds, displs, counts), int(lo_hi.min()), int(lo_hi.max()),
                        olds.lb_marked, olds.ub_marked, 1 if _empty(olds) else olds.align)
    runs, lbs, ubs, align = [], [], [], 1
    for disp, count, old in zip(displs.tolist(), counts.tolist(), olds):
        if count <= 0:
            continue
        runs.append(_piece_runs(old, np.array([disp], dtype=np.int64), np.array([count], dtype=np.int64)))
        ends = (disp + old.lb, disp + (count - 1) * old.extent + old.ub)
        lbs.append((min(ends), old.lb_marked))
        ubs.append((max(ends), old.ub_marked))
        align = max(align, 1 if _empty(old) else old.align)
    if not runs:
        return Layout(np.zeros((0, 2), dtype=np.int64), 0, 0, False, False, align)
    lb_marked, ub_marked = any(m for _, m in lbs), any(m for _, m in ubs)
    lb = min(v for v, m in lbs if m or not lb_marked)      # a set bound wins over data's
    ub = max(v for v, m in ubs if m or not ub_marked)
    return _bounded(np.concatenate(runs), lb, ub, lb_marked, ub_marked, align)


def _empty(old: Layout) -> bool:
    return old.packed == 0 and not (old.lb_marked or old.ub_marked)


def _piece_runs(old: Layout, displs: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The runs of ``counts[i]`` elements of ``old`` at byte ``displs[i]``, in order: one run a
    piece when an element is one run filling its extent (a block of a vector, a row)."""
    ext = old.extent
    if old.runs.shape[0] == 1 and int(old.runs[0, 1]) == ext and int(old.runs[0, 0]) == old.lb:
        return np.stack((displs + old.lb, counts * ext), axis=1)
    if (counts == counts[0]).all():
        starts = (displs[:, None] + np.arange(counts[0], dtype=np.int64)[None, :] * ext).reshape(-1)
    else:
        firsts = np.cumsum(counts) - counts
        starts = np.repeat(displs, counts) + (np.arange(int(counts.sum()), dtype=np.int64)
                                              - np.repeat(firsts, counts)) * ext
    return _shifted(old.runs, starts)


def _bounded(runs: np.ndarray, lb: int, ub: int, lb_marked: bool, ub_marked: bool, align: int) -> Layout:
    if not (runs[:, 1] > 0).any():     # no data at all: no bounds either (Open MPI: 0, 0)
        return Layout(np.zeros((0, 2), dtype=np.int64), 0, 0, False, False, align)
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


_INDEX_CACHE_ITEMS = 1 << 20      # index arrays larger than this (8 MiB) are not kept
_COLUMNS = 16       # an element of at most this many unequal runs: one strided copy a run


def _plan(layout: Layout, count: int) -> tuple[Any, ...]:
    """``(kind, unit, …)`` for ``count`` elements at byte 0: "one" (a single run),
    "strided" (every element's runs equally long and equally spaced: one 3-D strided
    copy, elements one extent apart), "columns" (a few unequal runs an element, a struct:
    one strided copy of each run over all the elements) or "index" (anything else); the
    unit divides every offset, length and stride (8 at most)."""
    plan = layout._plans.get(count)
    if plan is not None:
        return plan
    runs, ext = layout.runs, layout.extent
    starts, lengths = runs[:, 0], runs[:, 1]
    nruns = runs.shape[0]
    step = int(starts[1] - starts[0]) if nruns > 1 else 0
    if nruns == 1 and (count == 1 or int(lengths[0]) == ext):
        g = math.gcd(int(starts[0]), int(lengths[0]), 8)
        plan = ("one", g, int(starts[0]), int(lengths[0]) * count)
    elif (lengths == lengths[0]).all() and (nruns == 1 or (np.diff(starts) == step).all()):
        g = math.gcd(int(starts[0]), int(lengths[0]), step, ext, 8)
        plan = ("strided", g, int(starts[0]), ext, step, nruns, int(lengths[0]), count)
    elif nruns <= _COLUMNS and count > 1:
        packed_at = np.concatenate(([0], np.cumsum(lengths)[:-1]))
        plan = ("columns", 1, [(int(st), int(ln), int(at)) for st, ln, at in zip(starts, lengths, packed_at)],
                ext, layout.packed, count)
    else:
        every = _merge(_shifted(runs, np.arange(count, dtype=np.int64) * ext))
        g = math.gcd(int(np.gcd.reduce(every, axis=None)), 8) if every.size else 8
        packed_at = np.concatenate(([0], np.cumsum(every[:, 1])[:-1]))
        plan = ("index", g, every[:, 0], every[:, 1], packed_at, {})
    if len(layout._plans) >= 8:
        layout._plans.clear()
    layout._plans[count] = plan
    return plan


def _strided(raw: np.ndarray, at: int, unit: Any, shape: tuple[int, ...], strides: tuple[int, ...]
             ) -> np.ndarray:
    """``raw``'s bytes from byte ``at`` as a strided array of ``unit`` (numpy checks that it
    stays inside them; a read-only ``raw`` gives a read-only view)."""
    return np.ndarray(shape, unit, buffer=raw, offset=at, strides=strides)


def _view(raw: np.ndarray, layout: Layout, count: int, first: int, writable: bool
          ) -> tuple[np.ndarray, np.ndarray | None]:
    """(the message's memory as units: a view, or the whole buffer with an index array)."""
    plan = _plan(layout, count)
    g = math.gcd(plan[1], first)
    kind = plan[0]
    if kind == "one":
        at = first + plan[2]
        return raw[at:at + plan[3]].view(_UNITS[g]), None
    if kind == "strided":
        _, _, start, ext, step, nruns, length, n = plan
        return _strided(raw, first + start, _UNITS[g], (n, nruns, length // g), (ext, step, g)), None
    units = raw[:raw.size - raw.size % g].view(_UNITS[g])
    _, _, starts, lengths, packed_at, indexes = plan
    idx = indexes.get((first, g))
    if idx is None:
        idx = (np.repeat((starts + first - packed_at) // g, lengths // g)
               + np.arange(int(lengths.sum()) // g, dtype=np.int64))
        if idx.size <= _INDEX_CACHE_ITEMS:
            if len(indexes) >= 4:
                indexes.clear()
            indexes[first, g] = idx
    return units, idx


def _columns(raw: np.ndarray, plan: tuple[Any, ...], first: int, packed: np.ndarray, out: bool) -> None:
    """Copy each run of every element between ``raw`` and ``packed`` (``out``: to packed)."""
    _, _, runs, ext, per, count = plan
    for start, length, at in runs:
        g = math.gcd(first + start, length, ext, per, at, 8)
        unit = _UNITS[g]
        mem = _strided(raw, first + start, unit, (count, length // g), (ext, g))
        col = _strided(packed, at, unit, (count, length // g), (per, g))
        if out:
            col[...] = mem
        else:
            mem[...] = col


def pack(raw: np.ndarray, layout: Layout, count: int, first: int) -> np.ndarray:
    """The packed bytes of ``count`` elements at byte ``first`` of ``raw`` (uint8, a copy):
    in C when the native core is there (one memcpy a run), else by numpy (the plans)."""
    out = np.empty(count * layout.packed, dtype=np.uint8)
    if out.size and _NATIVE is not None:
        _NATIVE.pack_runs(raw, layout.runs, count, layout.ub - layout.lb, first, out, True)
    elif out.size:
        plan = _plan(layout, count)
        if plan[0] == "columns":
            _columns(raw, plan, first, out, True)
            return out
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
    if _NATIVE is not None:
        _NATIVE.pack_runs(raw, layout.runs, count, layout.ub - layout.lb, first, data, False)
        return
    plan = _plan(layout, count)
    if plan[0] == "columns":
        _columns(raw, plan, first, data, False)
        return
    dst, idx = _view(raw, layout, count, first, True)
    src = data.view(dst.dtype)
    if idx is None:
        dst[...] = src.reshape(dst.shape)
    else:
        dst[idx] = src
