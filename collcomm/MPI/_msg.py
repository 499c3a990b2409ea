"""Buffer specifications → numpy views of the caller's memory (never a copy).

The forms mpi4py accepts, and what they mean here:

* ``buf`` — anything with the buffer protocol (numpy array, ``array.array``,
  ``bytearray``, ``memoryview``, ``bytes`` for sends) or a torch CPU tensor; the datatype
  comes from its format (:mod:`._types`), the count is its whole length;
* ``[buf, datatype]``, ``[buf, count]``, ``[buf, count, datatype]``,
  ``[buf, (count, displ), datatype]`` — ``datatype`` an :class:`MPI.Datatype` or a typecode
  (``'i'``, ``'f8'``); ``count`` elements starting ``displ`` elements in; the bytes are
  read as ``datatype`` whatever the buffer's own format (as MPI does);
* vector forms for the ``…v`` collectives: ``[buf, counts]``, ``[buf, (counts, displs)]``,
  ``[buf, counts, displs, datatype]`` and the same with a datatype, where ``counts`` is a
  sequence (one per rank), an int (the same for every rank) or None (the buffer split
  evenly) and ``displs`` a sequence, an int ``d`` (rank i at ``i*d``) or None (packed).

:func:`simple` returns ``(array, datatype)``: a 1-D array of the datatype's base dtype over
exactly the message's elements. :func:`vector` returns the whole buffer as such an array
plus counts and displacements in datatype elements. Non-contiguous numpy arrays and
read-only buffers where the call writes raise ``BufferError``; an impossible count raises
``ValueError``; ``MPI.BOTTOM`` (absolute addresses) is refused.

A derived datatype with gaps (:mod:`._derived`) gives a packed copy of the message's
elements instead of a view (:mod:`._typemap`); where the call writes the buffer, the
caller passes ``staged`` (a list) and runs :func:`finisher`'s result once the data is in,
which unpacks the copy into place. A call that passes no ``staged`` refuses such a type
as a buffer it writes (NotImplementedError), never writing a copy nobody reads.
"""
from __future__ import annotations

import sys
from itertools import accumulate
from typing import Any, Sequence

import numpy as np

from ..tensor_memory import tensor_array
from ._derived import check_committed
from ._staging import Staged, pack_elements, type_name, packed_blocks
from ._types import Datatype, _BY_NUMPY, as_datatype, from_code, from_numpy


class _Sentinel:
    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def __repr__(self) -> str:
        return self._name

    def __reduce__(self) -> str:
        return self._name

    def __bool__(self) -> bool:
        return False


class InPlaceType(_Sentinel):
    """The type of ``MPI.IN_PLACE`` (mpi4py's name)."""
    __slots__ = ()


class BottomType(_Sentinel):
    """The type of ``MPI.BOTTOM`` (mpi4py's name)."""
    __slots__ = ()


class BufferAutomaticType(_Sentinel):
    """The type of ``MPI.BUFFER_AUTOMATIC`` (mpi4py's name)."""
    __slots__ = ()


IN_PLACE: Any = InPlaceType("IN_PLACE")
BOTTOM: Any = BottomType("BOTTOM")
BUFFER_AUTOMATIC: Any = BufferAutomaticType("BUFFER_AUTOMATIC")


def _bottom(call: str) -> NotImplementedError:
    return NotImplementedError(
        f"{call}: MPI.BOTTOM (buffers given by absolute address through derived datatypes) is "
        "not supported by collcomm.MPI; pass the buffer itself")


