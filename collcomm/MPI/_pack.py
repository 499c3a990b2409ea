"""MPI_Pack and MPI_Unpack (``Datatype.Pack``/``Unpack`` and their ``external32`` forms).

``Pack(inbuf, outbuf, position)`` reads ``inbuf`` as elements of the datatype (its count
is the buffer's bytes over the extent, or a spec's own count) and writes their packed
bytes into ``outbuf`` from byte ``position``; ``Unpack`` does the reverse into
``outbuf``'s elements. Both return the position after what they moved; a packed
message that does not fit raises ``ERR_TRUNCATE``. The packed form is what collcomm
sends: the basic elements in type-map order, native byte order, a value-index pair
without its padding (``DOUBLE_INT``: 12 bytes, as Open MPI); ``"external32"`` is the
same with every basic element big-endian.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ._errors import ERR_ARG, ERR_TRUNCATE, Exception as MPIException
from ._msg import _memory, simple
from ._derived import basic_dtypes
from ._staging import compact_pair, from_wire, unpack_staged

_EXTERNAL = "external32"


def external_check(datarep: str, call: str) -> None:
    if datarep != _EXTERNAL:
        raise MPIException(ERR_ARG, f"Datatype.{call}: datarep must be {_EXTERNAL!r}, got {datarep!r}")


def _external(data: np.ndarray, t: Any) -> np.ndarray:
    """Packed bytes (native order, pairs without padding) as external32 (big-endian): each
    basic element's bytes reversed; an involution."""
    if not (t.mixed or t.pair):
        return data if t.base.itemsize == 1 else data.view(t.base).byteswap().view(np.uint8)
    runs: list[list[Any]] = []          # (dtype, how many in a row) of one element
    for d in basic_dtypes(t):
        if runs and runs[-1][0] == d:
            runs[-1][1] += 1
        else:
            runs.append([d, 1])
    native = np.dtype([(f"f{i}", d, (k,)) for i, (d, k) in enumerate(runs)])
    big = np.dtype([(f"f{i}", d.newbyteorder(">") if d.itemsize > 1 else d, (k,)) for i, (d, k) in enumerate(runs)])
    return data.view(native).astype(big).view(np.uint8)


def _spec(buf: Any, dt: Any, call: str, role: str, writable: bool) -> Any:
    """``[buf, count, dt]`` for a plain buffer, the count its bytes over the extent (as
    mpi4py: whole elements, the rest left); a spec with its own count keeps it."""
    if isinstance(buf, (list, tuple)):
        return buf
    flat = _memory(buf, call, role, writable)[0]
    extent = dt.Get_extent()[1]
    return [flat, flat.nbytes // extent if extent > 0 else 0, dt]


def pack(dt: Any, inbuf: Any, outbuf: Any, position: int, call: str, datarep: str | None = None) -> int:
    if datarep is not None:
        external_check(datarep, call)
    data, _ = simple(_spec(inbuf, dt, call, "inbuf", False), call, "inbuf")
    packed = from_wire(dt._t, data.view(np.uint8))      # (pairs without their padding)
    if datarep is not None:
        packed = _external(packed, dt._t)
    raw = _memory(outbuf, call, "outbuf", True)[0].view(np.uint8)
    end = int(position) + packed.size
    if position < 0 or end > raw.size:
        raise MPIException(ERR_TRUNCATE, f"{call}: {packed.size} packed bytes at position {position} "
                                         f"do not fit in outbuf of {raw.size} bytes")
    raw[position:end] = packed
    return end


def unpack(dt: Any, inbuf: Any, position: int, outbuf: Any, call: str, datarep: str | None = None) -> int:
    if datarep is not None:
        external_check(datarep, call)
    staged: list[Any] = []
    out, _ = simple(_spec(outbuf, dt, call, "outbuf", True), call, "outbuf", writable=True, staged=staged)
    raw = _memory(inbuf, call, "inbuf", False)[0].view(np.uint8)
    t = dt._t
    size = out.nbytes // (t.base.itemsize * t.mult) * t.size if t.mult else 0   # (packed: no padding)
    end = int(position) + size
    if position < 0 or end > raw.size:
        raise MPIException(ERR_TRUNCATE, f"{call}: outbuf takes {size} packed bytes from position "
                                         f"{position}; inbuf has {raw.size} bytes")
    data = raw[position:end]
    if datarep is not None:
        data = _external(data.copy(), t)
    if t.pair:               # field by field: a pair's padding in the caller's memory stays
        compact, pairs = data.view(compact_pair(t.np)), out.view(t.np)
        for name in t.np.names:
            pairs[name] = compact[name]
    else:
        np.copyto(out.view(np.uint8), data)
    unpack_staged(staged)
    return end
