"""MPI_Pack and MPI_Unpack (``Datatype.Pack``/``Unpack`` and their ``external32`` forms).

``Pack(inbuf, outbuf, position)`` reads ``inbuf`` as elements of the datatype (its count
is the buffer's bytes over the extent, or a spec's own count) and writes their packed
bytes into ``outbuf`` from byte ``position``; ``Unpack`` does the reverse into
``outbuf``'s elements. Both return the position after what they moved; a packed
message that does not fit raises ``ERR_TRUNCATE``. The packed form is what collcomm
sends: the basic elements in type-map order, native byte order; ``"external32"`` is the
same big-endian (types of one basic type; a struct of mixed types or value-index pairs
is refused there).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ._errors import ERR_ARG, ERR_TRUNCATE, Exception as MPIException
from ._msg import _memory, simple
from ._staging import finisher

_EXTERNAL = "external32"


def external_check(datarep: str, call: str) -> None:
    if datarep != _EXTERNAL:
        raise MPIException(ERR_ARG, f"Datatype.{call}: datarep must be {_EXTERNAL!r}, got {datarep!r}")


def _external(data: np.ndarray, dt: Any, call: str) -> np.ndarray:
    """``data`` (packed, native order) as external32 (big-endian); an involution."""
    t = dt._t
    if t.mixed or t.pair:
        raise NotImplementedError(f"{call}: external32 of a struct of mixed types or of value-index "
                                  "pairs is not supported by collcomm.MPI")
    if t.base.itemsize == 1 or t.base.byteorder in ("|", ">"):
        return data
    return data.byteswap()


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
    if datarep is not None:
        data = _external(data, dt, call)
    raw = _memory(outbuf, call, "outbuf", True)[0].view(np.uint8)
    packed = data.view(np.uint8)
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
    target = out.view(np.uint8)
    end = int(position) + target.size
    if position < 0 or end > raw.size:
        raise MPIException(ERR_TRUNCATE, f"{call}: outbuf takes {target.size} packed bytes from position "
                                         f"{position}; inbuf has {raw.size} bytes")
    data = raw[position:end].view(out.dtype)
    np.copyto(out, _external(data, dt, call) if datarep is not None else data)
    done = finisher(staged)
    if done is not None:
        done()
    return end
