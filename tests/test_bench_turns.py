"""collcomm bench --interleave size: the schedule, the board, paired ratios, and what the
parent does when a peer library dies, hangs or never starts."""
from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from collcomm.tools.bench import jobs as J
from collcomm.tools.bench import options as O
from collcomm.tools.bench import report as R
from collcomm.tools.bench import runner
from collcomm.tools.bench import turns as T

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.timeout(10)
def test_schedule_rotates_the_libraries_round_by_round():
    got = [(t.cell, t.round, t.lib) for t in T.schedule(2, 2, 3)]
    assert got == [(0, 0, 0), (0, 0, 1), (0, 0, 2), (0, 1, 1), (0, 1, 2), (0, 1, 0),
                   (1, 0, 0), (1, 0, 1), (1, 0, 2), (1, 1, 1), (1, 1, 2), (1, 1, 0)]


@pytest.mark.timeout(10)
def test_cells_skip_sizes_with_nothing_per_rank():
    opts = O.Options(nproc=2, ops=["all_to_all", "barrier", "all_reduce"], sizes=[4, 16],
                     modes=["oop", "ip"])
    # all_to_all of 4 bytes at n=2 has no float32 per rank: skipped by every library alike
    assert T.cells(opts) == [("all_to_all", 16, "oop"), ("all_to_all", 16, "ip"),
                             ("barrier", 0, "oop"), ("barrier", 0, "ip"),
                             ("all_reduce", 4, "oop"), ("all_reduce", 4, "ip"),
                             ("all_reduce", 16, "oop"), ("all_reduce", 16, "ip")]
    assert len(T.cells(opts, n=8)) == 6       # all_to_all 16 B at n=8: skipped too


def _merged(lib, times, rounds):
    rows = [dict(R.make_row(lib=lib, op="all_reduce", size=64, count=16, dtype="float32",
                            redop="sum", root=-1, mode="oop", nproc=2, time_us=t, iters=5),
                 round=r) for t, r in zip(times, rounds)]
    return R.merge_rounds(rows)[0]


@pytest.mark.timeout(10)
def test_paired_ratio_pairs_the_rounds():
    # round 0 fast for both, round 1 slow for both: 2x and 1x; the medians (55 vs 60)
    # would say 1.09x
    cc, mpi = _merged("collcomm", [10.0, 100.0], [0, 1]), _merged("mpi", [20.0, 100.0], [0, 1])
    assert R.paired_ratio(cc, mpi) == pytest.approx(math.sqrt(2.0))
    assert R.compare_rows([cc, mpi], ["collcomm", "mpi"])[0]["ratios"]["mpi"] == \
        pytest.approx(math.sqrt(2.0))
    # three rounds: the middle ratio; rounds given out of order are put in order
    cc3 = _merged("collcomm", [100.0, 10.0, 10.0], [2, 0, 1])
    mpi3 = _merged("mpi", [30.0, 20.0, 100.0], [0, 1, 2])
    assert cc3["round_ids"] == [0, 1, 2]
    assert R.paired_ratio(cc3, mpi3) == pytest.approx(2.0)
    # a round only one library has is left out; rows without rounds: the two times
    assert R.paired_ratio(cc, _merged("mpi", [300.0], [1])) == pytest.approx(3.0)
    plain = {"time_us": 10.0}
    assert R.paired_ratio(plain, {"time_us": 25.0}) == pytest.approx(2.5)
    assert R.paired_ratio(plain, {"time_us": None}) is None


def _lib_thread(opts, lib, ran, stuck_at=None, release=None, gone=None):
    """A library with one rank, run as a thread: takes its turns, notes each in ``ran``;
    sets ``gone`` when it has left (as if its job had exited)."""
    def body():
        turns = T.RankTurns(opts, lib, 0)
        turns.ready()
        try:
            for i, (k, cell, rnd) in enumerate(turns.mine):
                turns.wait(k)
                ran.append((k, lib))
                if i == stuck_at:
                    release.wait(20)
                turns.done()
        except T.Stopped:
            ran.append(("stopped", lib))
        if gone is not None:
            gone.set()
    th = threading.Thread(target=body, daemon=True)
    th.start()
    return th