def _memory(obj: Any, call: str, role: str, writable: bool) -> tuple[np.ndarray, Datatype | None]:
    """(flat array over obj's memory in its own dtype, the datatype its format implies or None)."""
    if isinstance(obj, np.ndarray):
        a = obj
    else:
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(obj, torch.Tensor):
            return _tensor(obj, call, role, writable, torch)
        if obj is BOTTOM:
            raise _bottom(call)
        try:
            mv = memoryview(obj)
        except TypeError:
            if hasattr(obj, "__cuda_array_interface__"):
                raise BufferError(f"{call}: {role} ({type(obj).__name__}) is device memory "
                                  "(__cuda_array_interface__); collcomm.MPI moves host memory") from None
            raise TypeError(f"{call}: {role} must be a buffer (numpy array, bytearray, array.array, "
                            f"memoryview, torch CPU tensor) or a list/tuple spec (DLPack is not taken), got "
                            f"{type(obj).__name__}") from None
        if writable and mv.readonly:
            raise BufferError(f"{call}: {role} ({type(obj).__name__}) is read-only; the call writes it")
        if not mv.contiguous:
            raise BufferError(f"{call}: {role} ({type(obj).__name__}) is not contiguous")
        try:
            a = np.asarray(mv)
        except (TypeError, ValueError, NotImplementedError):
            if not mv.c_contiguous:    # (a Fortran-ordered view of a format numpy cannot read)
                raise BufferError(f"{call}: {role} ({type(obj).__name__}, format {mv.format!r}) "
                                  "is in Fortran order; pass it in C order") from None
            raw = np.frombuffer(mv.cast("B") if mv.ndim else mv, dtype=np.uint8)
            try:
                return raw, from_code(mv.format, call)
            except KeyError:
                return raw, None
    if not a.flags.c_contiguous:
        if not a.flags.f_contiguous:
            raise BufferError(f"{call}: {role} is not contiguous (shape {a.shape}, strides "
                              f"{a.strides}); use np.ascontiguousarray")
        a = a.T         # Fortran order: its elements in memory order, as mpi4py takes them
    if writable and not a.flags.writeable:
        raise BufferError(f"{call}: {role} is read-only; the call writes it")
    flat = a.reshape(-1)
    try:
        return flat, from_numpy(a.dtype, call)
    except KeyError:
        return flat, None


def _tensor(t: Any, call: str, role: str, writable: bool, torch: Any) -> tuple[np.ndarray, Datatype | None]:
    if t.device.type != "cpu":
        raise BufferError(f"{call}: {role} is a tensor on {t.device}; collcomm.MPI takes CPU tensors")
    if not t.is_contiguous():
        raise BufferError(f"{call}: {role} is a non-contiguous tensor; call .contiguous() first")
    t = t.detach()
    if t.is_conj() or t.is_neg():     # (its storage holds the values before the lazy flag)
        if writable:
            raise BufferError(f"{call}: {role} is a lazy conjugate/negative view; the call "
                              "writes it: pass a tensor without the flag (.resolve_conj())")
        t = t.resolve_conj().resolve_neg()
    if t.dtype == torch.bfloat16:
        from ._types import PREDEFINED
        return tensor_array(t, "<u2"), PREDEFINED["BFLOAT16_T"]
    a = tensor_array(t)       # (not t.numpy(): the storage stays resizable)
    return a, from_numpy(a.dtype, call)


def _typed(flat: np.ndarray, natural: Datatype | None, dt: Datatype | None, count: Any, displ: int,
           call: str, role: str, writable: bool = False, staged: Staged | None = None
           ) -> tuple[np.ndarray, Datatype]:
    if dt is None:
        if natural is None:
            raise KeyError(f"{call}: cannot tell the datatype of {role} ({flat.dtype}); "
                           "pass [buf, datatype]")
        dt = natural
    t = dt._t
    assert t is not None
    if dt is natural and count is None and not displ and flat.dtype == t.base:
        return flat, dt
    if not t.predefined:
        check_committed(t, call)
    extent = t.layout.extent
    raw = flat.view(np.uint8) if flat.dtype != np.uint8 else flat
    if count is None:
        avail = raw.size - displ * extent
        if extent <= 0 or avail % extent:
            raise ValueError(f"{call}: {role} has {raw.size} bytes, not a whole number of "
                             f"{type_name(dt)} elements ({extent} bytes each)")
        count = avail // extent
    count = int(count)
    if count < 0:
        raise ValueError(f"{call}: {role}: negative count {count}")
    if t.gaps:
        return pack_elements(raw, dt, count, displ * extent, call, role, writable, staged), dt
    start, stop = displ * extent, (displ + count) * extent
    if displ < 0 or stop > raw.size:
        raise ValueError(f"{call}: {role}: {count} {type_name(dt)} elements at displacement {displ} "
                         f"need {stop} bytes; the buffer has {raw.size}")
    return raw[start:stop].view(t.base), dt


def gapped(spec: Any) -> bool:
    """A buffer spec whose datatype has gaps: packed into (or received into) an array,
    which then takes the arrays' fast path (point to point, :mod:`._coll_packed`)."""
    if (type(spec) is not list and type(spec) is not tuple) or not spec:
        return False
    dt = spec[-1]
    return isinstance(dt, Datatype) and dt._t is not None and dt._t.gaps


def pinned(spec: Any) -> Any:
    """A buffer spec whose datatypes are handles of their own, for a persistent request:
    the program may free its handles once the request exists (MPI), the request's stay."""
    if isinstance(spec, (list, tuple)):
        return type(spec)(Datatype(x) if isinstance(x, Datatype) else pinned(x) for x in spec)
    return spec


