"""Rendezvous: find out who we are, meet the other ranks, build the transport.

Identity comes from explicit arguments, else the first launcher environment found:
collcomm run / torchrun (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``,
``MASTER_PORT``), Open MPI (``OMPI_COMM_WORLD_*``), MPICH/Hydra (``PMI_RANK``/``PMI_SIZE``)
and Slurm (``SLURM_PROCID``/``SLURM_NTASKS``/``SLURM_LOCALID``). None → a world of one.
"""
from __future__ import annotations

import json
import os
import re
import socket
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from ..rendezvous.auth import job_id, job_token
from ..errors import (ClosedError, CollcommError, CommTimeoutError, InvalidArgumentError,
                      MismatchError, PeerLostError)
from ..rendezvous import PrefixStore, store_from_url
from ..transport.engine import Engine
from ..transport.shm import (SHM_DIR, ShmChannel, ShmSpaceError, can_read, make_inbox, open_segment,
                              probe_address, space_text, warn_once)
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


class JoinWatch:
    """Who died while the job was joining.

    Every rank publishes ``alive/<rank>`` = its host id and pid first thing. The store
    waits of the join (:meth:`get`) then run in slices of :attr:`SLICE` seconds and, between
    slices, look at the ranks of this host that published: one whose process is gone ends
    the join at once with :class:`PeerLostError` naming it, instead of every other rank
    waiting for the job's timeout (300 s by default) for a key it will never write. A rank
    that died before publishing, or on another host, is still found by the timeout."""

    SLICE = 0.25

    def __init__(self, kv: Any, rank: int, size: int) -> None:
        self.kv, self.rank, self.size = kv, rank, size
        self.host = host_id()
        self.pids: dict[int, int] = {}      # same-host ranks that published
        self.known: set[int] = {rank}
        kv.set(f"alive/{rank}", f"{self.host} {os.getpid()}".encode())

    def check(self) -> None:
        """Raise PeerLostError if a same-host rank that published has died."""
        from ..transport.shm import pid_alive

        for r in range(self.size):
            if r in self.known:
                continue
            key = f"alive/{r}"
            try:
                if not self.kv.check([key]):
                    continue
                host, _, pid = self.kv.get(key, timeout=1.0).decode().rpartition(" ")
            except CollcommError:
                continue
            self.known.add(r)
            if host == self.host:
                self.pids[r] = int(pid)
        dead = [r for r, pid in self.pids.items() if not pid_alive(pid)]
        if not dead:
            return
        # a rank that gave up because of another one marked itself: name the root cause
        culprit = dead[0]
        for r in dead:
            try:
                reacted = self.kv.check([f"left/{r}"])
            except CollcommError:
                reacted = False
            if not reacted:
                culprit = r
                break
        raise PeerLostError(
            f"init_process_group: rank {culprit} (pid {self.pids[culprit]}, same host) died while "
            f"the job was joining; rank {self.rank} stops waiting for it", peer=culprit)

    def linger(self, patience: float = 10.0) -> None:
        """The store's host failing the join stays (``patience`` s at most) until every rank
        has left or is known dead, so that a rank arriving late still reaches the store and
        learns who died instead of retrying a vanished store until its timeout."""
        from ..transport.shm import pid_alive

        deadline = time.monotonic() + patience
        while time.monotonic() < deadline:
            try:
                self.check()
            except PeerLostError:
                pass
            pending = []
            for r in range(self.size):
                if r == self.rank or (r in self.pids and not pid_alive(self.pids[r])):
                    continue
                try:
                    if not self.kv.check([f"left/{r}"]):
                        pending.append(r)
                except CollcommError:
                    return
            if not pending:
                return
            time.sleep(0.05)

    def leave(self, exc: BaseException) -> None:
        """Mark this rank as gone because of ``exc`` (best effort), so that others do not
        take its exit for the root cause."""
        if isinstance(exc, CollcommError):
            try:
                self.kv.set(f"left/{self.rank}", str(getattr(exc, "peer", "") or "").encode())
            except Exception:  # noqa: BLE001 - the store may be gone too
                pass

    def get(self, key: str, timeout: float) -> bytes:
        """``kv.get(key)``, checking for dead ranks every :attr:`SLICE` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                return self.kv.get(key, timeout=max(0.001, min(self.SLICE, left)))
            except CommTimeoutError:
                if left <= self.SLICE:
                    raise
                self.check()


def store_barrier(store: Any, name: str, size: int, rank: int, timeout: float,
                  watch: JoinWatch | None = None) -> None:
    """Every rank adds itself to a counter; the last one opens the gate everyone waits on."""
    if store.add(f"{name}/count", 1) == size:
        store.set(f"{name}/open", b"1")
    try:
        if watch is not None:
            watch.get(f"{name}/open", timeout)
        else:
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
    install_fault_report(ident.rank)
    if ident.size == 1 and store is None and init_method is None:
        return Job(0, 1, ident)
    token = job_token(env)
    own_store = store is None
    url = (init_method or _default_url(ident, env)) if own_store else ""
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
        _share_cost_model(kv, ident.rank, timeout, watch)
        master = getattr(store, "host", None) or env.get("MASTER_ADDR")
        job.transport = _connect(job, kv, token, job_id(env), timeout, master, watch)
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


def _share_cost_model(kv: Any, rank: int, timeout: float, watch: JoinWatch | None = None) -> None:
    """Every rank uses rank 0's cost model, so every rank picks the same algorithms."""
    from ..algorithms import cost

    if rank == 0:
        kv.set("cost_model", cost.active().to_json().encode())
    raw = watch.get("cost_model", timeout) if watch is not None else kv.get("cost_model", timeout=timeout)
    cost.set_active(cost.CostModel.from_json(raw.decode()))


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


