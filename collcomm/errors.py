"""The exception hierarchy.

Every error collcomm raises derives from :class:`CollcommError`. Messages name the
collective, the group, this rank, the peer and what was expected versus what was found.
OS errors are translated at the transport boundary and chained (``raise ... from exc``).
"""
from __future__ import annotations


class CollcommError(RuntimeError):
    """Base class of every collcomm error."""


class InvalidArgumentError(CollcommError, ValueError):
    """Bad input, refused before any traffic (wrong size, root out of range, bad op...).

    ``kind`` says which argument, for front ends that map errors to their own classes
    (MPI's ERR_ROOT, ERR_OP...): "root", "op", "dtype", "count" or "" (anything else)."""

    def __init__(self, message: str = "", kind: str = "") -> None:
        super().__init__(message)
        self.kind = kind


class CommTimeoutError(CollcommError, TimeoutError):
    """A wait ran past its timeout. ``peer`` is the rank waited on, when one is known."""

    def __init__(self, message: str, peer: int | None = None) -> None:
        super().__init__(message)
        self.peer = peer


class PeerLostError(CollcommError, ConnectionError):
    """A peer process died or its connection broke. ``peer`` is its global rank."""

    def __init__(self, message: str, peer: int | None = None) -> None:
        super().__init__(message)
        self.peer = peer


class MismatchError(CollcommError):
    """Ranks disagree (message larger than the posted buffer, different collectives...)."""


class SignatureMismatchError(MismatchError):
    """A message whose sender's call signature differs from the receiver's (both are 64-bit
    words, see :mod:`collcomm.algorithms.signature`; the core turns them into words)."""

    def __init__(self, message: str, mine: int = 0, theirs: int = 0, peer: int | None = None,
                 rank: int | None = None, abandoned: bool = False) -> None:
        super().__init__(message)
        self.mine, self.theirs, self.peer, self.rank = mine, theirs, peer, rank
        self.abandoned = abandoned   # the peer gave the call up (it found a mismatch)


class ClosedError(CollcommError):
    """The process group, transport or store was closed or aborted."""


class AuthError(CollcommError, ConnectionError):
    """A connection failed to prove it belongs to this job."""


def with_context(exc: CollcommError, context: str) -> CollcommError:
    """Return a copy of ``exc`` whose message is prefixed by ``context`` (keeps ``peer``)."""
    peer = getattr(exc, "peer", None)
    msg = f"{context}: {exc}"
    if isinstance(exc, (CommTimeoutError, PeerLostError)):
        new: CollcommError = type(exc)(msg, peer=peer)
    else:
        new = type(exc)(msg)
    return new
