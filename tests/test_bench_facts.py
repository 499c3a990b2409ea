"""collcomm bench prints what collcomm found about the machine under its tables
(tools/bench/facts.py): the CPU, the native core, a cross-memory read's cost, and the
verdicts of the timings of copies and transfers 1-63 bytes past their source, every
rank's combined."""
from __future__ import annotations

import numpy as np

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
    assert "no shared-memory arena built" in F.line(dict(BASE, cma=None, cma_cost=None))
    assert F.line({}) == "# collcomm here: CPU unknown; no shared-memory arena built"


def test_every_ranks_verdict_counts() -> None:
    sent: list[list[float]] = []

    def allgather(values: list[float]) -> np.ndarray:
        sent.append(values)
        return np.array([values, [-2.0, 1.0]])    # (a pure-Python rank met transfers there)

    got = F.verdicts(dict(BASE), allgather)
    assert got["near"] == 1 and got["bounce"] == 1 and BASE["bounce"] == -1
    got = F.verdicts(dict(BASE, near=None, bounce=None), allgather)
    assert got["near"] is None and got["bounce"] == 1
    got = F.verdicts({}, allgather)                 # (a rank whose facts could not be read)
    assert got == {"near": None, "bounce": 1}
    assert all(len(v) == 2 for v in sent)           # every rank sends the same two


def test_a_fact_that_cannot_be_read_costs_nothing(monkeypatch) -> None:
    def broken() -> dict:
        raise AttributeError("near_copies")

    monkeypatch.setattr(F, "_collect", broken)
    assert F.collect() == {}


def test_notes_from_the_first_collcomm_row_with_facts() -> None:
    rows = [{"lib": "mpi", "facts": BASE}, {"lib": "collcomm"}, {"lib": "collcomm", "facts": BASE}]
    assert F.notes_from(rows) == [F.line(BASE)]
    assert F.notes_from(rows[:2]) == []


def test_the_machine_is_read(tmp_path, monkeypatch) -> None:
    assert F._l2_bytes() >= 0 and F._cpu_model()
    for index, level, size in (("index0", "1", "32K"), ("index1", "2", "1M"), ("index2", "3", "32768K")):
        (tmp_path / index).mkdir()
        (tmp_path / index / "level").write_text(level + "\n")
        (tmp_path / index / "size").write_text(size + "\n")
    (tmp_path / "uevent").write_text("")          # (not an index: skipped)
    monkeypatch.setattr(F, "CACHE_DIR", str(tmp_path))
    assert F._l2_bytes() == 1 << 20
    monkeypatch.setattr(F, "CACHE_DIR", str(tmp_path / "absent"))
    assert F._l2_bytes() == 0


def test_merged_rows_carry_no_facts() -> None:
    from collcomm.tools.bench.report import merge_rounds
    from tests.test_bench import _row

    rows = [dict(_row(), facts=BASE, round=0), dict(_row(time_us=None), op="broadcast", facts=BASE)]
    assert all("facts" not in r for r in merge_rounds(rows))