def _connect(job: Job, kv: Any, token: bytes, jid: str, timeout: float,
             master: str | None = None, watch: JoinWatch | None = None) -> Engine:
    """Build this rank's channels. Its TCP listener is bound to the address it advertises:
    the interface that routes to ``master`` (the store's host; loopback for a one-host
    job), ``COLLCOMM_SOCKET_IFNAME``'s, or ``COLLCOMM_HOST``; ``COLLCOMM_BIND_ADDR``
    overrides the bind address alone."""
    rank, size = job.rank, job.size
    mode = os.environ.get("COLLCOMM_TRANSPORT", "auto").lower()
    if mode not in ("auto", "shm", "tcp"):
        raise InvalidArgumentError(f"COLLCOMM_TRANSPORT must be auto, shm or tcp, got {mode!r}")
    engine = Engine(rank, size, timeout, jid)
    hub = TcpHub(engine, token)
    job.extras.append(hub)
    try:
        here = advertised_host(master or os.environ.get("MASTER_ADDR"))
        port = hub.listen(os.environ.get("COLLCOMM_BIND_ADDR") or here)
        me = {"host": host_id(), "pid": os.getpid(), "probe": probe_address(), "tcp": [here, port]}
        kv.set(f"info/{rank}", json.dumps(me).encode())
        get = watch.get if watch is not None else (lambda key, t: kv.get(key, timeout=t))
        infos = [json.loads(get(f"info/{r}", timeout)) for r in range(size)]
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
            # rings as large as /dev/shm has room for; none at all: TCP with this rank
            inbox = make_inbox(f"collcomm-{jid}-inbox-{rank}", len(local), local.index(rank))
            if inbox is not None:
                job.extras.append(inbox)
            kv.set(f"ring/{rank}", str(inbox.ring if inbox is not None else 0).encode())
        store_barrier(kv, "inboxes", size, rank, timeout, watch)
        rings = {r: int(get(f"ring/{r}", timeout)) for r in shm_peers}
        no_room = [r for r in shm_peers if not rings[r] or inbox is None]
        if no_room:
            if mode == "shm":
                raise ShmSpaceError(
                    f"init_process_group: rank {rank}: COLLCOMM_TRANSPORT=shm but "
                    + ("this rank has" if inbox is None else f"ranks {no_room} have")
                    + f" no room for a shared-memory inbox ({space_text()})")
            if inbox is not None:
                warn_once("inbox-tcp", f"{space_text()}: ranks {no_room} of this host had no room for "
                                   "their shared-memory inboxes: this rank talks to them over TCP")
            shm_peers = [r for r in shm_peers if r not in no_room]
            tcp_peers = sorted(tcp_peers + no_room)
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
                                          my_slot=local.index(rank), peer_slot=local.index(r),
                                          peer_ring=rings[r]),
                               polled=True)
            # may large messages from r come through its private memory? (read below, by r,
            # after the "connected" barrier)
            inbox.set_can_read(local.index(r), can_read(int(infos[r]["pid"]), int(infos[r].get("probe", 0))))
        while acceptor.is_alive() and time.monotonic() < deadline + 1:
            acceptor.join(JoinWatch.SLICE)
            if acceptor.is_alive() and watch is not None:
                watch.check()      # a higher rank that died never connects
        if acceptor_error:
            raise acceptor_error[0]
        for r, ch in hub.channels.items():
            engine.add_channel(ch, polled=False)
        store_barrier(kv, "connected", size, rank, timeout, watch)
        if inbox is not None:
            inbox.unlink()
        hub.start()
    except BaseException:
        hub.close(linger=0)
        engine.close()
        raise
    return engine


