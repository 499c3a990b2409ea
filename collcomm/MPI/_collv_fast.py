"""The blocking vector collectives through the group's fast call: ``Gatherv``,
``Scatterv``, ``Allgatherv`` and ``Alltoallv`` of numpy arrays.

Each is the same all_to_all with split sizes that :mod:`._collv` hands the core (or, for
an ``Allgatherv`` of equal blocks, the same all_gather), given straight to the fast call
(:mod:`collcomm.core.fastpath`; ``all_to_all_v`` in native/_fastcall_v.c), which does all
of it or nothing. Taken here: C-contiguous numpy arrays whose dtype is their datatype's
(no datatype given, or a predefined one), counts and displacements as lists or tuples of
ints, displacements absent or back to back from the start. Anything else, and whatever
the fast call declines, returns False before any traffic and the caller goes the regular
way (which packs other layouts, converts, and raises the errors). The counts each rank
gives are the regular path's, so ranks that go different ways still make the same call.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ._coll_impl import _run
from ._types import Datatype


def quick_vector(spec: Any) -> tuple[np.ndarray, Any, Any] | None:
    """(array, counts, displacements or None) of a vector buffer spec the fast call may
    take, read as :func:`._msg.vector` reads it; None for any other spec."""
    kind = type(spec)
    if kind is not list and kind is not tuple:
        return None
    k = len(spec)
    if k < 2 or k > 4 or type(spec[0]) is not np.ndarray:
        return None
    a = spec[0]
    last = spec[-1]
    if type(last) is Datatype:
        t = last._t
        if t is None or t.mult != 1 or t.gaps or t.core != a.dtype:
            return None
        k -= 1
    elif k == 4 or last is None or type(last) is str:
        return None
    if k == 3:
        return a, spec[1], spec[2]
    if k != 2:
        return None
    counts = spec[1]
    if type(counts) is tuple and len(counts) == 2:    # (counts, displs), as mpi4py writes it
        return a, counts[0], counts[1]
    return a, counts, None


def _seq(x: Any) -> bool:
    return type(x) is list or type(x) is tuple


def _call(entry: Any, *args: Any) -> bool:
    """Whether the fast call's ``entry`` did the call (None: it declined)."""
    return _run(entry, *args) is not None


def gatherv(fast: Any, g: Any, sendbuf: Any, recvbuf: Any, root: int) -> bool:
    """Gatherv through the fast call: True if it did the call."""
    n = g.size
    if type(sendbuf) is not np.ndarray or type(root) is not int or not 0 <= root < n:
        return False
    sc = [0] * n
    sc[root] = sendbuf.size
    if g.rank == root:
        q = quick_vector(recvbuf)
        if q is None or not _seq(q[1]):
            return False
        recv, rc, rd = q
    else:
        recv, rc, rd = sendbuf.reshape(-1)[:0], [0] * n, None
    return _call(fast.all_to_all_v, sendbuf, sc, None, recv, rc, rd, "Gatherv")


def scatterv(fast: Any, g: Any, sendbuf: Any, recvbuf: Any, root: int) -> bool:
    """Scatterv through the fast call: True if it did the call."""
    n = g.size
    if type(recvbuf) is not np.ndarray or type(root) is not int or not 0 <= root < n:
        return False
    rc = [0] * n
    if g.rank == root:
        q = quick_vector(sendbuf)
        if q is None or not _seq(q[1]) or len(q[1]) != n:
            return False
        send, sc, sd = q
        rc[root] = sc[root]           # (the root's own block: its count, as the regular path)
    else:
        send, sc, sd = recvbuf.reshape(-1)[:0], [0] * n, None
        rc[root] = recvbuf.size
    return _call(fast.all_to_all_v, send, sc, sd, recvbuf, rc, None, "Scatterv")


def allgatherv(fast: Any, g: Any, sendbuf: Any, recvbuf: Any) -> bool:
    """Allgatherv through the fast call: True if it did the call. Equal blocks (counts all
    equal to the send size) go as an all_gather, others as an all_to_all of the send block
    to every rank, as the regular path does."""
    q = quick_vector(recvbuf)
    if type(sendbuf) is not np.ndarray or q is None or not _seq(q[1]):
        return False
    recv, rc, rd = q
    n, k = g.size, sendbuf.size
    if len(rc) != n:
        return False
    if all(c == k for c in rc):
        if rd is not None and list(rd) != list(range(0, n * k, k)):
            return False
        if recv.size != n * k:
            if recv.size < n * k or not recv.flags.c_contiguous:
                return False         # (a view of a non-contiguous array would be a copy)
            recv = recv.reshape(-1)[:n * k]
        return _call(fast.all_gather, sendbuf, recv, "Allgatherv")
    return _call(fast.all_to_all_v, np.tile(sendbuf.reshape(-1), n), [k] * n, None, recv, rc, rd,
                 "Allgatherv")


def alltoallv(fast: Any, sendbuf: Any, recvbuf: Any) -> bool:
    """Alltoallv through the fast call: True if it did the call."""
    s = quick_vector(sendbuf)
    if s is None:
        return False
    r = quick_vector(recvbuf)
    if r is None:
        return False
    return _call(fast.all_to_all_v, s[0], s[1], s[2], r[0], r[1], r[2], "Alltoallv")
