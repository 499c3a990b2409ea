"""Rendezvous and store under abuse (issue 9, item 4); the long version is tools/abuse.py.

* idle and half-open connections to rank 0's store and transport listener during init
  delay nobody (they used to cost 10 s each, and 200 made init fail);
* the store server serves a client through 400 unauthenticated connections with one
  thread, survives running out of file descriptors, and goes on afterwards;
* listeners are bound to the interface that routes to the master (loopback for a
  one-host job; COLLCOMM_SOCKET_IFNAME overrides);
* an env:// job without COLLCOMM_TOKEN warns once that its token is derivable.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from tests import reliability_work as work

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))

import abuse  # noqa: E402


@pytest.mark.timeout(120)
def test_idle_and_half_open_connections_delay_no_init():
    # 150 idle + 50 half-open connections to the store and to rank 0's listener before
    # ranks 1 and 2 start: each used to cost them 10 s
    r = work.abused_init(3, idle=150, half=50, timeout=90)
    assert r["ok"], r["errors"]
    assert max(r["init"][1:]) < 5.0, r["init"]


@pytest.mark.timeout(60)
def test_store_serves_through_a_flood_with_one_thread():
    r = abuse.store_flood(200, 100, 100)
    assert r["answers_right"] and r["alive_after"], r
    assert r["server_threads"] == 1, r          # no thread per connection
    assert r["client_connect_set_get_add_s"] < 2.0, r


@pytest.mark.timeout(60)
def test_store_survives_running_out_of_descriptors():
    r = abuse.store_out_of_fds(300)
    assert r["accept_failures"] > 0, r          # the limit was really hit
    assert r["alive_after"] and r["served_after"], r


def test_responder_rejects_a_wrong_token():
    from collcomm.errors import AuthError
    from collcomm.rendezvous import TCPStore, TCPStoreServer

    with TCPStoreServer("127.0.0.1", 0, token=b"right") as server:
        with pytest.raises(AuthError):
            TCPStore("127.0.0.1", server.port, token=b"wrong", timeout=3.0)
        ok = TCPStore("127.0.0.1", server.port, token=b"right", timeout=3.0)
        ok.set("a", b"1")
        assert ok.get("a") == b"1"
        ok.close()


def test_listeners_bind_where_the_master_is_reached(monkeypatch):
    from collcomm.rendezvous.netaddr import bind_address_for, interface_address
    from collcomm.transport.tcp import TcpHub, advertised_host

    assert bind_address_for("127.0.0.1") == "127.0.0.1"
    assert bind_address_for("localhost") == "127.0.0.1"
    assert interface_address("lo") == "127.0.0.1"
    assert advertised_host("127.0.0.1") == "127.0.0.1"
    monkeypatch.delenv("COLLCOMM_HOST", raising=False)
    monkeypatch.setenv("COLLCOMM_SOCKET_IFNAME", "lo")
    assert advertised_host("192.0.2.1") == "127.0.0.1"     # the interface wins over routing
    hub = TcpHub(engine=None, token=b"t")  # type: ignore[arg-type]
    try:
        hub.listen(advertised_host("127.0.0.1"))
        assert hub.listener is not None and hub.listener.getsockname()[0] == "127.0.0.1"
    finally:
        hub.close(linger=0)
    monkeypatch.setenv("COLLCOMM_SOCKET_IFNAME", "no-such-if0")
    from collcomm.errors import CollcommError
    with pytest.raises(CollcommError, match="no-such-if0"):
        advertised_host("127.0.0.1")


def test_env_store_of_a_one_host_job_listens_on_loopback():
    from collcomm.rendezvous import TCPStore

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = TCPStore("127.0.0.1", port, is_master=True, token=b"t", timeout=5.0)
    try:
        assert store._server is not None and store._server.host == "127.0.0.1"
    finally:
        store.close()


_INIT = ("import collcomm as d; d.init_process_group(init_method='env://', world_size=1, rank=0); "
         "d.destroy_process_group(); d.init_process_group(init_method='env://', world_size=1, rank=0); "
         "d.destroy_process_group()")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("token", [None, "secret"])
def test_env_job_without_token_warns_once(token):
    from tests.harness import free_port

    env = {k: v for k, v in os.environ.items() if not k.startswith(("COLLCOMM_", "RANK", "WORLD_SIZE"))}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), PYTHONPATH=ROOT)
    if token:
        env["COLLCOMM_TOKEN"] = token
    out = subprocess.run([sys.executable, "-W", "always", "-c", _INIT], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=50)
    assert out.returncode == 0, out.stderr
    warned = out.stderr.count("COLLCOMM_TOKEN is not set")
    assert warned == (0 if token else 1), out.stderr