# --------------------------------------------------------------------------- fault reports
#
# Under ``collcomm run`` (``COLLCOMM_REPORT`` names a directory), a rank that dies of an
# uncaught exception leaves ``rank-<r>.json`` there: one JSON object with "rank", "pid",
# "t" (time.monotonic(), comparable between processes of one machine), "type" (the
# exception's class), "message", "peers" (the ranks its collcomm error names: ``.peer``,
# else the other ranks its message mentions), "reaction" (true when the error is about
# another rank: PeerLostError, CommTimeoutError, ClosedError, MismatchError) and
# "traceback" (trimmed, see :func:`trimmed_traceback`). In a job of several nodes the rank
# also puts it in the launcher's store under FAULT_KEY. The launchers read these to name
# the root cause of a failed job; the rank's own stderr gets the exception's last line only,
# the trimmed traceback is printed once, in the launcher's summary.

REPORT_ENV = "COLLCOMM_REPORT"
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_REACTIONS = (PeerLostError, CommTimeoutError, ClosedError, MismatchError)


def debug_enabled() -> bool:
    return os.environ.get("COLLCOMM_DEBUG", "") not in ("", "0")


def _next_in_chain(exc: BaseException) -> BaseException | None:
    if exc.__cause__ is not None:
        return exc.__cause__
    return None if exc.__suppress_context__ else exc.__context__


def _collcomm_error(exc: BaseException) -> CollcommError | None:
    """The outermost collcomm error in ``exc``'s chain (``exc`` itself, or what it came from)."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        if isinstance(e, CollcommError):
            return e
        seen.add(id(e))
        e = _next_in_chain(e)
    return None


def _format_frames(tb: Any) -> list[str]:
    """User frames as Python prints them; runs of collcomm's own frames folded into one line."""
    out: list[str] = []
    inside = 0
    for frame in traceback.extract_tb(tb):
        if frame.filename.startswith("<frozen "):
            continue
        if frame.filename.startswith(_PACKAGE_DIR):
            inside += 1
            continue
        if inside:
            out.append(f"  [{inside} frame(s) inside collcomm]\n")
            inside = 0
        out.extend(traceback.StackSummary.from_list([frame]).format())
    if inside:
        out.append(f"  [{inside} frame(s) inside collcomm]\n")
    return out


