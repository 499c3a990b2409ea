"""Proving job membership on every TCP connection, and the framing helpers around it.

Every TCP connection collcomm opens (rendezvous store, TCP transport) starts with a mutual
HMAC-SHA256 challenge-response before anything else on it is parsed:

1. the initiator sends ``MAGIC + nonce_i`` (16 random bytes);
2. the responder sends ``MAGIC + nonce_r``;
3. the initiator sends ``HMAC(token, b"I" + nonce_i + nonce_r)``;
4. the responder checks it (constant-time compare) and, only if it matches, answers
   ``HMAC(token, b"R" + nonce_i + nonce_r)``, which the initiator checks.

The role byte stops a peer from reflecting one side's proof back to it; the fresh nonces
stop replays. A responder that refuses just closes the connection, which the initiator
reports as "peer rejected our token". The token itself never crosses the wire.

The token comes from :func:`job_token`; :func:`job_id` names a job's shared-memory segments
(``/dev/shm/collcomm-<job_id>-*``).
"""
from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import socket
import time
from collections.abc import Mapping

from ..errors import AuthError

__all__ = ["authenticate", "job_token", "job_id", "send_all", "recv_exact",
           "ConnectionClosed", "NONCE_BYTES"]

NONCE_BYTES = 16
_MAGIC = b"CCAUTH1\0"
_MAC_BYTES = hashlib.sha256().digest_size

#: Environment variables that identify one launched job, identical on all of its ranks.
_JOB_ID_VARS = (
    "TORCHELASTIC_RUN_ID",                                  # torchrun
    "OMPI_MCA_ess_base_jobid", "OMPI_MCA_orte_ess_jobid",   # Open MPI (mpirun)
    "PMIX_NAMESPACE",                                       # PMIx (Open MPI 5, Slurm)
    "PMI_JOBID", "PMI_KVSNAME",                             # PMI-1/2 (MPICH, Slurm)
    "SLURM_JOB_ID", "SLURM_STEP_ID",                        # srun
    "MASTER_ADDR", "MASTER_PORT",                           # torch-style env:// rendezvous
)


class ConnectionClosed(ConnectionError):
    """The peer closed the connection (EOF) before the expected bytes arrived."""


def send_all(sock: socket.socket, data: bytes | bytearray | memoryview) -> None:
    """Write all of ``data`` to ``sock`` (OS errors propagate unchanged)."""
    sock.sendall(data)


