"""What a datatype is inside collcomm.MPI (:class:`_Type`), and the derived-type constructors.

Every type, predefined or derived, has:

* ``layout``: one element in memory (:mod:`._typemap`: runs of bytes, bounds, alignment);
  ``gaps`` is True when a message of the type is not simply its memory (holes, a lower
  bound or extent of its own, pieces out of order), so it is packed to move;
* ``base`` and ``mult``: the numpy dtype and the number of its items one *packed* element
  is: the basic type's when every basic element is of one type (so a reduction applies
  to the packed message, as MPI's predefined ops apply to a derived type of one basic
  type), bytes (``uint8``) for a struct of mixed types (``mixed``: not reducible); a
  type of value-index pairs packs their data (12 bytes of a ``DOUBLE_INT``: its padding
  is never written) and carries them as the predefined pairs are (16);
  ``core`` the dtype the core is told, ``np`` one basic element's numpy dtype;
* ``size``: MPI's size (data bytes, a value-index pair without its padding), ``nbasic``:
  basic elements in one element;
* ``recipe``: how it was made (``decode``, ``Get_envelope``, ``Get_contents``).

A derived type must be committed (``Commit``) before it is used to communicate, as MPI
requires; constructors check their arguments with MPI's error classes (ERR_COUNT,
ERR_ARG, ERR_TYPE).
"""
from __future__ import annotations

import operator
from typing import Any, Sequence

import numpy as np

from . import _typemap
from ._errors import ERR_ARG, ERR_COUNT, ERR_TYPE, Exception as MPIException

#: Open MPI's combiner numbers (``MPI.COMBINER_*``).
COMBINERS = {"NAMED": 0, "DUP": 1, "CONTIGUOUS": 2, "VECTOR": 3, "HVECTOR": 5, "INDEXED": 6,
             "HINDEXED": 8, "INDEXED_BLOCK": 9, "STRUCT": 11, "SUBARRAY": 12, "DARRAY": 13,
             "RESIZED": 17, "HINDEXED_BLOCK": 18, "F90_REAL": 14, "F90_COMPLEX": 15,
             "F90_INTEGER": 16}


class _Type:
    __slots__ = ("name", "np", "base", "mult", "core", "code", "predefined", "pair", "size",
                 "layout", "gaps", "mixed", "nbasic", "committed", "recipe", "attrs")

    def __init__(self, name: str, npdt: Any, code: str, *, base: Any = None, mult: int = 1,
                 core: Any = None, predefined: bool = True, pair: bool = False) -> None:
        self.name, self.code, self.predefined, self.pair = name, code, predefined, pair
        self.np = None if npdt is None else np.dtype(npdt)
        self.base = self.np if base is None else np.dtype(base)
        self.mult = mult
        self.core = self.base if core is None else core
        # MPI's size: the bytes of data, without a pair's padding (MPI_DOUBLE_INT: 12, its
        # extent 16); the extent is base.itemsize * mult, the element's bytes in memory
        packed = sum(f[0].itemsize for f in self.np.fields.values()) if pair else self.base.itemsize
        self.size = packed * mult
        align = self.np.alignment if self.np is not None else 1
        if pair:         # the data only: a pair's padding is never written (DOUBLE_INT: 12 of 16)
            fields = sorted((off, f.itemsize) for f, off, *_ in self.np.fields.values())
            self.layout = _typemap.Layout(np.array(fields, dtype=np.int64), 0, self.base.itemsize,
                                          False, False, align)
        else:
            self.layout = _typemap.plain(self.base.itemsize * mult, align)
        self.gaps = self.mixed = False
        self.nbasic, self.committed = mult, True
        self.recipe: tuple[str, dict[str, Any], list[Any]] = ("NAMED", {}, [])

    def key(self) -> tuple[Any, ...]:
        """What a basic element is, for telling a struct of one type from a mixed one."""
        return (self.base.str, str(self.core), self.pair, self.np.str if self.pair else None)