@pytest.mark.timeout(30)
def test_turns_go_in_order_and_a_stuck_library_is_passed_over(tmp_path):
    libs = ["collcomm", "mpi", "gloo"]
    opts = O.Options(nproc=2, ops=["all_reduce"], sizes=[8, 64, 512], modes=["oop"], rounds=2,
                     turns_path=str(tmp_path / "board"), turn_libs=libs)
    board = T.Board(opts.turns_path, 3, 2, create=True)
    ran: list = []
    release = threading.Event()
    threads = [_lib_thread(opts, "collcomm", ran), _lib_thread(opts, "gloo", ran),
               _lib_thread(opts, "mpi", ran, stuck_at=1, release=release)]
    seen, stopped = [], []

    def on_fail(i):                               # (the runner kills the job here)
        stopped.append((i, len(seen)))

    failed = T.run_turns(board, libs, opts, lambda i: True,
                         lambda k, total, label: seen.append(label), turn_timeout=0.5,
                         on_fail=on_fail)
    release.set()
    for th in threads:
        th.join(10)
    assert failed == {1}
    want = [(k, libs[t.lib]) for k, t in enumerate(T.schedule(3, 2, 3))]
    # mpi's second turn (global turn 3: cell 0, round 1, mpi first) hung: every later mpi
    # turn is skipped, the others go on in order
    mpi_turns = [k for k, lib in want if lib == "mpi"]
    expected = [x for x in want if x[1] != "mpi" or x[0] <= mpi_turns[1]]
    assert [x for x in ran if x[0] != "stopped"] == expected
    assert ("stopped", "mpi") in ran            # released late, it finds its turn passed
    assert seen[0] == "collcomm all_reduce 8 oop" and len(seen) == len(expected)
    assert stopped == [(1, 4)]                    # at once, not after the schedule
    board.close()


@pytest.mark.timeout(30)
def test_a_last_word_just_before_exiting_counts(tmp_path):
    """A library that reports its turn done and exits before the parent looks again: the
    parent reads what is in the pipe before it calls the library dead."""
    libs = ["collcomm", "mpi"]
    opts = O.Options(nproc=2, ops=["all_reduce"], sizes=[8, 64], modes=["oop"], rounds=1,
                     turns_path=str(tmp_path / "board"), turn_libs=libs)
    board = T.Board(opts.turns_path, 2, 2, create=True)
    ran: list = []
    gone = {0: threading.Event(), 1: threading.Event()}
    for i, name in enumerate(libs):
        _lib_thread(opts, name, ran, gone=gone[i])

    def alive(i):
        time.sleep(0.05)                          # (the parent looks late)
        return not gone[i].is_set()

    failed = T.run_turns(board, libs, opts, alive, lambda *a: None)
    assert failed == set() and [k for k, _ in ran] == [0, 1, 2, 3]
    board.close()


@pytest.mark.timeout(30)
def test_a_library_that_never_starts_is_skipped_and_collcomm_failing_stops_all(tmp_path):
    libs = ["collcomm", "mpi"]
    opts = O.Options(nproc=2, ops=["all_reduce"], sizes=[8, 64], modes=["oop"], rounds=1,
                     turns_path=str(tmp_path / "board"), turn_libs=libs)
    board = T.Board(opts.turns_path, 2, 2, create=True)
    ran: list = []
    th = _lib_thread(opts, "collcomm", ran)
    failed = T.run_turns(board, libs, opts, lambda i: i == 0, lambda *a: None)
    th.join(10)
    assert failed == {1} and ran == [(0, "collcomm"), (2, "collcomm")]
    board.close()
    # collcomm itself gone before it is ready: nothing is handed out at all
    opts.turns_path = str(tmp_path / "board2")
    board = T.Board(opts.turns_path, 2, 2, create=True)
    ran = []
    th = _lib_thread(opts, "mpi", ran)
    failed = T.run_turns(board, libs, opts, lambda i: i == 1, lambda *a: None)
    th.join(10)
    assert failed == {0} and ran == [("stopped", "mpi")]
    board.close()


@pytest.mark.timeout(90)
def test_a_peer_that_dies_is_noted_and_collcomm_rows_stay(monkeypatch):
    """The real collcomm job against a 'peer' that exits 7 at once: the run finishes, the
    note quotes the peer's exit and stderr, collcomm's rows carry both rounds."""
    real_start = J.start

    def fake_start(lib, opts, opts_path, out_path, tmp):
        if lib != "mpi":
            return real_start(lib, opts, opts_path, out_path, tmp)
        err = open(os.path.join(tmp, "fake.err"), "w+b")
        p = subprocess.Popen([sys.executable, "-c", "import sys; print('no MPI here', "
                              "file=sys.stderr); sys.exit(7)"], stderr=err,
                             start_new_session=True)
        return J.Job("mpi", [p], out_path, [err])

    monkeypatch.setattr(runner, "start", fake_start)
    monkeypatch.setattr(runner, "peer_unavailable", lambda lib: None)
    opts = O.Options(nproc=2, ops=["all_reduce"], sizes=[8, 64], modes=["oop"], rounds=2,
                     compare=["mpi"], iters=3, warmup=1, check=True)
    rows, notes = runner.bench(opts, err=open(os.devnull, "w"))
    assert notes[0].startswith("# collcomm here: "), notes      # (the machine: facts.py)
    assert notes[1:] == ["# mpi: skipped: mpi: exited 7: no MPI here"], notes
    assert {(r["lib"], r["size"], r["rounds"], r["wrong"]) for r in rows} == \
        {("collcomm", 8, 2, 0), ("collcomm", 64, 2, 0)}
    assert all(r["round_ids"] == [0, 1] for r in rows)


