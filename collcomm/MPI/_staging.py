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

from ._derived import check_committed
from ._typemap import pack, span, unpack
from ._types import Datatype

#: Where a call that writes a buffer of a derived type with gaps collects what copies its
#: packed temporary into place once the data has arrived (see :func:`finisher`).
Staged = list


def _named(dt: Datatype) -> str:
    return dt.Get_name() or "derived-datatype"


def _gathered(raw: np.ndarray, dt: Datatype, count: int, first: int, call: str, role: str,
              writable: bool, staged: Staged | None) -> np.ndarray:
    """The packed message of ``count`` elements of a derived type with gaps at byte
    ``first``; for a buffer the call writes, what unpacks it goes to ``staged``."""
    t = dt._t
    assert t is not None
    lo, hi = span(t.layout, count, first)
    if lo < 0 or hi > raw.size:
        raise ValueError(f"{call}: {role}: {count} elements of the derived datatype at byte {first} "
                         f"span bytes [{lo}, {hi}); the buffer has {raw.size}")
    data = pack(raw, t.layout, count, first)
    if writable:
        if staged is None:
            raise NotImplementedError(f"{call}: {role}: a derived datatype with gaps cannot be "
                                      "written by this call; pass a contiguous datatype")
        staged.append(lambda: unpack(raw, t.layout, count, first, data))
    return data.view(t.base)


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
        return _gathered(raw, dt, count, first, call, role, staged is not None, staged)
    stop = first + count * t.layout.extent
    if stop > raw.size:
        raise ValueError(f"{call}: {role}: {count} {_named(dt)} elements at byte {first} need "
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
            if t.gaps:  # type: ignore[union-attr]
                staged.append(lambda t=t, c=int(c), f=int(f), part=whole[pos:pos + size]:
                              unpack(raw, t.layout, c, f, part))
            else:
                staged.append(lambda f=int(f), part=whole[pos:pos + size]:
                              raw[f:f + part.size].__setitem__(slice(None), part))
            pos += size
    return whole, sizes


def finisher(staged: Staged, then: Callable[[], Any] | None = None) -> Callable[[], Any] | None:
    """What to run once the call's data has arrived: ``then``, then the unpacks in ``staged``."""
    if not staged:
        return then

    def finish() -> Any:
        value = then() if then is not None else None
        for step in staged:
            step()
        return value
    return finish