def trimmed_traceback(exc: BaseException) -> str:
    """The traceback a user can act on: their own frames (collcomm's folded into one line)
    and collcomm's message, without the internal errors that message was raised from.
    With ``COLLCOMM_DEBUG=1`` the full traceback."""
    if debug_enabled():
        return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    chain: list[BaseException] = []
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        chain.append(e)
        if isinstance(e, CollcommError):
            break  # what collcomm raised it from is internal
        e = _next_in_chain(e)
    parts: list[str] = []
    for inner, outer in zip(reversed(chain), list(reversed(chain))[1:] + [None]):
        if inner.__traceback__ is not None:
            parts.append("Traceback (most recent call last):\n")
            parts.extend(_format_frames(inner.__traceback__))
        parts.extend(traceback.format_exception_only(type(inner), inner))
        if outer is not None:
            parts.append("\nThe above exception was the direct cause of the following exception:\n\n"
                         if outer.__cause__ is inner else
                         "\nDuring handling of the above exception, another exception occurred:\n\n")
    return "".join(parts)


def fault_report(exc: BaseException, rank: int) -> dict[str, Any]:
    """What :func:`install_fault_report` writes for ``exc`` raised on ``rank``."""
    err = _collcomm_error(exc)
    peers: list[int] = []
    if err is not None:
        peer = getattr(err, "peer", None)
        if isinstance(peer, int) and peer != rank:
            peers = [peer]
        else:
            named = sorted({int(m) for m in re.findall(r"\brank (\d+)\b", str(err))} - {rank})
            peers = named
    return {"rank": rank, "pid": os.getpid(), "t": time.monotonic(),
            "type": type(exc).__name__, "message": str(err if err is not None else exc)[:4000],
            "peers": peers, "reaction": isinstance(err, _REACTIONS),
            "traceback": trimmed_traceback(exc)}


#: Store key of a rank's fault report, for the launchers of the other nodes.
FAULT_KEY = "collcomm/faults/{rank}"


def _publish_report(report: dict[str, Any], wait: float = 0.5) -> None:
    """In a job of several nodes, also put the report in the launcher's store, so the
    launchers of other nodes can follow what this rank named. A fresh, short-lived
    connection on a helper thread, waited for ``wait`` seconds at most: an unreachable store
    (the very fault being reported, maybe) delays this rank's exit by no more."""
    where = os.environ.get("COLLCOMM_STORE", "")
    local = os.environ.get("LOCAL_WORLD_SIZE", "")
    world = os.environ.get("WORLD_SIZE", "")
    if not where or not (local.isdigit() and world.isdigit()) or int(world) <= int(local):
        return

    def send() -> None:
        from ..rendezvous.tcp_client import TCPStore

        try:
            host, _, port = where.rpartition(":")
            store = TCPStore(host.strip("[]"), int(port), timeout=wait, token=job_token(os.environ))
            try:
                store.set(FAULT_KEY.format(rank=report["rank"]), json.dumps(report).encode())
            finally:
                store.close()
        except Exception:  # noqa: BLE001 - best effort
            pass

    sender = threading.Thread(target=send, daemon=True, name="collcomm-fault-report")
    sender.start()
    sender.join(wait)


def install_fault_report(rank: int) -> None:
    """Under ``collcomm run``, report an uncaught exception to the launcher (see above)."""
    directory = os.environ.get(REPORT_ENV)
    if not directory or getattr(sys.excepthook, "_collcomm_rank", None) == rank:
        return
    previous = sys.excepthook
    if getattr(previous, "_collcomm_rank", None) is not None:
        previous = previous._collcomm_previous  # type: ignore[attr-defined]

    def hook(etype: type[BaseException], exc: BaseException, tb: Any) -> None:
        try:
            report = fault_report(exc, rank)
            path = os.path.join(directory, f"rank-{rank}.json")
            with open(path + ".tmp", "w") as fh:
                json.dump(report, fh)
            os.replace(path + ".tmp", path)
            _publish_report(report)
        except Exception:  # noqa: BLE001 - reporting must never hide the error itself
            previous(etype, exc, tb)
            return
        if previous is not sys.__excepthook__ or debug_enabled():
            previous(etype, exc, tb)
        else:
            sys.stderr.write("".join(traceback.format_exception_only(etype, exc)))
            sys.stderr.flush()

    hook._collcomm_rank = rank  # type: ignore[attr-defined]
    hook._collcomm_previous = previous  # type: ignore[attr-defined]
    sys.excepthook = hook
