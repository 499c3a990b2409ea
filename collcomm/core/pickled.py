"""Python objects through a process group: pickling and the object collectives' bodies.

Front-end neutral: torch's ``*_object`` functions (:mod:`collcomm.objects`) and mpi4py's
lower-case methods (:mod:`collcomm.MPI`) both call these.

Wire format. An object list is pickled with protocol 5; every out-of-band buffer of at
least 64 KiB (a large numpy array, a ``PickleBuffer``) is *not* copied into the pickle but
sent as its own message straight from the object's memory, and received into a fresh
buffer the unpickled object then owns (no second copy). A packed list travels as:

1. ``hdr``: int64[1], the length of ``meta``;
2. ``meta``: int64[], ``[n_objects, (pickle_len, n_buffers, *buffer_lens) per object]``;
3. ``payload``: the pickles, concatenated (uint8);
4. each out-of-band buffer (uint8), in order.

Sizes go first, as in torch, so receivers allocate exactly. Broadcast uses the tree/ring
algorithms for every part; gather, scatter, all-to-all and send/recv move packed lists
point to point, inside one collective call (the call's private tag keeps them apart from
every other message).
"""
from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from .. import algorithms
from ..errors import InvalidArgumentError, MismatchError
from .call_comm import GroupComm
from .group import ProcessGroup

__all__ = ["OUT_OF_BAND_MIN", "STANDARD", "Packed", "Serializer", "all_gather_objects", "all_gather_packed",
           "all_to_all_objects", "alloc", "bcast_objects", "bcast_packed", "dumps", "gather_objects", "loads",
           "out_of_band", "own_copy", "pack", "recv_packed", "scatter_objects", "send_packed", "unpack"]

#: Pickle buffers at least this large travel as their own message (out of band).
OUT_OF_BAND_MIN = 64 * 1024


class Serializer:
    """How objects become bytes and back: ``dumps(obj, buffer_callback)`` (the callback,
    given, decides per PickleBuffer: True keeps it in band, False leaves it to travel out of
    band) and ``loads(data, buffers)``. This one is the standard library's pickle, protocol
    5, out of band from ``OUT_OF_BAND_MIN`` bytes; a front end may pass its own
    (``collcomm.MPI.pickle``: mpi4py's ``MPI.pickle.__init__(dill.dumps, dill.loads)``)."""

    oob_min = OUT_OF_BAND_MIN
    #: how the fast call's object entries may pickle in C (native/_obj_pickle.c, the entries
    #: in _fastcall_obj.c and _p2p_obj.c):
    #: ``(dumps, loads, protocol, dumps takes a buffer_callback, oob_min)`` with
    #: ``dumps(obj[, protocol][, buffer_callback=…])`` and ``loads(bytes)`` exactly what this
    #: serializer's methods call for an object pickled in band; None: the Python code
    #: pickles (a subclass with methods of its own must leave it None or say how: the C
    #: code calls these functions, not the methods)
    native: tuple | None = None

    def dumps(self, obj: Any, buffer_callback: Callable[[pickle.PickleBuffer], bool] | None) -> bytes:
        return pickle.dumps(obj, protocol=5, buffer_callback=buffer_callback)

    def loads(self, data: Any, buffers: Sequence[Any]) -> Any:
        return pickle.loads(data, buffers=buffers)


#: what every object call uses unless told otherwise
STANDARD = Serializer()
STANDARD.native = (pickle.dumps, pickle.loads, 5, True, OUT_OF_BAND_MIN)


# ----------------------------------------------------------------------------- packing
@dataclass
class Packed:
    meta: np.ndarray            # int64, see the module docstring
    payload: np.ndarray         # uint8
    buffers: list[np.ndarray]   # uint8 views of out-of-band buffers (no copy)


def out_of_band(oob_min: int, into: list[memoryview]) -> Callable[[pickle.PickleBuffer], bool]:
    """A pickle ``buffer_callback``: buffers of ``oob_min`` bytes and up are appended to
    ``into`` (they travel out of band), smaller ones stay in the pickle."""
    def callback(pb: pickle.PickleBuffer) -> bool:
        raw = pb.raw()
        if raw.nbytes < oob_min:
            return True  # small: in band
        into.append(raw)
        return False
    return callback


def pack_one(data: bytes, oob: list[memoryview]) -> Packed:
    """One object already pickled (``data``, its out-of-band buffers ``oob``) as a packed list."""
    payload = np.empty(len(data), dtype=np.uint8)
    payload[:] = np.frombuffer(data, dtype=np.uint8)
    return Packed(np.array([1, len(data), len(oob), *(m.nbytes for m in oob)], dtype=np.int64), payload,
                  [np.frombuffer(m, dtype=np.uint8) for m in oob])


def pack(objs: list[Any], collective: str = "pickle", ser: Serializer = STANDARD) -> Packed:
    meta: list[int] = [len(objs)]
    datas: list[bytes] = []
    buffers: list[np.ndarray] = []
    for i, obj in enumerate(objs):
        oob: list[memoryview] = []
        try:
            data = ser.dumps(obj, out_of_band(ser.oob_min, oob))
        except Exception as exc:  # noqa: BLE001 - any pickling failure
            raise InvalidArgumentError(
                f"{collective}: object {i} ({type(obj).__name__}) cannot be pickled: {exc}") from exc
        meta += [len(data), len(oob), *(m.nbytes for m in oob)]
        datas.append(data)
        buffers += [np.frombuffer(m, dtype=np.uint8) for m in oob]
    # a writable array (some broadcast families write the root's buffer too), one copy
    payload = np.empty(sum(len(d) for d in datas), dtype=np.uint8)
    pos = 0
    for d in datas:
        payload[pos:pos + len(d)] = np.frombuffer(d, dtype=np.uint8)
        pos += len(d)
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


