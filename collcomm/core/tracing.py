"""Tracing: every message and arena step of a call, as Chrome trace events.

:class:`TracingComm` wraps the :class:`~collcomm.core.call_comm.GroupComm` of one call and
records each ``isend``/``irecv`` (peer, bytes, step, post and completion times) and each
``sync`` of the shared-memory arena (it wraps what ``arena()`` returns). Algorithms are
plain functions over a Comm, so the wrapper sees every step of every family without any
change to them. A *step* of a rank is what it posts between two waits: a new step starts
at the first post after a wait (and at every arena sync), so ring all_reduce on n ranks
has 2(n-1) steps, a binomial broadcast ⌈log2 n⌉ on the root.

``COLLCOMM_TRACE=DIR`` (``collcomm run --trace DIR``) turns it on for every call; each
rank writes ``DIR/trace-rank<R>.json`` when it leaves the job, in the Chrome trace-event
format (Perfetto, chrome://tracing): per rank (``pid``) a slice per collective (op, group,
seq, bytes, dtype, algorithm), nested slices per step and per arena sync, a slice per
message on a track per peer, and a flow arrow from each send to its receive. Timestamps
are on rank 0's clock: at init every rank measures its offset to rank 0 through the
rendezvous store (5 rounds bounding it by causality, see :func:`measure_offset`); ranks
on one host share CLOCK_MONOTONIC, so there the offset is exactly 0 unless
``COLLCOMM_TRACE_CLOCK=store`` asks to use the measured one. ``collcomm trace merge DIR``
joins the files into one.
"""
from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from typing import Any

from ..algorithms import signature

_now = time.monotonic_ns
MAX_EVENTS = int(os.environ.get("COLLCOMM_TRACE_MAX", 1_000_000))
_ITEMSIZE = {"bool": 1, "int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "int32": 4, "uint32": 4,
             "int64": 8, "uint64": 8, "float16": 2, "bfloat16": 2, "float32": 4, "float64": 8,
             "longdouble": 16, "complex64": 8, "complex128": 16, "clongdouble": 32, "bytes": 1}


def sig_fields(sig: int) -> dict[str, Any]:
    """dtype, count, root and op of a call signature (what :func:`signature.describe` shows)."""
    if not sig:
        return {}
    d, o, r = (sig >> 55) & 0x1F, (sig >> 50) & 0x1F, (sig >> 36) & signature.NO_ROOT
    out: dict[str, Any] = {"count": sig & ((1 << 36) - 1)}
    if d < len(signature.DTYPES):
        out["dtype"] = signature.DTYPES[d]
    if o:
        out["op"] = signature.OPS[o] if o < len(signature.OPS) else "custom"
    if r != signature.NO_ROOT:
        out["root"] = r
    return out


def sig_bytes(sig: int) -> int:
    """Bytes per rank a signature names (count × item size; 0 when unknown)."""
    f = sig_fields(sig)
    return f.get("count", 0) * _ITEMSIZE.get(f.get("dtype", ""), 0)


def flow_id(*key: Any) -> int:
    return int.from_bytes(hashlib.blake2b(repr(key).encode(), digest_size=6).digest(), "little")


class _Handle:
    """A handle that stamps its message's completion time when waited."""

    __slots__ = ("_h", "_msg", "_comm")

    def __init__(self, h: Any, msg: dict[str, Any], comm: "TracingComm") -> None:
        self._h, self._msg, self._comm = h, msg, comm

    def wait(self, timeout: float | None = None) -> Any:
        st = self._h.wait(timeout)
        if "t1" not in self._msg:
            self._msg["t1"] = _now()
        self._comm._root._waited = True
        return st

    def test(self) -> bool:
        done = self._h.test()
        if done and "t1" not in self._msg:
            self._msg["t1"] = _now()
        return done


