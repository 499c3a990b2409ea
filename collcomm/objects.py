"""Collectives on picklable Python objects (torch's ``*_object`` functions, mpi4py's lower case).

Wire format. An object list is pickled with protocol 5; every out-of-band buffer of at
least 64 KiB (a large numpy array, a ``PickleBuffer``) is *not* copied into the pickle but
sent as its own message straight from the object's memory, and received into a fresh
buffer the unpickled object then owns (no second copy). A packed list travels as:

1. ``hdr``: int64[1], the length of ``meta``;
2. ``meta``: int64[], ``[n_objects, (pickle_len, n_buffers, *buffer_lens) per object]``;
3. ``payload``: the pickles, concatenated (uint8);
4. each out-of-band buffer (uint8), in order.

Sizes go first, as in torch, so receivers allocate exactly. Broadcast uses the tree/ring
algorithms for every part; gather, scatter and send/recv move packed lists point to point.
The reductions (``all_reduce_object``, ``reduce_object``) gather the objects, then fold
them in rank order with Python semantics (SUM → ``a + b``, MAX → ``max``, a callable →
``f(a, b)``), so every rank computes the same value.
"""
from __future__ import annotations

import functools
import operator
import pickle
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from . import algorithms
from .api import _group, _local_rank, _member, _no_list_here, _p2p_group, _p2p_peer, _where
from .errors import InvalidArgumentError, MismatchError
from .core.group import GroupComm, ProcessGroup
from .ops import ReduceOp

__all__ = [
    "all_gather_object", "all_reduce_object", "broadcast_object_list", "gather_object",
    "recv_object_list", "reduce_object", "scatter_object_list", "send_object_list",
]

#: Pickle buffers at least this large travel as their own message (out of band).
OUT_OF_BAND_MIN = 64 * 1024


# ----------------------------------------------------------------------------- packing
@dataclass
class Packed:
    meta: np.ndarray            # int64, see the module docstring
    payload: np.ndarray         # uint8
    buffers: list[np.ndarray]   # uint8 views of out-of-band buffers (no copy)


def pack(objs: list[Any], collective: str = "pickle") -> Packed:
    meta: list[int] = [len(objs)]
    datas: list[bytes] = []
    buffers: list[np.ndarray] = []
    for i, obj in enumerate(objs):
        oob: list[memoryview] = []

        def callback(pb: pickle.PickleBuffer) -> bool:
            raw = pb.raw()
            if raw.nbytes < OUT_OF_BAND_MIN:
                return True  # small: in band
            oob.append(raw)
            return False

        try:
            data = pickle.dumps(obj, protocol=5, buffer_callback=callback)
        except Exception as exc:  # noqa: BLE001 - any pickling failure
            raise InvalidArgumentError(
                f"{collective}: object {i} ({type(obj).__name__}) cannot be pickled: {exc}") from exc
        meta += [len(data), len(oob), *(m.nbytes for m in oob)]
        datas.append(data)
        buffers += [np.frombuffer(m, dtype=np.uint8) for m in oob]
    payload = np.frombuffer(b"".join(datas), dtype=np.uint8)
    return Packed(np.array(meta, dtype=np.int64), payload, buffers)


def _layout(meta: np.ndarray) -> list[tuple[int, list[int]]]:
    out, pos = [], 1
    for _ in range(int(meta[0])):
        dlen, nb = int(meta[pos]), int(meta[pos + 1])
        out.append((dlen, [int(x) for x in meta[pos + 2:pos + 2 + nb]]))
        pos += 2 + nb
    return out


def alloc(meta: np.ndarray) -> Packed:
    """Empty receive buffers for the packed list ``meta`` describes."""
    lay = _layout(meta)
    payload = np.empty(sum(d for d, _ in lay), dtype=np.uint8)
    buffers = [np.empty(n, dtype=np.uint8) for _, lens in lay for n in lens]
    return Packed(meta, payload, buffers)


