"""Buffer specs as the arrays the fast calls take (what :mod:`._coll`, :mod:`._p2p` and
:mod:`._coll_persistent` do before their fast paths): a spec that stands for its array as
it is, found in C (``PLAIN``: native/_mpi_plain.c), else parsed as :mod:`._msg` parses it
into a view of the message's elements; a reduction's specs only where the datatype's
arithmetic is its array's.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ._msg import IN_PLACE, blocks, gapped, simple
from ._types import PLAIN


def as_array(spec: Any, call: str, role: str, writable: bool = False, per: int = 0,
             reduction: bool = False) -> Any:
    """The numpy array a buffer spec stands for, for the fast calls, which take arrays:
    the spec's own array where the spec means it as it is (``[x, MPI.DOUBLE]`` of a
    float64 array), or a view of the message's elements made in C (a count, a
    displacement, a datatype read over another dtype's bytes, a ``bytearray``, an
    ``array.array``: native/_mpi_plain.c), else the spec parsed as the general path parses
    it (a typecode, a torch tensor, a Fortran-ordered array); ``None`` when neither applies
    (a derived type with gaps, ``MPI.BOTTOM``, ``None``, ``IN_PLACE``, a spec the parse
    refuses: the general path raises its error). ``per``: a block spec of ``per`` blocks (a
    count is one rank's: :func:`blocks`), 0 a message (:func:`simple`). ``reduction``: only
    where the datatype reduces as the array's dtype does (:func:`reducible_type`)."""
    if type(spec) is np.ndarray or spec is None or spec is IN_PLACE:
        return None
    if PLAIN is not None:
        a = PLAIN(spec, per or 1, writable)     # (its datatypes all reduce as their dtypes)
        if type(a) is np.ndarray:
            return a
    if gapped(spec):
        return None
    try:
        a, dt = blocks(spec, per, call, role, writable)[::2] if per else simple(spec, call, role, writable)
    except Exception:  # noqa: BLE001 - (the general path parses it again and raises)
        return None
    if reduction and not reducible_type(dt):
        return None
    return a if type(a) is np.ndarray and a.flags.c_contiguous else None


def plain_pair(send: Any, recv: Any, call: str, send_per: int = 0, recv_per: int = 0,
               send_writable: bool = False, reduction: bool = False) -> tuple[Any, Any] | None:
    """``(send, recv)`` as arrays (:func:`as_array`; ``None`` and ``IN_PLACE`` as they are)
    when at least one of them is a spec or another buffer that stands for an array and
    neither is one that cannot: the caller then makes its call again on the arrays, which
    its fast path takes; else None (the general path goes on with the specs).
    ``reduction`` (a reduction with a built-in op, which the caller checked): only specs
    whose datatype reduces as their array's dtype (:func:`reducible_type`: a derived or
    pair type's error or meaning stays the general path's; ``PLAIN`` takes no other)."""
    if PLAIN is not None:            # (the common case, in C: [x, MPI.DOUBLE] and the like)
        s, r = PLAIN(send, send_per or 1, send_writable), PLAIN(recv, recv_per or 1, True)
        if (s is not send or r is not recv) and (type(s) is np.ndarray or s is None or s is IN_PLACE) \
                and (type(r) is np.ndarray or r is None):
            return s, r
    out = []
    for spec, per, writable, role in ((send, send_per, send_writable, "sendbuf"), (recv, recv_per, True, "recvbuf")):
        if type(spec) is np.ndarray or spec is None or spec is IN_PLACE:
            out.append(spec)
            continue
        a = as_array(spec, call, role, writable, per, reduction)
        if a is None:
            return None
        out.append(a)
    return (out[0], out[1]) if out[0] is not send or out[1] is not recv else None


def bound_at_init(spec: Any) -> bool:
    """May a persistent request turn this spec into its array once, at ``…_init``? Not a
    torch tensor's: its storage may be swapped or resized between ``Start``s (FSDP frees
    and remakes it), and a lazily conjugated one is read at each ``Start``; the general
    path, which reads the tensor anew at each ``Start``, stays."""
    obj = spec[0] if (type(spec) is list or type(spec) is tuple) and spec else spec
    return not type(obj).__module__.startswith("torch")


def reducible_type(dt: Any) -> bool:
    """A predefined datatype that is no value-index pair and whose elements the core
    reduces as their numpy dtype (not ``BFLOAT16_T``: uint16 elements reduced as bfloat16)."""
    t = getattr(dt, "_t", None)
    return t is not None and t.predefined and not t.pair and t.core is t.base
