"""Which rank made a job fail: the launcher's verdict from what its ranks did and said.

Inputs, per rank of this node (:class:`RankState`): how and when it exited, whether the
launcher itself had signalled it, whether it was stopped (``/proc/<pid>/stat`` state ``T``)
and the fault report it left (``rank-<r>.json``, written by
:func:`collcomm.core.bootstrap.install_fault_report` when the rank died of an exception).

The rules, in order (:func:`root_cause`):

Ranks of other nodes (``local=False``) are known only by the reports their ranks put in
the job's store; they are followed when a local rank names them, never counted as failures
of this node.

1. A *genuine* failure is a death by signal or a non-zero exit that the launcher did not
   cause and that is not a *reaction* (a report of a collcomm error about another rank:
   PeerLostError, CommTimeoutError, ClosedError, MismatchError). The earliest genuine
   failure is the root cause, unless a rank was stopped before it. A rank ended by
   SIGTERM that left no report is not counted beside one that left a report: the rank
   that raised ended it (``MPI.Abort``, and collcomm.MPI's hook on an uncaught exception,
   send SIGTERM to the ranks of their host before exiting).
2. Else a rank that was stopped (SIGSTOP) when the job failed is the root cause.
3. Else, when ranks disagree (a MismatchError was reported), the one rank whose failing
   call differs from the call every other reporting rank failed in (a mismatch names both
   sides alike: "rank 1 called barrier but rank 0 called all_reduce").
4. Else the ranks the reactions name: each reaction votes for the rank its error names,
   following a named rank's own reaction when it has one (so "rank 3 timed out waiting for
   2, rank 0 for 3" votes for 2); in a cycle (mismatches name each other) the direct name
   counts. The most-named rank is the root cause: one that exited 0 "left", one still
   running never made the call (stuck, or skipped it), one not on this node is named as
   such.

Polling order never matters: every decision uses the recorded times and reports.
"""
from __future__ import annotations

import collections
import re
import signal
from dataclasses import dataclass, field
from typing import Any

__all__ = ["RankState", "Verdict", "root_cause", "settled", "describe_exit"]


@dataclass
class RankState:
    rank: int
    pid: int
    returncode: int | None = None      # None: still running when the verdict is made
    exit_t: float | None = None        # time.monotonic() of the exit
    signalled: bool = False            # the launcher signalled it before it exited
    stopped_since: float | None = None  # time.monotonic() it was first seen stopped
    report: dict[str, Any] | None = None
    local: bool = True                 # False: a rank of another node, known by its report only

    @property
    def failed(self) -> bool:
        return self.returncode not in (None, 0)

    @property
    def reaction(self) -> bool:
        return bool(self.report and self.report.get("reaction"))

    @property
    def event_t(self) -> float:
        """When it failed: its report's time if it left one, else its exit time."""
        times = [t for t in (self.exit_t, (self.report or {}).get("t")) if t is not None]
        return min(times) if times else float("inf")


@dataclass
class Verdict:
    rank: int                 # the root-cause rank (global rank)
    local: bool               # it runs on this node
    how: str                  # what happened to it, for "rank R (pid P) failed first: <how>"
    code: int                 # the launcher's exit code
    kind: str                 # genuine | stopped | named
    named_by: dict[int, list[int]] = field(default_factory=dict)  # voter ranks per named rank


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"killed by signal {name}"
    return f"exit code {returncode}"


