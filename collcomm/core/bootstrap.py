"""Rendezvous: find out who we are, meet the other ranks, build the transport.

Identity comes from explicit arguments, else the first launcher environment found:
collcomm run / torchrun (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``,
``MASTER_PORT``), Open MPI (``OMPI_COMM_WORLD_*``), MPICH/Hydra (``PMI_RANK``/``PMI_SIZE``)
and Slurm (``SLURM_PROCID``/``SLURM_NTASKS``/``SLURM_LOCALID``). None → a world of one.
"""
from __future__ import annotations

import json
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from ..rendezvous.auth import job_id, job_token
from ..errors import ClosedError, CommTimeoutError, InvalidArgumentError
from ..rendezvous import PrefixStore, store_from_url
from ..transport.engine import Engine
from ..transport.shm import SHM_DIR, Inbox, ShmChannel, open_segment, ring_bytes
from ..transport.tcp import TcpHub, advertised_host


@dataclass
class Identity:
    rank: int
    size: int
    local_rank: int
    launcher: str


def _int(env: Mapping[str, str], *names: str) -> int | None:
    for name in names:
        value = env.get(name)
        if value not in (None, ""):
            return int(value)  # type: ignore[arg-type]
    return None


def identify(env: Mapping[str, str] = os.environ, rank: int = -1, world_size: int = -1) -> Identity:
    """This process's rank, world size and local rank, and which launcher said so."""
    sources = [
        ("collcomm/torchrun", ("RANK",), ("WORLD_SIZE",), ("LOCAL_RANK",)),
        ("openmpi", ("OMPI_COMM_WORLD_RANK",), ("OMPI_COMM_WORLD_SIZE",), ("OMPI_COMM_WORLD_LOCAL_RANK",)),
        ("mpich", ("PMI_RANK",), ("PMI_SIZE",), ("MPI_LOCALRANKID", "PMI_LOCAL_RANK")),
        ("slurm", ("SLURM_PROCID",), ("SLURM_NTASKS", "SLURM_NPROCS"), ("SLURM_LOCALID",)),
    ]
    found = Identity(0, 1, 0, "none")
    for launcher, r, s, lr in sources:
        env_rank, env_size = _int(env, *r), _int(env, *s)
        if env_rank is not None and env_size is not None:
            local = _int(env, *lr)
            found = Identity(env_rank, env_size, env_rank if local is None else local, launcher)
            break
    if rank >= 0:
        found.rank = rank
    if world_size > 0:
        found.size = world_size
    if not 0 <= found.rank < found.size:
        raise InvalidArgumentError(
            f"init_process_group: rank must be in [0, world_size={found.size}), got {found.rank} "
            f"(from {found.launcher if rank < 0 else 'the rank argument'})")
    return found


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
                threading.Thread(target=self.store.close, daemon=True).start()
            else:
                self.store.close()
            self.store = None


_generation = 0


def _default_url(ident: Identity, env: Mapping[str, str]) -> str:
    """Where to meet when init_method is not given."""
    if env.get("COLLCOMM_STORE"):
        return "env://"
    addr, port = env.get("MASTER_ADDR"), env.get("MASTER_PORT")
    if addr and port:
        if env.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
            # torchrun's agent serves its own store on MASTER_PORT: use the next port
            return f"tcp://{addr}:{int(env.get('COLLCOMM_MASTER_PORT', int(port) + 1))}"
        return "env://"
    if ident.launcher in ("openmpi", "mpich", "slurm"):
        # one host (or a shared file system): meet in a file named after the job
        return f"file:///tmp/collcomm-rdzv-{job_id(env)}"
    raise InvalidArgumentError(
        f"init_process_group: world size {ident.size} from {ident.launcher} but no way to meet: "
        "set MASTER_ADDR/MASTER_PORT, pass init_method='tcp://host:port' or 'file:///path', "
        "or start the job with 'collcomm run'")


def host_id() -> str:
    """Ranks with equal host ids can share memory: same host, boot, pid namespace and /dev/shm.

    ``COLLCOMM_HOST_ID`` overrides it (ranks with different values talk TCP even on one
    machine: how the tests build multi-host jobs on one host).
    """
    forced = os.environ.get("COLLCOMM_HOST_ID")
    if forced:
        return f"forced:{forced}"
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = "?"
    try:
        pidns = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        pidns = 0
    try:
        st = os.stat(SHM_DIR)
        shm = f"{st.st_dev}:{st.st_ino}"
    except OSError:
        shm = "none"
    return f"{socket.gethostname()}|{boot}|{pidns}|{shm}"


def store_barrier(store: Any, name: str, size: int, rank: int, timeout: float) -> None:
    """Every rank adds itself to a counter; the last one opens the gate everyone waits on."""
    if store.add(f"{name}/count", 1) == size:
        store.set(f"{name}/open", b"1")
    try:
        store.get(f"{name}/open", timeout=timeout)
    except CommTimeoutError as exc:
        arrived = store.add(f"{name}/count", 0)
        raise CommTimeoutError(
            f"init_process_group: rank {rank} waited {timeout:g} s at the rendezvous step "
            f"{name!r}: only {arrived} of {size} ranks arrived") from exc


