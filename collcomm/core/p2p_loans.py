"""Waiting for a send lent from C (native/_p2p_lend.c ``P2P.lend``): the one loop behind the
front ends' lent sends (the functional API's ``LentWork``, collcomm.MPI's ``Isend``).

A loan is over once the receiver has read the buffer (released) or, unclaimed past the
patience (transport/shm_lent.py ``lend_patience``), withdrawn into a copy. The wait spins
in C a little at a time (``P2P.loan_wait`` bounded, the GIL released) and, between,
lets this rank's receives take what has come: the first deferred receive in the engine's
line (its ``test()``: never waiting; with one deferred it goes first, before any step), or,
none deferred, the engine's poll (which reads loans aside), so two ranks that both wait for
their sends first read each other's loans at once. Every CHECK_S it checks the engine, the peer and the timeout as a native
receive's wait does, and its error (or Ctrl-C) ends the loan before it leaves (withdrawn,
or, being read, the buffer kept for its reader); an explicit ``timeout`` raises
CommTimeoutError with the loan still out (the wait may be retried).
"""
from __future__ import annotations

import time
from typing import Any

from ..errors import CollcommError, CommTimeoutError
from ..transport import shm_lent
from .group import ProcessGroup
from .timeouts import current_timeout

#: the wait's steps in C (ns) between the receives' tries, the first FIRST_STEP_NS, each
#: next twice as long up to STEP_NS; its checks' period (s)
FIRST_STEP_NS, STEP_NS, CHECK_S = 2_000, 20_000, 0.1


def patience_ns(nbytes: int) -> int:
    """The patience (ns) of a lent send of ``nbytes``, as transport/shm_lent.py has it now."""
    return int(shm_lent.lend_patience(nbytes) * 1e9)


def loan_over(f: Any, g: ProcessGroup, local: int, loan: tuple[int, int, int], buf: Any,
              nbytes: int, block: bool, timeout: float | None = None, first_step: bool = True) -> bool:
    """Is the loan ``loan`` (P2P.lend's ``(ident, start, since)``) of ``buf`` (``nbytes``) to
    local rank ``local`` over? ``block``: wait until it is (True), else one bounded try (which still
    withdraws it past the patience). ``first_step`` False: the caller spun for it already
    (native/_p2p_lent.c): the receives go first."""
    ident, start, since = loan
    patience = patience_ns(nbytes)
    if not block:
        return bool(f.loan_wait(local, ident, start, buf, since, 1, patience))
    step, eng = FIRST_STEP_NS, g.transport
    try:
        if first_step and not eng._deferred:   # (a receive deferred goes first: the peer
                                                # may be waiting for this rank to read it)
            if f.loan_wait(local, ident, start, buf, since, step, patience):
                return True       # (over within the first step: no set-up for the loop)
            step = min(STEP_NS, 2 * step)
        t0, progress = time.monotonic(), True
        next_check, peer = t0 + CHECK_S, g.ranks[local]
        while True:
            if progress:          # the receives take what came: the first deferred one, or
                try:              # (none deferred) the engine's poll, which reads loans aside
                    try:
                        first = eng._deferred[0]
                    except IndexError:        # (none; or another thread took the last one)
                        first = None
                    if first is not None:
                        first.test()
                    else:
                        eng.progress()
                except CollcommError:         # (the receive's own wait raises it)
                    progress = False
            now = time.monotonic()
            if timeout is not None and now - t0 > timeout:
                break
            if now >= next_check:  # as a native receive's wait: closed, the peer lost, the timeout
                next_check = now + CHECK_S
                eng.native_check(peer, nbytes, 0, now - t0, current_timeout(g.timeout))
            if f.loan_wait(local, ident, start, buf, since, step, patience):
                return True
            step = min(STEP_NS, 2 * step)
    except BaseException:         # (the check's error, Ctrl-C): the loan ends first
        keep_unwaited(f, local, loan, buf)
        raise
    raise CommTimeoutError(f"rank {g.rank}: the send of {nbytes} bytes to global rank {peer} "
                           f"was not read within {timeout:g} s", peer=peer)   # (still lent)


def keep_unwaited(f: Any, local: int, loan: tuple[int, int, int], buf: Any) -> None:
    """A lent send dropped unwaited (its work's finalizer): the loan ends now (withdrawn
    into a copy), or, being read (or send_lock busy), ``buf`` stays alive for its reader
    (transport/shm_end.py ``_kept``), never freed under it."""
    ident, start, since = loan
    try:
        over = f.loan_wait(local, ident, start, buf, since, 1, 0)
    except Exception:  # noqa: BLE001 - (the group gone: keep it)
        over = False
    if not over:
        from ..transport.shm_end import _kept
        _kept.append(buf)


class LentFields:
    """The fields of a lent send's work or request (the functional API's ``LentWork``,
    collcomm.MPI's ``_LentSend``) where the native core is not built (never lent then:
    the stand-in keeps the classes whole). native/_p2p_lent.c's ``Lent`` holds them in C
    and does the common case of ``wait`` there, calling the class's ``_wait(timeout,
    spun)`` (this loop) for the rest."""

    __slots__ = ("_f", "_group", "_peer", "_local", "_loan", "_buf", "_rec", "_status", "_exc",
                 "_nbytes")

    def wait(self, timeout: float | None = None) -> bool:
        return self._wait(timeout)  # type: ignore[attr-defined,no-any-return]

    def __del__(self) -> None:
        if getattr(self, "_status", None) is None and getattr(self, "_buf", None) is not None:
            keep_unwaited(self._f, self._local, self._loan, self._buf)


def lent_base() -> Any:
    """The base of a lent send's work: the C type where the native core is built, else
    the stand-in."""
    from .. import native as nat
    return getattr(nat.core, "Lent", None) or LentFields
