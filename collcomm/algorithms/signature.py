"""The signature of one collective call, packed into one 64-bit word.

Every rank of a group must make the same collective calls in the same order, with the same
dtype, element count, root and reduce op. Each call carries its signature so the ranks can
check that they agree before any data is combined or reinterpreted: shared-memory families
publish it in their arena header word and compare all ranks' words after the first sync;
point-to-point families send it in every message's header, and a receive compares it with
its own (see :mod:`collcomm.core.group`). A mismatch is a ``MismatchError`` naming both
sides, never a wrong answer.

Layout (most significant bit first)::

    63..60  collective   (4 bits: index in COLLECTIVES + 1; 0 = no call)
    59..55  dtype        (5 bits: index in DTYPES; OTHER_DTYPE for anything else)
    54..50  reduce op    (5 bits: index in OPS; 0 = no op, CUSTOM_OP for a user function)
    49..36  root         (14 bits: local rank; NO_ROOT when the call has none)
    35..0   count        (36 bits: elements per rank, modulo 2**36; 0 for all_to_all(v))

Two signatures are equal exactly when the calls agree on all five fields (counts equal
modulo 2**36, i.e. any two counts below 64 Gi elements are told apart).
"""
from __future__ import annotations

from typing import Any

import numpy as np

COLLECTIVES = ("all_reduce", "reduce", "broadcast", "all_gather", "gather", "reduce_scatter",
               "scatter", "all_to_all", "barrier", "scan", "exscan", "internal", "p2p")
DTYPES = ("bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
          "float16", "bfloat16", "float32", "float64", "longdouble", "complex64",
          "complex128", "clongdouble", "bytes")
OTHER_DTYPE = 31
OPS = ("", "SUM", "PRODUCT", "MIN", "MAX", "AVG", "BAND", "BOR", "BXOR", "LAND", "LOR", "LXOR",
       "PREMUL_SUM", "REPLACE", "NO_OP", "MAXLOC", "MINLOC")
CUSTOM_OP = 31
NO_ROOT = (1 << 14) - 1
_COUNT_MASK = (1 << 36) - 1

_COLLECTIVE_CODE = {name: i + 1 for i, name in enumerate(COLLECTIVES)}
_DTYPE_CODE = {name: i for i, name in enumerate(DTYPES)}
_OP_CODE = {name: i for i, name in enumerate(OPS)}
_dtype_cache: dict[Any, int] = {}


def dtype_code(dtype: Any) -> int:
    """The 5-bit code of a numpy dtype (or the name ``"bfloat16"``)."""
    code = _dtype_cache.get(dtype)
    if code is None:
        if isinstance(dtype, str) and dtype == "bfloat16":
            code = _DTYPE_CODE["bfloat16"]
        else:
            dt = np.dtype(dtype)
            name = "bytes" if dt.kind == "V" and dt.fields is None else dt.name
            if dt == np.longdouble and dt != np.float64:
                name = "longdouble"
            elif dt == np.clongdouble and dt != np.complex128:
                name = "clongdouble"
            code = _DTYPE_CODE.get(name, OTHER_DTYPE)
        _dtype_cache[dtype] = code
    return code


def op_code(op_name: str | None) -> int:
    """The 5-bit code of a reduce op's name (``None`` or "" for calls without an op)."""
    if not op_name:
        return 0
    return _OP_CODE.get(op_name.upper(), CUSTOM_OP)


def make(collective: str, dtype: Any = None, count: int = 0, root: int | None = None,
         op_name: str | None = None) -> int:
    """The signature word of a call (see the module docstring)."""
    d = 0 if dtype is None else dtype_code(dtype)
    r = NO_ROOT if root is None else root & NO_ROOT
    return ((_COLLECTIVE_CODE[collective] << 60) | (d << 55) | (op_code(op_name) << 50)
            | (r << 36) | (count & _COUNT_MASK))


_P2P: dict[Any, int] = {}


def p2p(dtype: Any) -> int:
    """The signature of a point-to-point message of ``dtype`` (its size is checked apart:
    MPI lets a receive be larger than the message, torch does not); computed once per dtype."""
    sig = _P2P.get(dtype)
    if sig is None:
        sig = _P2P[dtype] = make("p2p", dtype)
    return sig


def with_count(base: int, count: int, root: int | None = None) -> int:
    """``base`` (made with count 0 and root 0) for ``count`` elements and ``root``."""
    return base | ((NO_ROOT if root is None else root & NO_ROOT) << 36) | (count & _COUNT_MASK)


#: the signature of an arena step taken by a rank that found, as its next call began, a
#: mismatch in an eager rooted call it had left early (shm_stage.settle_early): it raises
#: there and takes that call's step with this word, so the ranks that raised in the eager
#: call itself and went on raise in their next call too, and every rank stays in step
ABANDONED = (0xE << 60) | 1


def describe(sig: int) -> str:
    """A readable form: ``all_reduce(float32[4], op=SUM)``, ``broadcast(int64[3], root=1)``."""
    if sig == ABANDONED:
        return "nothing: it raised here the mismatch of the call before (found late: eager rooted call)"
    code = (sig >> 60) & 0xF
    if not 1 <= code <= len(COLLECTIVES):
        return "no collective call (or an older one)"
    d, o, r, count = (sig >> 55) & 0x1F, (sig >> 50) & 0x1F, (sig >> 36) & NO_ROOT, sig & _COUNT_MASK
    name = COLLECTIVES[code - 1]
    if name in ("barrier", "internal"):
        return name
    if name == "p2p":
        return f"a point-to-point message of {DTYPES[d] if d < len(DTYPES) else 'an unusual dtype'}"
    dtype = DTYPES[d] if d < len(DTYPES) else "an unusual dtype"
    parts = [f"{dtype}[{count}]" if name != "all_to_all" else dtype]
    if o:
        parts.append(f"op={OPS[o] if o < len(OPS) else 'a user function'}")
    if r != NO_ROOT:
        parts.append(f"root={r}")
    return f"{name}({', '.join(parts)})"


def differences(mine: int, theirs: int) -> str:
    """Which fields differ, e.g. ``dtype float32 vs float64``."""
    names = (("collective", 60, 0xF), ("dtype", 55, 0x1F), ("op", 50, 0x1F), ("root", 36, NO_ROOT),
             ("count", 0, _COUNT_MASK))
    diff = [n for n, shift, mask in names if (mine >> shift) & mask != (theirs >> shift) & mask]
    return ", ".join(diff) if diff else "nothing"
