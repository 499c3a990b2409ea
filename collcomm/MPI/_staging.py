"""Messages of derived datatypes with gaps: packed copies, and unpacking them into place.

:func:`gathered` gives a message's elements packed (a view when the type has no gaps);
:func:`packed_blocks` packs the blocks of a vector or ``Alltoallw`` buffer back to back.
For a buffer the call writes, each registers in ``staged`` (a list) what copies the
packed data into the caller's memory; :func:`finisher` turns the list into the one
callable the call runs after its data has arrived (the core's ``after``, a request's
completion).
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from ._derived import _Type, check_committed
from ._typemap import pack, span, unpack
from ._types import Datatype

#: Where a call that writes a buffer of a derived type with gaps collects what copies its
#: packed temporary into place once the data has arrived (see :func:`finisher`).
Staged = list


class Receiving(list):
    """The staged steps of a point-to-point receive: its temporary starts empty (nothing
    is read first) and each step is called with the bytes that arrived."""


def type_name(dt: Datatype) -> str:
    return dt.Get_name() or "derived-datatype"


def pack_elements(raw: np.ndarray, dt: Datatype, count: int, first: int, call: str, role: str,
              writable: bool, staged: Staged | None) -> np.ndarray:
    """The packed message of ``count`` elements of a derived type with gaps at byte
    ``first``; for a buffer the call writes, what unpacks it goes to ``staged`` (the
    packed copy starts as the memory's contents, for calls that may leave some of it; a
    receive's starts empty and unpacks only the bytes it got)."""
    t = dt._t
    assert t is not None
    lo, hi = span(t.layout, count, first)
    if lo < 0 or hi > raw.size:
        wider = _within_base(raw, lo, hi)
        if wider is None:
            raise ValueError(f"{call}: {role}: {count} elements of the derived datatype at byte {first} "
                             f"span bytes [{lo}, {hi}); the buffer has {raw.size}")
        raw, shift = wider
        first += shift
    if writable and staged is None:
        raise NotImplementedError(f"{call}: {role}: a derived datatype with gaps cannot be "
                                  "written by this call; pass a contiguous datatype")
    if writable and isinstance(staged, Receiving):
        wire = np.empty(count * t.base.itemsize * t.mult, dtype=np.uint8)
    else:
        wire = to_wire(t, pack(raw, t.layout, count, first))
    if writable:
        staged.append(lambda received=None: unpack_message(raw, t, count, first, wire, received))
    return wire.view(t.base)


def _within_base(raw: np.ndarray, lo: int, hi: int) -> tuple[np.ndarray, int] | None:
    """The whole array ``raw`` is a view of, as bytes, and where ``raw`` starts in it, when
    bytes [lo, hi) from ``raw``'s start lie inside it (a type with a negative lower bound
    on ``a[3:]`` reads ``a[:3]``, as MPI reads memory by address); else None."""
    root = raw
    while isinstance(root.base, np.ndarray):
        root = root.base
    if root is raw or not (root.flags.c_contiguous or root.flags.f_contiguous):
        return None
    low = root.__array_interface__["data"][0]
    high = low + root.nbytes
    start = raw.__array_interface__["data"][0]
    if start + lo < low or start + hi > high:
        return None
    whole = (root if root.flags.c_contiguous else root.T).reshape(-1).view(np.uint8)
    return whole, start - low


def unpack_message(raw: np.ndarray, t: _Type, count: int, first: int, wire: np.ndarray,
                   received: int | None = None) -> None:
    """Write the packed message ``wire`` (as it travels) into its elements in ``raw``; with
    ``received`` (bytes), only that much of it arrived: the rest of the elements keep
    their contents."""
    if received == 0:           # (nothing arrived: a PROC_NULL peer, an empty message)
        return
    if received is not None and received < wire.size:
        whole = to_wire(t, pack(raw, t.layout, count, first))
        whole[:received] = wire[:received]
        wire = whole
    unpack(raw, t.layout, count, first, from_wire(t, wire))


def pack_message(raw: np.ndarray, t: _Type, count: int, first: int) -> np.ndarray:
    """``count`` elements at byte ``first`` of ``raw``, packed as they travel (bytes)."""
    return to_wire(t, pack(raw, t.layout, count, first))


_COMPACT_PAIRS: dict[np.dtype, np.dtype] = {}


def compact_pair(pair: np.dtype) -> np.dtype:
    """A value-index pair's dtype without its padding (DOUBLE_INT: 12 bytes)."""
    c = _COMPACT_PAIRS.get(pair)
    if c is None:
        names = list(pair.names)
        formats = [pair.fields[k][0] for k in names]
        offsets = [int(sum(f.itemsize for f in formats[:i])) for i in range(len(names))]
        c = _COMPACT_PAIRS[pair] = np.dtype({"names": names, "formats": formats, "offsets": offsets,
                                       "itemsize": sum(f.itemsize for f in formats)})
    return c


def to_wire(t: _Type, data: np.ndarray) -> np.ndarray:
    """Packed data as it travels: pairs spread to their padded size (the core's carriers)."""
    if not t.pair:
        return data
    compact = data.view(compact_pair(t.np))
    out = np.zeros(compact.size, dtype=t.np)
    for name in t.np.names:
        out[name] = compact[name]
    return out.view(np.uint8)


def from_wire(t: _Type, wire: np.ndarray) -> np.ndarray:
    """The reverse of :func:`to_wire`: pairs without their padding."""
    if not t.pair:
        return wire
    pairs = wire.view(t.np)
    out = np.empty(pairs.size, dtype=compact_pair(t.np))
    for name in t.np.names:
        out[name] = pairs[name]
    return out.view(np.uint8)


def gathered(raw: np.ndarray, dt: Datatype, count: int, first: int, call: str, role: str,
             staged: Staged | None) -> np.ndarray:
    """``count`` elements of ``dt`` at byte ``first`` of ``raw``, packed (a view for a type
    without gaps); written back through ``staged`` when it is given."""
    t = dt._t
    assert t is not None
    if not t.predefined:
        check_committed(t, call)
    if count < 0 or first < 0:
        raise ValueError(f"{call}: {role}: {count} elements at byte {first}: negative")
    if t.gaps:
        return pack_elements(raw, dt, count, first, call, role, staged is not None, staged)
    stop = first + count * t.layout.extent
    if stop > raw.size:
        raise ValueError(f"{call}: {role}: {count} {type_name(dt)} elements at byte {first} need "
                         f"{stop} bytes; the buffer has {raw.size}")
    return raw[first:stop].view(t.base)


def packed_blocks(raw: np.ndarray, dts: Sequence[Datatype], counts: Sequence[int], firsts: Sequence[int],
                  call: str, role: str, staged: Staged | None) -> tuple[np.ndarray, list[int]]:
    """Blocks (``counts[i]`` elements of ``dts[i]`` at byte ``firsts[i]``) packed back to back
    as bytes, and each one's bytes; with ``staged``, each block is unpacked from its place
    in the result once the call has written it."""
    parts = [gathered(raw, dt, int(c), int(f), call, f"{role} block {i}", None).view(np.uint8)
             for i, (c, f, dt) in enumerate(zip(counts, firsts, dts))]
    sizes = [p.size for p in parts]
    whole = np.concatenate(parts) if parts else np.empty(0, dtype=np.uint8)
    if staged is not None:
        pos = 0
        for dt, c, f, size in zip(dts, counts, firsts, sizes):
            t = dt._t
            part = whole[pos:pos + size]
            if t.gaps:  # type: ignore[union-attr]
                staged.append(lambda t=t, c=int(c), f=int(f), part=part: unpack_message(raw, t, c, f, part))
            else:
                staged.append(lambda f=int(f), part=part: raw[f:f + part.size].__setitem__(slice(None), part))
            pos += size
    return whole, sizes


def unpack_staged(staged: Staged, received: int | None = None) -> None:
    """Run the unpacks in ``staged`` now (``received``: the bytes a receive got)."""
    for step in staged:
        if received is None:
            step()
        else:
            step(received)


def finisher(staged: Staged, then: Callable[[], Any] | None = None) -> Callable[[], Any] | None:
    """What to run once the call's data has arrived: ``then``, then the unpacks in ``staged``."""
    if not staged:
        return then

    def finish() -> Any:
        value = then() if then is not None else None
        unpack_staged(staged)
        return value
    return finish