def join(init_method: str | None, world_size: int, rank: int, store: Any, timeout: float) -> Job:
    """Meet the other ranks and connect to each of them (see the module docstring)."""
    global _generation
    env = os.environ
    ident = identify(env, rank, world_size)
    if ident.size == 1 and store is None and init_method is None:
        return Job(0, 1, ident)
    token = job_token(env)
    own_store = store is None
    url = (init_method or _default_url(ident, env)) if own_store else ""
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
    try:
        _share_cost_model(kv, ident.rank, timeout)
        job.transport = _connect(job, kv, token, job_id(env), timeout)
        kv.add("joined", 1)
        if ident.rank == 0 and own_store:
            def await_others() -> None:
                if not _await_others(kv, ident.size):
                    job.store_stuck = True
            job.on_close.append(await_others)
    except BaseException:
        job.close()
        raise
    return job


def _share_cost_model(kv: Any, rank: int, timeout: float) -> None:
    """Every rank uses rank 0's cost model, so every rank picks the same algorithms."""
    from ..algorithms import cost

    if rank == 0:
        kv.set("cost_model", cost.active().to_json().encode())
    cost.set_active(cost.CostModel.from_json(kv.get("cost_model", timeout=timeout).decode()))


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

    waiter = threading.Thread(target=poll, daemon=True, name="collcomm-await-others")
    waiter.start()
    waiter.join(max(0.0, deadline - time.monotonic()))
    return not waiter.is_alive()


def _connect(job: Job, kv: Any, token: bytes, jid: str, timeout: float) -> Engine:
    rank, size = job.rank, job.size
    mode = os.environ.get("COLLCOMM_TRANSPORT", "auto").lower()
    if mode not in ("auto", "shm", "tcp"):
        raise InvalidArgumentError(f"COLLCOMM_TRANSPORT must be auto, shm or tcp, got {mode!r}")
    engine = Engine(rank, size, timeout, jid)
    hub = TcpHub(engine, token)
    job.extras.append(hub)
    try:
        port = hub.listen(os.environ.get("COLLCOMM_BIND_ADDR", "0.0.0.0"))
        me = {"host": host_id(), "pid": os.getpid(),
              "tcp": [advertised_host(os.environ.get("MASTER_ADDR")), port]}
        kv.set(f"info/{rank}", json.dumps(me).encode())
        infos = [json.loads(kv.get(f"info/{r}", timeout=timeout)) for r in range(size)]
        local = [r for r in range(size) if infos[r]["host"] == me["host"]]
        engine.hosts = [str(info["host"]) for info in infos]
        if mode == "tcp":
            shm_peers: list[int] = []
        else:
            shm_peers = [r for r in local if r != rank]
        tcp_peers = [r for r in range(size) if r != rank and r not in shm_peers]
        if mode == "shm" and tcp_peers:
            raise InvalidArgumentError(
                f"init_process_group: COLLCOMM_TRANSPORT=shm but ranks {tcp_peers} are on other hosts")
        inbox = None
        if shm_peers:
            inbox = Inbox(f"collcomm-{jid}-inbox-{rank}", len(local), ring_bytes(len(local)))
            job.extras.append(inbox)
        store_barrier(kv, "inboxes", size, rank, timeout)
        deadline = time.monotonic() + timeout
        higher = {r for r in tcp_peers if r > rank}
        acceptor_error: list[BaseException] = []

        def accept() -> None:
            try:
                hub.accept(higher, deadline)
            except BaseException as exc:  # noqa: BLE001 - re-raised below
                acceptor_error.append(exc)

        acceptor = threading.Thread(target=accept, daemon=True)
        acceptor.start()
        for r in sorted(tcp_peers):
            if r < rank:
                host, peer_port = infos[r]["tcp"]
                hub.connect(r, host, int(peer_port), deadline)
        for r in shm_peers:
            assert inbox is not None
            peer_inbox = open_segment(f"collcomm-{jid}-inbox-{r}")
            engine.add_channel(ShmChannel(engine, r, int(infos[r]["pid"]), jid, inbox, peer_inbox,
                                          my_slot=local.index(rank), peer_slot=local.index(r)),
                               polled=True)
        acceptor.join(max(0.0, deadline - time.monotonic()) + 1)
        if acceptor_error:
            raise acceptor_error[0]
        for r, ch in hub.channels.items():
            engine.add_channel(ch, polled=False)
        store_barrier(kv, "connected", size, rank, timeout)
        if inbox is not None:
            inbox.unlink()
        hub.start()
    except BaseException:
        hub.close(linger=0)
        engine.close()
        raise
    return engine