class TracingArena:
    """The group's arena with every ``sync`` recorded as a step (everything else passes).

    Its ``native_core`` is None, so shm_direct takes its Python path, whose syncs are seen
    (the native core syncs inside C)."""

    native_core = None

    def __init__(self, arena: Any, comm: "TracingComm") -> None:
        self._arena, self._comm = arena, comm

    def sync(self) -> None:
        c = self._comm
        c._new_step(force=True)
        t0 = _now()
        self._arena.sync()
        c.syncs.append({"t0": t0, "t1": _now(), "step": c.step})
        c._root._waited = True

    def slot_array(self, phase: int, rank: int, dtype: Any, count: int, offset: int = 0) -> Any:
        c = self._comm
        c.slots.append({"t": _now(), "step": c.step, "phase": phase, "slot_rank": rank,
                        "bytes": count * getattr(dtype, "itemsize", 1)})
        return self._arena.slot_array(phase, rank, dtype, count, offset)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._arena, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in ("_arena", "_comm"):
            object.__setattr__(self, name, value)
        else:
            setattr(self._arena, name, value)


class TracingComm:
    """A Comm that records every message and arena step of one call (module docstring).

    ``ranks``: global rank of each local rank. ``on_post(comm, kind, arr, peer)`` and
    ``on_step(comm, why)`` are optional hooks (``collcomm explain`` snapshots buffers)."""

    def __init__(self, comm: Any, call_key: tuple = (), on_post: Any = None, on_step: Any = None,
                 parent: "TracingComm | None" = None) -> None:
        self._comm = comm
        self.rank, self.size = comm.rank, comm.size
        self.ranks = list(getattr(comm, "_ranks", range(comm.size)))
        self.call_key = call_key
        self.on_post, self.on_step = on_post, on_step
        root = parent if parent is not None else self
        self.msgs: list[dict[str, Any]] = root.msgs if parent is not None else []
        self.syncs: list[dict[str, Any]] = root.syncs if parent is not None else []
        self.slots: list[dict[str, Any]] = root.slots if parent is not None else []
        self._root = root
        self._counts: dict[tuple[str, int], int] = {}
        self._arena: Any = None
        if parent is None:
            self._step = 0
            self._waited = False
            self.children: list[TracingComm] = []

    @property
    def step(self) -> int:
        """This call's current step (shared with the sub-comms of a hierarchical call)."""
        return self._root._step

    def _new_step(self, force: bool = False) -> None:
        root = self._root
        if force or root._waited or root._step == 0:
            if self.on_step is not None:
                self.on_step(root, "step")      # the step that ends here
            root._step += 1
            root._waited = False

    def _post(self, kind: str, arr: Any, peer: int, post: Any) -> Any:
        self._new_step()         # before posting: a receive may complete as it is posted
        t0 = _now()
        h = post(arr, peer)
        g = self.ranks[peer]
        n = self._counts.get((kind, g), 0)
        self._counts[(kind, g)] = n + 1
        me = self.ranks[self.rank]
        src, dst = (me, g) if kind == "send" else (g, me)
        msg = {"kind": kind, "peer": g, "bytes": int(arr.nbytes), "step": self.step, "t0": t0,
               "flow": flow_id(self.call_key, src, dst, n), "addr": arr.__array_interface__["data"][0]
               if arr.nbytes else 0}
        self.msgs.append(msg)
        if self.on_post is not None:
            self.on_post(self, kind, arr, g, msg)
        return _Handle(h, msg, self)

    def isend(self, arr: Any, peer: int) -> Any:
        return self._post("send", arr, peer, self._comm.isend)

    def irecv(self, arr: Any, peer: int) -> Any:
        return self._post("recv", arr, peer, self._comm.irecv)

    def arena(self) -> Any:
        if self._arena is None:
            a = self._comm.arena()
            self._arena = TracingArena(a, self) if a is not None else None
        return self._arena

    def hierarchy(self) -> tuple[Any, Any]:
        local, leaders = self._comm.hierarchy()
        out = []
        for i, c in enumerate((local, leaders)):
            if c is None:
                out.append(None)
                continue
            t = TracingComm(c, self.call_key + (("local", "leaders")[i],), self.on_post,
                            self.on_step, parent=self._root)
            self._root.children.append(t)
            out.append(t)
        return out[0], out[1]

    def __getattr__(self, name: str) -> Any:   # sig, scratch, shared, link, … pass through
        return getattr(self._comm, name)