def _derived(displs: Any, counts: Any, olds: "_Type | Sequence[_Type]",
             recipe: tuple[str, dict[str, Any], list[Any]], layout: _typemap.Layout | None = None) -> _Type:
    """A new (uncommitted) type of pieces: piece i is ``counts[i]`` elements of the old type
    (one type for all, or one each) at byte ``displs[i]``."""
    counts = np.asarray(counts, dtype=np.int64).reshape(-1)
    if isinstance(olds, _Type):
        used = [olds] if counts.size and counts.max() > 0 else []
        total = int(counts.sum())
        size, nbasic = total * olds.size, total * olds.nbasic
        if layout is None:
            layout = _typemap.combine(displs, counts, olds.layout)
    else:
        used = [o for o, c in zip(olds, counts.tolist()) if c > 0]
        size = sum(c * o.size for o, c in zip(olds, counts.tolist()) if c > 0)
        nbasic = sum(c * o.nbasic for o, c in zip(olds, counts.tolist()) if c > 0)
        if layout is None:
            layout = _typemap.combine(displs, counts, [o.layout for o in olds])
    keys = {o.key() for o in used if o.nbasic}
    mixed = len(keys) > 1 or any(o.mixed for o in used)
    first = next((o for o in used if o.nbasic), None)
    t = _Type.__new__(_Type)
    t.name, t.predefined, t.committed, t.recipe = "", False, False, recipe
    if first is None or mixed:
        t.np = t.base = t.core = np.dtype(np.uint8)
        t.code, t.pair = "B", False
    else:
        t.np, t.base, t.core, t.code, t.pair = first.np, first.base, first.core, first.code, first.pair
    t.mixed, t.layout, t.size, t.nbasic = mixed, layout, size, nbasic
    if t.pair:       # packed without padding, carried as the predefined pairs are (_staging)
        t.mult, t.gaps = nbasic, True
    else:
        t.mult, t.gaps = layout.packed // t.base.itemsize, not layout.contiguous()
    return t


def _count(value: Any, call: str, what: str = "count") -> int:
    v = int(value)          # (a scalar: mpi4py takes 3.0; list items must be integers)
    if v < 0:      # (a count: ERR_COUNT; a block length: ERR_ARG, as Open MPI)
        raise MPIException(ERR_COUNT if what == "count" else ERR_ARG,
                           f"Datatype.{call}: {what} must be >= 0, got {v}")
    return v


def _ints(values: Any, call: str, what: str) -> list[int]:
    try:
        return [operator.index(v) for v in values]
    except TypeError:
        raise TypeError(f"Datatype.{call}: {what} must be a sequence of integers, got {values!r:.80}") from None


def _same_lengths(call: str, **lists: list[int]) -> None:
    if len({len(v) for v in lists.values()}) > 1:      # (mpi4py's own check: ValueError)
        raise ValueError(f"Datatype.{call}: " + ", ".join(f"{len(v)} {k}" for k, v in lists.items())
                         + "; they must be as many")


def contiguous(old: _Type, count: Any) -> _Type:
    n = _count(count, "Create_contiguous")
    return _derived([0], [n], old, ("CONTIGUOUS", {"count": n}, [old]))


def vector(old: _Type, count: Any, blocklength: Any, stride: Any, hbytes: bool) -> _Type:
    call = "Create_hvector" if hbytes else "Create_vector"
    n, bl, st = _count(count, call), _count(blocklength, call, "blocklength"), int(stride)
    step = st if hbytes else st * old.layout.extent
    params = {"count": n, "blocklength": bl, "stride": st}
    return _derived(np.arange(n, dtype=np.int64) * step, np.full(n, bl), old,
                    ("HVECTOR" if hbytes else "VECTOR", params, [old]))


def indexed(old: _Type, blocklengths: Any, displacements: Any, hbytes: bool, block: bool) -> _Type:
    call = ("Create_hindexed" if hbytes else "Create_indexed") + ("_block" if block else "")
    displs = _ints(displacements, call, "displacements")
    if block:
        bl = _count(blocklengths, call, "blocklength")
        lengths = [bl] * len(displs)
    else:
        lengths = [_count(b, call, "blocklengths") for b in _ints(blocklengths, call, "blocklengths")]
        _same_lengths(call, blocklengths=lengths, displacements=displs)
    scale = 1 if hbytes else old.layout.extent
    name = ("HINDEXED" if hbytes else "INDEXED") + ("_BLOCK" if block else "")
    params = ({"blocklength": lengths[0] if lengths else int(blocklengths)} if block
              else {"blocklengths": lengths})
    params["displacements"] = displs
    return _derived(np.array(displs, dtype=np.int64) * scale, lengths, old, (name, params, [old]))


