"""collcomm bench prints what collcomm found about the machine under its tables
(tools/bench/facts.py): the CPU, the native core, a cross-memory read's cost, and the
verdicts of the timings of copies and transfers 1-63 bytes past their source, every
rank's combined."""
from __future__ import annotations

from collcomm.tools.bench import facts as F

BASE = {"cpu": "AMD EPYC", "l2": 512 << 10, "native": True, "cma": True, "cma_cost": 2.5,
        "near": 1, "bounce": -1}


def test_the_line_says_each_fact() -> None:
    text = F.line(BASE)
    assert text == ("# collcomm here: AMD EPYC (L2 512 KiB); native core; a cross-memory read costs "
                    "2.50 memcpy'd bytes a byte; memcpy 1-63 B past its source mod 4 KiB: slow there "
                    "(vector loop); cross-memory transfers there: not met")
    pure = F.line(dict(BASE, native=False, near=None, bounce=0, cma=False, l2=0, cpu=""))
    assert pure == ("# collcomm here: CPU unknown; pure Python (no native core); no cross-memory "
                    "reads (staged); cross-memory transfers there: as fast")
    assert "no shared-memory arena" in F.line(dict(BASE, cma=None, cma_cost=None))


def test_every_ranks_verdict_counts() -> None:
    def allgather(values: list[float]) -> list[list[float]]:
        return [values, [0.0, 1.0]]       # (another rank met the band of transfers)

    got = F.verdicts(dict(BASE), allgather)
    assert got["near"] == 1 and got["bounce"] == 1 and BASE["bounce"] == -1
    assert F.verdicts(dict(BASE, near=None, bounce=None), allgather)["near"] is None


def test_notes_from_the_first_collcomm_row_with_facts() -> None:
    rows = [{"lib": "mpi", "facts": BASE}, {"lib": "collcomm"}, {"lib": "collcomm", "facts": BASE}]
    assert F.notes_from(rows) == [F.line(BASE)]
    assert F.notes_from(rows[:2]) == []


def test_the_machine_is_read() -> None:
    assert F._l2_bytes() >= 0 and isinstance(F._cpu_model(), str)