def unpack(p: Packed) -> list[Any]:
    objs, pos, b = [], 0, 0
    data = p.payload.tobytes() if p.payload.size else b""
    for dlen, lens in _layout(p.meta):
        bufs = p.buffers[b:b + len(lens)]
        objs.append(pickle.loads(data[pos:pos + dlen], buffers=bufs))
        pos += dlen
        b += len(lens)
    return objs


# ----------------------------------------------------------------------------- moving packs
Send = Callable[[np.ndarray, Any], Any]   # (array, peer) -> handle with wait()


def send_packed(isend: Send, p: Packed, peer: Any) -> None:
    hdr = np.array([p.meta.size], dtype=np.int64)
    handles = [isend(hdr, peer), isend(p.meta, peer), isend(p.payload, peer)]
    handles += [isend(b, peer) for b in p.buffers]
    for h in handles:
        h.wait()


def recv_packed(irecv: Send, peer: Any) -> tuple[Packed, int]:
    """Receive one packed list from ``peer`` (None: any); returns it and the sender's rank as the status says."""
    hdr = np.empty(1, dtype=np.int64)
    status = irecv(hdr, peer).wait()
    source = status.source
    meta = np.empty(int(hdr[0]), dtype=np.int64)
    irecv(meta, source if peer is None else peer).wait()
    p = alloc(meta)
    handles = [irecv(p.payload, source if peer is None else peer)]
    handles += [irecv(b, source if peer is None else peer) for b in p.buffers]
    for h in handles:
        h.wait()
    return p, source


def bcast_packed(comm: GroupComm, p: Packed | None, root: int) -> Packed:
    hdr = np.array([0 if p is None else p.meta.size], dtype=np.int64)
    algorithms.broadcast(comm, hdr, root)
    meta = p.meta if p is not None else np.empty(int(hdr[0]), dtype=np.int64)
    algorithms.broadcast(comm, meta, root)
    if p is None:
        p = alloc(meta)
    algorithms.broadcast(comm, p.payload, root)
    for b in p.buffers:
        algorithms.broadcast(comm, b, root)
    return p


def _check_list(xs: Any, collective: str, where: str, what: str, n: int | None = None) -> None:
    if not isinstance(xs, list):
        raise InvalidArgumentError(
            f"{collective} on {where}: {what} must be a list (it is filled in place), got {type(xs).__name__}")
    if n is not None and len(xs) != n:
        raise InvalidArgumentError(
            f"{collective} on {where}: {what} must have one entry per rank of the group: "
            f"expected {n}, got {len(xs)}")


def _root(g: ProcessGroup, name: str, what: str, glob: Any, local: Any) -> int:
    if glob is None and local is None:
        glob = 0
    return _local_rank(g, name, what, glob, local)


# ----------------------------------------------------------------------------- collectives
def broadcast_object_list(object_list: list[Any], src: int | None = None, group: Any = None,
                          device: Any = None, group_src: int | None = None) -> None:
    """Every rank's ``object_list`` becomes (unpickled copies of) ``src``'s, in place."""
    name = "broadcast_object_list"
    g = _group(group, name)
    _check_list(object_list, name, _where(g), "object_list")
    if not _member(g):
        return None
    root = _root(g, name, "src", src, group_src)
    mine = pack(object_list, name) if g.rank == root else None

    def body(comm: GroupComm) -> None:
        p = bcast_packed(comm, mine, root)
        if mine is None:
            objs = unpack(p)
            if len(objs) != len(object_list):
                raise MismatchError(
                    f"{name}: object_list has {len(object_list)} entries on this rank but the "
                    f"source (global rank {g.to_global(root)}) sent {len(objs)}; they must match")
            object_list[:] = objs

    g.run(name, body)
    return None


