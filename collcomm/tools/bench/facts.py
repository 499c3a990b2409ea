"""What collcomm found about the machine it was measured on, printed under the tables.

A result depends on things the bench cannot set: the CPU, whether the native core was
built, what a cross-memory read costs against a memcpy (measured when the world's arena
is built: ``cma_cost``, which picks between staging and reading peers directly), and
whether this CPU copies slowly to a destination 1-63 bytes past its source modulo 4 KiB
(timed at the first such copy: then a vector loop, native/_copy_near.c; and cross-memory
transfers there bounce, native/_cma_move.c and transport/cma_move.py). The collcomm job's
ranks gather them after the sweep (:func:`collect`, the verdicts of every rank combined:
:func:`verdicts`) and the parent prints one line (:func:`line`).
"""
from __future__ import annotations

import os
from typing import Any

VERDICT = {1: "slow there", 0: "as fast", -1: "not met"}
CACHE_DIR = "/sys/devices/system/cpu/cpu0/cache"     # (sysfs: index*/level, index*/size)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for text in fh:
                if text.startswith("model name"):
                    return text.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.machine()


def _l2_bytes() -> int:
    """The L2's size as sysfs says it (0: not known)."""
    base = CACHE_DIR
    try:
        indexes = sorted(os.listdir(base))
    except OSError:
        return 0
    for index in indexes:
        try:
            with open(os.path.join(base, index, "level")) as fh:
                if fh.read().strip() != "2":
                    continue
            with open(os.path.join(base, index, "size")) as fh:
                text = fh.read().strip().upper()
            return int(text.rstrip("KM")) * {"K": 1 << 10, "M": 1 << 20}.get(text[-1:], 1)
        except (OSError, ValueError):
            continue
    return 0


def verdicts(facts: dict[str, Any], allgather: Any) -> dict[str, Any]:
    """``facts`` with the timing verdicts every rank reached combined: a rank that met the
    band says what the CPU does there (``allgather``: the backend's, floats of every rank;
    a collective, so every rank sends the same two, -2 for none)."""
    keys = ("near", "bounce")
    mine = [-2.0 if facts.get(k) is None else float(facts[k]) for k in keys]
    seen = [[float(v) for v in row] for row in allgather(mine)]
    combined = {k: max(row[i] for row in seen) for i, k in enumerate(keys)}
    return dict(facts, **{k: None if v == -2 else int(v) for k, v in combined.items()})


def collect() -> dict[str, Any]:
    """This process's facts (call after the sweep, in the collcomm job); a fact that cannot
    be read is left out (the line is only a note: it must not cost the sweep)."""
    try:
        return _collect()
    except Exception:  # noqa: BLE001 - e.g. an older native core without near_copies
        return {}


def _collect() -> dict[str, Any]:
    from ... import native
    from ...core import runtime
    from ...transport import cma_move

    facts: dict[str, Any] = {"cpu": _cpu_model(), "l2": _l2_bytes(), "native": native.core is not None}
    arena = runtime.get_world("bench").arena
    facts["cma"] = None if arena is None else bool(arena.cma)
    facts["cma_cost"] = None if arena is None else float(arena.cma_cost)
    # (the Python code's own transfers go through cma_move even beside the native core)
    facts["near"] = None if native.core is None else int(native.core.near_copies()[1])
    facts["bounce"] = max(cma_move.verdict(),
                          -1 if native.core is None else int(native.core.cma_bounces()[1]))
    return facts


def line(facts: dict[str, Any]) -> str:
    """One ``# collcomm here: ...`` line."""
    l2 = f" (L2 {facts['l2'] >> 10} KiB)" if facts.get("l2") else ""
    parts = [f"{facts.get('cpu') or 'CPU unknown'}{l2}"]
    if "native" in facts:
        parts.append("native core" if facts["native"] else "pure Python (no native core)")
    if facts.get("cma") is None:
        parts.append("no shared-memory arena built")
    elif facts["cma"]:
        parts.append(f"a cross-memory read costs {facts['cma_cost']:.2f} memcpy'd bytes a byte")
    else:
        parts.append("no cross-memory reads (staged)")
    if facts.get("near") is not None:
        parts.append("memcpy 1-63 B past its source mod 4 KiB: "
                     + VERDICT.get(facts["near"], "?") + (" (vector loop)" if facts["near"] == 1 else ""))
    if facts.get("bounce") is not None:
        parts.append("cross-memory transfers there: " + VERDICT.get(facts["bounce"], "?")
                     + (" (bounced)" if facts["bounce"] == 1 else ""))
    return "# collcomm here: " + "; ".join(parts)


def notes_from(rows: list[dict[str, Any]]) -> list[str]:
    """The line of the first collcomm row that carries facts (none: no line)."""
    for r in rows:
        if r.get("lib") == "collcomm" and r.get("facts"):
            return [line(r["facts"])]
    return []
