"""Several hosts on one machine, for real: network namespaces joined by veth links.

``Cluster(hosts=3)`` builds, for one test, a switch namespace holding a bridge and one
namespace per host, each with its own loopback, an ``eth0`` (a veth whose other end is a
bridge port) at ``10.231.0.<i + 1>/24``, and -- for every process started with
:meth:`Cluster.popen` -- its own hostname (``h<i>``) and a private ``/dev/shm`` (a tmpfs
mounted in a private mount namespace by ``unshare``). Ranks on one host therefore share
memory and ranks on different hosts can only talk TCP over the veth links, exactly as
separate machines would; collcomm's host detection (hostname, ``/dev/shm`` device) tells
them apart without ``COLLCOMM_HOST_ID``. Only the 10.231.0.0/24 addresses inside these
namespaces are ever used: nothing outside this machine is contacted.

:meth:`Cluster.cut` takes a host's bridge port down (its packets are dropped; no RST, no
FIN: a pulled cable). Leaving the ``with`` block, on every path, SIGTERMs what was started,
SIGKILLs every process still inside the namespaces (``ip netns pids``) and deletes the
namespaces, which removes their veths.

Needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN), iproute2 (``ip``) and util-linux (``unshare``);
:func:`unavailable` says why not, for ``pytest.skip``. ``.ci/setup-netns.sh`` installs
iproute2 where it is missing.
"""
from __future__ import annotations

import functools
import os
import secrets
import shutil
import signal
import subprocess
import time
from typing import IO, Any

SUBNET = "10.231.0"

# runs inside the host's namespaces: own /dev/shm and hostname, then the command; after it
# exits, says how many collcomm segments it left in that /dev/shm
_WRAP = ('mount -t tmpfs -o size=1g tmpfs /dev/shm && hostname "$1" && shift || exit 97; '
         '"$@"; rc=$?; '
         'echo "netns: /dev/shm collcomm files left: $(ls /dev/shm | grep -c "^collcomm-")" >&2; '
         'exit $rc')


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20,
                          check=check)


@functools.lru_cache(maxsize=1)
def unavailable() -> str | None:
    """None if namespaces can be built here, else the reason they cannot."""
    if os.geteuid() != 0:
        return "needs root (CAP_NET_ADMIN) to create network namespaces"
    for tool in ("ip", "unshare"):
        if shutil.which(tool) is None:
            return f"'{tool}' not found (iproute2 / util-linux; see .ci/setup-netns.sh)"
    name = f"ccprobe{secrets.token_hex(3)}"
    try:
        res = _ip("netns", "add", name, check=False)
        if res.returncode != 0:
            return f"cannot create a network namespace: {res.stderr.strip()}"
        res = subprocess.run(["ip", "netns", "exec", name, "unshare", "--mount", "--uts",
                              "--propagation", "private", "sh", "-c",
                              "mount -t tmpfs tmpfs /dev/shm && hostname probe"],
                             capture_output=True, text=True, timeout=20)
        if res.returncode != 0:
            return f"cannot give a namespace its own /dev/shm and hostname: {res.stderr.strip()}"
        res = _ip("link", "add", f"{name}a", "type", "veth", "peer", "name", f"{name}b",
                  check=False)
        if res.returncode != 0:
            return f"cannot create veth links: {res.stderr.strip()}"
        _ip("link", "del", f"{name}a", check=False)
    finally:
        _ip("netns", "del", name, check=False)
    return None


class Cluster:
    """``hosts`` namespaces on one bridge; see the module docstring."""

    def __init__(self, hosts: int) -> None:
        self.hosts = hosts
        self.tag = f"cc{secrets.token_hex(2)}"
        self.switch = f"{self.tag}-sw"
        self.names = [f"{self.tag}-h{i}" for i in range(hosts)]
        self.procs: list[subprocess.Popen[bytes]] = []
        self._files: list[IO[Any]] = []

    def addr(self, host: int) -> str:
        return f"{SUBNET}.{host + 1}"

    # ------------------------------------------------------------------ build / tear down

    def __enter__(self) -> Cluster:
        try:
            _ip("netns", "add", self.switch)
            _ip("-n", self.switch, "link", "set", "lo", "up")
            _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.switch, "link", "set", "br0", "up")
            for i, ns in enumerate(self.names):
                host_end, port = f"{self.tag}h{i}", f"{self.tag}p{i}"
                _ip("netns", "add", ns)
                _ip("-n", ns, "link", "set", "lo", "up")
                _ip("link", "add", host_end, "type", "veth", "peer", "name", port)
                _ip("link", "set", host_end, "netns", ns)
                _ip("link", "set", port, "netns", self.switch)
                _ip("-n", ns, "link", "set", host_end, "name", "eth0")
                _ip("-n", ns, "addr", "add", f"{self.addr(i)}/24", "dev", "eth0")
                _ip("-n", ns, "link", "set", "eth0", "up")
                _ip("-n", self.switch, "link", "set", port, "master", "br0")
                _ip("-n", self.switch, "link", "set", port, "up")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def pids(self) -> list[int]:
        """Every process inside the host namespaces."""
        out: list[int] = []
        for ns in self.names:
            res = _ip("netns", "pids", ns, check=False)
            out.extend(int(p) for p in res.stdout.split())
        return out

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 10
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for _ in range(3):
            left = self.pids()
            if not left:
                break
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.2)
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
        for f in self._files:
            f.close()
        for ns in [*self.names, self.switch]:
            _ip("netns", "del", ns, check=False)

    # ------------------------------------------------------------------ use

    def popen(self, host: int, argv: list[str], env: dict[str, str], stdout: str,
              stderr: str) -> subprocess.Popen[bytes]:
        """Start ``argv`` on ``host`` (its own session), output to the files named."""
        out, err = open(stdout, "wb"), open(stderr, "wb")
        self._files += [out, err]
        cmd = ["ip", "netns", "exec", self.names[host], "unshare", "--mount", "--uts",
               "--propagation", "private", "sh", "-c", _WRAP, "sh", f"h{host}", *argv]
        p = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                             start_new_session=True)
        self.procs.append(p)
        return p

    def cut(self, host: int) -> None:
        """Pull ``host``'s cable: its bridge port goes down, packets to and from it are lost."""
        _ip("-n", self.switch, "link", "set", f"{self.tag}p{host}", "down")


def namespaces() -> list[str]:
    """Every network namespace name on this machine."""
    res = _ip("netns", "list", check=False)
    return [line.split()[0] for line in res.stdout.splitlines() if line.strip()]
