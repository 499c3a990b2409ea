"""Rendezvous: meet the other ranks of a job and build the transport (:func:`join`).

A rank finds out who it is (:mod:`.identity`), meets the others through a store (its own,
made from ``init_method`` or the launcher's variables, or one handed in) while watching
for ranks that die on the way (:mod:`.joinwatch`), takes rank 0's cost model and connects
to every other rank (:mod:`.connect`); the result is the :class:`Job` it holds until it
leaves. Under ``collcomm run`` it also arranges a fault report for the launcher should it
die of an uncaught exception (:mod:`.faults`).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from ..errors import ClosedError, PeerLostError
from ..helper_thread import run_with_patience, standby
from ..rendezvous import PrefixStore, store_from_url
from ..rendezvous.auth import job_id, job_token
from ..transport.shm_segments import warn_once
from .connect import connect_transport, share_cost_model
from .faults import install_fault_report
from .identity import Identity, default_url, identify
from .joinwatch import JoinWatch

# read by other modules as collcomm.core.bootstrap.<name>
from .faults import FAULT_KEY, REPORT_ENV, debug_enabled, fault_report, trimmed_traceback  # noqa: F401
from .identity import host_id  # noqa: F401
from .joinwatch import store_barrier  # noqa: F401


@dataclass
class Job:
    """What a rank holds while it is part of a job."""

    rank: int
    size: int
    identity: Identity
    transport: Any = None
    store: Any = None
    extras: list[Any] = field(default_factory=list)
    on_close: list[Callable[[], None]] = field(default_factory=list)
    store_stuck: bool = False  # the store stopped answering: close it without waiting

    def close(self) -> None:
        for fn in self.on_close:
            fn()
        self.on_close.clear()
        if self.transport is not None:
            self.transport.close()
            self.transport = None
        for x in self.extras:
            x.close()
        self.extras.clear()
        if self.store is not None:
            if self.store_stuck:  # a request still holds its lock: close in the background
                run_with_patience(self.store.close, "collcomm-store-close", 0.0)
            else:
                self.store.close()
            self.store = None


_generation = 0


def join(init_method: str | None, world_size: int, rank: int, store: Any, timeout: float) -> Job:
    """Meet the other ranks and connect to each of them (see the module docstring)."""
    global _generation
    env = os.environ
    ident = identify(env, rank, world_size)
    install_fault_report(ident.rank)
    standby()     # (the thread that runs the leaving steps where Python starts none: at exit)
    if ident.size == 1 and store is None and init_method is None:
        return Job(0, 1, ident)
    token = job_token(env)
    own_store = store is None
    url = (init_method or default_url(ident, env)) if own_store else ""
    if ident.rank == 0 and not env.get("COLLCOMM_TOKEN") and url.startswith(("env://", "tcp://")):
        warn_once("token", "COLLCOMM_TOKEN is not set, so this job's connections are authenticated "
                           "with a token derived from its launcher's variables ("
                           + (", ".join(n for n in ("TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT",
                                                    "SLURM_JOB_ID", "PMIX_NAMESPACE") if env.get(n))
                              or "none set") + "): anyone who can guess them can join it or talk "
                           "to its store. Set COLLCOMM_TOKEN to a secret, the same on every node "
                           "('collcomm run' does it for you)")
    # a store hosted by rank 0 of an earlier incarnation of this job may still be up when we
    # re-join: if it closes under us, meet again at the new one (same generation)
    retry = own_store and ident.rank != 0 and _hosted_by_rank0(url, env)
    _generation += 1
    deadline = time.monotonic() + timeout
    while True:
        if own_store:
            store = store_from_url(url, ident.rank, ident.size, timeout, token)
        try:
            return _join_once(ident, store, own_store, token, env, timeout)
        except ClosedError:
            if not retry or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _hosted_by_rank0(url: str, env: Mapping[str, str]) -> bool:
    return url.startswith("tcp://") or (url.startswith("env://") and not env.get("COLLCOMM_STORE"))


def _join_once(ident: Identity, store: Any, own_store: bool, token: bytes,
               env: Mapping[str, str], timeout: float) -> Job:
    kv = PrefixStore(f"collcomm/init{_generation}", store)
    job = Job(ident.rank, ident.size, ident, store=store if own_store else None)
    watch: JoinWatch | None = None
    try:
        watch = JoinWatch(kv, ident.rank, ident.size)
        share_cost_model(kv, ident.rank, timeout, watch)
        master = getattr(store, "host", None) or env.get("MASTER_ADDR")
        job.transport = connect_transport(job, kv, token, job_id(env), timeout, master, watch)
        kv.add("joined", 1)
        if ident.rank == 0 and own_store:
            def await_others() -> None:
                if not _await_others(kv, ident.size):
                    job.store_stuck = True
            job.on_close.append(await_others)
    except BaseException as exc:
        if watch is not None:
            watch.leave(exc)
            hosts_store = own_store and getattr(store, "_server", None) is not None
            if hosts_store and isinstance(exc, PeerLostError):
                watch.linger()
        job.close()
        raise
    return job



def _await_others(kv: Any, size: int, patience: float = 10.0) -> bool:
    """The store's host stays until every rank is done with it, ``patience`` seconds at most.

    The polls run on a helper thread joined with the remaining patience, so a store that
    stops answering costs ``patience``, not the client's socket timeout (10 s slack + up to
    60 s). Returns False when a poll is still in flight at the deadline: the caller must not
    then wait for the store's lock to close it.
    """
    deadline = time.monotonic() + patience

    def poll() -> None:
        while time.monotonic() < deadline:
            try:
                if kv.add("joined", 0) >= size:
                    return
            except Exception:  # noqa: BLE001 - the store may already be gone
                return
            time.sleep(0.01)

    return run_with_patience(poll, "collcomm-await-others", max(0.0, deadline - time.monotonic()))