def _all_gather_packed(comm: GroupComm, mine: Packed) -> list[Packed]:
    """Every rank's packed list, on every rank (metas all-gathered, the rest broadcast per rank)."""
    n = comm.size
    lens = np.empty(n, dtype=np.int64)
    algorithms.all_gather(comm, np.array([mine.meta.size], dtype=np.int64), lens)
    width = int(lens.max())
    metas = np.zeros(n * width, dtype=np.int64)
    padded = np.zeros(width, dtype=np.int64)
    padded[:mine.meta.size] = mine.meta
    algorithms.all_gather(comm, padded, metas)
    packs = []
    for r in range(n):
        if r == comm.rank:
            p = mine
        else:
            p = alloc(metas[r * width:r * width + int(lens[r])].copy())
        algorithms.broadcast(comm, p.payload, r)
        for b in p.buffers:
            algorithms.broadcast(comm, b, r)
        packs.append(p)
    return packs


def all_gather_object(object_list: list[Any], obj: Any, group: Any = None) -> None:
    """``object_list[i]`` of every rank becomes rank i's ``obj`` (``object_list`` has group-size entries)."""
    name = "all_gather_object"
    g = _group(group, name)
    if not _member(g):
        return None
    _check_list(object_list, name, g.describe(), "object_list", g.size)
    mine = pack([obj], name)

    def body(comm: GroupComm) -> None:
        packs = _all_gather_packed(comm, mine)
        object_list[:] = [unpack(p)[0] for p in packs]

    g.run(name, body)
    return None


def _gather_objs(g: ProcessGroup, name: str, obj: Any, root: int) -> list[Any] | None:
    mine = pack([obj], name)

    def body(comm: GroupComm) -> list[Any] | None:
        if comm.rank != root:
            send_packed(comm.isend, mine, root)
            return None
        out: list[Any] = []
        for r in range(comm.size):
            p = mine if r == root else recv_packed(comm.irecv, r)[0]
            out.append(unpack(p)[0])
        return out

    return g.run(name, body)  # type: ignore[return-value]


def gather_object(obj: Any, object_gather_list: list[Any] | None = None, dst: int | None = None,
                  group: Any = None, group_dst: int | None = None) -> None:
    """``object_gather_list[i]`` on ``dst`` (default 0) becomes rank i's ``obj``; pass None elsewhere."""
    name = "gather_object"
    g = _group(group, name)
    if not _member(g):
        return None
    root = _root(g, name, "dst", dst, group_dst)
    if g.rank == root:
        _check_list(object_gather_list, name, g.describe(), "object_gather_list", g.size)
    else:
        _no_list_here(object_gather_list, name, g, "object_gather_list", "destination", root)
    out = _gather_objs(g, name, obj, root)
    if out is not None:
        assert object_gather_list is not None
        object_gather_list[:] = out
    return None


def scatter_object_list(scatter_object_output_list: list[Any],
                        scatter_object_input_list: list[Any] | None = None, src: int | None = None,
                        group: Any = None, group_src: int | None = None) -> None:
    """``scatter_object_output_list[0]`` of rank i becomes ``scatter_object_input_list[i]`` of ``src``."""
    name = "scatter_object_list"
    g = _group(group, name)
    where = _where(g)
    if not isinstance(scatter_object_output_list, list) or len(scatter_object_output_list) < 1:
        raise InvalidArgumentError(
            f"{name} on {where}: scatter_object_output_list must be a non-empty list, got "
            f"{scatter_object_output_list!r:.80}")
    if not _member(g):
        return None
    root = _root(g, name, "src", src, group_src)
    packs: list[Packed] = []
    if g.rank == root:
        _check_list(scatter_object_input_list, name, where, "scatter_object_input_list", g.size)
        assert scatter_object_input_list is not None
        packs = [pack([o], name) for o in scatter_object_input_list]

    def body(comm: GroupComm) -> Any:
        if comm.rank == root:
            for r in range(comm.size):
                if r != root:
                    send_packed(comm.isend, packs[r], r)
            return unpack(packs[root])[0]
        return unpack(recv_packed(comm.irecv, root)[0])[0]

    scatter_object_output_list[0] = g.run(name, body)
    return None


