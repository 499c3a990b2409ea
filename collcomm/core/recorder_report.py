"""What the flight recorder says about a call that went wrong between ranks.

:func:`missing_report` reads the states gathered from every rank (:mod:`.recorder_exchange`)
and names the ranks that never entered a call, where each of them is, and the call at which
the ranks diverged. :func:`detail_check` (``COLLCOMM_DEBUG=DETAIL``) compares every rank's
call before it runs and raises the same :class:`~collcomm.errors.MismatchError` on all of
them when two differ.
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from ..algorithms import signature
from ..errors import MismatchError
from .recorder_records import R_CODE, R_LASTI, R_OP, R_SEQ, R_SIG, _SEQ_MASK, where

if TYPE_CHECKING:
    from .recorder import Observer


def _describe_entry(e: dict[str, Any]) -> str:
    return f"{e['op']} #{e['seq']} at {e['where']} ({e['state']})"


def missing_report(obs: Observer, rec: list[Any], states: dict[int, Any]) -> dict[str, Any]:
    """Who never entered call #seq of ``obs``'s group, and where everyone is."""
    seq, key = rec[R_SEQ] & _SEQ_MASK, f"{obs.ctx:x}"
    arrived, missing, unknown, elsewhere = [], [], [], []
    lines = []
    for local, g in enumerate(obs.ranks):
        st = states.get(g)
        if st is None:
            unknown.append(g)
            continue
        grp = st["groups"].get(key)
        recent = [e for e in (grp or {}).get("recent", []) if "peer" not in e]
        at_seq = [e for e in recent if e["seq"] == seq]
        last = recent[-1] if recent else None
        if at_seq:
            e = at_seq[0]
            if e["op"] != rec[R_OP] or (e["sig"] and rec[R_SIG] and e["sig"] != rec[R_SIG]):
                elsewhere.append(g)
                lines.append(f"  rank {g} entered #{seq} as {e['call']} at {e['where']} ({e['state']})")
            elif st.get("left"):
                arrived.append(g)
            else:
                arrived.append(g)
        elif last is not None and last["seq"] > seq:
            elsewhere.append(g)
            lines.append(f"  rank {g} is past #{seq}: last entered {_describe_entry(last)}")
        elif st.get("left"):
            missing.append(g)
            lines.append(f"  rank {g} left the job without entering #{seq}; its last call on "
                         "this group: " + (_describe_entry(last) if last else "none"))
        else:
            missing.append(g)
            lines.append(f"  rank {g} never entered #{seq}; its last call on this group: "
                         + (_describe_entry(last) if last else "none"))
    # an earlier divergence (a rank skipped a call and went on with the next one) explains more
    calls: dict[int, dict[int, dict[str, Any]]] = {}
    for g in obs.ranks:
        st = states.get(g)
        grp = (st or {}).get("groups", {}).get(key) if st else None
        if grp:
            calls[g] = {e["seq"]: e for e in grp.get("recent", []) if "peer" not in e}
    diverged = None
    for q in sorted({q for c in calls.values() for q in c if q <= seq}):
        at = {g: c[q] for g, c in calls.items() if q in c}
        if len({(e["op"], e["sig"]) for e in at.values()}) > 1:
            diverged = q
            lines.insert(0, f"  the ranks diverged at #{q}: " + "; ".join(
                f"rank {g} called {e['call']} at {e['where']}" for g, e in sorted(at.items())))
            break
    head = (f"call #{seq} ({rec[R_OP]}) of group {obs.name}: "
            + (f"ranks {missing} never entered it" if missing else "no rank is missing it")
            + (f"; in it: ranks {arrived}" if arrived else "")
            + (f"; unknown (no answer through the store: dead or gone): ranks {unknown}" if unknown else ""))
    text = "\n".join([head] + lines)
    return {"seq": seq, "op": rec[R_OP], "group": obs.name, "missing": missing, "diverged": diverged,
            "arrived": arrived, "unknown": unknown, "elsewhere": elsewhere, "text": text}


# ------------------------------------------------------------------- COLLCOMM_DEBUG=DETAIL
_DESC = 256


def detail_check(comm: Any, rec: Any, obs: Observer) -> None:
    """Before the call, every rank sends every other a small descriptor (op, signature,
    file:line); all ranks then hold the same table and all raise the same MismatchError
    when any two calls differ, naming both sides."""
    import numpy as np

    n, me = comm.size, comm.rank
    seq = rec[R_SEQ] & _SEQ_MASK
    text = json.dumps([rec[R_OP], rec[R_SIG], where(rec[R_CODE], rec[R_LASTI])[-200:]]).encode()
    mine = np.zeros(_DESC, dtype=np.uint8)
    mine[:len(text)] = np.frombuffer(text[:_DESC], dtype=np.uint8)
    table = np.zeros((n, _DESC), dtype=np.uint8)
    table[me] = mine
    saved = comm.sig
    comm.sig = 0          # the descriptors are not the call's data: no signature check on them
    try:
        recvs = [comm.irecv(table[p], p) for p in range(n) if p != me]
        sends = [comm.isend(mine, p) for p in range(n) if p != me]
        for h in recvs + sends:
            h.wait()
    finally:
        comm.sig = saved
    calls = [json.loads(bytes(row).rstrip(b"\0").decode()) for row in table]

    kinds: dict[tuple, list[int]] = {}
    for r in range(n):
        kinds.setdefault((calls[r][0], calls[r][1]), []).append(r)
    if len(kinds) > 1:           # the same text on every rank: distinct calls by lowest rank
        parts = []
        for i, ((op, sig), rs) in enumerate(kinds.items()):
            who = f"rank {obs.ranks[rs[0]]}" if len(rs) == 1 else f"ranks {[obs.ranks[r] for r in rs]}"
            what = signature.describe(sig) if sig else op
            at = calls[rs[0]][2]
            parts.append(f"{who} called {what} as #{seq} on group {obs.name} at {at}" if i == 0
                         else f"{who} called {what} at {at}")
        raise MismatchError("; ".join(parts) + " (COLLCOMM_DEBUG=DETAIL: every rank must make "
                            "the same collective calls in the same order, with the same dtype, "
                            "count, root and op)")
