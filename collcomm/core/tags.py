"""The tag space of a process group's messages (64 bits).

``ctx`` (28 bits, :func:`make_ctx`: the same on every rank that agrees on the group) |
kind (1 bit: 0 collective, 1 point-to-point) | the call's sequence number or the user's
tag (35 bits). No two live groups share a ``ctx``, so their messages never mix, and a
group's point-to-point traffic never meets its collectives'.

collcomm.MPI's point to point uses the low 31 bits of the user tag for its tags proper
(``MPI_TAG_BITS``, MPI's ``TAG_UB``) and three flags above them: ``SYNC`` (the message of
a synchronous send: its receiver acknowledges it when a receive takes it, core/p2p.py),
``ACK`` (that acknowledgement) and ``BODY`` (the second part of a large object).
"""
from __future__ import annotations

import hashlib
import struct

__all__ = ["ACK", "BODY", "CTX_SHIFT", "KIND_P2P", "MAX_USER_TAG", "MPI_TAG_BITS", "SEQ_BITS", "SYNC",
           "make_ctx"]


SEQ_BITS = 35
KIND_P2P = 1 << SEQ_BITS
CTX_SHIFT = SEQ_BITS + 1
MAX_USER_TAG = (1 << SEQ_BITS) - 1
MPI_TAG_BITS = (1 << 31) - 1
SYNC, ACK, BODY = 1 << 31, 1 << 32, 1 << 33


def make_ctx(*parts: object) -> int:
    """A 28-bit context id derived from ``parts`` (the same on every rank that agrees on them)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return (struct.unpack("<Q", digest)[0] & ((1 << 28) - 1)) or 1