# ------------------------------------------------------------------------------ the tracer
class Tracer:
    """Collects the events of this process and writes them when the rank leaves."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.offset_ns = 0           # add to a local monotonic time to get rank 0's
        self.measured_ns: int | None = None
        self.bounds_ns: list[int] = []     # the interval the measured offset must lie in
        self.rank = 0
        self.folder = os.environ.get("COLLCOMM_TRACE", "")
        self.dropped = 0
        self._lock = threading.Lock()
        self._threads: set[int] = set()
        self._written = False

    # -- job start: clock offsets --------------------------------------------------------------
    def start(self, job: Any) -> None:
        self.rank = job.rank
        self.events.append({"name": "process_name", "ph": "M", "pid": self.rank, "tid": 0,
                            "args": {"name": f"rank {self.rank}"}})
        self.events.append({"name": "process_sort_index", "ph": "M", "pid": self.rank, "tid": 0,
                            "args": {"sort_index": self.rank}})
        if job.size > 1 and job.store is not None:
            try:
                self.measured_ns, *self.bounds_ns = measure_offset(job.store, job.rank, job.size)
            except Exception:  # noqa: BLE001 - a trace without aligned clocks is still a trace
                self.measured_ns = None
            hosts = getattr(job.transport, "hosts", None) or []
            boots = {h.split("|")[1] if h.count("|") >= 3 else h for h in hosts}
            same_clock = len(boots) == 1 and not hosts[0].startswith("forced:") if hosts else False
            if os.environ.get("COLLCOMM_TRACE_CLOCK", "").lower() == "store" or not same_clock:
                self.offset_ns = self.measured_ns or 0
        job.on_close.append(self.write)

    # -- per call -------------------------------------------------------------------------------
    def wrap(self, comm: Any, rec: Any, obs: Any) -> TracingComm:
        t = TracingComm(comm, (obs.ctx, rec[1]))
        t.t_start = _now()   # type: ignore[attr-defined]
        return t

    def end(self, comm: Any, rec: Any, obs: Any, failed: bool) -> None:
        if not isinstance(comm, TracingComm):
            return
        from .recorder import algorithm_name, where

        t_end = _now()
        off = self.offset_ns
        pid = self.rank
        tid = threading.get_native_id()
        seq = rec[1] & ((1 << 35) - 1)
        fields = sig_fields(rec[3])
        ev: list[dict[str, Any]] = []
        if tid not in self._threads:
            self._threads.add(tid)
            ev.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                       "args": {"name": threading.current_thread().name}})
        args = {"group": obs.name, "seq": seq, "bytes": sig_bytes(rec[3]),
                "algorithm": algorithm_name(rec[4]), "where": where(rec[5], rec[6]), **fields}
        if failed:
            args["failed"] = True
        start = getattr(comm, "t_start", t_end)
        ev.append({"name": rec[2], "cat": "collective", "ph": "X", "pid": pid, "tid": tid,
                   "ts": (start + off) / 1e3, "dur": (t_end - start) / 1e3, "args": args})
        # step slices, nested in the call (steps follow each other)
        spans: dict[int, list[int]] = {}
        for m in comm.msgs:
            s = spans.setdefault(m["step"], [m["t0"], m.get("t1", m["t0"])])
            s[0], s[1] = min(s[0], m["t0"]), max(s[1], m.get("t1", m["t0"]))
        for sy in comm.syncs:
            s = spans.setdefault(sy["step"], [sy["t0"], sy["t1"]])
            s[0], s[1] = min(s[0], sy["t0"]), max(s[1], sy["t1"])
        for step, (a, b) in sorted(spans.items()):
            ev.append({"name": f"step {step}", "cat": "step", "ph": "X", "pid": pid, "tid": tid,
                       "ts": (a + off) / 1e3, "dur": max(b - a, 1) / 1e3,
                       "args": {"step": step, "seq": seq}})
        for sy in comm.syncs:
            ev.append({"name": "arena sync", "cat": "arena", "ph": "X", "pid": pid, "tid": tid,
                       "ts": (sy["t0"] + off) / 1e3, "dur": max(sy["t1"] - sy["t0"], 1) / 1e3,
                       "args": {"step": sy["step"], "seq": seq}})
        for m in comm.msgs:
            send = m["kind"] == "send"
            mtid = 1_000_000 + 2 * m["peer"] + (0 if send else 1)
            if mtid not in self._threads:
                self._threads.add(mtid)
                ev.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": mtid, "args": {
                    "name": f"send → rank {m['peer']}" if send else f"recv ← rank {m['peer']}"}})
            t1 = m.get("t1", t_end)
            name = f"{'send to' if send else 'recv from'} {m['peer']}"
            ev.append({"name": name, "cat": "message", "ph": "X", "pid": pid, "tid": mtid,
                       "ts": (m["t0"] + off) / 1e3, "dur": max(t1 - m["t0"], 1) / 1e3,
                       "args": {"peer": m["peer"], "bytes": m["bytes"], "step": m["step"],
                                "op": rec[2], "seq": seq}})
            if send:
                ev.append({"name": "message", "cat": "message", "ph": "s", "id": m["flow"],
                           "pid": pid, "tid": mtid, "ts": (m["t0"] + off) / 1e3})
            else:
                ev.append({"name": "message", "cat": "message", "ph": "f", "bp": "e",
                           "id": m["flow"], "pid": pid, "tid": mtid, "ts": (t1 + off) / 1e3})
        with self._lock:
            if len(self.events) + len(ev) > MAX_EVENTS:
                self.dropped += 1
                return
            self.events.extend(ev)

    # -- output ---------------------------------------------------------------------------------
    def write(self) -> str | None:
        if self._written or not self.folder:
            return None
        self._written = True
        os.makedirs(self.folder, exist_ok=True)
        path = os.path.join(self.folder, f"trace-rank{self.rank}.json")
        meta = {"rank": self.rank, "clock_offset_ns": self.offset_ns,
                "measured_offset_ns": self.measured_ns, "measured_bounds_ns": self.bounds_ns,
                "dropped_calls": self.dropped}
        with self._lock:
            events = list(self.events)
        events.append({"name": "clock", "ph": "M", "pid": self.rank, "tid": 0, "args": meta})
        with open(path + ".tmp", "w") as f:
            json.dump({"traceEvents": events, "displayTimeUnit": "ns", "metadata": meta}, f)
        os.replace(path + ".tmp", path)
        return path


def measure_offset(store: Any, rank: int, size: int, rounds: int = 5) -> tuple[int, int, int]:
    """(estimate, lower, upper) nanoseconds to add to this rank's monotonic clock to get
    rank 0's (0s on rank 0), measured through the store.

    In round i every rank stamps ``t_req``, announces itself (``ready/i``) and waits for
    ``clk/i``; rank 0, once all have announced, stamps its clock ``v`` into ``clk/i``; the
    rank stamps ``t_resp`` when it arrives. Causality gives ``t_req < v < t_resp`` (in true
    time), so the offset lies in ``[v - t_resp, v - t_req]``; the rounds' intervals are
    intersected and the estimate is the middle (its error is at most half the width)."""
    from .bootstrap import _generation
    from ..rendezvous.auth import job_id

    p = f"collcomm/trace/{job_id()}/{_generation}"
    if rank == 0:
        for i in range(rounds):
            deadline = time.monotonic() + 30
            while store.add(f"{p}/ready/{i}", 0) < size - 1 and time.monotonic() < deadline:
                time.sleep(0.0002)
            store.set(f"{p}/clk/{i}", str(_now()))
        return 0, 0, 0
    lower, upper = -(1 << 62), 1 << 62
    for i in range(rounds):
        t_req = _now()
        store.add(f"{p}/ready/{i}", 1)
        v = int(store.get(f"{p}/clk/{i}", timeout=30.0))
        t_resp = _now()
        lower, upper = max(lower, v - t_resp), min(upper, v - t_req)
    return (lower + upper) // 2, lower, upper


_tracer: Tracer | None = None


def tracer() -> Tracer:
    global _tracer
    if _tracer is None:
        _tracer = Tracer()
    return _tracer
