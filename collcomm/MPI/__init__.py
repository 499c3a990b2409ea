"""``from collcomm import MPI``: the mpi4py API over collcomm's groups and algorithms.

An mpi4py program runs unchanged but for its import line::

    from collcomm import MPI            # was: from mpi4py import MPI
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    data = comm.bcast({"msg": "Hello"} if rank == 0 else None, root=0)
    x = np.full(4, rank, dtype="i"); y = np.empty_like(x)
    comm.Allreduce(x, y, op=MPI.SUM)

Run it with ``collcomm run -n 4 prog.py``, ``mpiexec -n 4 python prog.py``, ``srun`` or as a
plain ``python prog.py`` (a world of one). Names, signatures, defaults, return values and
error classes follow mpi4py 4.x; MPI-IO, one-sided windows, dynamic processes, graph
topologies and intercommunicators raise ``NotImplementedError`` naming the call.

The package is a front end like :mod:`collcomm.api`: it turns mpi4py's arguments (buffer
specs, ``IN_PLACE``, statuses, requests, ranks of communicators) into calls of the core
(:mod:`collcomm.core`), which checks and runs them. Modules: ``_consts`` and ``_errors``
(constants, ``MPI.Exception``), ``_types`` (datatypes; derived ones: ``_derived``, their
layouts and packing ``_typemap``, recipes and MPI_Pack ``_type_contents``/``_pack``), ``_ops`` (reduction ops), ``_msg``
(buffer specs), ``_pickle`` (``MPI.pickle``), ``_status``, ``_request``, ``_group``, ``_comm`` and ``_attrs``
(communicators), ``_p2p``, ``_pobj`` (``Message``: ``_message``), ``_coll``, ``_collv``, ``_cobj`` (the communication
methods), ``_topo`` (Cartesian topologies; ``_graph`` graph ones, ``_neighbor`` their collectives), ``_env`` (init, clocks, memory), ``_misc``
(Info, Errhandler) and ``_absent`` (what is left out). ``collcomm.MPI.bench`` measures the
front end against the functional API.
"""
from __future__ import annotations

from ._consts import *  # noqa: F401,F403 - the integer constants
from ._consts import TAG_UB_VALUE as _TAG_UB_VALUE  # noqa: F401
from ._errors import (  # noqa: F401
    SUCCESS, ERR_LASTCODE, Add_error_class, Add_error_code, Add_error_string, Exception, Get_error_class,
    Get_error_string, Remove_error_class, Remove_error_code, Remove_error_string, _CLASSES,
)
from ._types import PREDEFINED as _TYPES, Datatype
from ._derived import COMBINERS as _COMBINERS
from ._types import TYPEDICT as _typedict, TYPEDICT_C as _typedict_c, TYPEDICT_F as _typedict_f  # noqa: F401
from ._types import typecode as _typecode  # noqa: F401
from ._pickle import Pickle, pickle  # noqa: F401
from ._ops import PREDEFINED as _OPS, Op
from ._msg import BOTTOM, BUFFER_AUTOMATIC, IN_PLACE, BottomType, BufferAutomaticType, InPlaceType
from ._prequest import Prequest
from . import _request_waits  # noqa: F401 - (Request.Wait, wait, Test, Waitall... in C where built)
from ._request import REQUEST_NULL, Request, Status
from ._group import GROUP_EMPTY, GROUP_NULL, Group
from ._misc import (
    ERRHANDLER_NULL, ERRORS_ABORT, ERRORS_ARE_FATAL, ERRORS_RETURN, INFO_ENV, INFO_NULL, Errhandler, Info,
)
from ._comm import COMM_NULL, COMM_SELF, COMM_WORLD, Comm, Intracomm
from ._message import MESSAGE_NO_PROC, MESSAGE_NULL, Message
from ._topo import Cartcomm, Compute_dims, Topocomm
from ._graph import Distgraphcomm, Graphcomm
from ._absent import (  # noqa: F401
    FILE_NULL, SESSION_NULL, WIN_NULL, File, Get_abi_fortran_info, Get_abi_info, Get_abi_version,
    Get_hw_resource_info, Grequest, Intercomm, Session, Win,
)
from ._env import (
    Aint_add, Aint_diff, Alloc_mem, Attach_buffer, Close_port, Detach_buffer, Finalize, Flush_buffer,
    Free_mem, Get_address, Get_library_version, Get_processor_name, Get_version, Iflush_buffer, Init,
    Init_thread, Is_finalized, Is_initialized, Is_thread_main, Lookup_name, Open_port, Pcontrol,
    Publish_name, Query_thread, Register_datarep, Unpublish_name, Wtick, Wtime, buffer, get_vendor, memory,
)

for _name, _code, _text in _CLASSES:
    globals()[_name] = _code
globals().update(_TYPES)
globals().update(_OPS)
globals()["2INT"] = _TYPES["TWOINT"]
# Fortran types Open MPI leaves out here (no 128-bit integer, no 2-byte complex) or that
# numpy cannot hold (IEEE quad precision): MPI.DATATYPE_NULL, as Open MPI's missing ones
for _missing in ("INTEGER16", "LOGICAL16", "COMPLEX4", "REAL16", "COMPLEX32"):
    globals()[_missing] = Datatype()
globals().update({f"COMBINER_{_k}": _v for _k, _v in _COMBINERS.items()})
del _name, _code, _text
