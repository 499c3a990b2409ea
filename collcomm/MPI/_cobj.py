"""Object collectives (lower case): ``bcast``, ``gather``, ``scatter``, ``allgather``,
``alltoall``, ``reduce``, ``allreduce``, ``scan``, ``exscan``, ``barrier``.

Objects are pickled by ``MPI.pickle`` (_pickle.py: protocol 5, large numpy buffers out of
band, unless the program gave it other functions) and moved by
:mod:`collcomm.core.pickled_small`: two calls of plain bytes on the communicator's group
(the sizes, then the pickles), each through the fast call where there is one, or the
general bodies of :mod:`collcomm.core.pickled` for objects with large buffers.
Every rank gets unpickled copies, the root too, as with mpi4py. The reductions gather the
objects and fold them in rank order with the op (:meth:`MPI.Op.__call__`, or any callable
``f(x, y)``), so a non-commutative function gives ``f(f(x0, x1), x2)…`` on every rank:
``reduce`` on the root (None elsewhere), ``allreduce`` everywhere, ``scan`` the prefix up
to this rank, ``exscan`` the prefix before it (None on rank 0).
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

from ..core import pickled_small as small
from ..errors import CollcommError
from ._collv import _check_root
from ._errors import translate
from ._ops import SUM, py_combine
from ._pickle import pickle as _pickle


def _run(fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    except CollcommError as exc:
        raise translate(exc) from exc


def _expect(seq: Any, n: int, call: str) -> Sequence[Any]:
    if seq is None or not hasattr(seq, "__len__"):
        raise TypeError(f"{call}: expecting a sequence of {n} items, got {type(seq).__name__}")
    if len(seq) != n:
        raise ValueError(f"{call}: expecting {n} items, got {len(seq)}")
    return seq


class ObjectCollectives:
    """The object collectives of a communicator."""

    __slots__ = ()

    _grp: Callable[..., Any]      # the communicator's group, from Comm

    def barrier(self) -> None:
        self.Barrier()  # type: ignore[attr-defined]

    def bcast(self, obj: Any, root: int = 0) -> Any:
        g = self._grp("bcast")
        _check_root(g, root, "bcast")
        return _run(small.bcast, g, obj, root, "bcast", _pickle)

    def gather(self, sendobj: Any, root: int = 0) -> list[Any] | None:
        g = self._grp("gather")
        _check_root(g, root, "gather")
        return _run(small.gather, g, sendobj, root, "gather", _pickle)

    def scatter(self, sendobj: Sequence[Any] | None, root: int = 0) -> Any:
        g = self._grp("scatter")
        _check_root(g, root, "scatter")
        objs = _expect(sendobj, g.size, "scatter") if g.rank == root else None
        return _run(small.scatter, g, objs, root, "scatter", _pickle)

    def allgather(self, sendobj: Any) -> list[Any]:
        g = self._grp("allgather")
        return _run(small.allgather, g, sendobj, "allgather", _pickle)

    def alltoall(self, sendobj: Sequence[Any]) -> list[Any]:
        g = self._grp("alltoall")
        return _run(small.alltoall, g, list(_expect(sendobj, g.size, "alltoall")), "alltoall", _pickle)

    def reduce(self, sendobj: Any, op: Any = SUM, root: int = 0) -> Any:
        f = py_combine(op, "reduce")
        values = self.gather(sendobj, root)
        return None if values is None else functools.reduce(f, values)

    def allreduce(self, sendobj: Any, op: Any = SUM) -> Any:
        f = py_combine(op, "allreduce")
        return functools.reduce(f, self.allgather(sendobj))

    def scan(self, sendobj: Any, op: Any = SUM) -> Any:
        f = py_combine(op, "scan")
        values = self.allgather(sendobj)
        return functools.reduce(f, values[:self._grp("scan").rank + 1])

    def exscan(self, sendobj: Any, op: Any = SUM) -> Any:
        f = py_combine(op, "exscan")
        values = self.allgather(sendobj)
        rank = self._grp("exscan").rank
        return None if rank == 0 else functools.reduce(f, values[:rank])
