"""What ``collcomm run`` says when a job fails: every rank's state (exit, signal, stop,
the fault report it left) and the summary naming the root cause.

Each rank that dies of an uncaught exception leaves a JSON fault report
(:mod:`collcomm.core.faults`) in the job's report folder; ranks of other nodes put theirs
in the store, fetched here for at most ``REMOTE_REPORTS_S``. :func:`rank_states` turns all of
it into :class:`~collcomm.tools.rootcause.RankState` rows for the verdict, and
:func:`summary` writes the lines the user reads: the rank that failed first and how, what
the others raised and whom they named, and one traceback.
"""
from __future__ import annotations

import collections
import json
import os
import threading
from typing import TYPE_CHECKING, Any

from ..core.bootstrap import FAULT_KEY
from ..rendezvous.auth import job_token
from .rank_procs import Rank
from .rootcause import RankState, Verdict, describe_exit

if TYPE_CHECKING:
    from .launcher import LaunchConfig

__all__ = ["REMOTE_REPORTS_S", "remote_reports", "rank_states", "summary"]


def _read_report(report_dir: str, rank: int) -> dict[str, Any] | None:
    try:
        with open(os.path.join(report_dir, f"rank-{rank}.json")) as fh:
            report = json.load(fh)
        return report if isinstance(report, dict) else None
    except (OSError, ValueError):
        return None


#: Seconds the launcher waits for the other nodes' fault reports from the store.
REMOTE_REPORTS_S = 1.0


def remote_reports(cfg: LaunchConfig, port: int, token: str) -> dict[int, dict[str, Any]]:
    """The fault reports other nodes' ranks put in the store (several nodes only), fetched
    on a helper thread for ``REMOTE_REPORTS_S`` at most (the store may be unreachable)."""
    if cfg.nnodes == 1:
        return {}
    found: dict[int, dict[str, Any]] = {}
    lock = threading.Lock()
    mine = range(cfg.node_rank * cfg.nproc, (cfg.node_rank + 1) * cfg.nproc)

    def fetch() -> None:
        from ..rendezvous.tcp_client import TCPStore

        try:
            store = TCPStore(cfg.master_addr, port, timeout=REMOTE_REPORTS_S,
                             token=job_token({"COLLCOMM_TOKEN": token}))
        except Exception:  # noqa: BLE001 - unreachable: judge from this node alone
            return
        try:
            for r in range(cfg.nproc * cfg.nnodes):
                key = FAULT_KEY.format(rank=r)
                if r not in mine and store.check([key]):
                    report = json.loads(store.get(key, timeout=1.0))
                    if isinstance(report, dict):
                        with lock:
                            found[r] = report
        except Exception:  # noqa: BLE001 - what we have so far
            pass
        finally:
            store.close()

    fetcher = threading.Thread(target=fetch, daemon=True, name="collcomm-run-reports")
    fetcher.start()
    fetcher.join(REMOTE_REPORTS_S)
    with lock:
        return dict(found)


def rank_states(ranks: list[Rank], report_dir: str,
            remote: dict[int, dict[str, Any]] | None = None) -> list[RankState]:
    states = [RankState(rank=r.rank, pid=r.proc.pid, returncode=r.returncode, exit_t=r.exit_t,
                        signalled=r.signalled, stopped_since=r.stopped_since,
                        report=_read_report(report_dir, r.rank)) for r in ranks]
    for rank, report in sorted((remote or {}).items()):
        states.append(RankState(rank=rank, pid=int(report.get("pid", 0)), report=report,
                                local=False))
    return states


def _ranks_text(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r) for r in sorted(ranks))


def _indent(text: str) -> list[str]:
    return [f"    {line}" for line in text.rstrip("\n").splitlines()]


def summary(verdict: Verdict, ranks: list[Rank], states: list[RankState]) -> str:
    by_rank = {r.rank: r for r in ranks}
    state_of = {s.rank: s for s in states}
    root = by_rank.get(verdict.rank)
    where = f"(pid {root.proc.pid})" if root is not None else "(on another node)"
    lines = [f"collcomm run: rank {verdict.rank} {where} failed first: {verdict.how}"]
    # what the other ranks of this node did, grouped
    reactions: dict[tuple[str, tuple[int, ...]], list[int]] = collections.defaultdict(list)
    others: dict[str, list[int]] = collections.defaultdict(list)
    for s in states:
        if s.rank == verdict.rank or not s.local:
            continue
        if s.report:
            key = (str(s.report.get("type", "an error")), tuple(s.report.get("peers") or []))
            reactions[key].append(s.rank)
        elif s.signalled and s.returncode is not None:
            others["stopped by the launcher"].append(s.rank)
        elif s.failed:
            others[f"failed too ({describe_exit(s.returncode or 1)})"].append(s.rank)
    for (etype, peers), who in sorted(reactions.items(), key=lambda kv: min(kv[1])):
        naming = f" naming {_ranks_text(list(peers))}" if peers else ""
        lines.append(f"collcomm run: {_ranks_text(who)} raised {etype}{naming}")
    for what, who in sorted(others.items(), key=lambda kv: min(kv[1])):
        verb = "was" if len(who) == 1 else "were"
        lines.append(f"collcomm run: {_ranks_text(who)} {verb + ' ' if what.startswith('stopped') else ''}{what}")
    # what the ranks of other nodes named here said, in their words
    named_here = {p for s in states if s.local and s.report for p in s.report.get("peers") or []}
    for s in states:
        if not s.local and s.report and (s.rank in named_here or s.rank == verdict.rank):
            first = str(s.report.get("message", "")).splitlines()[:1]
            lines.append(f"collcomm run: rank {s.rank} (on another node) raised "
                         f"{s.report.get('type', 'an error')}: {first[0] if first else ''}")
    # one traceback, once: the root cause's; else (it left none) its stderr; else the
    # first error reported on this node
    shown = state_of.get(verdict.rank)
    if shown is None or not shown.report:
        reported = sorted((s for s in states if s.local and s.report), key=lambda s: s.event_t)
        shown = None if (root is not None and root.stderr_tail) or not reported else reported[0]
    if shown is not None and shown.report and shown.report.get("traceback"):
        lines.append(f"collcomm run: rank {shown.rank}'s error "
                     "(your frames; COLLCOMM_DEBUG=1 for the full trace):")
        lines.extend(_indent(shown.report["traceback"]))
    elif root is not None and root.stderr_tail:
        lines.append(f"collcomm run: last {len(root.stderr_tail)} line(s) of rank {root.rank}'s "
                     "stderr:")
        lines.extend(f"    {line}" for line in root.stderr_tail)
    return "\n".join(lines) + "\n"
