"""``Request.Wait``, ``wait``, ``Test``, ``Waitall``, ``Testall``, ``Waitany`` and
``Waitsome`` made the core's where it is built (native/_mpi_request_wait.c,
_mpi_request_many.c): the common way (no status, a native receive, a send done, an object
irecv, a collective started in two parts) without a Python frame, ~0.25 µs of every ``Wait`` on the project's VM (BENCHMARKS.md, session 46;
``Testall``, ``Waitany`` and ``Waitsome`` since session 47); the Python methods
(:data:`PY_WAIT`, :data:`PY_WAIT_VALUE`, :data:`PY_TEST`, :data:`PY_WAITALL`,
:data:`PY_TESTALL`, :data:`PY_WAITANY`, :data:`PY_WAITSOME`, which the C ones call for
everything else) stay the reference, and the tests run both ways.
"""
from __future__ import annotations

from ..core.tags import MPI_TAG_BITS
from ..errors import CollcommError
from . import _request_makers  # noqa: F401 - (registers Request with the core first)
from ._obj_spare import SPARE
from ._pickle import pickle as _pickle
from ._request import Request
from ._request_many import ManyRequests, waitsome_rest
from ._request_ops import ORPHANS, Done, reap_orphans

#: the Python methods (what the C ones fall back to)
PY_WAIT, PY_WAIT_VALUE, PY_TEST = Request.Wait, Request.wait, Request.Test
PY_WAITALL = Request.__dict__["Waitall"].__func__
PY_TESTALL = ManyRequests.__dict__["Testall"].__func__
PY_WAITANY = ManyRequests.__dict__["Waitany"].__func__
PY_WAITSOME = ManyRequests.__dict__["Waitsome"].__func__


def _install() -> bool:
    from .. import native

    make = getattr(native.core, "mpi_request_waits", None) if native.core is not None else None
    python = (PY_WAIT, PY_WAIT_VALUE, PY_TEST, PY_WAITALL, PY_TESTALL, PY_WAITANY, PY_WAITSOME)
    made = make(Request, python, Done, MPI_TAG_BITS, _pickle, SPARE, ORPHANS, reap_orphans, CollcommError,
                waitsome_rest) if make is not None else None
    if made is None:
        return False
    Request.Wait, Request.wait, Request.Test = made[0], made[1], made[2]    # type: ignore[method-assign]
    for name, method in zip(("Waitall", "Testall", "Waitany", "Waitsome"), made[3:]):
        setattr(Request, name, classmethod(method))
    return True


#: whether Request.Wait, wait, Test and the class methods Waitall, Testall, Waitany, Waitsome are the core's
NATIVE_WAITS = _install()
