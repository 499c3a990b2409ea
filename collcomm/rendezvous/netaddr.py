"""Which address to listen on, and an interface's address (``COLLCOMM_SOCKET_IFNAME``)."""
from __future__ import annotations

import os
import socket
import struct

from ..errors import CollcommError

__all__ = ["bind_address_for", "interface_address"]


def bind_address_for(host: str) -> str:
    """Where a server that clients reach at ``host`` should listen: ``host``'s own address
    when it is one of this machine's (loopback for a one-host job), else
    ``COLLCOMM_SOCKET_IFNAME``'s address when set, else every interface."""
    v6 = ":" in host
    try:
        addr = socket.getaddrinfo(host, None, socket.AF_INET6 if v6 else socket.AF_INET,
                                  socket.SOCK_STREAM)[0][4][0]
        with socket.socket(socket.AF_INET6 if v6 else socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind((addr, 0))                    # fails unless the address is this machine's
        return addr
    except (OSError, IndexError, UnicodeError):
        pass
    ifname = os.environ.get("COLLCOMM_SOCKET_IFNAME", "")
    if ifname and not v6:
        return interface_address(ifname)
    return "::" if v6 else "0.0.0.0"


def interface_address(ifname: str) -> str:
    """The IPv4 address of network interface ``ifname`` (CollcommError if it has none)."""
    import fcntl

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), 0x8915,    # SIOCGIFADDR
                                 struct.pack("256s", ifname.encode()[:15]))
        except OSError as exc:
            raise CollcommError(f"COLLCOMM_SOCKET_IFNAME={ifname!r}: no IPv4 address on that "
                                f"interface ({exc.strerror})") from None
    return socket.inet_ntoa(packed[20:24])