@pytest.mark.timeout(120)
def test_compare_in_turns_and_in_sweeps_with_mpi(tmp_path):
    """Both interleavings against the real Open MPI: the same cells, both rounds, results
    checked (0 wrong), the header says which interleaving ran."""
    pytest.importorskip("mpi4py")
    if J.mpiexec_path() is None:
        pytest.skip("no mpiexec")
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "COLLCOMM_STORE")}
    for how, words in (("size", "taking turns at each size"), ("sweep", "whole sweeps")):
        out = tmp_path / f"{how}.json"
        p = subprocess.run([sys.executable, "-m", "collcomm", "bench", "-n", "2", "--op",
                            "all_reduce,broadcast", "-b", "8", "-e", "512", "-f", "64",
                            "--iters", "3", "--warmup", "1", "--rounds", "2", "--compare", "mpi",
                            "--check", "--interleave", how, "--json", str(out)],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=55)
        assert p.returncode == 0, p.stderr
        assert words in p.stdout, p.stdout
        rows = json.loads(out.read_text())["rows"]
        assert sorted((r["lib"], r["op"], r["size"]) for r in rows) == sorted(
            (lib, op, size) for lib in ("collcomm", "mpi") for op in ("all_reduce", "broadcast")
            for size in (8, 512))
        assert all(r["round_ids"] == [0, 1] and r["wrong"] == 0 for r in rows), rows
        assert "skipped" not in p.stdout, p.stdout


@pytest.mark.timeout(60)
def test_stopping_a_collcomm_job_stops_its_ranks(tmp_path):
    """collcomm's ranks run in sessions of their own: Job.kill asks the launcher first
    (SIGTERM), which stops them; a Ctrl-C while waiting for a job stops it too."""
    psutil = pytest.importorskip("psutil")

    def job():
        p = subprocess.Popen([sys.executable, "-m", "collcomm", "run", "-n", "2", "python", "-c",
                              "import time; time.sleep(120)"], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 30
        while len(psutil.Process(p.pid).children()) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        ranks = psutil.Process(p.pid).children()
        assert len(ranks) == 2
        return J.Job("collcomm", [p], str(tmp_path / "x.json"), []), ranks

    j, ranks = job()
    j.kill()
    gone, alive = psutil.wait_procs(ranks, timeout=10)
    assert not alive and j.poll() is not None
    j, ranks = job()
    threading.Timer(0.5, os.kill, args=(os.getpid(), signal.SIGINT)).start()
    with pytest.raises(KeyboardInterrupt):
        j.wait(None)
    gone, alive = psutil.wait_procs(ranks, timeout=10)
    assert not alive and j.poll() is not None


@pytest.mark.timeout(20)
def test_a_waiting_rank_sleeps_and_leaves_when_the_parent_is_gone(tmp_path):
    """A rank waiting for its turn blocks in read() (no CPU: the library being timed has
    the machine to itself); one whose parent has gone stops waiting."""
    opts = O.Options(nproc=2, ops=["all_reduce"], sizes=[8], modes=["oop"], rounds=1,
                     turns_path=str(tmp_path / "board"), turn_libs=["collcomm", "mpi"],
                     turns_parent=os.getpid())
    board = T.Board(opts.turns_path, 2, 2, create=True)
    board.open_all()
    turns = T.RankTurns(opts, "mpi", 1)
    threading.Timer(1.0, board.go, args=(1, 1)).start()
    t0, c0 = time.monotonic(), time.thread_time()
    turns.wait(1)
    wall, cpu = time.monotonic() - t0, time.thread_time() - c0
    assert wall >= 0.9 and cpu < 0.05 * wall, (wall, cpu)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    turns.parent = dead.pid                  # (a pid that ran and is gone)
    t0 = time.monotonic()
    with pytest.raises(T.Stopped):
        turns.wait(3)
    assert time.monotonic() - t0 < 1.5 * T.CHECK_PARENT_S + 0.5
    board.close()
