"""Building a rank's transport once the ranks have met, and sharing rank 0's cost model.

:func:`connect_transport` exchanges every rank's connection info through the (prefixed)
store and builds this rank's channels: shared memory to the ranks of its host (as far as
``/dev/shm`` has room), TCP to the others (``COLLCOMM_TRANSPORT`` forces one kind).
:func:`share_cost_model` makes every rank use rank 0's cost model. Both serve a normal join
(:mod:`.bootstrap`) and an attach to another framework's ranks (:mod:`.attach`).
"""
from __future__ import annotations

import json
import os
import threading
import time
from typing import TYPE_CHECKING, Any

from ..errors import InvalidArgumentError
from ..transport.engine import Engine
from ..transport.peer_process import can_read, probe_address
from ..transport.shm import ShmChannel
from ..transport.shm_lent import python_loans, takes_lent
from ..transport.shm_ring import make_inbox
from ..transport.shm_segments import ShmSpaceError, open_segment, space_text, warn_once
from ..transport.tcp import TcpHub, advertised_host
from .identity import host_id
from .joinwatch import JoinWatch, store_barrier
from .tags import SYNC

if TYPE_CHECKING:
    from .bootstrap import Job


def share_cost_model(kv: Any, rank: int, timeout: float, watch: JoinWatch | None = None) -> None:
    """Every rank uses rank 0's cost model, so every rank picks the same algorithms."""
    from ..algorithms import cost

    if rank == 0:
        kv.set("cost_model", cost.active().to_json().encode())
    raw = watch.get("cost_model", timeout) if watch is not None else kv.get("cost_model", timeout=timeout)
    cost.set_active(cost.CostModel.from_json(raw.decode()))


def connect_transport(job: Job, kv: Any, token: bytes, jid: str, timeout: float,
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
    engine.prompt_bits = SYNC   # a synchronous send's message is matched on arrival (p2p_sync.py)
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
        lends = takes_lent()      # (said to every shm peer: it may lend us large isends)
        own_loans = python_loans(len(shm_peers) + 1)
        for r in shm_peers:
            assert inbox is not None
            peer_inbox = open_segment(f"collcomm-{jid}-inbox-{r}")
            channel = ShmChannel(engine, r, int(infos[r]["pid"]), jid, inbox, peer_inbox,
                                 my_slot=local.index(rank), peer_slot=local.index(r),
                                 peer_ring=rings[r])
            channel.python_loans = own_loans
            engine.add_channel(channel, polled=True)
            # may large messages from r come through its private memory? (read below, by r,
            # after the "connected" barrier)
            inbox.set_can_read(local.index(r), can_read(int(infos[r]["pid"]), int(infos[r].get("probe", 0))),
                               takes_lent=lends)
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
