"""The transport contract.

A transport moves byte buffers between the ranks of one job. It knows nothing of
collectives: algorithms are written against this contract only.

* ``isend(buf, dst, tag)`` starts sending the contiguous bytes of ``buf`` to global rank
  ``dst``; ``irecv(buf, src, tag)`` posts a receive into the writable ``buf`` from ``src``
  (or ``ANY_SOURCE``). Both return a :class:`Handle` at once.
* Messages between one (source, destination, tag) are delivered in the order they were
  sent, and matched to receives in the order those were posted.
* Every message carries its call's 64-bit signature (collective, dtype, count, root, op;
  0 = none); a receive expecting another signature fails with
  :class:`~collcomm.errors.SignatureMismatchError` instead of reinterpreting the bytes.
* A message larger than the posted receive buffer fails that receive with
  :class:`~collcomm.errors.MismatchError`; a shorter one completes and the handle's
  :class:`Status` says how many bytes arrived.
* Sends complete without the receiver's help once their bytes are out of the caller's
  buffer (eagerly copied or written to the kernel), so an ``isend``/``irecv`` pair
  completes even if one side only waits later, and two ranks sending large messages to
  each other at once never deadlock.
* Optional, for MPI matching (the engine has them; a caller checks with ``hasattr``):
  ``irecv(buf, src, tag, mask)`` matches every tag equal to ``tag`` on the bits of
  ``mask``; ``probe(src, tag, mask, block=, take=, timeout=)`` returns the first early
  message such a receive would match (``source``, ``tag``, ``nbytes``) without receiving
  it, or takes it out of matching (``take=True``) for ``mrecv(message, buf)``;
  ``cancel(handle)`` withdraws a receive that nothing has matched yet.
* Every wait has a timeout (:class:`~collcomm.errors.CommTimeoutError`); when a peer dies
  every pending and later operation with it fails with
  :class:`~collcomm.errors.PeerLostError` naming it; ``abort(exc)`` fails everything
  pending with ``exc`` and makes later calls raise it.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

ANY_SOURCE = -1
#: The signature of a message saying "its sender abandoned this call" (after it found that
#: another rank is in a different call); its 8-byte body is the sender's own signature. A
#: receive that matches it fails with SignatureMismatchError whatever it expected.
ABORT_SIG = 0xF << 60

#: Buffers the transport accepts: anything exposing contiguous bytes.
Buffer = memoryview


@dataclass(slots=True)
class Status:
    """What a completed operation moved: the peer's global rank, the byte count and the
    message's tag (the one that arrived, for a receive posted with a tag mask; -1 when a
    transport does not say). A plain slotted record, not a frozen dataclass: one is made
    per completed message, and a frozen one costs 3x as much to make (~1.2 µs here)."""

    source: int
    nbytes: int
    tag: int = -1


class Handle(ABC):
    """A pending send or receive."""

    @abstractmethod
    def wait(self, timeout: float | None = None) -> Status:
        """Block until done (or ``timeout`` seconds; ``None`` = the transport default).

        Raises CommTimeoutError, PeerLostError, MismatchError or ClosedError.
        """

    @abstractmethod
    def test(self) -> bool:
        """True if done; raises the operation's error if it failed. Never blocks."""


class Transport(ABC):
    """Point-to-point byte transport between the ranks of one job (global ranks)."""

    rank: int
    size: int
    timeout: float

    @abstractmethod
    def isend(self, buf: Buffer, dst: int, tag: int, sig: int = 0, lend: bool = False) -> Handle:
        """Start sending ``buf`` (contiguous bytes) to ``dst`` with ``tag`` (0 <= tag < 2**64).

        ``sig`` is the 64-bit signature of the call the message belongs to; it travels in
        the message header. ``lend``: the caller leaves ``buf`` untouched until the handle
        is done (a non-blocking send), so the transport may have the peer read it in place."""

    @abstractmethod
    def irecv(self, buf: Buffer, src: int, tag: int, sig: int = 0) -> Handle:
        """Post a receive into writable ``buf`` from ``src`` (or ANY_SOURCE) with ``tag``.

        A matching message whose signature differs from ``sig`` (both non-zero) fails the
        receive with :class:`~collcomm.errors.SignatureMismatchError` (and is consumed)."""

    @abstractmethod
    def abort(self, exc: BaseException) -> None:
        """Fail every pending operation with ``exc``; later calls raise it too."""

    @abstractmethod
    def close(self) -> None:
        """Release connections and shared memory. Idempotent."""
