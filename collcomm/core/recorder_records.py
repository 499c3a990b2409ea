"""The flight recorder's record layout, and reading a record's fields back.

A record (see :mod:`.recorder`) names its group by its observer's index in
:data:`_OBSERVERS`, its caller by a code object and an instruction offset, and its algorithm
by the id of the family function. This module holds that layout (the ``R_*`` indices and
the states) and turns the fields into names when a record is read: :func:`caller` finds
the first frame outside collcomm, :func:`where` makes a caller ``file:line``,
:func:`algorithm_name` names an algorithm and :func:`state_of` derives a record's state.
The observer's hot path (:meth:`.recorder.Observer.call`) walks frames with the same
caches, :data:`_internal` and :data:`_codes`, inline.
"""
from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

from ..algorithms import signature

if TYPE_CHECKING:
    from .recorder import Observer

# A collective's record made in Python is a tuple (the cheapest thing to build per call) of
# the fields R_GROUP … R_T0, all plain numbers, strings and the caller's code object (the
# observer's index, the id of the family function; code objects are not tracked by the
# garbage collector): the collector untracks such a tuple at its first look, so 2000 of
# them in the ring cost no collection time (holding objects, the ring made the collections
# walk it: +3 us per call measured). Its state is derived: completed when its group's last
# completed call is this one or a later one, failed when listed in the group's failures. A
# point-to-point record is a list with three more fields (peer, state, end time). Records
# made in C (native/_record_rec.c) are Record objects that read as the tuple or the list
# (len, indexing; a point-to-point one's rec[R_PSTATE] / rec[R_PT1] assigned), refilled
# in their slot of the C ring (native/_record_ring.c) once nothing else holds them.
R_GROUP, R_SEQ, R_OP, R_SIG, R_ALGO, R_CODE, R_LASTI, R_T0, R_PEER, R_PSTATE, R_PT1 = range(11)
ENTERED, COMPLETED, FAILED = "entered", "completed", "failed"
_SEQ_MASK = (1 << 35) - 1     # group.py: the low 35 bits of a collective's tag are its seq

_PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
PACKAGE_PREFIX = _PKG             # frames of files under it are collcomm's own
_internal: dict[int, bool] = {}   # id(code object) -> it lies inside the collcomm package
_codes: dict[int, Any] = {}       # id -> those code objects, kept alive so their ids stay theirs
_getframe = sys._getframe


def caller(depth: int = 2) -> tuple[Any, int]:
    """(code object, instruction offset) of the first frame outside collcomm, starting
    ``depth`` frames above the caller of this function.

    At most 8 frames are walked; whether a code object is collcomm's is cached per code
    object (keyed by id: hashing a code object costs ~0.3 us), and the line is computed
    from the offset only when a record is read (:func:`where`)."""
    try:
        f: Any = _getframe(depth + 1)
    except ValueError:
        return None, 0
    internal = _internal
    for _ in range(8):
        code = f.f_code
        inside = internal.get(id(code))
        if inside is None:
            inside = internal[id(code)] = code.co_filename.startswith(_PKG)
            _codes[id(code)] = code
        if not inside:
            return code, f.f_lasti
        back = f.f_back
        if back is None:
            break
        f = back
    return f.f_code, f.f_lasti


def line_of(code: Any, lasti: int) -> int:
    """The source line of instruction offset ``lasti`` in ``code``."""
    for start, end, line in code.co_lines():
        if start <= lasti < end and line is not None:
            return line
    return code.co_firstlineno


def where(code: Any, lasti: int) -> str:
    """``file:line`` of a recorded caller (a code object or its id; relative to the working
    directory when inside it)."""
    if isinstance(code, int):
        code = _codes.get(code)
    if code is None:
        return "?"
    path = code.co_filename
    try:
        rel = os.path.relpath(path)
        if not rel.startswith(".."):
            path = rel
    except ValueError:
        pass
    return f"{path}:{line_of(code, lasti)}"


_ALGO_NAMES: dict[int, str] = {}   # id(family function) -> its name in the registry


def algorithm_name(fn: Any) -> str:
    """The family name of an algorithm function (``ring``, ``shm_direct`` …), or ``""``."""
    if not fn:
        return ""
    if not _ALGO_NAMES:
        from ..algorithms.registry import ALGORITHMS

        for table in ALGORITHMS.values():
            for name, f in table.items():
                _ALGO_NAMES.setdefault(id(f), name)
    if isinstance(fn, int):
        return _ALGO_NAMES.get(fn, "?")
    return _ALGO_NAMES.get(id(fn), getattr(fn, "__name__", str(fn)))


_family_index: dict[int, int] = {}


def family_of(body: Any) -> Any:
    """The ``family`` a core collective's closure calls (None if it has none)."""
    code = getattr(body, "__code__", None)
    if code is None:
        return None
    if body.__closure__ is None:     # the family itself (barrier runs it directly)
        return body if algorithm_name(body) != getattr(body, "__name__", None) else None
    i = _family_index.get(id(code))
    if i is None:
        i = _family_index[id(code)] = code.co_freevars.index("family") if "family" in code.co_freevars else -1
        _codes[id(code)] = code
    return body.__closure__[i].cell_contents if i >= 0 else None


_OBSERVERS: list["Observer"] = []   # every observer made, by index (records hold the index)


def state_of(rec: Any) -> str:
    """entered / completed / failed (see the record layout above)."""
    if len(rec) > R_PEER:
        return rec[R_PSTATE]
    obs = _OBSERVERS[rec[R_GROUP]]
    if id(rec) in obs.failures:
        return FAILED
    done = obs.done
    return COMPLETED if done is not None and (rec[R_SEQ] & _SEQ_MASK) <= (done[R_SEQ] & _SEQ_MASK) else ENTERED


def record_entry(rec: list[Any], t_ref: float, wall_ref: float) -> dict[str, Any]:
    """A record as the dumps and the store exchange show it (``t_ref``/``wall_ref``: the
    same moment on the perf counter and the wall clock, for its enter time)."""
    obs = _OBSERVERS[rec[R_GROUP]]
    sig = rec[R_SIG]
    d: dict[str, Any] = {
        "group": obs.name, "ctx": obs.ctx, "seq": rec[R_SEQ] & _SEQ_MASK, "op": rec[R_OP],
        "call": signature.describe(sig) if sig else rec[R_OP], "sig": sig,
        "algorithm": algorithm_name(rec[R_ALGO]), "where": where(rec[R_CODE], rec[R_LASTI]),
        "state": state_of(rec), "t_enter": round(wall_ref - (t_ref - rec[R_T0]), 6),
    }
    if len(rec) > R_PEER:
        d["peer"] = rec[R_PEER]
        if rec[R_PT1]:
            d["duration_s"] = round(rec[R_PT1] - rec[R_T0], 9)
    else:
        fail = obs.failures.get(id(rec))
        if fail is not None:
            d["duration_s"] = round(fail[1] - rec[R_T0], 9)
            d["error"] = fail[2]
        elif d["state"] == ENTERED:
            d["waiting_s"] = round(t_ref - rec[R_T0], 6)
    return d