def recv_exact(sock: socket.socket, n: int) -> bytes:
    """Read exactly ``n`` bytes; raise :class:`ConnectionClosed` on EOF (OS errors propagate)."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionClosed(f"connection closed by peer after {got} of {n} bytes")
        got += k
    return bytes(buf)


def _mac(token: bytes, role: bytes, nonce_i: bytes, nonce_r: bytes) -> bytes:
    return hmac.new(token, role + nonce_i + nonce_r, hashlib.sha256).digest()


def authenticate(sock: socket.socket, token: bytes, initiator: bool, timeout: float) -> None:
    """Run the mutual challenge-response on a freshly connected ``sock``.

    ``initiator`` is True on the side that called ``connect``. The whole exchange must end
    within ``timeout`` seconds. Raises :class:`~collcomm.errors.AuthError` on a wrong token,
    a protocol violation, EOF or timeout (OS errors chained). The socket's own timeout is
    restored before returning or raising.
    """
    if not token:
        raise AuthError("empty authentication token")
    saved = sock.gettimeout()
    deadline = time.monotonic() + timeout
    try:
        def recv(n: int) -> bytes:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise socket.timeout("authentication deadline passed")
            sock.settimeout(remaining)
            return recv_exact(sock, n)

        def send(data: bytes) -> None:
            sock.settimeout(max(deadline - time.monotonic(), 0.001))
            send_all(sock, data)

        mine = secrets.token_bytes(NONCE_BYTES)
        if initiator:
            send(_MAGIC + mine)
            theirs = _read_hello(recv)
            nonce_i, nonce_r = mine, theirs
            send(_mac(token, b"I", nonce_i, nonce_r))
            try:
                proof = recv(_MAC_BYTES)
            except ConnectionClosed as exc:
                raise AuthError("peer rejected our token (closed the connection); "
                                "is COLLCOMM_TOKEN the same on every rank?") from exc
            if not hmac.compare_digest(proof, _mac(token, b"R", nonce_i, nonce_r)):
                raise AuthError("peer failed to prove it knows the job token")
        else:
            theirs = _read_hello(recv)
            send(_MAGIC + mine)
            nonce_i, nonce_r = theirs, mine
            proof = recv(_MAC_BYTES)
            if not hmac.compare_digest(proof, _mac(token, b"I", nonce_i, nonce_r)):
                raise AuthError("peer failed to prove it knows the job token")
            send(_mac(token, b"R", nonce_i, nonce_r))
    except AuthError:
        raise
    except socket.timeout as exc:
        raise AuthError(f"authentication timed out after {timeout:g}s") from exc
    except ConnectionClosed as exc:
        raise AuthError(f"connection closed during authentication: {exc}") from exc
    except OSError as exc:
        raise AuthError(f"authentication failed: {exc}") from exc
    finally:
        try:
            sock.settimeout(saved)
        except OSError:
            pass


def _read_hello(recv) -> bytes:  # type: ignore[no-untyped-def]
    hello = recv(len(_MAGIC) + NONCE_BYTES)
    if not hmac.compare_digest(hello[:len(_MAGIC)], _MAGIC):
        raise AuthError("peer does not speak the collcomm authentication protocol")
    return hello[len(_MAGIC):]


def _job_identifiers(env: Mapping[str, str]) -> bytes:
    parts = [f"{name}={env[name]}" for name in _JOB_ID_VARS if env.get(name)]
    return "\n".join(parts).encode()


def job_token(env: Mapping[str, str] = os.environ) -> bytes:
    """The secret every connection of this job proves knowledge of.

    ``COLLCOMM_TOKEN`` if set (an even-length hex string is decoded, anything else is used
    as UTF-8 text); ``collcomm run`` sets a random one per job. Otherwise a token is derived
    from the launcher's job identifiers (``TORCHELASTIC_RUN_ID``, Open MPI's
    ``OMPI_MCA_ess_base_jobid``, ``PMIX_NAMESPACE``, ``PMI_JOBID``, ``SLURM_JOB_ID`` +
    ``SLURM_STEP_ID``, ``MASTER_ADDR``/``MASTER_PORT``). A derived token stops two jobs
    from talking to each other by accident, but it is **not a secret**: anyone who can read
    the job's environment or guess those values can compute it. Set ``COLLCOMM_TOKEN``
    (identically on every node) where that matters.
    """
    raw = env.get("COLLCOMM_TOKEN", "")
    if raw:
        try:
            if len(raw) % 2 == 0:
                return bytes.fromhex(raw)
        except ValueError:
            pass
        return raw.encode("utf-8")
    return hashlib.sha256(b"collcomm-job-token\0" + _job_identifiers(env)).digest()


def job_id(env: Mapping[str, str] = os.environ) -> str:
    """A short name for this job, the same on all of its ranks (12 hex characters).

    ``COLLCOMM_JOB_ID`` if set (``collcomm run`` sets a random one), else derived from the
    same launcher identifiers as :func:`job_token`. Without any identifier it falls back
    to one value per user, so two unlaunched jobs of one user on one host would share it.
    """
    explicit = env.get("COLLCOMM_JOB_ID", "")
    if explicit:
        return explicit
    ids = _job_identifiers(env)
    if not ids:
        ids = f"uid={os.getuid()}".encode()
    return hashlib.sha256(b"collcomm-job-id\0" + ids).hexdigest()[:12]
