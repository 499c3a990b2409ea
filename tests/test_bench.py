"""collcomm bench: parsing, busbw factors, formatting, JSON, ratios, and short smoke runs."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from collcomm.tools.bench import options as O
from collcomm.tools.bench import report as R
from collcomm.tools.bench.calibrate import fit_alpha_beta
from collcomm.tools.bench.checks import count_wrong, expected, pattern
from collcomm.tools.bench.worker import pick_iters

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROW_RE = re.compile(r"^\s+\d+\s+\d+\s+\S+\s+\S+\s+-?\d+(\s+\S+){8}$")


def _bench(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "COLLCOMM_STORE")}
    return subprocess.run([sys.executable, "-m", "collcomm", "bench", *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=timeout)


def _row(**kw):
    base = dict(lib="collcomm", op="all_reduce", size=1024, count=256, dtype="float32",
                redop="sum", root=-1, mode="oop", nproc=2, time_us=10.0, wrong=0, iters=7,
                lat_avg_us=11.0, lat_min_us=10.5, lat_max_us=11.5)
    base.update(kw)
    return R.make_row(**base)


# --------------------------------------------------------------------------- parsing

@pytest.mark.timeout(10)
@pytest.mark.parametrize("text,want", [
    ("8", 8), ("0", 0), ("64K", 65536), ("64k", 65536), ("1M", 1 << 20), ("64M", 64 << 20),
    ("2G", 2 << 30), ("64KiB", 65536), ("1MB", 1 << 20), (" 3K ", 3072), (5, 5)])
def test_parse_size(text, want):
    assert O.parse_size(text) == want


@pytest.mark.timeout(10)
@pytest.mark.parametrize("bad", ["", "K", "1.5M", "-8", "8T", "ten"])
def test_parse_size_rejects(bad):
    with pytest.raises(ValueError):
        O.parse_size(bad)


@pytest.mark.timeout(10)
def test_size_sweep():
    assert O.size_sweep(8, 64, 2) == [8, 16, 32, 64]
    assert O.size_sweep(8, 65536, 4) == [8, 32, 128, 512, 2048, 8192, 32768]
    assert O.size_sweep(8, 8, 2) == [8]
    assert O.size_sweep(8, 100, 2) == [8, 16, 32, 64]
    assert len(O.size_sweep(8, 64 << 20, 2)) == 24
    with pytest.raises(ValueError):
        O.size_sweep(64, 8, 2)
    with pytest.raises(ValueError):
        O.size_sweep(8, 64, 1)


@pytest.mark.timeout(10)
def test_parse_ops_dtype_compare_count():
    assert O.parse_ops("all") == O.OPS
    assert O.parse_ops("allreduce,bcast") == ["all_reduce", "broadcast"]
    with pytest.raises(ValueError):
        O.parse_ops("allfoo")
    assert O.normalize_dtype("float") == "float32"
    with pytest.raises(ValueError):
        O.normalize_dtype("complex64")
    assert O.parse_compare("mpi,gloo") == ["mpi", "gloo"]
    assert O.parse_compare("torch") == ["gloo"]
    with pytest.raises(ValueError):
        O.parse_compare("nccl")
    assert O.count_for("all_reduce", 8, 4, 4) == (2, 2)
    assert O.count_for("all_gather", 8, 4, 4) == (0, 0)       # rounded to a multiple of n
    assert O.count_for("all_gather", 1024, 4, 3) == (255, 85)
    assert O.count_for("barrier", 1024, 4, 3) == (0, 0)


@pytest.mark.timeout(10)
def test_cli_options():
    from collcomm.tools.cli import build_parser

    args = build_parser().parse_args(["bench", "-n", "3", "--op", "all", "-b", "1K", "-e", "4K",
                                      "--compare", "mpi", "--inplace"])
    opts = O.options_from_args(args)
    assert opts.nproc == 3 and opts.ops == O.OPS and opts.sizes == [1024, 2048, 4096]
    assert opts.modes == ["ip"] and opts.compare == ["mpi"] and opts.rounds == 2
    opts = O.options_from_args(build_parser().parse_args(["bench"]))
    assert opts.modes == ["oop", "ip"] and opts.sizes[0] == 8 and opts.sizes[-1] == 64 << 20
    assert O.Options.from_json(opts.to_json()) == opts
    help_text = build_parser()._subparsers._group_actions[0].choices["bench"].format_help()
    for word in ("2(n-1)/n", "(n-1)/n", "MEDIAN", "MAX over ranks", "barrier()"):
        assert word in help_text


# --------------------------------------------------------------------------- factors, rows

@pytest.mark.timeout(10)
def test_busbw_factors_every_op():
    n = 4
    want = {"all_reduce": 1.5, "all_gather": 0.75, "reduce_scatter": 0.75, "all_to_all": 0.75,
            "gather": 0.75, "scatter": 0.75, "broadcast": 1.0, "reduce": 1.0, "sendrecv": 1.0,
            "barrier": 0.0}
    assert set(want) == set(O.OPS)
    for op, f in want.items():
        assert R.busbw_factor(op, n) == pytest.approx(f)
    assert R.busbw_factor("all_reduce", 2) == 1.0
    assert R.busbw_factor("all_reduce", 1) == 0.0
    with pytest.raises(ValueError):
        R.busbw_factor("nope", 2)


@pytest.mark.timeout(10)
def test_bandwidths():
    algbw, busbw = R.bandwidths("all_reduce", 1_000_000, 4, 100.0)  # 1 MB in 100 us
    assert algbw == pytest.approx(10.0) and busbw == pytest.approx(15.0)
    assert R.bandwidths("all_gather", 10, 2, None) == (0.0, 0.0)


@pytest.mark.timeout(10)
def test_ratio_and_merge_rounds():
    assert R.ratio(10.0, 30.0) == pytest.approx(3.0)        # collcomm 3x faster
    assert R.ratio(20.0, 10.0) == pytest.approx(0.5)
    assert R.ratio(None, 10.0) is None and R.ratio(10.0, None) is None
    rows = [_row(time_us=t) for t in (10.0, 30.0, 12.0)] + [_row(lib="mpi", time_us=40.0)]
    merged = {r["lib"]: r for r in R.merge_rounds(rows)}
    assert merged["collcomm"]["time_us"] == 12.0 and merged["collcomm"]["rounds"] == 3
    assert merged["collcomm"]["busbw"] == pytest.approx(1024 / 12e-6 / 1e9)
    cmp = R.compare_rows(list(merged.values()), ["collcomm", "mpi"])
    assert cmp[0]["ratios"]["mpi"] == pytest.approx(40.0 / 12.0)


# --------------------------------------------------------------------------- formatting

@pytest.mark.timeout(10)
def test_format_table_columns():
    rows = [_row(size=8, count=2, time_us=5.5), _row(size=8, count=2, mode="ip", time_us=6.25),
            _row(size=1 << 20, count=1 << 18, time_us=123456.0, wrong=3),
            _row(size=1 << 20, count=1 << 18, mode="ip", time_us=12345.6)]
    text = R.format_table(rows)
    lines = text.splitlines()
    assert lines[0] == "# all_reduce"
    assert "out-of-place" in lines[1] and "in-place" in lines[1]
    assert lines[2].split()[1:] == ["size", "count", "type", "redop", "root", "time", "algbw",
                                    "busbw", "#wrong", "time", "algbw", "busbw", "#wrong"]
    data = [ln for ln in lines if not ln.startswith("#")]
    assert len(data) == 2 and all(ROW_RE.match(ln) for ln in data)
    f = data[0].split()
    assert f[:5] == ["8", "2", "float", "sum", "-1"]
    assert f[5:] == ["5.50", "0.00", "0.00", "0", "6.25", "0.00", "0.00", "0"]
    assert data[1].split()[5] == "123456" and data[1].split()[8] == "3"
    assert data[1].split()[9] == "12345.6"
    # the columns line up under the header (nccl-tests widths)
    assert len(data[0]) == len(lines[2])
    assert "# Out of bounds values : 3 FAILED" in text
    m = re.search(r"# Avg bus bandwidth\s*: (\S+)", text)
    want = sum(r["busbw"] for r in rows) / 4
    assert m and float(m.group(1)) == pytest.approx(want, rel=1e-3)


@pytest.mark.timeout(10)
def test_format_table_na_and_unchecked():
    rows = [_row(op="sendrecv", wrong=-1),
            _row(op="sendrecv", mode="ip", time_us=None, wrong=-1,
                 error="sendrecv has no in-place form")]
    text = R.format_table(rows)
    data = [ln for ln in text.splitlines() if not ln.startswith("#")][0].split()
    assert data[8] == "N/A" and data[9:] == ["N/A"] * 4
    assert "Out of bounds" not in text


@pytest.mark.timeout(10)
def test_format_latency_columns():
    text = R.format_latency([_row(size=8), _row(size=1024, lat_avg_us=123.456)])
    lines = text.splitlines()
    assert lines[1] == R.OSU_HEADER
    assert lines[1].startswith("# Size       Avg Latency(us)   Min Latency(us)   Max Latency(us)")
    assert lines[2].split() == ["8", "11.00", "10.50", "11.50", "7"]
    assert lines[3].split()[:2] == ["1024", "123.46"]
    assert lines[2][:10] == "8         "


@pytest.mark.timeout(10)
def test_format_compare_ratio_columns():
    rows = [_row(time_us=10.0), _row(lib="mpi", time_us=5.0), _row(lib="gloo", time_us=300.0),
            _row(size=2048, count=512, time_us=20.0), _row(lib="mpi", size=2048, count=512,
                                                           time_us=None, error="boom")]
    text = R.format_compare(rows, ["collcomm", "mpi", "gloo"], 2)
    lines = text.splitlines()
    assert "cc/mpi" in lines[1] and "cc/gloo" in lines[1] and "collcomm(us)" in lines[1]
    assert lines[2].split()[-3:] == ["0.50x", "30.00x", "0/0/0"]
    assert lines[3].split()[-3:-1] == ["N/A", "N/A"]
    assert "# mpi: boom" in text


@pytest.mark.timeout(10)
def test_write_json(tmp_path):
    path = tmp_path / "out.json"
    rows = [_row(), _row(mode="ip")]
    R.write_json(str(path), rows, {"host": "x"})
    data = json.loads(path.read_text())
    assert data["meta"] == {"host": "x"} and len(data["rows"]) == 2
    assert {"size", "count", "time_us", "algbw", "busbw", "wrong", "mode", "lib"} <= set(data["rows"][0])


@pytest.mark.timeout(10)
def test_check_patterns_and_iters():
    assert count_wrong(pattern(0, __import__("numpy").arange(4), "sum", "float32"),
                       pattern(0, __import__("numpy").arange(4), "sum", "float32")) == 0
    want = expected("all_reduce", 0, 2, 4, 4, "sum", "float32", 0)
    assert list(want) == [p0 + p1 for p0, p1 in zip(pattern(0, __import__("numpy").arange(4), "sum", "float32"),
                                                    pattern(1, __import__("numpy").arange(4), "sum", "float32"))]
    got = want.copy()
    got[1] += 1
    assert count_wrong(got, want) == 1
    opts = O.Options(iters=100, min_iters=5, time_per_size=0.2)
    assert pick_iters(1e-6, opts) == 100 and pick_iters(1.0, opts) == 5 and pick_iters(0.01, opts) == 20


@pytest.mark.timeout(10)
def test_fit_alpha_beta():
    sizes = [8, 128, 2048, 32768, 1 << 20]
    times = [2e-6 + 1e-10 * s for s in sizes]
    a, b = fit_alpha_beta(sizes, times)
    assert a == pytest.approx(2e-6, rel=1e-3) and b == pytest.approx(1e-10, rel=1e-3)


# --------------------------------------------------------------------------- smoke runs

def _data_lines(text: str) -> list[list[str]]:
    return [ln.split() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]


@pytest.mark.timeout(60)
def test_smoke_all_reduce(tmp_path):
    out = tmp_path / "r.json"
    p = _bench("-n", "2", "--op", "all_reduce", "-b", "8", "-e", "64K", "-f", "4", "--iters", "5",
               "--warmup", "1", "--check", "--json", str(out))
    assert p.returncode == 0, p.stderr
    rows = _data_lines(p.stdout)
    assert [int(r[0]) for r in rows] == [8, 32, 128, 512, 2048, 8192, 32768]
    assert all(len(r) == 13 and r[8] == "0" and r[12] == "0" for r in rows), p.stdout
    assert re.search(r"# Avg bus bandwidth\s*: \d", p.stdout)
    assert len(json.loads(out.read_text())["rows"]) == 14


@pytest.mark.timeout(60)
def test_smoke_all_ops_check():
    p = _bench("-n", "2", "--op", "all", "-b", "64", "-e", "64", "--iters", "2", "--warmup", "1",
               "--check")
    assert p.returncode == 0, p.stderr
    assert "# Out of bounds values : 0 OK" in p.stdout, p.stdout
    ops = [ln[2:] for ln in p.stdout.splitlines() if ln.startswith("# ") and ln[2:] in O.OPS]
    assert ops == O.OPS
    rows = _data_lines(p.stdout)
    assert len(rows) == len(O.OPS)
    for r in rows:
        assert r[8] == "0" and r[12] in ("0", "N/A"), p.stdout


@pytest.mark.timeout(60)
def test_smoke_compare_peers():
    p = _bench("-n", "2", "--op", "all_reduce", "-b", "8", "-e", "8", "--iters", "2",
               "--warmup", "1", "--rounds", "1", "--compare", "mpi,gloo", timeout=55)
    assert p.returncode == 0, p.stderr
    for lib in ("mpi", "gloo"):
        has_ratio = f"cc/{lib}" in p.stdout
        skipped = re.search(rf"# {lib}: skipped: .+", p.stdout)
        assert has_ratio or skipped, p.stdout
    if "cc/mpi" in p.stdout or "cc/gloo" in p.stdout:
        line = _data_lines(p.stdout)[0]
        assert line[0] == "8"
        assert line[-1].endswith("x") or line[-1] == "N/A"


def test_parse_api():
    assert O.parse_api("mpi,torch") == ["cc-mpi", "cc-torch"]
    assert O.parse_api("functional") == [] and O.parse_api(None) == []
    with pytest.raises(ValueError, match="unknown front end"):
        O.parse_api("mpich")


@pytest.mark.timeout(120)
def test_smoke_front_ends_checked():
    """--api times collcomm.MPI and the torch backend with the peers' own sweep code, and
    --check verifies their results (0 wrong)."""
    pytest.importorskip("torch")
    p = _bench("-n", "2", "--op", "all_reduce,broadcast", "-b", "8", "-e", "64", "-f", "8",
               "--iters", "2", "--warmup", "1", "--rounds", "1", "--api", "mpi,torch", "--check",
               timeout=115)
    assert p.returncode == 0, p.stderr
    assert "cc/cc-mpi" in p.stdout and "cc/cc-torch" in p.stdout, p.stdout
    rows = _data_lines(p.stdout)
    assert len(rows) == 4 and all(r[-1] == "0/0/0" for r in rows), p.stdout


@pytest.mark.timeout(30)
def test_bad_arguments():
    p = _bench("-b", "1.5Q")
    assert p.returncode == 2 and "invalid size" in p.stderr


@pytest.mark.timeout(10)
def test_collcomm_env():
    opts = O.Options(ops=["all_reduce", "broadcast"], algo="ring", transport="tcp")
    assert O.collcomm_env(opts) == {"COLLCOMM_ALGO_ALL_REDUCE": "ring",
                                    "COLLCOMM_ALGO_BROADCAST": "ring", "COLLCOMM_TRANSPORT": "tcp"}
    opts = O.Options(ops=["all_reduce"], algo="all_reduce=ring, broadcast=tree")
    assert O.collcomm_env(opts) == {"COLLCOMM_ALGO_ALL_REDUCE": "ring",
                                    "COLLCOMM_ALGO_BROADCAST": "tree"}
    assert O.collcomm_env(O.Options()) == {}


@pytest.mark.timeout(60)
def test_smoke_inside_launched_job():
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    p = subprocess.run([sys.executable, "-m", "collcomm", "run", "-n", "2", "--no-prefix", "-m",
                        "collcomm", "bench", "--op", "broadcast", "-b", "1K", "-e", "1K",
                        "--iters", "2", "--warmup", "1", "--check", "--latency"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=55)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines.count(R.OSU_HEADER) == 2          # printed once (rank 0), oop + ip blocks
    assert [ln.split()[0] for ln in lines if ln and not ln.startswith("#")] == ["1024", "1024"]
    assert sum(ln.startswith("# collcomm here: ") for ln in lines) == 1, p.stdout   # (facts.py)
