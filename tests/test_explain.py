"""collcomm explain: real runs drawn step by step, checked against the seeds' formulas."""
from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from collcomm.algorithms.registry import ALGORITHMS
from collcomm.tools import explain, explain_render


def test_ring_all_reduce_on_5_ranks_takes_8_steps_and_the_formula_bytes():
    n, k = 5, 10
    ex = explain.run("all_reduce", "ring", n, count=k, repeats=2)
    assert ex["steps"] == 2 * (n - 1) == 8
    assert ex["local_steps"] == [8] * n
    assert len(ex["frames"]) == 9
    for f in ex["frames"][1:]:
        assert len(f["arrows"]) == n                                   # every rank sends once
        assert sorted((a["from"], a["to"]) for a in f["arrows"]) == [(r, (r + 1) % n) for r in range(n)]
        assert all(len(row["changed"]) == 1 for row in f["rows"])     # and gets one chunk
    # rank r starts with its own contribution in every chunk ...
    assert [row["labels"] for row in ex["frames"][0]["rows"]] == [[str(r)] * n for r in range(n)]
    # ... and ends with the full result in every chunk
    assert all(row["labels"] == ["01234"] * n for row in ex["frames"][-1]["rows"])
    assert ex["final_ok"]
    K = k * 8
    assert ex["bytes_sent"] == [2 * (n - 1) * K // n] * n == [128] * n   # 2(N-1)/N·K
    assert ex["model"]["rounds"] == 8 and ex["model"]["bytes_per_rank"] == pytest.approx(128)
    assert ex["measured_time_s"] > 0 and ex["model"]["time_s"] > 0
    text = explain_render.terminal(ex)
    assert "step 8 of 8" in text and "r4 → r0" in text
    assert "cost model rounds (α coefficient): 8  = measured steps 8" in text
    assert "cost model bytes on the critical path (β coefficient): 128  = max measured 128" in text
    assert "final state: every rank holds the sum of all ranks in every chunk — yes" in text


def test_every_family_renders_and_ends_in_the_right_state():
    pairs = [(op, algo) for op, table in ALGORITHMS.items() for algo in table]
    n = 4
    results = explain.run_many(pairs, n, repeats=1)
    for (op, algo), ex in zip(pairs, results):
        assert ex["final_ok"], (op, algo, explain_render.terminal(ex))
        assert ex["steps"] >= 1 or (op == "barrier" and algo == "hierarchical"), (op, algo)
        assert "step 1 of" in explain_render.terminal(ex)
        assert "<svg" in explain_render.svg(ex) and "__DATA__" not in explain_render.html(ex)
    got = {(ex["op"], ex["algorithm"]): ex for ex in results}
    K = n * 8
    # tree broadcast: ⌈log2 4⌉ = 2 rounds; K per edge
    assert got[("broadcast", "tree")]["steps"] == 2
    assert got[("broadcast", "tree")]["bytes_sent"] == [2 * K, 0, K, 0]   # 0 → 2, 1; 2 → 3
    # recursive doubling all_reduce: log2 4 = 2 exchanges of the whole vector
    assert got[("all_reduce", "recursive_doubling")]["steps"] == 2
    assert got[("all_reduce", "recursive_doubling")]["bytes_sent"] == [2 * K] * n
    # Rabenseifner: halving + doubling = 2·log2 4 steps, 2(N-1)/N·K bytes
    assert got[("all_reduce", "rabenseifner")]["steps"] == 4
    assert got[("all_reduce", "rabenseifner")]["bytes_sent"] == [2 * (n - 1) * K // n] * n
    # Bruck all_gather: ⌈log2 4⌉ rounds, (N-1)·k bytes per rank (k = one block)
    assert got[("all_gather", "bruck")]["steps"] == 2
    assert got[("all_gather", "bruck")]["bytes_sent"] == [(n - 1) * K] * n
    # dissemination barrier: ⌈log2 4⌉ rounds of empty messages
    assert got[("barrier", "dissemination")]["steps"] == 2
    # shm_direct moves nothing by message: one arena sync for all_reduce of a small buffer
    assert got[("all_reduce", "shm_direct")]["syncs"] == [1] * n
    assert got[("all_reduce", "shm_direct")]["bytes_sent"] == [0] * n


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(_chromium() is None, reason="Debian's chromium is not installed "
                    "(apt-get install -y chromium)")
def test_html_page_in_headless_chromium(tmp_path):
    ex = explain.run("all_reduce", "ring", 5, repeats=1)
    page = tmp_path / "ring.html"
    page.write_text(explain_render.html(ex))
    browser = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
               f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0"]
    # press "next" 8 times, as a user stepping through: the last frame, the final state
    run = subprocess.run(browser + ["--dump-dom", f"file://{page}#steps=8"], capture_output=True,
                         text=True, timeout=120)
    dom, log = run.stdout, run.stderr
    assert 'data-ready="1"' in dom and 'data-frame="8"' in dom, dom[-2000:]
    assert re.search(r'<div id="errors">\s*</div>', dom), dom
    assert "step 8 of 8 — final: every rank holds the sum of all ranks in every chunk ✓" in dom
    labels = re.findall(r'class="label"[^>]*>([^<]*)<', dom)
    assert labels == ["01234"] * 25, labels
    console = [line for line in log.splitlines() if "CONSOLE" in line or "Uncaught" in line]
    assert not console, console
    # a screenshot of the final frame, kept as a test artifact
    artifacts = os.environ.get("COLLCOMM_TEST_ARTIFACTS", str(tmp_path))
    os.makedirs(artifacts, exist_ok=True)
    shot = os.path.join(artifacts, "explain-ring-all_reduce-5.png")
    subprocess.run(browser + ["--window-size=1000,520", f"--screenshot={shot}",
                              f"file://{page}#last"], capture_output=True, timeout=120, check=True)
    with open(shot, "rb") as f:
        png = f.read()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
