"""What the channels report to the engine (:class:`EngineArrivals`, a base class of
:class:`~.engine.Engine`): a whole message (:meth:`~EngineArrivals.arrived`), one whose
body is still being read (:meth:`~EngineArrivals.arriving`, then
:meth:`~EngineArrivals.landed`), a peer lost (:meth:`~EngineArrivals.peer_lost`), and
the matching and delivery they share: a message meets the first posted receive of its
source and tag (or the receive's mask), else waits in the unexpected list; a message of
another call (its signature) or too large for the receive fails that receive. The lock
order is in engine.py's module docstring.
"""
from __future__ import annotations

import threading
from typing import Any

from ..errors import MismatchError, SignatureMismatchError
from .base import ABORT_SIG, ANY_SOURCE
from .request import Incoming, Payload, Request, _Bytes

__all__ = ["EngineArrivals"]


class EngineArrivals:
    """The arriving half of the :class:`~.engine.Engine` (its base class: every attribute
    below is the engine's, set in ``Engine.__init__``)."""

    rank: int
    lost: dict[int, BaseException]
    crashed: set[int]
    health: bytearray
    prompt_bits: int
    _prompt: bool
    _lock: threading.Lock
    _posted: list[Request]
    _unexpected: list[Incoming]
    _inflight: dict[int, Any]
    _news: threading.Event

    # -- channels report here -----------------------------------------------------------
    def arrived(self, source: int, tag: int, nbytes: int, payload: Payload, sig: int = 0) -> None:
        """A whole message from ``source`` is available in ``payload``."""
        with self._lock:
            req = self._match(source, tag)
            if req is None:
                self._unexpected.append(Incoming(source, tag, nbytes, payload.detach(), sig))
        if req is None:
            if tag & self.prompt_bits:
                self._prompt = True
            self._news.set()
            return
        self._deliver(req, source, nbytes, payload, sig)

    def arriving(self, source: int, tag: int, nbytes: int, sig: int = 0) -> tuple[memoryview, Any]:
        """A message's header has arrived; return where to read its body and a token for
        :meth:`landed`. The body goes straight into a posted buffer when one matches."""
        with self._lock:
            req = self._match(source, tag)
            if req is not None and (sig == ABORT_SIG or (req.sig and sig and req.sig != sig)):
                body = bytearray(nbytes)        # read aside, then fail the receive
                view, token = memoryview(body), (req, "signature", sig, body)
            elif req is not None and nbytes <= len(req.buf):
                view, token = req.buf[:nbytes], req
            elif req is not None:  # too large: read it aside, then fail the receive
                view, token = memoryview(bytearray(nbytes)), (req, "overflow", sig, b"")
            else:
                token = Incoming(source, tag, nbytes, None, sig)
                if tag & self.prompt_bits:
                    self._prompt = True
                self._unexpected.append(token)
                body = bytearray(nbytes)
                token.payload = _Bytes(body)
                view = memoryview(body)
                self._news.set()
            self._inflight[source] = token   # peer_lost fails its receive if the body never lands
            return view, token

    def landed(self, source: int, nbytes: int, token: Any) -> None:
        """The body announced by :meth:`arriving` is complete."""
        waiter: Request | None = None
        with self._lock:
            self._inflight.pop(source, None)
            if isinstance(token, Incoming):
                token.ready = True
                waiter = token.waiter
        if isinstance(token, Request):
            token.complete(source, nbytes)
        elif isinstance(token, tuple):
            req, why, sig, body = token
            req.fail_matched(source, self._wrong_signature(req, source, sig, body) if why == "signature"
                             else self._overflow(req, nbytes))
        elif waiter is not None:
            self._deliver(waiter, source, nbytes, token.payload, token.sig)

    def peer_lost(self, peer: int, exc: BaseException, crashed: bool = True) -> None:
        """``peer`` is gone: fail what is pending with it, refuse what comes later.

        ``crashed``: it died or broke off without leaving cleanly, which also dooms the
        collectives of its groups that wait on other ranks (see ``wait``'s ``watch``).
        Called with no lock held (channels record a failure under their own lock and
        report it after releasing it); the requests are failed after ``_lock`` is released.
        """
        with self._lock:
            if peer in self.lost:
                return
            self.lost[peer] = exc
            self.health[0] = 1
            if crashed:
                self.crashed.add(peer)
            doomed = [r for r in self._posted if r.peer == peer]
            self._posted = [r for r in self._posted if r.peer != peer]
            self._unexpected = [i for i in self._unexpected if i.ready or i.source != peer]
            token = self._inflight.pop(peer, None)   # a receive whose body was still arriving
            if isinstance(token, Request):
                doomed.append(token)
            elif isinstance(token, tuple):
                doomed.append(token[0])
            elif token is not None and token.waiter is not None:
                doomed.append(token.waiter)
        for req in doomed:
            req.fail(exc)

    # -- matching and delivery ---------------------------------------------------------------
    def _match(self, source: int, tag: int) -> Request | None:
        for i, req in enumerate(self._posted):
            if ((req.tag == tag or not (req.tag ^ tag) & req.mask)
                    and (req.peer == source or req.peer == ANY_SOURCE)):
                del self._posted[i]
                req.tag = tag      # the tag that arrived (differs from the posted one under a mask)
                return req
        return None

    def _overflow(self, req: Request, nbytes: int) -> MismatchError:
        return MismatchError(f"rank {self.rank}: message of {nbytes} bytes from rank {req.peer} is "
                             f"larger than the posted receive buffer ({len(req.buf)} bytes, tag {req.tag:#x})")

    def _wrong_signature(self, req: Request, source: int, sig: int,
                         body: bytes | bytearray = b"") -> SignatureMismatchError:
        """The error of a receive that matched a message of another call (or an ABORT)."""
        abandoned = sig == ABORT_SIG
        if abandoned:
            sig = int.from_bytes(bytes(body[:8]), "little") if len(body) >= 8 else 0
        return SignatureMismatchError(
            f"rank {self.rank}: the message from rank {source} (signature {sig:#018x}) belongs to "
            f"another call than the receive posted for it (signature {req.sig:#018x})"
            + (" (it abandoned the call)" if abandoned else ""),
            mine=req.sig, theirs=sig, peer=source, rank=self.rank, abandoned=abandoned)

    def _deliver(self, req: Request, source: int, nbytes: int, payload: Any, sig: int = 0) -> None:
        try:
            if sig == ABORT_SIG or (req.sig and sig and req.sig != sig):
                body = bytearray(min(nbytes, 8))
                if body:
                    scratch = bytearray(nbytes)
                    payload.copy_into(memoryview(scratch))
                    body = scratch[:8]
                req.fail_matched(source, self._wrong_signature(req, source, sig, body))
                return
            if nbytes > len(req.buf):
                req.fail_matched(source, self._overflow(req, nbytes))
                return
            payload.copy_into(req.buf[:nbytes])
        finally:
            payload.release()
        req.complete(source, nbytes)
