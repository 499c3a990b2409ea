"""The store's wire protocol (no pickle), both directions: ``!BI`` (op or status, field
count), then per field ``!I`` length + bytes. Timeouts travel as an 8-byte ``!d`` field."""
from __future__ import annotations

import socket
import struct
from collections.abc import Iterable

from . import auth

# --------------------------------------------------------------------------- wire format

_HEADER = struct.Struct("!BI")
_LEN = struct.Struct("!I")
_F64 = struct.Struct("!d")
_MAX_FIELDS = 1 << 16
_MAX_FIELD_BYTES = 1 << 30

_SET, _GET, _WAIT, _ADD, _CAS, _DELETE, _CHECK, _NUM_KEYS = range(1, 9)
_OP_NAMES = {_SET: "set", _GET: "get", _WAIT: "wait", _ADD: "add", _CAS: "compare_set",
             _DELETE: "delete_key", _CHECK: "check", _NUM_KEYS: "num_keys"}
_OK, _TIMEOUT, _ERROR = 0, 1, 2


class _ProtocolError(Exception):
    pass


def _encode(code: int, fields: Iterable[bytes]) -> bytes:
    fields = list(fields)
    parts = [_HEADER.pack(code, len(fields))]
    for f in fields:
        parts.append(_LEN.pack(len(f)))
        parts.append(f)
    return b"".join(parts)


def _try_decode(buf: bytearray) -> tuple[int, list[bytes], int] | None:
    """Parse one frame from the front of ``buf``: (code, fields, bytes used), or None."""
    if len(buf) < _HEADER.size:
        return None
    code, nfields = _HEADER.unpack_from(buf, 0)
    if nfields > _MAX_FIELDS:
        raise _ProtocolError(f"frame declares {nfields} fields")
    pos = _HEADER.size
    fields = []
    for _ in range(nfields):
        if len(buf) < pos + _LEN.size:
            return None
        (n,) = _LEN.unpack_from(buf, pos)
        if n > _MAX_FIELD_BYTES:
            raise _ProtocolError(f"frame declares a {n}-byte field")
        pos += _LEN.size
        if len(buf) < pos + n:
            return None
        fields.append(bytes(buf[pos:pos + n]))
        pos += n
    return code, fields, pos


def _read_frame(sock: socket.socket) -> tuple[int, list[bytes]]:
    code, nfields = _HEADER.unpack(auth.recv_exact(sock, _HEADER.size))
    fields = []
    for _ in range(nfields):
        (n,) = _LEN.unpack(auth.recv_exact(sock, _LEN.size))
        fields.append(auth.recv_exact(sock, n))
    return code, fields
