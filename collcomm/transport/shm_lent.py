"""Lent bodies: a large non-blocking send read straight out of the sender's buffer
(:class:`LentBodies`, the lending half of :class:`collcomm.transport.shm.ShmChannel`).

A message past the inline limit otherwise crosses in two whole copies: the sender's into a
staging segment (or a private copy) and the receiver's out of it. A non-blocking send
(``isend``, ``batch_isend_irecv``, ``MPI.Isend`` / ``Sendrecv`` / ...: the caller may not
touch its buffer before the wait) *lends* the buffer instead: its LENT record carries the
buffer's address, the receiver reads it by cross-memory attach (``process_vm_readv``)
straight into the posted receive, and the send completes once the receiver has released
it (the ring's ``RELEASED`` word, as for a PRIVATE record). One copy: a 16 MiB exchange
between two ranks took 5.7 ms through the staging segments against about 2 with one
read each (Open MPI, whose default is the same read: 1.7-1.9 ms), measured 2026-11-28.

The receiver never makes the sender wait on it for long, so nothing that works with a
copied send can hang with a lent one (and a loan still out when the channel closes is
withdrawn too, so a late reader never sees a buffer its owner has taken back):

* it reads a LENT record when it takes it off the ring (any wait of the receiver polls),
  into the posted receive, or aside when none is posted yet. Receives deferred to their
  wait (core/p2p.py ``Deferred``) are posted first when the line is free, so an
  ``isend`` waited for before its partner ``irecv`` still reads straight into place;
* a sender that has waited its patience (``lend_patience``: 5 ms, longer for a large
  buffer) for the receiver to come (it may be busy
  elsewhere: computing, or in a collective that waits for this very sender) withdraws
  the loan: it copies the buffer privately and completes, the receiver reads the copy.

Who reads what is settled by one word of the record (``state``), handed over with a
compare-and-swap from both processes (``native.core.swap_word``): the receiver's
LENT_POSTED -> LENT_CLAIMED before it reads the lent buffer, the sender's LENT_POSTED ->
LENT_WITHDRAWN after it wrote the copy's address into the record. Whoever swaps first
wins; a claimed loan is waited for (the read is under way). The sender only tries while
the receiver's ``tail`` has not passed the record (the record's bytes are still the
record). So lending needs the native core on both sides: a rank says in its inbox's
header whether it takes LENT records (shm_ring.TAKES_LENT); a sender lends only to such
a rank, and only with the core itself. ``COLLCOMM_LEND=0`` turns lending off (the
receiving rank then does not offer it; :func:`takes_lent`).

The native core does both halves too (native/_p2p_lend.c, native/_p2p.c): a native receive
reads a LENT record itself (claim, one read, release), and ``P2P.lend`` / ``P2P.loan_wait``
lend from C, below the inline limit too, for the sends whose wait lets the receives take
their messages meanwhile: ``MPI.Sendrecv`` from :data:`LEND_FROM`, the functional
``batch_isend_irecv`` and ``MPI.Isend`` from :data:`LEND_FROM_WORK`, and a plain ``isend``
past the inline limit (api_p2p_work.LentWork, MPI's _LentSend: their wait is C's,
native/_p2p_lent.c, and core/p2p_loans.py's loop past its bounds).
Those loans are the caller's to end (released, or withdrawn by its wait): they never
enter ``lent``, and a withdrawn one's copy goes into ``held`` as any other.

Blocking sends (``collcomm.send``, ``MPI.Send``/``Bsend``/``Rsend``) keep copying: their
buffer is the caller's again when they return, and a lent one would wait for the receiver
(up to its patience) every time. torch's blocking ``dist.send`` waits on the Work of
the backend's ``send``, which lends (as ``isend`` does: torch's contract for both is the
tensor untouched until the Work is done); ``MPI.Ssend`` waits for the receiver anyway.
"""
from __future__ import annotations

import os
import struct
import threading
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import ClosedError
from .shm_ring import HEADER, LENT, READS_YOU, RELEASED, TAKES_LENT, _Ring

if TYPE_CHECKING:
    from .engine import Engine
    from .request import Request

__all__ = ["LENT_BODY", "LEND_FROM", "LEND_FROM_WORK", "LEND_PATIENCE", "LEND_PATIENCE_MAX",
           "LEND_PATIENCE_PER_BYTE", "LentBodies", "lend_patience", "python_loans", "takes_lent"]