def struct(blocklengths: Any, displacements: Any, types: Sequence[_Type]) -> _Type:
    lengths = [_count(b, "Create_struct", "blocklengths") for b in _ints(blocklengths, "Create_struct", "blocklengths")]
    displs = _ints(displacements, "Create_struct", "displacements")
    _same_lengths("Create_struct", blocklengths=lengths, displacements=displs, datatypes=list(types))
    params = {"blocklengths": lengths, "displacements": displs, "datatypes": list(types)}
    return _derived(displs, lengths, list(types), ("STRUCT", params, list(types)))


def subarray(old: _Type, sizes: Any, subsizes: Any, starts: Any, order: int) -> _Type:
    sizes, subsizes, starts = (_ints(v, "Create_subarray", w) for v, w in
                               ((sizes, "sizes"), (subsizes, "subsizes"), (starts, "starts")))
    _same_lengths("Create_subarray", sizes=sizes, subsizes=subsizes, starts=starts)
    if not sizes:
        raise MPIException(ERR_ARG, "Datatype.Create_subarray: an array of no dimensions")
    for s, ss, st in zip(sizes, subsizes, starts):
        if s < 1 or ss < 1 or st < 0 or st + ss > s:      # (a subsize of 0 too, as Open MPI)
            raise MPIException(ERR_ARG, f"Datatype.Create_subarray: a subarray of {subsizes} at "
                                        f"{starts} does not fit in an array of {sizes}")
    if order not in (0, 1):
        raise MPIException(ERR_ARG, f"Datatype.Create_subarray: order must be MPI.ORDER_C or "
                                    f"MPI.ORDER_FORTRAN, got {order}")
    dims = list(zip(sizes, subsizes, starts))
    if order == 1:                       # Fortran: the first index varies fastest
        dims.reverse()
    ext = old.layout.extent
    strides, acc = [], ext
    for s, _, _ in reversed(dims):
        strides.append(acc)
        acc *= s
    strides.reverse()
    offset = sum(st * k for (_, _, st), k in zip(dims, strides))
    grid = np.zeros(1, dtype=np.int64)
    for (_, ss, _), k in zip(dims[:-1], strides[:-1]):
        grid = (grid[:, None] + np.arange(ss, dtype=np.int64)[None, :] * k).reshape(-1)
    inner = np.full(grid.size, dims[-1][1])
    rows = _typemap.combine(offset + grid, inner, old.layout)
    layout = _typemap.Layout(rows.runs, 0, acc, True, True, old.layout.align)   # the whole array
    params = {"sizes": sizes, "subsizes": subsizes, "starts": starts, "order": order}
    return _derived(offset + grid, inner, old, ("SUBARRAY", params, [old]), layout)


def resized(old: _Type, lb: Any, extent: Any) -> _Type:
    lb, extent = int(lb), int(extent)
    return _derived([0], [1], old, ("RESIZED", {"lb": lb, "extent": extent}, [old]),
                    _typemap.resized(old.layout, lb, extent))


def dup(old: _Type) -> _Type:
    if old.predefined:
        t = _Type(f"Dup {old.name}", old.np, old.code, base=old.base, mult=old.mult, core=old.core,
                  predefined=False, pair=old.pair)
    else:
        t = _derived([0], [1], old, ("DUP", {}, [old]), old.layout)
        t.name = f"Dup {old.name}"
    t.recipe, t.committed = ("DUP", {}, [old]), old.committed
    return t


def basic_dtypes(t: _Type) -> list[np.dtype]:
    """The numpy dtypes of one element's basic elements, in type-map order, as they are
    packed (a value-index pair as its value and index, without padding)."""
    name, p, olds = t.recipe
    if name == "NAMED":
        return [t.np.fields[k][0] for k in t.np.names] if t.pair else [t.base if t.np.kind == "S" else t.np]
    if name == "STRUCT":
        return [d for b, o in zip(p["blocklengths"], olds) for d in basic_dtypes(o) * b]
    inner = basic_dtypes(olds[0])
    if name in ("CONTIGUOUS", "VECTOR", "HVECTOR"):
        return inner * (p.get("count", 1) * p.get("blocklength", 1))
    if name in ("INDEXED", "HINDEXED"):
        return inner * sum(p["blocklengths"])
    if name in ("INDEXED_BLOCK", "HINDEXED_BLOCK"):
        return inner * (p["blocklength"] * len(p["displacements"]))
    if name == "SUBARRAY":
        return inner * int(np.prod(p["subsizes"]))
    return inner              # RESIZED, DUP


def check_committed(t: _Type, call: str) -> None:
    if not t.committed:
        raise MPIException(ERR_TYPE, f"{call}: the derived datatype is not committed; call "
                                     "its Commit() before communicating with it")