def simple(spec: Any, call: str, role: str, writable: bool = False, staged: Staged | None = None
           ) -> tuple[np.ndarray, Datatype]:
    """``(array of the base dtype over the message's elements, datatype)`` for a BufSpec."""
    if type(spec) is np.ndarray:   # the hot path: a contiguous array, its own type
        dt = _BY_NUMPY.get(spec.dtype)
        if dt is not None and spec.flags.c_contiguous and (spec.flags.writeable or not writable):
            return (spec if spec.ndim == 1 else spec.reshape(-1)), dt
    elif type(spec) is list and 2 <= len(spec) <= 3 and type(spec[-1]) is Datatype:
        packed = _derived_spec(spec, call, role, writable, staged)    # (a halo's column: the common case)
        if packed is not None:
            return packed, spec[-1]
    arr, dt, _ = _parse(spec, call, role, writable, 1, staged)
    return arr, dt


def _derived_spec(spec: list, call: str, role: str, writable: bool, staged: Staged | None) -> np.ndarray | None:
    """``[array, count, datatype]`` / ``[array, datatype]`` of a committed type with gaps on a
    C-contiguous numpy array, packed the short way; None for anything else (_parse)."""
    t, a = spec[-1]._t, spec[0]
    if t is None or not t.gaps or not t.committed or type(a) is not np.ndarray or not a.flags.c_contiguous \
            or (writable and not a.flags.writeable):
        return None
    raw = a.reshape(-1).view(np.uint8)
    if len(spec) == 3:
        count = spec[1]
        if type(count) is not int or count < 0:
            return None
    else:
        extent = t.layout.extent
        if extent <= 0 or raw.size % extent:
            return None
        count = raw.size // extent
    return pack_elements(raw, spec[-1], count, 0, call, role, writable, staged)


