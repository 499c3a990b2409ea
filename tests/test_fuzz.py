"""Fuzzing the wire decoders (issue 9, Proof): no input crashes or hangs them.

* the TCP transport's frame decoder, running for real on its I/O thread (a socketpair
  stands for an authenticated peer): whatever bytes arrive, the connection ends in a
  PeerLostError (or the message is delivered), a posted receive completes or fails, and
  the I/O thread survives;
* the store protocol: ``_try_decode`` on arbitrary bytes (a frame, "need more", or a
  protocol error; encoding round-trips), and a live TCPStoreServer fed arbitrary bytes
  by authenticated and by unauthenticated clients: it stays up and keeps serving.

``COLLCOMM_FUZZ_EXAMPLES`` scales the number of examples (tools/fuzz.py runs it long).
"""
from __future__ import annotations

import math
import os
import socket
import struct
import time

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from collcomm.errors import CollcommError, CommTimeoutError  # noqa: E402

EXAMPLES = int(os.environ.get("COLLCOMM_FUZZ_EXAMPLES", "120"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize="COLLCOMM_FUZZ_EXAMPLES" not in os.environ,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])

# --------------------------------------------------------------------------- TCP frames
from collcomm.transport.tcp_channel import BYE, DATA, FRAME, HEARTBEAT  # noqa: E402

POST_TAG = 0x1234
u64 = st.integers(0, 2**64 - 1)
sizes = st.one_of(st.integers(0, 600), st.sampled_from([2**47 + 1, 2**48 + 1, 2**63, 2**64 - 1]))


@st.composite
def frame(draw):
    kind = draw(st.one_of(st.sampled_from([DATA, DATA, HEARTBEAT, BYE]), st.integers(0, 2**32 - 1)))
    tag = draw(st.one_of(st.just(POST_TAG), u64))
    nbytes = draw(sizes)
    sig = draw(st.one_of(st.just(0), u64))
    body_len = min(nbytes, 600) if draw(st.booleans()) else draw(st.integers(0, 600))
    return FRAME.pack(tag, nbytes, sig, kind) + os.urandom(body_len)


stream = st.one_of(st.binary(max_size=2048),
                   st.lists(frame(), max_size=6).map(b"".join),
                   st.tuples(st.lists(frame(), max_size=4).map(b"".join), st.binary(max_size=64))
                   .map(lambda t: t[0] + t[1]))


@FUZZ
@given(data=stream, post=st.one_of(st.none(), st.integers(0, 700)))
def test_tcp_frame_decoder_never_crashes_or_hangs(data, post):
    from collcomm.transport.engine import Engine
    from collcomm.transport.tcp import TcpHub
    from collcomm.transport.tcp_channel import TcpChannel

    engine = Engine(0, 2, timeout=5.0, job="fuzz")
    hub = TcpHub(engine, b"t")
    a, b = socket.socketpair()
    try:
        ch = TcpChannel(hub, 1, a)
        hub.channels[1] = ch
        engine.add_channel(ch, polled=False)
        req = engine.irecv(memoryview(bytearray(post)), 1, POST_TAG) if post is not None else None
        hub.start()
        b.sendall(data)
        b.shutdown(socket.SHUT_WR)              # then EOF: the peer is gone
        deadline = time.monotonic() + 5.0
        while 1 not in engine.lost and time.monotonic() < deadline:
            time.sleep(0.001)
        assert 1 in engine.lost, "the connection's end was never noticed (hang)"
        assert hub.thread is not None and hub.thread.is_alive(), "the I/O thread died"
        if req is not None:
            try:
                req.wait(2.0)
            except CommTimeoutError:
                raise AssertionError("a posted receive hung") from None
            except CollcommError:
                pass                            # lost peer, overflow, wrong signature: all fine
    finally:
        hub.close(linger=0)
        engine.close()
        b.close()


# --------------------------------------------------------------------------- store protocol
from collcomm.rendezvous import auth  # noqa: E402
from collcomm.rendezvous.protocol import _F64, _encode, _ProtocolError, _try_decode  # noqa: E402

fields = st.lists(st.binary(max_size=40), max_size=6)


@FUZZ
@given(st.binary(max_size=512))
def test_store_decoder_on_arbitrary_bytes(buf):
    try:
        out = _try_decode(bytearray(buf))
    except _ProtocolError:
        return
    if out is not None:
        code, got, used = out
        assert 0 < used <= len(buf) and 0 <= code < 256
        assert _encode(code, got) == bytes(buf[:used])


@FUZZ
@given(st.integers(0, 255), fields)
def test_store_encoding_round_trips_and_prefixes_wait(code, fs):
    wire = _encode(code, fs)
    assert _try_decode(bytearray(wire)) == (code, fs, len(wire))
    for cut in range(len(wire)):
        assert _try_decode(bytearray(wire[:cut])) is None


TOKEN = b"fuzz-token"


@pytest.fixture(scope="module")
def server():
    from collcomm.rendezvous import TCPStore, TCPStoreServer

    srv = TCPStoreServer("127.0.0.1", 0, token=TOKEN, auth_timeout=2.0)
    client = TCPStore("127.0.0.1", srv.port, token=TOKEN, timeout=10.0)
    yield srv, client
    client.close()
    srv.close()


def _alive(srv, client) -> None:
    """The server still serves: a set and a get within a second, thread alive."""
    t0 = time.monotonic()
    value = os.urandom(8)
    client.set("probe", value)
    assert client.get("probe", timeout=2.0) == value
    assert time.monotonic() - t0 < 1.0
    assert srv._thread.is_alive()


timeouts = st.sampled_from([-1.0, 0.0, 0.01, 1e308, math.inf, -math.inf, math.nan]).map(_F64.pack)


@st.composite
def request(draw):
    op = draw(st.one_of(st.integers(1, 8), st.integers(0, 255)))
    fs = draw(fields)
    if op in (2, 3) and draw(st.booleans()):     # get / wait: a timeout field last
        fs = fs + [draw(timeouts)]
    return _encode(op, fs)


requests = st.one_of(st.lists(request(), max_size=5).map(b"".join), st.binary(max_size=300),
                     st.tuples(request(), st.binary(max_size=30)).map(lambda t: t[0] + t[1]))


def _talk(port: int, data: bytes, authenticate: bool) -> None:
    s = socket.create_connection(("127.0.0.1", port), timeout=3.0)
    try:
        if authenticate:
            auth.authenticate(s, TOKEN, initiator=True, timeout=3.0)
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        s.settimeout(3.0)
        while s.recv(65536):                      # the server answers or drops us: never hangs
            pass
    except (ConnectionError, socket.timeout, OSError) as exc:
        if isinstance(exc, socket.timeout):
            raise AssertionError("the server neither answered nor closed (hang)") from None
    finally:
        s.close()


@FUZZ
@given(data=requests)
def test_store_server_survives_authenticated_garbage(server, data):
    srv, client = server
    _talk(srv.port, data, authenticate=True)
    _alive(srv, client)


@FUZZ
@given(data=st.one_of(st.binary(max_size=200),
                      st.binary(max_size=40).map(lambda b: b"CCAUTH1\0" + b)))
def test_store_server_survives_unauthenticated_garbage(server, data):
    srv, client = server
    _talk(srv.port, data, authenticate=False)
    _alive(srv, client)


def test_nan_timeout_is_refused_not_fatal(server):
    srv, client = server
    _talk(srv.port, _encode(2, [b"k", struct.pack("!d", math.nan)]), authenticate=True)
    _alive(srv, client)