#: The body of a LENT record: release id, state word, address of the sender's copy.
LENT_BODY = struct.Struct("<QQQ")
LENT_POSTED, LENT_CLAIMED, LENT_WITHDRAWN = 0, 1, 2
_STATE_AT = HEADER.size + 8        # the state word's offset in the record (8-aligned)
_RECORD = HEADER.size + LENT_BODY.size
assert _RECORD == 64 and _STATE_AT % 8 == 0
#: How long a lent send waits for the receiver to claim it before it withdraws the loan
#: (copies the buffer and completes): LEND_PATIENCE (s) at least, LEND_PATIENCE_PER_BYTE
#: (s) a byte of a larger one (:func:`lend_patience`): about what the withdrawal costs, a
#: copy into fresh memory (32 MiB took 11.5-12.6 ms here, alone), so that a sender never
#: waits more than about twice what the cheaper way would have cost. A fixed 5 ms
#: withdrew loans whose reader was busy reading one as large first: 4 ranks on 2 vCPUs,
#: a 32 MiB ring exchange (batch_isend_irecv + waits, 30 rounds, three jobs each,
#: measured 2026-11-29) took 37.6-44.2 ms (median round; 1-7 of 128 loans withdrawn)
#: against 16.4-18.4 ms with 34 ms or more of patience (none withdrawn); Open MPI 13-20.
#: At most LEND_PATIENCE_MAX: a receiver busy in a collective that waits for this very
#: sender costs the sender that long before it withdraws (a 1 GiB copy: ~0.4 s here).
LEND_PATIENCE = 0.005
LEND_PATIENCE_PER_BYTE = 1e-9
LEND_PATIENCE_MAX = 1.0


def lend_patience(nbytes: int) -> float:
    """The patience (s) of a loan of ``nbytes``: see LEND_PATIENCE."""
    return max(LEND_PATIENCE, min(nbytes * LEND_PATIENCE_PER_BYTE, LEND_PATIENCE_MAX))

#: From this many bytes collcomm.MPI's Sendrecv lends its send from C (native/_p2p_lend.c),
#: below the inline limit too: one read by the receiver instead of two copies through the
#: ring. Measured 2026-11-29 (2-vCPU VM, n = 2, alternating jobs, µs lent / copied):
#: 16 KiB 4.7-7.3 / 5.7-6.0, 32 KiB 5.0-8.3 / 7.4-7.7, 64 KiB 9.0-10.1 / 11.4-12.3,
#: 128 KiB 14.5-15.4 / 22.
LEND_FROM = 64 << 10
#: ... and the functional API's isend / batch_isend_irecv sends from this many bytes
#: (api_p2p_work.LentWork, whose wait lets the deferred receives take their messages
#: meanwhile; a Python work until session 24, now the C Lent's). Measured likewise (batch + waits, µs lent /
#: through the ring): 64 KiB 15.7-15.8 / 12.4-12.7, 128 KiB 20.4-20.5 / 20.5-21.5,
#: 256 KiB 31.4-31.7 / 39.1-39.2, 384 KiB 35.6-36.6 / 58.2, 512 KiB 44.8-45.4 / 82.7-88.1.
#: Since the batch lends in its C call (native/_p2p_batch.c; session 23, two jobs each
#: alternating the ways, median µs): 32 KiB 11.8-15.6 / 9.7-11.9, 64 KiB 14.3-18.1 /
#: 14.5-17.3, 128 KiB 18.2-22.3 / 23.1-26.4, 192 KiB 22.2-26.9 / 29.1-33.8; collcomm.MPI's
#: Isend + Irecv + Waitall: 64 KiB 11.4-13.6 / 12.7-16.6, 128 KiB 17.3-34.6 / 21.1-39.9.
#: Since the work's wait is C's (native/_p2p_lent.c, session 24; one job, five blocks
#: alternating the ways, medians): 32 KiB 11.2 / 7.6, 48 KiB 10.5 / 9.9, 64 KiB 11.1 /
#: 11.7 (another job 13.4 / 14.1), 96 KiB 13.9 / 15.9, 128 KiB 17.8 / 22.0.
LEND_FROM_WORK = 64 << 10


def python_loans(local_ranks: int) -> bool:
    """Does the channels' own (Python) send lend, ``local_ranks`` on this host? Only with a
    CPU each (LentBodies.python_loans)."""
    from .peer_process import cpus

    return local_ranks <= cpus()


