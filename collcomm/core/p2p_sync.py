"""Synchronous sends' acknowledgements (collcomm.MPI's ``Ssend``, ``Issend``, ``ssend``).

A synchronous send completes only once a receive has taken its message: the sender posts
a receive for an ``ACK`` after its message (user tag flag ``SYNC``, core/tags.py), and
the receiver sends the ack when a receive takes the message. *When* matters: MPI lets a
program post ``Irecv`` and then block in another call (a ``Recv`` of a later message from
the same sender, a ``Wait`` on something else) while the sender sits in ``Ssend``; acked
only at the receive's own completion (its ``Wait``), both ranks would wait for each other.
So the ack is owed by the receive request's ``matched`` hook (transport/request.py), run
by whichever thread lands the message (the caller, a waiter polling the channel, a native
receive's poll, TCP's I/O thread) the moment the message completes the posted receive,
and written by the engine without waiting (``Engine.owe_ack``: into the peer's ring if
it has room, else by a later progress; queued for TCP's I/O thread).

A receive that takes the message but cannot hold it (``ERR_TRUNCATE``) acks it too
(``Request.fail_matched``): the send completes, the receive raises, as in MPI.

Which receives ack: those posted with a tag mask that leaves the ``SYNC`` bit out (every
collcomm.MPI receive; a functional-API receive compares every bit, so a message with that
bit set is simply its tag there), and the receive of a matched probe (``Mrecv``). A
message taken by the native receive path never carries ``SYNC`` (native/_p2p.c leaves
such messages to the engine), so there is no second place that acks.
"""
from __future__ import annotations

from typing import Any, Callable

from .tags import ACK, MAX_USER_TAG, MPI_TAG_BITS, SYNC

__all__ = ["ack_sync", "acker"]


def ack_sync(req: Any) -> None:
    """The ``matched`` hook: owe ``req``'s sender an acknowledgement if its message is a
    synchronous send's (in the same group's tag space)."""
    tag = req.tag
    if tag & SYNC:
        req.engine.owe_ack(req.status.source, (tag & ~MAX_USER_TAG) | ACK | (tag & MPI_TAG_BITS))


def acker(mask: int) -> Callable[[Any], None] | None:
    """The hook of a receive posted with user tag mask ``mask`` (None: it does not ack)."""
    return None if mask & SYNC else ack_sync
