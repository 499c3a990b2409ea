"""The rendezvous stores: TCPStore (+ server, auth), FileStore, PrefixStore, store_from_url."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from collcomm.errors import AuthError, ClosedError, CollcommError, CommTimeoutError
from collcomm.rendezvous import (FileStore, PrefixStore, Store, TCPStore, TCPStoreServer,
                            store_from_url)

from tests.harness import free_port

TOKEN = b"test-token"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def server():
    srv = TCPStoreServer("127.0.0.1", 0, token=TOKEN)
    yield srv
    srv.close()


def client(srv: TCPStoreServer, timeout: float = 5.0, token: bytes = TOKEN) -> TCPStore:
    return TCPStore("127.0.0.1", srv.port, timeout=timeout, token=token)


def check_semantics(a: Store, b: Store) -> None:
    """The Store contract, exercised through two handles on one store."""
    a.set("k", b"v1")
    assert b.get("k") == b"v1"
    a.set("s", "text")
    assert b.get("s") == b"text"
    assert b.add("n", 5) == 5 and a.add("n", -2) == 3 and b.get("n") == b"3"
    # compare_set, torch semantics
    assert a.compare_set("c", b"", b"x") == b"x"
    assert a.compare_set("c", b"wrong", b"y") == b"x"
    assert b.compare_set("c", b"x", b"y") == b"y"
    assert a.compare_set("missing", b"e", b"d") == b"e" and not a.check(["missing"])
    assert a.check(["k", "n", "c"]) and not a.check(["k", "nope"])
    b.wait(["k", "n"], timeout=1)
    assert a.num_keys() == 4
    assert b.delete_key("k") and not b.delete_key("k") and not a.check(["k"])
    assert a.num_keys() == 3
    t0 = time.monotonic()
    with pytest.raises(CommTimeoutError, match="nope"):
        a.get("nope", timeout=0.3)
    with pytest.raises(CommTimeoutError, match="nope2"):
        a.wait(["n", "nope2"], timeout=0.2)
    assert time.monotonic() - t0 < 3
    # a blocking get is answered when another handle sets the key later
    threading.Timer(0.2, lambda: b.set("late", b"L")).start()
    assert a.get("late", timeout=5) == b"L"
    a.set_timeout(0.2)
    assert a.timeout == 0.2
    with pytest.raises(CommTimeoutError):
        a.get("never")


@pytest.mark.timeout(30)
def test_tcp_store_semantics(server):
    with client(server) as a, client(server) as b:
        check_semantics(a, b)


@pytest.mark.timeout(30)
def test_tcp_master_hosts_server_and_client_may_start_first():
    port_holder: list[int] = []
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    result: list[bytes] = []

    def early_client() -> None:
        with TCPStore("127.0.0.1", port, timeout=10, token=TOKEN) as c:
            result.append(c.get("hello", timeout=10))

    t = threading.Thread(target=early_client)
    t.start()
    time.sleep(0.3)  # the client is retrying its connection meanwhile
    with TCPStore("127.0.0.1", port, world_size=2, is_master=True, timeout=10,
                  token=TOKEN) as master:
        port_holder.append(master.port)
        master.set("hello", b"world")
        t.join(10)
    assert result == [b"world"] and port_holder == [port]


@pytest.mark.timeout(30)
def test_wait_for_workers():
    master = TCPStore("127.0.0.1", 0, world_size=1, is_master=True, timeout=5,
                      token=TOKEN, wait_for_workers=True)
    master.close()
    done = []

    def start_master(port: int) -> None:
        with TCPStore("127.0.0.1", port, world_size=2, is_master=True, timeout=10,
                      token=TOKEN, wait_for_workers=True):
            done.append(time.monotonic())

    srv_port = free_port()
    t = threading.Thread(target=start_master, args=(srv_port,))
    t.start()
    time.sleep(0.5)
    assert not done  # still waiting for the second worker
    joined = time.monotonic()
    with TCPStore("127.0.0.1", srv_port, world_size=2, timeout=10, token=TOKEN):
        t.join(10)
    assert done and done[0] >= joined


@pytest.mark.timeout(30)
def test_connect_timeout_when_no_server():
    t0 = time.monotonic()
    with pytest.raises(CommTimeoutError, match="could not connect"):
        TCPStore("127.0.0.1", free_port(), timeout=0.5, token=TOKEN)
    assert time.monotonic() - t0 < 5


@pytest.mark.timeout(60)
def test_many_concurrent_adders_threads_and_processes(server):
    n_threads, n_procs, per = 8, 2, 50
    script = (
        "import sys; from collcomm.rendezvous import TCPStore\n"
        f"s = TCPStore('127.0.0.1', int(sys.argv[1]), timeout=20, token={TOKEN!r})\n"
        f"for _ in range({per}): s.add('total', 1)\n"
        "s.close()\n")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    procs = [subprocess.Popen([sys.executable, "-c", script, str(server.port)], env=env)
             for _ in range(n_procs)]
    try:
        def work() -> None:
            with client(server, timeout=20) as c:
                for _ in range(per):
                    c.add("total", 1)
        threads = [threading.Thread(target=work) for _ in range(n_threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        for p in procs:
            assert p.wait(timeout=30) == 0
        with client(server) as c:
            assert c.get("total") == str((n_threads + n_procs) * per).encode()
    finally:
        for p in procs:
            p.kill()
            p.wait()


@pytest.mark.timeout(30)
def test_shared_client_is_thread_safe(server):
    with client(server, timeout=20) as c:
        threads = [threading.Thread(target=lambda: [c.add("x", 1) for _ in range(100)])
                   for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
        assert c.add("x", 0) == 400


@pytest.mark.timeout(30)
def test_wrong_token_refused_and_server_keeps_serving(server):
    good = client(server)
    good.set("a", b"1")
    with pytest.raises(AuthError):
        client(server, token=b"wrong")
    assert good.get("a") == b"1"
    assert client(server).get("a") == b"1"
    good.close()


@pytest.mark.timeout(30)
def test_garbage_client_dropped(server):
    with client(server) as good:
        raw = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        try:
            raw.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + os.urandom(200))
            assert raw.recv(100) == b""  # dropped without an answer
        except ConnectionResetError:
            pass
        finally:
            raw.close()
        good.set("still", b"here")
        assert good.get("still") == b"here"


@pytest.mark.timeout(30)
def test_server_closed_gives_error_not_hang():
    srv = TCPStoreServer("127.0.0.1", 0, token=TOKEN)
    c = client(srv, timeout=30)
    threading.Timer(0.3, srv.close).start()
    t0 = time.monotonic()
    with pytest.raises(ClosedError, match=f"127.0.0.1:{srv.port}"):
        c.get("never", timeout=30)
    assert time.monotonic() - t0 < 5
    with pytest.raises(ClosedError):
        c.set("x", b"y")
    c.close()
    with pytest.raises(ClosedError):
        c.get("x")


@pytest.mark.timeout(30)
def test_file_store_semantics(tmp_path):
    path = str(tmp_path / "store")
    with FileStore(path) as a, FileStore(path) as b:
        check_semantics(a, b)


_FILE_WORKER = """
import sys
from collcomm.rendezvous import FileStore
path, rank = sys.argv[1], int(sys.argv[2])
s = FileStore(path, world_size=3, timeout=20)
for _ in range(50):
    s.add("total", 1)