def takes_lent() -> bool:
    """Whether this process takes LENT records (says so to its peers): the native core is
    there (the claim is a compare-and-swap) and ``COLLCOMM_LEND`` is not 0. Whatever the
    host's CPUs: with more ranks than CPUs a lender's wait yields its CPU to the reader
    (native/_p2p_lent.c), and the one read beats the ring's two copies, which need the
    same hand-overs piece by piece. Measured 2026-11-29 (the 2-vCPU Intel VM, 4 ranks, jobs
    lending and copying alternating, three pairs, µs): a batch_isend_irecv ring exchange
    256 KiB 107-125 copied against 52-98 lent, 1 MiB 691-917 / 262-384, 4 MiB 1,517-2,289 /
    996-1,269; MPI.Sendrecv 1 MiB 437-642 / 267-412; every rank isending to every other
    1 MiB 2,015-2,175 / 923-1,326; a chain of blocking sends and receives (copied both
    ways: ``send`` lends nothing) the same; 8 ranks, 2 MiB ring 1,587-2,564 / 1,108-1,627.
    (Until then it was off with more ranks than CPUs, measured before the lent wait moved
    to C: a 4 MiB ring exchange at 4 ranks took 5.0 ms lent against 3.8-4.6 copied.)"""
    from .. import native

    return native.core is not None and os.environ.get("COLLCOMM_LEND", "1").strip() != "0"


class _Loan:
    """A lent send: its request, the buffer (kept alive while the peer may read it), the
    record's position in the ring, when it was lent and how long it may wait unclaimed."""

    __slots__ = ("req", "buf", "start", "since", "patience", "claimed")

    def __init__(self, req: "Request", buf: Any, start: int, since: float) -> None:
        self.req, self.buf, self.start, self.since = req, buf, start, since
        self.patience = lend_patience(memoryview(buf).nbytes)
        self.claimed = False       # a withdrawal found it claimed: wait for the release