def own_copy(p: Packed) -> Packed:
    """This rank's own pack, to be unpickled here: its out-of-band buffers are views of the
    caller's objects, so they are copied (the result must not alias what was sent, as
    mpi4py's and torch's own-rank results do not)."""
    return Packed(p.meta, p.payload, [b.copy() for b in p.buffers]) if p.buffers else p


def unpack(p: Packed, ser: Serializer = STANDARD) -> list[Any]:
    objs, pos, b = [], 0, 0
    data = p.payload.tobytes() if p.payload.size else b""
    for dlen, lens in _layout(p.meta):
        bufs = p.buffers[b:b + len(lens)]
        objs.append(ser.loads(data[pos:pos + dlen], bufs))
        pos += dlen
        b += len(lens)
    return objs


def dumps(obj: Any, collective: str = "pickle", ser: Serializer = STANDARD) -> np.ndarray:
    """One object as one in-band pickle (uint8), for a single point-to-point message."""
    try:
        return np.frombuffer(ser.dumps(obj, None), dtype=np.uint8)
    except Exception as exc:  # noqa: BLE001 - any pickling failure
        raise InvalidArgumentError(f"{collective}: {type(obj).__name__} object cannot be pickled: {exc}") from exc


def loads(data: Any, ser: Serializer = STANDARD) -> Any:
    return ser.loads(data, ())


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


def all_gather_packed(comm: GroupComm, mine: Packed) -> list[Packed]:
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


# ----------------------------------------------------------------------------- group calls
def bcast_objects(g: ProcessGroup, objs: list[Any] | None, root: int, name: str,
                  copy_at_root: bool = True, ser: Serializer = STANDARD, packed: Packed | None = None
                  ) -> list[Any]:
    """``root``'s list of objects (``objs``, None elsewhere), unpickled on every rank; with
    ``copy_at_root=False`` the root gets its own list back instead of a copy. ``packed``:
    the root's list already packed."""
    mine = (packed or pack(objs, name, ser)) if g.rank == root else None  # type: ignore[arg-type]

    def body(comm: GroupComm) -> list[Any]:
        p = bcast_packed(comm, mine, root)
        if mine is not None:
            return objs if not copy_at_root else unpack(own_copy(p), ser)  # type: ignore[return-value]
        return unpack(p, ser)

    return g.run(name, body)  # type: ignore[return-value]


def all_gather_objects(g: ProcessGroup, obj: Any, name: str, ser: Serializer = STANDARD,
                       packed: Packed | None = None) -> list[Any]:
    """Every rank's ``obj``, in rank order, on every rank (``packed``: it already packed)."""
    mine = packed or pack([obj], name, ser)

    def body(comm: GroupComm) -> list[Any]:
        return [unpack(own_copy(p) if p is mine else p, ser)[0] for p in all_gather_packed(comm, mine)]

    return g.run(name, body)  # type: ignore[return-value]


def gather_objects(g: ProcessGroup, obj: Any, root: int, name: str,
                   ser: Serializer = STANDARD, packed: Packed | None = None) -> list[Any] | None:
    """Every rank's ``obj`` in rank order on ``root``; None elsewhere (``packed``: it
    already packed)."""
    mine = packed or pack([obj], name, ser)

    def body(comm: GroupComm) -> list[Any] | None:
        if comm.rank != root:
            send_packed(comm.isend, mine, root)
            return None
        out: list[Any] = []
        for r in range(comm.size):
            p = own_copy(mine) if r == root else recv_packed(comm.irecv, r)[0]
            out.append(unpack(p, ser)[0])
        return out

    return g.run(name, body)  # type: ignore[return-value]


def scatter_objects(g: ProcessGroup, objs: Sequence[Any] | None, root: int, name: str,
                    ser: Serializer = STANDARD, packed: list[Packed] | None = None) -> Any:
    """Item i of ``root``'s ``objs`` (one per rank; None elsewhere) to rank i (``packed``:
    the root's items already packed)."""
    packs: list[Packed] = []
    if g.rank == root:
        assert objs is not None and len(objs) == g.size
        packs = packed or [pack([o], name, ser) for o in objs]

    def body(comm: GroupComm) -> Any:
        if comm.rank == root:
            for r in range(comm.size):
                if r != root:
                    send_packed(comm.isend, packs[r], r)
            return unpack(own_copy(packs[root]), ser)[0]
        return unpack(recv_packed(comm.irecv, root)[0], ser)[0]

    return g.run(name, body)


def all_to_all_objects(g: ProcessGroup, objs: Sequence[Any], name: str,
                       ser: Serializer = STANDARD, packed: list[Packed] | None = None) -> list[Any]:
    """Item j of every rank's ``objs`` (one per rank) to rank j; returns what each rank sent
    this one, in rank order. Sends complete without the receiver, so every rank sends all
    its items first, then receives."""
    if len(objs) != g.size:
        raise MismatchError(f"{name} on {g.describe()}: expected {g.size} items, got {len(objs)}")
    packs = packed or [pack([o], name, ser) for o in objs]

    def body(comm: GroupComm) -> list[Any]:
        for k in range(1, comm.size):
            peer = (comm.rank + k) % comm.size
            send_packed(comm.isend, packs[peer], peer)
        out: list[Any] = [None] * comm.size
        out[comm.rank] = unpack(own_copy(packs[comm.rank]), ser)[0]
        for k in range(1, comm.size):
            peer = (comm.rank - k) % comm.size
            out[peer] = unpack(recv_packed(comm.irecv, peer)[0], ser)[0]
        return out

    return g.run(name, body)  # type: ignore[return-value]