def exit_code(returncode: int) -> int:
    """The shell's convention: 128 + N for a death by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r) for r in sorted(ranks))


def _resolve(start: int, direct: int, by_rank: dict[int, RankState]) -> int:
    """Follow ``direct`` through the reactions of the ranks it names; a cycle keeps ``direct``."""
    seen = {start}
    current = direct
    while True:
        if current in seen:
            return direct
        state = by_rank.get(current)
        peers = (state.report or {}).get("peers") or [] if state is not None else []
        if state is None or not state.reaction or len(peers) != 1:
            return current
        seen.add(current)
        current = int(peers[0])


_CALL = re.compile(r"^(\w+) on group '([^']*)'")


def _odd_call_out(states: list[RankState]) -> tuple[int, str, str, list[int]] | None:
    """When ranks disagree (a MismatchError was reported): the one rank whose failing call
    differs from the call all the others failed in, as (rank, its call, theirs, their ranks).
    A mismatch names both sides alike; the call each side was in tells them apart."""
    reports = {s.rank: s.report for s in states if s.report}
    if not any(r.get("type") == "MismatchError" for r in reports.values()):
        return None
    calls: dict[int, str] = {}
    for rank, report in reports.items():
        m = _CALL.match(str(report.get("message", "")))
        if m:
            calls[rank] = f"{m.group(1)} (group '{m.group(2)}')"
    counts = collections.Counter(calls.values())
    if len(calls) < 3 or len(counts) != 2:
        return None
    (majority, n_major), (minority, n_minor) = counts.most_common()
    if n_minor != 1 or n_major < 2:
        return None
    rank = next(r for r, c in calls.items() if c == minority)
    return rank, minority, majority, sorted(r for r, c in calls.items() if c == majority)


def settled(states: list[RankState]) -> bool:
    """After a failure: is waiting for the ranks still running pointless? True when each is
    stopped, or is where a strict majority of the reactions so far lead (it is the cause the
    others gave up on, not a survivor about to report). A rank named by one survivor while
    another survivor names someone else may itself be waiting: not settled yet."""
    by_rank = {s.rank: s for s in states}
    running = [s for s in states if s.local and s.returncode is None]
    targets: collections.Counter[int] = collections.Counter()
    reactions = 0
    for s in states:
        peers = (s.report or {}).get("peers") or []
        if s.local and s.returncode is not None and s.reaction and peers:
            reactions += 1
            targets[_resolve(s.rank, int(peers[0]), by_rank)] += 1
    return all(s.stopped_since is not None or 2 * targets[s.rank] > reactions > 0
               for s in running)


def root_cause(states: list[RankState]) -> Verdict | None:
    """The verdict for a job in which some rank failed; None if no rank failed."""
    by_rank = {s.rank: s for s in states}
    states = [s for s in states if s.local]
    if not any(s.failed for s in states):
        return None
    first_failed = min((s for s in states if s.failed and not s.signalled),
                       key=lambda s: s.event_t, default=None) or \
        min((s for s in states if s.failed), key=lambda s: s.event_t)
    fallback_code = exit_code(first_failed.returncode or 1)

    genuine = [s for s in states if s.failed and not s.signalled and not s.reaction]
    raised = [s for s in states if s.report and not s.reaction]
    if raised:
        # a rank ended by SIGTERM, silent, beside one that raised (its report written, even
        # if it is still exiting, or the launcher ended it after): the one that raised ended
        # it (MPI.Abort and collcomm.MPI's uncaught-exception hook end this host's ranks so)
        genuine = [s for s in genuine if s.report or s.returncode != -signal.SIGTERM]
        genuine += [s for s in raised if s not in genuine]
    stopped = [s for s in states if s.stopped_since is not None]
    g = min(genuine, key=lambda s: s.event_t, default=None)
    st = min(stopped, key=lambda s: s.stopped_since or 0.0, default=None)

    odd = _odd_call_out(states)
    votes: collections.Counter[int] = collections.Counter()
    named_by: dict[int, list[int]] = collections.defaultdict(list)
    first_named: dict[int, float] = {}
    for s in sorted(states, key=lambda s: s.event_t):
        if not s.reaction or not s.report:
            continue
        for peer in s.report.get("peers") or []:
            target = _resolve(s.rank, int(peer), by_rank)
            votes[target] += 1
            named_by[target].append(s.rank)
            first_named.setdefault(target, s.event_t)

    if g is not None and (st is None or g.event_t <= (st.stopped_since or 0.0)):
        rc = g.returncode or 1
        if g.report and rc == -signal.SIGTERM:   # it raised, then a peer's abort ended it while
            rc = 1                                # it exited: its own exit, 1 (MPI.Abort's hook)
        how = describe_exit(rc)
        if g.report:
            how += f" ({g.report.get('type', 'an exception')})"
        return Verdict(g.rank, True, how, exit_code(rc), "genuine", dict(named_by))
    if st is not None:
        how = "stopped (state T, e.g. SIGSTOP): it could not take part in the collectives"
        voters = [r for r in named_by.get(st.rank, [])]
        if voters:
            how += f"; {_ranks(voters)} gave up waiting for it"
        return Verdict(st.rank, True, how, fallback_code, "stopped", dict(named_by))
    if odd is not None:
        rank, call, majority, others = odd
        how = (f"it was in {call} while {_ranks(others)} were in {majority} (MismatchError: "
               "a skipped, extra or reordered collective call)")
        return Verdict(rank, True, how, fallback_code, "named", dict(named_by))
    if votes:
        top = max(votes, key=lambda r: (votes[r], -first_named[r]))
        voters = named_by[top]
        s = by_rank.get(top)
        mismatch = any((by_rank[v].report or {}).get("type") == "MismatchError"
                       for v in voters if v in by_rank)
        if s is None or not s.local:
            report = s.report if s is not None else None
            if report and not report.get("reaction"):
                how = f"on another node, it raised {report.get('type', 'an error')}"
            else:
                how = (f"on another node; the errors of {_ranks(voters)} here (and of the "
                       "ranks they name) lead back to it")
            return Verdict(top, False, how, fallback_code, "named", dict(named_by))
        if mismatch:
            how = (f"its collective calls differ from those of {_ranks(voters)} "
                   "(MismatchError: a skipped, extra or reordered call)")
            if s.returncode is not None and not s.signalled:
                how += f"; {describe_exit(s.returncode)}"
        elif s.returncode == 0:
            how = (f"left (exit code 0) while {_ranks(voters)} still needed it "
                   "(it made fewer collective calls than they did)")
        elif s.returncode is None or s.signalled:
            how = (f"never made the call {_ranks(voters)} waited in "
                   "(stuck in its own code, or it skipped or reordered a collective)")
            if s.signalled and s.returncode is not None:
                how += "; stopped by the launcher afterwards"
        else:
            how = (f"{describe_exit(s.returncode)} ({(s.report or {}).get('type', 'error')}); "
                   f"named by {_ranks(voters)}")
        return Verdict(top, True, how, fallback_code, "named", dict(named_by))
    how = describe_exit(first_failed.returncode or 1)
    if first_failed.report:
        how += f" ({first_failed.report.get('type', 'an exception')})"
    return Verdict(first_failed.rank, True, how, fallback_code, "genuine", dict(named_by))
