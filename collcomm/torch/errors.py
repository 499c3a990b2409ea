"""collcomm's errors as torch.distributed users catch them.

torch reports communication failures as :class:`torch.distributed.DistBackendError` (a
``RuntimeError``). Every error the collcomm backend raises out of a collective, a
point-to-point call or ``Work.wait`` is one of the classes below: each is *both* a
``DistBackendError`` and the collcomm error it translates (so ``except
collcomm.CommTimeoutError`` and ``except TimeoutError`` keep working), and carries
collcomm's message unchanged (it names the call, the group, this rank and the peer).

Bad arguments stay :class:`~collcomm.errors.InvalidArgumentError` (a ``ValueError`` and a
``RuntimeError``), raised before any traffic, as torch raises ``ValueError`` for them.
"""
from __future__ import annotations

from torch.distributed import DistBackendError

from ..errors import (
    AuthError, ClosedError, CollcommError, CommTimeoutError, InvalidArgumentError, MismatchError,
    PeerLostError,
)

__all__ = ["BackendError", "BackendTimeoutError", "BackendPeerLostError", "BackendMismatchError",
           "BackendClosedError", "BackendAuthError", "translate"]


class BackendError(DistBackendError, CollcommError):
    """A collcomm failure inside the torch backend (any not covered below)."""


class BackendTimeoutError(DistBackendError, CommTimeoutError):
    """A collective, a point-to-point call or ``Work.wait(timeout)`` ran past its timeout."""


class BackendPeerLostError(DistBackendError, PeerLostError):
    """A member of the group died or its connection broke (``.peer`` is its rank)."""


class BackendMismatchError(DistBackendError, MismatchError):
    """The ranks disagree (different collectives, sizes or dtypes in the same call)."""


class BackendClosedError(DistBackendError, ClosedError):
    """The group or its transport was shut down."""


class BackendAuthError(DistBackendError, AuthError):
    """A connection failed to prove it belongs to this job."""


_MAP: list[tuple[type, type]] = [
    (CommTimeoutError, BackendTimeoutError), (PeerLostError, BackendPeerLostError),
    (MismatchError, BackendMismatchError), (ClosedError, BackendClosedError),
    (AuthError, BackendAuthError),
]


def translate(exc: BaseException) -> BaseException:
    """The exception a torch user should see for ``exc`` (``exc`` itself if already fine)."""
    if isinstance(exc, (DistBackendError, InvalidArgumentError)) or not isinstance(exc, CollcommError):
        return exc
    for src, dst in _MAP:
        if isinstance(exc, src):
            break
    else:
        dst = BackendError
    if dst in (BackendTimeoutError, BackendPeerLostError):
        new = dst(str(exc), peer=getattr(exc, "peer", None))
    else:
        new = dst(str(exc))
    new.__cause__ = exc
    return new