# ----------------------------------------------------------------------------- point to point
def send_object_list(object_list: list[Any], dst: int | None = None, group: Any = None,
                     device: Any = None, group_dst: int | None = None) -> None:
    """Send the objects of ``object_list`` to global rank ``dst`` (received by recv_object_list)."""
    name = "send_object_list"
    g = _p2p_group(group, name)
    _check_list(object_list, name, g.describe(), "object_list")
    peer = _p2p_peer(g, name, "dst", dst, group_dst)
    send_packed(lambda a, p: g.p2p_isend(a, p), pack(object_list, name), peer)


def recv_object_list(object_list: list[Any], src: int | None = None, group: Any = None,
                     device: Any = None, group_src: int | None = None) -> int:
    """Fill ``object_list`` with the objects ``src`` (None: any rank) sent; returns the sender's global rank."""
    name = "recv_object_list"
    g = _p2p_group(group, name)
    _check_list(object_list, name, g.describe(), "object_list")
    peer = _p2p_peer(g, name, "src", src, group_src, allow_any=True)

    def irecv(arr: np.ndarray, p: Any) -> Any:
        # after the first message p is the sender's *global* rank (from the status)
        local = p if p is None or peer is not None else g.to_local(p)
        return g.p2p_irecv(arr, local)

    p, source = recv_packed(irecv, peer)
    objs = unpack(p)
    if len(objs) != len(object_list):
        raise MismatchError(
            f"{name} on {g.describe()}: object_list has {len(object_list)} entries but global rank "
            f"{source} sent {len(objs)}; they must match")
    object_list[:] = objs
    return int(source)


# ----------------------------------------------------------------------------- reductions
def _max(a: Any, b: Any) -> Any:
    return np.maximum(a, b) if isinstance(a, np.ndarray) or isinstance(b, np.ndarray) else max(a, b)


def _min(a: Any, b: Any) -> Any:
    return np.minimum(a, b) if isinstance(a, np.ndarray) or isinstance(b, np.ndarray) else min(a, b)


_PY_OPS: dict[str, Callable[[Any, Any], Any]] = {
    "SUM": operator.add, "AVG": operator.add, "PRODUCT": operator.mul,
    "MIN": _min, "MAX": _max,
    "BAND": operator.and_, "BOR": operator.or_, "BXOR": operator.xor,
    "LAND": lambda a, b: a and b, "LOR": lambda a, b: a or b,
    "LXOR": lambda a, b: bool(a) != bool(b),
}


def python_op(op: Any, collective: str) -> tuple[Callable[[Any, Any], Any], bool]:
    """``(f(a, b), is_avg)`` for ``op`` applied to Python objects."""
    try:
        rop = ReduceOp.from_any(op)
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(f"{collective}: {exc}") from None
    if rop.fn is not None:
        return rop.fn, False
    return _PY_OPS[rop.name], rop is ReduceOp.AVG


def _fold(values: list[Any], f: Callable[[Any, Any], Any], avg: bool) -> Any:
    result = functools.reduce(f, values)
    return result / len(values) if avg else result


def all_reduce_object(obj: Any, op: Any = ReduceOp.SUM, group: Any = None) -> Any:
    """The ``op``-combination of every rank's ``obj`` (rank order), returned on every rank."""
    name = "all_reduce_object"
    g = _group(group, name)
    f, avg = python_op(op, name)
    if not _member(g):
        return None
    values: list[Any] = [None] * g.size
    all_gather_object(values, obj, g)
    return _fold(values, f, avg)


def reduce_object(obj: Any, op: Any = ReduceOp.SUM, dst: int = 0, group: Any = None) -> Any:
    """The ``op``-combination of every rank's ``obj`` on global rank ``dst``; None elsewhere."""
    name = "reduce_object"
    g = _group(group, name)
    f, avg = python_op(op, name)
    if not _member(g):
        return None
    root = _local_rank(g, name, "dst", dst, None)
    values = _gather_objs(g, name, obj, root)
    return None if values is None else _fold(values, f, avg)
