"""The vector collectives through the group's fast call: ``Gatherv``, ``Scatterv``,
``Allgatherv``, ``Alltoallv`` and ``Alltoallw`` of numpy arrays, blocking, ``I…`` and
``…_init`` (their Start).

Each is the same all_to_all with split sizes that :mod:`._collv` hands the core (or, for
an ``Allgatherv`` of equal blocks, the same all_gather), given straight to the fast call
(:mod:`collcomm.core.fastpath`; ``all_to_all_v`` in native/_fastcall_v.c), which does all
of it or nothing; an ``I…`` form to its two-part entry (``all_to_all_v_async``,
native/_fastcall_a2a_parts.c), which starts it or does nothing. ``Alltoallw`` goes as the
bytes the regular path moves (blocks of predefined or gapless datatypes, byte
displacements back to back). All five go to the fast call's own entries (``gatherv``,
``scatterv``, ``allgatherv``, ``alltoallv``: native/_fastcall_vroot.c; ``alltoallw``:
native/_fastcall_vw.c), which read the specs as
:func:`quick_vector` reads them and make the same calls in C (an ``Allgatherv`` they
leave is tried here). Taken: C-contiguous numpy arrays whose dtype is their datatype's
(no datatype given, or a predefined one), counts and displacements as lists or tuples of
ints, displacements absent or back to back from the start. Anything else, and whatever
the fast call declines, returns None before any traffic and the caller goes the regular
way (which packs other layouts, converts, and raises the errors). The counts each rank
gives are the regular path's, so ranks that go different ways still make the same call.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import CollcommError
from ._coll_impl import _run
from ._errors import translate
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


def _a2av(fast: Any, aop: bool) -> Any:
    """The fast call's all_to_all_v entry: whole, or (``aop``) started in two parts."""
    return fast.all_to_all_v_async if aop else fast.all_to_all_v


def _kept(x: Any) -> Any:
    """A list of counts or displacements as the call reads it: a tuple (a call started in
    two parts keeps its arguments until its wait, and MPI reads them at the call: the
    program may reuse its list meanwhile)."""
    return tuple(x) if type(x) is list else x


def rooted_v(entry: Any, sendbuf: Any, recvbuf: Any, root: Any, call: str, aop: bool) -> Any:
    """Gatherv / Scatterv (``entry``: the fast call's ``gatherv`` or ``scatterv``, which read
    the root's spec as :func:`quick_vector` does and make the all_to_all with split sizes
    the regular path makes, in C: native/_fastcall_vroot.c): True (done) or, with ``aop``,
    the started call's Work; None if it did nothing."""
    try:
        return entry(sendbuf, recvbuf, root, call, Datatype, aop)
    except CollcommError as exc:
        raise translate(exc) from exc


def allgatherv(fast: Any, g: Any, sendbuf: Any, recvbuf: Any, call: str, aop: bool = False) -> Any:
    """Allgatherv through the fast call: True (done) or, with ``aop``, the started call's
    Work; None if it did nothing. Equal blocks (counts all
    equal to the send size) go as an all_gather, others as an all_to_all of the send block
    to every rank, as the regular path does. The fast call's own entry (``allgatherv``,
    native/_fastcall_vroot.c) does the same in C first; what it leaves (a send of other
    shapes, ...) is tried here."""
    try:
        r = fast.allgatherv(sendbuf, recvbuf, call, Datatype, aop, np.tile)
    except CollcommError as exc:
        raise translate(exc) from exc
    if r is not None:
        return r
    q = quick_vector(recvbuf)
    if type(sendbuf) is not np.ndarray or q is None or not _seq(q[1]):
        return None
    recv, rc, rd = q
    n, k = g.size, sendbuf.size
    if len(rc) != n:
        return None
    if aop:
        rc, rd = _kept(rc), _kept(rd)
    if all(c == k for c in rc):
        if rd is not None and list(rd) != [i * k for i in range(n)]:   # (k may be 0)
            return None
        if recv.size != n * k:
            if recv.size < n * k or not recv.flags.c_contiguous:
                return None          # (a view of a non-contiguous array would be a copy)
            recv = recv.reshape(-1)[:n * k]
        return _run(fast.all_gather_async if aop else fast.all_gather, sendbuf, recv, call)
    return _run(_a2av(fast, aop), np.tile(sendbuf.reshape(-1), n), [k] * n, None, recv, rc, rd, call)


def alltoallv(fast: Any, sendbuf: Any, recvbuf: Any, call: str, aop: bool = False) -> Any:
    """Alltoallv through the fast call (its ``alltoallv`` reads both specs as
    :func:`quick_vector` does: native/_fastcall_vroot.c): True (done) or, with ``aop``, the
    started call's Work; None if it did nothing."""
    try:
        return fast.alltoallv(sendbuf, recvbuf, call, Datatype, aop)
    except CollcommError as exc:
        raise translate(exc) from exc


def alltoallw(fast: Any, g: Any, sendbuf: Any, recvbuf: Any, call: str, aop: bool = False) -> Any:
    """Alltoallw of contiguous blocks through the fast call, as the regular path puts it:
    an all_to_all of bytes (blocks of datatypes without gaps, byte displacements back to
    back from 0; the fast call's ``alltoallw``, native/_fastcall_vw.c, reads the specs):
    True (done) or, with ``aop``, the started call's Work; None if it did nothing."""
    try:
        return fast.alltoallw(sendbuf, recvbuf, call, Datatype, aop, UINT8)
    except CollcommError as exc:
        raise translate(exc) from exc


UINT8 = np.dtype(np.uint8)     # (the fast call's alltoallw moves bytes)
