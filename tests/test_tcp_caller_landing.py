"""A caller waiting for a TCP receive runs the hub's selector itself (TcpHub.drive).

In-process and deterministic, like test_lock_discipline: rank 0's Engine with TCP channels
over socket pairs whose other ends the test plays. Checks behaviour only (what completes,
what fails and how), never speed: the speed is in docs/tcp-small-messages.md.
"""
from __future__ import annotations

import socket
import threading
import time
from typing import Any, Callable

import pytest

from collcomm.errors import ClosedError, CommTimeoutError, PeerLostError
from collcomm.transport.base import ANY_SOURCE
from collcomm.transport.engine import Engine
from collcomm.transport.tcp import TcpHub
from collcomm.transport.tcp_channel import BYE, DATA, FRAME, HEARTBEAT, TcpChannel

pytestmark = pytest.mark.timeout(60)

HANG = 10.0


def within(seconds: float, fn: Callable[[], Any]) -> Any:
    """``fn()`` on a daemon thread: its result, or its exception re-raised; fails if hung."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            box["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"hung for {seconds} s"
    if "error" in box:
        raise box["error"]
    return box.get("value")


def engine_with(peers: int = 1) -> tuple[Engine, TcpHub, list[socket.socket]]:
    engine = Engine(0, peers + 1, timeout=30.0, job="landing")
    hub = TcpHub(engine, b"token")
    theirs = []
    for p in range(1, peers + 1):
        a, b = socket.socketpair()
        ch = TcpChannel(hub, p, a)
        hub.channels[p] = ch
        engine.add_channel(ch, polled=False)
        theirs.append(b)
    hub.start()
    return engine, hub, theirs


def frame(tag: int, body: bytes) -> bytes:
    return FRAME.pack(tag, len(body), 0, DATA) + body


def read_frames(sock: socket.socket, until: Callable[[list[tuple[int, int, bytes]]], bool],
                seconds: float = HANG) -> list[tuple[int, int, bytes]]:
    """Frames (kind, tag, body) read from ``sock`` until ``until(frames)``."""
    sock.settimeout(seconds)
    frames: list[tuple[int, int, bytes]] = []
    data = b""
    deadline = time.monotonic() + seconds
    while not until(frames):
        assert time.monotonic() < deadline, f"frames so far: {[(k, t, len(b)) for k, t, b in frames]}"
        chunk = sock.recv(1 << 20)
        assert chunk, "connection closed"
        data += chunk
        while len(data) >= FRAME.size:
            tag, nbytes, _, kind = FRAME.unpack(data[:FRAME.size])
            if len(data) < FRAME.size + nbytes:
                break
            frames.append((kind, tag, data[FRAME.size:FRAME.size + nbytes]))
            data = data[FRAME.size + nbytes:]
    return frames


def test_waiting_receive_completes_when_the_message_lands() -> None:
    """The waiter drives the selector: the message sent after it started waiting lands
    in its buffer and the wait returns its status."""
    engine, hub, (peer,) = engine_with()
    buf = bytearray(5)
    req = engine.irecv(memoryview(buf), 1, 3)
    t = threading.Timer(0.2, lambda: peer.sendall(frame(3, b"hello")))
    t.start()
    status = within(HANG, req.wait)
    assert (status.source, status.nbytes, bytes(buf)) == (1, 5, b"hello")
    within(HANG, engine.close)
    peer.close()


def test_two_threads_waiting_both_complete() -> None:
    """One waiter drives the selector, the other waits on its event: the driver lands
    both messages (in either order) and both waits return."""
    engine, hub, peers = engine_with(peers=2)
    bufs = [bytearray(3), bytearray(3)]
    reqs = [engine.irecv(memoryview(bufs[i]), i + 1, 7) for i in range(2)]
    results: list[Any] = [None, None]

    def waiter(i: int) -> None:
        results[i] = reqs[i].wait()

    threads = [threading.Thread(target=waiter, args=(i,), daemon=True) for i in range(2)]
    for th in threads:
        th.start()
    time.sleep(0.1)
    peers[1].sendall(frame(7, b"two"))
    time.sleep(0.05)
    peers[0].sendall(frame(7, b"one"))
    for th in threads:
        th.join(HANG)
        assert not th.is_alive()
    assert [bytes(b) for b in bufs] == [b"one", b"two"]
    assert [r.source for r in results] == [1, 2]
    within(HANG, engine.close)
    for p in peers:
        p.close()


def test_driving_waiter_flushes_a_queued_send() -> None:
    """A send too large for the socket buffer waits in the queue; the caller then waits
    for the reply (driving the selector): the rest of the send goes out meanwhile, the
    peer reads it and replies, and both complete."""
    engine, hub, (peer,) = engine_with()
    big = bytes(range(256)) * (16 << 10)           # 4 MiB: more than a socket pair holds
    send = engine.isend(memoryview(big), 1, 1)
    reply = bytearray(2)
    recv = engine.irecv(memoryview(reply), 1, 2)

    def play_peer() -> None:
        got = read_frames(peer, lambda fs: any(k == DATA for k, _, _ in fs), 30)
        assert [b for k, _, b in got if k == DATA] == [big]
        peer.sendall(frame(2, b"ok"))

    player = threading.Thread(target=play_peer, daemon=True)
    player.start()
    assert within(HANG * 3, recv.wait).nbytes == 2
    within(HANG, send.wait)
    player.join(HANG)
    assert bytes(reply) == b"ok"
    within(HANG, engine.close)
    peer.close()


def test_driving_waiter_sends_heartbeats_and_times_out_as_before() -> None:
    """A receive that never comes: while its caller drives the selector the peer still
    gets heartbeats, and the wait ends with the usual CommTimeoutError."""
    engine, hub, (peer,) = engine_with()
    req = engine.irecv(memoryview(bytearray(4)), 1, 9)
    beats: list[Any] = []
    reader = threading.Thread(
        target=lambda: beats.extend(read_frames(peer, lambda fs: any(k == HEARTBEAT for k, _, _ in fs))),
        daemon=True)
    reader.start()
    with pytest.raises(CommTimeoutError) as info:
        within(HANG, lambda: req.wait(timeout=2.5))
    assert "rank 0 timed out after 2.5 s waiting for the recv of 4 bytes from rank 1" in str(info.value)
    assert info.value.peer == 1
    reader.join(HANG)
    assert any(k == HEARTBEAT for k, _, _ in beats)
    within(HANG, engine.close)
    peer.close()


def test_peer_leaves_while_a_caller_drives() -> None:
    """BYE then EOF read by the driving caller: the receive fails with PeerLostError
    saying the peer left; an ANY_SOURCE receive of another rank is unaffected."""
    engine, hub, peers = engine_with(peers=2)
    req = engine.irecv(memoryview(bytearray(4)), 1, 9)
    other = engine.irecv(memoryview(bytearray(4)), ANY_SOURCE, 9)

    def leave() -> None:
        peers[0].sendall(FRAME.pack(0, 0, 0, BYE))
        peers[0].close()

    threading.Timer(0.2, leave).start()
    with pytest.raises(PeerLostError) as info:
        within(HANG, req.wait)
    assert info.value.peer == 1 and "rank 1 left the job" in str(info.value)
    peers[1].sendall(frame(9, b"live"))
    assert within(HANG, other.wait).source == 2
    within(HANG, engine.close)
    peers[1].close()


def test_close_from_another_thread_ends_a_driven_wait() -> None:
    """The transport closes while a caller drives the selector: close returns and the
    wait ends with ClosedError."""
    engine, hub, (peer,) = engine_with()
    req = engine.irecv(memoryview(bytearray(4)), 1, 9)
    box: list[BaseException] = []

    def waiter() -> None:
        try:
            req.wait()
        except BaseException as exc:  # noqa: BLE001
            box.append(exc)

    th = threading.Thread(target=waiter, daemon=True)
    th.start()
    time.sleep(0.2)
    within(HANG, engine.close)
    th.join(HANG)
    assert not th.is_alive()
    assert len(box) == 1 and isinstance(box[0], ClosedError), box
    peer.close()


def test_self_send_completes_a_receive_another_thread_waits_for() -> None:
    """An ANY_SOURCE receive waited on (its caller driving the selector) is matched by a
    send to self from another thread, which never goes through the selector: it completes."""
    engine, hub, (peer,) = engine_with()
    buf = bytearray(4)
    req = engine.irecv(memoryview(buf), ANY_SOURCE, 4)
    threading.Timer(0.2, lambda: engine.isend(memoryview(b"self"), 0, 4)).start()
    status = within(HANG, req.wait)
    assert (status.source, bytes(buf)) == (0, b"self")
    within(HANG, engine.close)
    peer.close()