s.set(f"done{rank}", str(rank))
s.wait(["done0", "done1"])
print(s.get("total").decode(), s.get(f"done{1 - rank}").decode())
s.close()
"""


@pytest.mark.timeout(60)
def test_file_store_across_processes_and_cleanup(tmp_path):
    path = str(tmp_path / "store")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    procs = [subprocess.Popen([sys.executable, "-c", _FILE_WORKER, path, str(r)], env=env,
                              stdout=subprocess.PIPE, text=True) for r in range(2)]
    try:
        outs = [p.communicate(timeout=30)[0].split() for p in procs]
        assert [p.returncode for p in procs] == [0, 0]
        assert outs[0] == ["100", "1"] and outs[1] == ["100", "0"]
        # the third of world_size=3 participants closing removes the file
        assert os.path.exists(path)
        FileStore(path, world_size=3).close()
        assert not os.path.exists(path)
    finally:
        for p in procs:
            p.kill()
            p.wait()


@pytest.mark.timeout(30)
def test_file_store_cleanup_and_closed(tmp_path):
    s = FileStore(str(tmp_path / "f"))
    s.set("a", b"1")
    s.cleanup()
    assert not os.path.exists(s.path)
    s.close()
    with pytest.raises(ClosedError):
        s.get("a")


@pytest.mark.timeout(30)
def test_file_store_never_recreates_a_removed_file(tmp_path):
    # a rank's background thread polling the store after the last rank removed the file
    # must not leave it behind (CI once found /tmp/collcomm-rdzv-<job> after a clean job)
    path = str(tmp_path / "f")
    a, b = FileStore(path, world_size=2), FileStore(path, world_size=2)
    poller = FileStore(path, timeout=1.0, create=False)
    a.set("k", b"1")
    a.close()
    b.close()  # the last of world_size instances: the file goes
    assert not os.path.exists(path)
    with pytest.raises(ClosedError, match="removed"):
        poller.get("k", timeout=0.2)
    with pytest.raises(ClosedError, match="removed"):
        FileStore(path, create=False)
    assert not os.path.exists(path)


@pytest.mark.timeout(30)
def test_prefix_store(server):
    with client(server) as base:
        a, b = PrefixStore("a", base), PrefixStore("b", base)
        a.set("k", b"A")
        b.set("k", b"B")
        assert a.get("k") == b"A" and b.get("k") == b"B" and base.get("a/k") == b"A"
        assert a.add("n", 2) == 2 and not b.check(["n"])
        assert a.compare_set("k", b"A", b"A2") == b"A2"
        a.wait(["k", "n"], timeout=1)
        assert a.delete_key("k") and base.check(["b/k"])
        nested = PrefixStore("x", a)
        nested.set("y", b"1")
        assert base.get("a/x/y") == b"1"
        with pytest.raises(CommTimeoutError, match="a/missing"):
            a.get("missing", timeout=0.2)


@pytest.mark.timeout(30)
def test_store_from_url_tcp():
    port = free_port()
    stores: list[Store] = []

    def rank1() -> None:
        stores.append(store_from_url(f"tcp://127.0.0.1:{port}", 1, 2, 10, TOKEN))

    t = threading.Thread(target=rank1)
    t.start()
    s0 = store_from_url(f"tcp://127.0.0.1:{port}", 0, 2, 10, TOKEN)
    t.join(10)
    try:
        s0.set("x", b"1")
        assert stores[0].get("x") == b"1"
    finally:
        stores[0].close()
        s0.close()


@pytest.mark.timeout(30)
def test_store_from_url_file(tmp_path):
    path = tmp_path / "fs"
    s0 = store_from_url(f"file://{path}", 0, 2, 10, TOKEN)
    s1 = store_from_url(f"file://{path}", 1, 2, 10, TOKEN)
    s0.set("x", b"1")
    assert s1.get("x") == b"1"
    s0.close()
    s1.close()
    assert not path.exists()


@pytest.mark.timeout(30)
def test_store_from_url_env(server, monkeypatch):
    # launcher-hosted server: every rank, rank 0 included, is a plain client
    monkeypatch.setenv("COLLCOMM_STORE", f"127.0.0.1:{server.port}")
    with store_from_url("env://", 0, 2, 5, TOKEN) as s0, \
            store_from_url("env://", 1, 2, 5, TOKEN) as s1:
        s0.set("y", b"2")
        assert s1.get("y") == b"2"
    # MASTER_ADDR/MASTER_PORT: rank 0 hosts
    monkeypatch.delenv("COLLCOMM_STORE")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    with store_from_url("env://", 0, 1, 5, TOKEN) as s:
        s.set("z", b"3")
        assert s.get("z") == b"3"
    monkeypatch.delenv("MASTER_PORT")
    with pytest.raises(CollcommError, match="MASTER_PORT"):
        store_from_url("env://", 0, 1, 5, TOKEN)


# --------------------------------------------------------------------------- auth

def _handshake(token_a: bytes, token_b: bytes) -> tuple[BaseException | None, BaseException | None]:
    from collcomm.rendezvous.auth import authenticate
    a, b = socket.socketpair()
    a.settimeout(7.0)
    errors: list[BaseException | None] = [None, None]

    def side(i: int, sock: socket.socket, token: bytes) -> None:
        try:
            authenticate(sock, token, initiator=(i == 0), timeout=2)
        except BaseException as exc:  # noqa: BLE001 - recorded for the assertions
            errors[i] = exc
            sock.close()

    t = threading.Thread(target=side, args=(1, b, token_b))
    t.start()
    side(0, a, token_a)
    t.join(5)
    if errors[0] is None:
        assert a.gettimeout() == 7.0  # restored
    a.close()
    b.close()
    return errors[0], errors[1]


@pytest.mark.timeout(30)
def test_authenticate_mutual():
    assert _handshake(b"same", b"same") == (None, None)
    ea, eb = _handshake(b"one", b"two")
    assert isinstance(ea, AuthError) and isinstance(eb, AuthError)


@pytest.mark.timeout(30)
def test_authenticate_timeout_and_garbage():
    from collcomm.rendezvous.auth import authenticate
    a, b = socket.socketpair()
    try:
        t0 = time.monotonic()
        with pytest.raises(AuthError, match="timed out"):
            authenticate(a, TOKEN, initiator=False, timeout=0.3)  # silent peer
        assert time.monotonic() - t0 < 2
        b.sendall(b"x" * 64)
        with pytest.raises(AuthError, match="protocol"):
            authenticate(a, TOKEN, initiator=False, timeout=1)
    finally:
        a.close()
        b.close()


def test_job_token_and_job_id():
    from collcomm.rendezvous.auth import job_id, job_token
    assert job_token({"COLLCOMM_TOKEN": "abcd"}) == b"\xab\xcd"
    assert job_token({"COLLCOMM_TOKEN": "not hex!"}) == b"not hex!"
    slurm1 = {"SLURM_JOB_ID": "12", "SLURM_STEP_ID": "0"}
    slurm2 = {"SLURM_JOB_ID": "13", "SLURM_STEP_ID": "0"}
    assert job_token(slurm1) == job_token(dict(slurm1)) != job_token(slurm2)
    assert job_id({"COLLCOMM_JOB_ID": "myjob"}) == "myjob"
    assert len(job_id(slurm1)) == 12 and job_id(slurm1) != job_id(slurm2)
    assert job_id({"TORCHELASTIC_RUN_ID": "x"}) == job_id({"TORCHELASTIC_RUN_ID": "x"})