def blocks(spec: Any, n: int, call: str, role: str, writable: bool = False, staged: Staged | None = None
           ) -> tuple[np.ndarray, int, Datatype]:
    """``(array over n blocks, datatype elements per block, datatype)`` for a BufSpecB: an
    explicit count is one block's (one rank's share), else the buffer splits evenly."""
    arr, dt, count = _parse(spec, call, role, writable, n, staged)
    m = dt._t.mult  # type: ignore[union-attr]
    if count is not None:
        return arr, count, dt
    if m and n and arr.size % (m * n):      # (mpi4py refuses too: no silent flooring)
        raise ValueError(f"{call}: {role}: cannot infer the count: {arr.size} base elements are not "
                         f"{n} equal blocks of whole {dt.Get_name()} elements")
    k = (arr.size // m) // n if m and n else 0
    return arr[:n * k * m], k, dt


def _parse(spec: Any, call: str, role: str, writable: bool, per: int, staged: Staged | None
           ) -> tuple[np.ndarray, Datatype, int | None]:
    if isinstance(spec, (list, tuple)):
        if not 2 <= len(spec) <= 4:
            raise ValueError(f"{call}: {role}: a buffer spec has 2 to 4 items, got {len(spec)}")
        obj, rest = spec[0], list(spec[1:])
        if obj is BOTTOM:
            raise _bottom(call)
        count: Any = None
        displ = 0
        dt: Datatype | None = None
        if len(rest) == 3:                 # [buf, count, displ, datatype], as mpi4py
            rest = [(rest[0], rest[1]), rest[2]]
        if rest and (isinstance(rest[-1], (Datatype, str)) or (len(rest) == 2 and rest[-1] is None)):
            dt = None if rest[-1] is None else as_datatype(rest[-1], call)
            rest = rest[:-1]
        if len(rest) > 1:      # (a last item that is no datatype is not silently dropped)
            raise TypeError(f"{call}: {role}: expected an MPI datatype or a typecode as the last "
                            f"item of the buffer spec, got {type(spec[-1]).__name__} {spec[-1]!r:.60}")
        if rest:
            c = rest[0]
            if isinstance(c, (tuple, list)):
                if len(c) != 2:
                    raise ValueError(f"{call}: {role}: (count, displ) must have 2 items")
                count, displ = c[0], int(c[1] or 0)
            elif c is not None:
                count = int(c)
        if obj is None:           # no buffer: an empty message (mpi4py's [None, datatype])
            if count not in (None, 0) or displ:
                raise ValueError(f"{call}: {role}: a None buffer holds no elements; got count {count}, "
                                 f"displacement {displ}")
            if dt is None:
                raise TypeError(f"{call}: {role}: the buffer is None and no datatype is given")
            t = dt._valid(call)
            return np.empty(0, dtype=t.base), dt, None if count is None else 0
        flat, natural = _memory(obj, call, role, writable)
        if count is not None and int(count) < 0:
            raise ValueError(f"{call}: {role}: negative count {count}")
        arr, dt = _typed(flat, natural, dt, None if count is None else int(count) * per, displ, call, role,
                         writable, staged)
        return arr, dt, None if count is None else int(count)
    flat, natural = _memory(spec, call, role, writable)
    arr, dt = _typed(flat, natural, None, None, 0, call, role)
    return arr, dt, None


def vector(spec: Any, n: int, call: str, role: str, writable: bool = False, staged: Staged | None = None
           ) -> tuple[np.ndarray, list[int], list[int], Datatype]:
    """``(whole buffer as base-dtype array, counts, displs, datatype)`` for a BufSpecV.
    Counts and displacements are in datatype elements, one per rank of ``n``. With a
    derived type with gaps the blocks are packed back to back (displacements become
    their offsets there) and, for a buffer the call writes, unpacked through ``staged``."""
    counts: Any = None
    displs: Any = None
    dt: Datatype | None = None
    obj = spec
    if isinstance(spec, (list, tuple)):
        if not 2 <= len(spec) <= 4:
            raise ValueError(f"{call}: {role}: a vector buffer spec has 2 to 4 items, got {len(spec)}")
        obj, rest = spec[0], list(spec[1:])
        if obj is BOTTOM:
            raise _bottom(call)
        if isinstance(rest[-1], (Datatype, str)) or (len(rest) == 3 and rest[-1] is None):
            dt = None if rest[-1] is None else as_datatype(rest[-1], call)
            rest = rest[:-1]
        if len(rest) == 2:
            counts, displs = rest
        elif len(rest) == 1:
            counts = rest[0]
            if isinstance(counts, tuple) and len(counts) == 2:   # (counts, displs), as mpi4py
                counts, displs = counts
    flat, natural = _memory(obj, call, role, writable)
    if dt is not None and dt._t.gaps:  # type: ignore[union-attr]
        check_committed(dt._t, call)  # type: ignore[arg-type]
        extent = dt._t.layout.extent  # type: ignore[union-attr]
        raw = flat.view(np.uint8)
        length = raw.size // extent if extent > 0 else 0
    else:
        whole, dt = _typed(flat, natural, dt, None, 0, call, role)
        length = whole.size // dt._t.mult if dt._t.mult else 0  # type: ignore[union-attr]
    if counts is None:
        counts = [length // n] * n
    elif _is_int(counts):
        counts = [int(counts)] * n
    else:
        counts = [int(c) for c in counts]
    if len(counts) != n:
        raise ValueError(f"{call}: {role}: expecting {n} counts (one per rank), got {len(counts)}")
    if displs is None:
        displs, pos = [], 0
        for c in counts:
            displs.append(pos)
            pos += c
    elif _is_int(displs):
        displs = [i * int(displs) for i in range(n)]
    else:
        displs = [int(d) for d in displs]
    if len(displs) != n:
        raise ValueError(f"{call}: {role}: expecting {n} displacements (one per rank), got {len(displs)}")
    if dt._t.gaps:  # type: ignore[union-attr]
        if writable and staged is None:
            raise NotImplementedError(f"{call}: {role}: a derived datatype with gaps cannot be "
                                      "written by this call; pass a contiguous datatype")
        whole, _ = packed_blocks(raw, [dt] * n, counts, [d * extent for d in displs], call, role,
                                 staged if writable else None)
        return whole.view(dt._t.base), counts, list(accumulate(counts, initial=0))[:n], dt  # type: ignore[union-attr]
    for i, (c, d) in enumerate(zip(counts, displs)):
        if c < 0 or d < 0 or d + c > length:
            raise ValueError(f"{call}: {role}: block {i} ({c} elements at displacement {d}) does not "
                             f"fit in the buffer of {length} {dt.Get_name()} elements")
    return whole, counts, displs, dt


def _is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def block(whole: np.ndarray, dt: Datatype, displ: int, count: int) -> np.ndarray:
    """Elements ``[displ, displ + count)`` of a vector buffer (a view)."""
    m = dt._t.mult  # type: ignore[union-attr]
    return whole[displ * m:(displ + count) * m]


def packed(whole: np.ndarray, dt: Datatype, counts: Sequence[int], displs: Sequence[int]) -> bool:
    """True when the blocks lie back to back from the start (displacements = prefix sums)."""
    pos = 0
    for c, d in zip(counts, displs):
        if d != pos:
            return False
        pos += c
    return True

