"""Lists of buffers that lie back to back in memory, used as one buffer without a copy.

torch's list forms (``scatter(tensor, scatter_list)``, ``gather(tensor, gather_list)``,
``all_gather(tensor_list, tensor)``) hand a collective one buffer per rank; the core
moves one contiguous buffer. When the list's arrays are views of one buffer, in order
(``big.split(k)``, ``[big[i*k:(i+1)*k] for i ...]``), that buffer already exists: both
front ends (the functional API's list forms, the torch backend's) send from it or
receive into it instead of concatenating the list into a new one (and copying the
result back out), which for a 64 MiB scatter cost more than moving the data.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

__all__ = ["apart_or_own", "joined"]


class _Run:
    """The array interface of a run of back-to-back arrays; holds every one of them, so
    the joined view keeps all their memory alive (an asynchronous call may outlive the
    caller's list)."""

    def __init__(self, arrs: Sequence[np.ndarray], start: int, size: int, dtype: np.dtype,
                 writable: bool) -> None:
        self.arrs = list(arrs)
        self.__array_interface__ = {"data": (start, not writable), "shape": (size,),
                                    "typestr": dtype.str, "version": 3}


def joined(arrs: Sequence[np.ndarray], writable: bool) -> np.ndarray | None:
    """``arrs`` as one flat array over their own memory when they lie back to back in it,
    in order, each C-contiguous and non-empty, of one dtype (and writable if asked);
    else None."""
    if not arrs:
        return None
    dtype = arrs[0].dtype
    start = pos = arrs[0].__array_interface__["data"][0]
    for a in arrs:
        if (a.dtype != dtype or not a.size or not a.flags.c_contiguous or (writable and not a.flags.writeable)
                or a.__array_interface__["data"][0] != pos):
            return None
        pos += a.nbytes
    return np.asarray(_Run(arrs, start, (pos - start) // dtype.itemsize, dtype, writable))


def apart_or_own(run: np.ndarray | None, other: np.ndarray, block: int) -> np.ndarray | None:
    """``run`` (a list's memory as one buffer) if ``other`` (the call's one-rank buffer)
    shares none of it or is exactly block ``block`` of it, the one the call itself skips
    (a scatter root's own block, a gather's own contribution); else None (a copy is
    needed: the call would overwrite data it has yet to send)."""
    if run is None or not np.shares_memory(run, other):
        return run
    at = run.__array_interface__["data"][0] + block * other.nbytes
    if other.flags.c_contiguous and other.__array_interface__["data"][0] == at:
        return run
    return None