class LentBodies:
    """Lending large bodies (sender) and reading lent ones (receiver) for one peer's
    channel. ShmChannel sets ``lent`` ({release id: _Loan}) and ``lent_due``."""

    engine: "Engine"
    peer: int
    out: _Ring
    inp: _Ring
    send_lock: threading.Lock
    held: dict[int, np.ndarray]
    next_private: int
    lent: dict[int, _Loan]
    lent_due: float          # when settle_lent next has something to do at the latest
    loans = 0                # LENT records written (diagnostics, tests)
    #: does this channel's own (Python) send lend? core/connect.py: only with a CPU per
    #: local rank (python_loans). The C lenders (P2P.lend, the batch) lend regardless: their
    #: wait yields to the reader in C, where the engine's Python wait loses to the copy with
    #: more ranks than CPUs (the torch backend's batch_isend_irecv ring, 4 ranks on 2
    #: vCPUs, alternating jobs, three pairs, ms lent / copied: 4 MiB 2.8-3.6 / 1.5-2.1,
    #: 1 MiB 1.3-2.2 / 1.3-1.5, 16 MiB 8.3-10.4 / 10.0-11.6; measured 2026-11-29).
    python_loans = True
    withdrawals = 0          # ... of which withdrawn into a copy

    if TYPE_CHECKING:    # (StagedBodies has them)
        def peer_word(self) -> int: ...

        def prune_held(self) -> None: ...

        def _take_private(self, tag: int, nbytes: int, address: int, ident: int, sig: int) -> None: ...

    # -- sender ------------------------------------------------------------------------------
    def lends(self) -> bool:
        """May a large non-blocking send to the peer be lent (see the module docstring)?"""
        from .. import native

        want = READS_YOU | TAKES_LENT
        return native.core is not None and self.peer_word() & want == want

    @staticmethod
    def lent_body(ident: int) -> bytes:
        """The body of a LENT record with release id ``ident`` (taken by the sender with the
        append that writes it: ids reach the ring in order)."""
        return LENT_BODY.pack(ident, LENT_POSTED, 0)

    def lent_out(self, req: "Request", ident: int) -> None:
        """The LENT record of ``req`` (release id ``ident``) is the last one written (caller
        holds ``send_lock``): its request completes when the peer releases it."""
        now = time.monotonic()
        self.loans += 1
        loan = self.lent[ident] = _Loan(req, req.buf, int(self.out.ctl[0]) - _RECORD, now)
        self.lent_due = min(self.lent_due, now + loan.patience)

    def settle_lent(self) -> None:
        """Complete the lent sends the peer has released; withdraw those it has not claimed
        within their patience (:func:`lend_patience`); drop the private copies it has released (called by any
        polling thread, holding no lock, while there are loans or copies). ``send_lock`` is
        only tried (a busy one: the next poll settles): a native receive polls holding
        ``poll_lock``, which comes after ``send_lock`` in the lock order. A lost peer's
        loans fail (its copies stay: close keeps what was never released)."""
        lost = self.engine.lost.get(self.peer)
        if lost is not None and not self.lent:
            return
        released = int(self.out.ctl[RELEASED])
        first = min(min(self.lent, default=released), min(self.held, default=released))
        if lost is None and released <= first and time.monotonic() < self.lent_due:
            return
        if not self.send_lock.acquire(blocking=False):
            return
        done: list[Request] = []
        try:
            if lost is not None:
                failed = [loan.req for loan in self.lent.values()]
                self.lent.clear()
                self.lent_due = float("inf")
            else:
                failed = []
                self._settle_locked(done)
        finally:
            self.send_lock.release()
        for req in done:
            req.complete(self.peer, len(req.buf))
        for req in failed:
            req.fail(lost)   # type: ignore[arg-type]

    def _settle_locked(self, done: list["Request"]) -> None:
        """settle_lent's work, ``send_lock`` held: the requests that completed go to ``done``."""
        released = int(self.out.ctl[RELEASED])
        if self.held:
            self.prune_held()
        now = time.monotonic()
        due = float("inf")
        for ident in sorted(self.lent):
            loan = self.lent[ident]
            if ident < released:
                del self.lent[ident]
                done.append(loan.req)
            elif loan.claimed:
                continue
            elif now - loan.since >= loan.patience:
                if self._withdraw(ident, loan):
                    del self.lent[ident]
                    done.append(loan.req)
            else:
                due = min(due, loan.since + loan.patience)
        self.lent_due = due

    def _withdraw(self, ident: int, loan: _Loan) -> bool:
        """Copy a loan the peer has not claimed and point its record at the copy (caller
        holds ``send_lock``): True if withdrawn (the send is done; the copy is held until
        released, as a PRIVATE one), False if the peer claimed it first (or took the
        record already): then its release is waited for."""
        from .. import native

        if int(self.out.ctl[8]) > loan.start:      # the peer took the record: it is reading
            loan.claimed = True
            return False
        copy = np.empty(len(loan.buf), dtype=np.uint8)
        copy[:] = np.frombuffer(loan.buf, dtype=np.uint8)
        off = loan.start % self.out.ring
        data = self.out.data
        struct.pack_into("<Q", data, off + _STATE_AT + 8, int(copy.ctypes.data))   # before the swap
        if native.core.swap_word(data, off + _STATE_AT, LENT_POSTED, LENT_WITHDRAWN) != LENT_POSTED:
            loan.claimed = True
            return False
        self.held[ident] = copy
        self.withdrawals += 1
        loan.buf = None
        return True

    def drop_lent(self) -> list[Any]:
        """The channel closes (``send_lock`` held): every loan the peer has not claimed is
        withdrawn first (its copy held, then kept by close like any unreleased copy: a late
        reader still gets the message, never a buffer its owner has taken back) and its send
        completes, as do the released ones; a loan being read fails with ClosedError (its
        buffer is returned, for the caller to keep alive for that reader)."""
        released = int(self.out.ctl[RELEASED])
        kept: list[Any] = []
        for ident, loan in sorted(self.lent.items()):
            if ident < released or (not loan.claimed and self._withdraw(ident, loan)):
                loan.req.complete(self.peer, len(loan.req.buf))
                continue
            kept.append(loan.buf)
            loan.req.fail(ClosedError(
                f"rank {self.engine.rank}: transport closed while rank {self.peer} was reading "
                f"the {loan.req.describe()}"))
        self.lent.clear()
        return kept

    # -- receiver ------------------------------------------------------------------------
    def take_lent(self, off: int, tag: int, nbytes: int, address: int, sig: int) -> None:
        """Read the LENT record at ring offset ``off`` (poll_lock held): claim the loan and
        read the lent buffer at ``address``, or, withdrawn, the sender's copy."""
        from .. import native

        data = self.inp.data
        ident = LENT_BODY.unpack_from(data, off + HEADER.size)[0]
        if native.core.swap_word(data, off + _STATE_AT, LENT_POSTED, LENT_CLAIMED) == LENT_WITHDRAWN:
            address = LENT_BODY.unpack_from(data, off + HEADER.size)[2]    # withdrawn: the copy
        # (LENT_CLAIMED already: our own claim, this record taken again after an exception
        # between the claim and the read left it at the tail: the loan is still ours)
        self._take_private(tag, nbytes, address, ident, sig)
