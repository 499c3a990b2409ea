"""The parent side of ``collcomm bench``: launch the jobs, interleave the libraries, print.

:func:`bench` returns the merged rows (testable); :func:`main` prints them. Inside an
already launched job (``RANK`` and ``WORLD_SIZE`` set) the sweep runs in place and rank 0
prints.
"""
from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any, TextIO

from .jobs import KILL_GRACE_S, Job, LaunchFailed, peer_unavailable, start
from .facts import notes_from as facts_notes
from .options import Options
from .report import format_compare, format_latency, format_table, merge_rounds, write_json
from .turns import Board, run_turns
from .worker import write_progress

PEER_TIMEOUT_S = 1800.0

__all__ = ["LaunchFailed", "bench", "in_job", "main", "render"]


def in_job() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


@contextlib.contextmanager
def _environ(extra: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class ProgressBar:
    """Draws the progress file (written by rank 0, or by the turns' parent) as one ``\\r``
    line on a tty stderr."""

    def __init__(self, path: str, stream: TextIO, enabled: bool) -> None:
        self.path, self.stream, self.enabled = path, stream, enabled
        self.label = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, label: str) -> None:
        self.label = label
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        if self.enabled:
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(0.2):
            try:
                with open(self.path) as fh:
                    done, total, *what = fh.read().split()
            except (OSError, ValueError):
                continue
            frac = int(done) / max(1, int(total))
            bar = "#" * int(frac * 30)
            self.stream.write(f"\r[{bar:<30}] {self.label} {done}/{total} {' '.join(what)[:30]:<30}")
            self.stream.flush()

    def write(self, done: int, total: int, label: str) -> None:
        """Report progress from this process (the ranks' ``Progress`` does it from theirs)."""
        write_progress(self.path, done, total, label)

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            self.stream.write("\r" + " " * 100 + "\r")
            self.stream.flush()


def bench(opts: Options, err: TextIO | None = None) -> tuple[list[dict[str, Any]], list[str]]:
    """Run the sweep (and the peers, interleaved); return (merged rows, skip/failure notes)."""
    err = err if err is not None else sys.stderr
    notes: list[str] = []
    libs = ["collcomm"]
    for lib in opts.compare:
        reason = peer_unavailable(lib)
        if reason:
            notes.append(f"# {lib}: skipped: {reason}")
        else:
            libs.append(lib)
    with tempfile.TemporaryDirectory(prefix="collcomm-bench-") as tmp:
        bar = ProgressBar(os.path.join(tmp, "progress"), err, err.isatty())
        if len(libs) > 1 and opts.interleave == "size":
            rows = _in_turns(opts, libs, tmp, bar, notes)
        else:
            rows = _in_sweeps(opts, libs, tmp, bar, notes, err)
    merged = merge_rounds(rows)
    return merged, facts_notes(rows) + notes


def _options_file(opts: Options, tmp: str, **changes: Any) -> str:
    worker_opts = Options.from_json(opts.to_json())
    for k, v in changes.items():
        setattr(worker_opts, k, v)
    path = os.path.join(tmp, "options.json")
    with open(path, "w") as fh:
        fh.write(worker_opts.to_json())
    return path


def _finished(job: Job, timeout: float | None) -> list[dict[str, Any]]:
    """Wait for ``job`` (stopping it if interrupted); its rows, or LaunchFailed saying why
    there are none."""
    try:
        code = job.wait(timeout)
        if code != 0:
            raise LaunchFailed(job.failure(code))
        return job.rows()
    finally:
        job.close()


def _timeout(lib: str) -> float | None:
    """How long a job may run: collcomm's as long as it takes (its calls have timeouts of
    their own, and a long sweep is what was asked for), a peer's PEER_TIMEOUT_S."""
    return None if lib == "collcomm" else PEER_TIMEOUT_S


def _in_sweeps(opts: Options, libs: list[str], tmp: str, bar: ProgressBar,
               notes: list[str], err: TextIO) -> list[dict[str, Any]]:
    """--interleave sweep (and a single library): one job per library and round, whole
    sweeps alternated (collcomm, mpi, gloo, collcomm, ...)."""
    opts_path = _options_file(opts, tmp, progress_path=bar.path)
    rows: list[dict[str, Any]] = []
    failed: set[str] = set()
    for rnd in range(opts.rounds):
        for lib in libs:
            if lib in failed:
                continue
            label = f"{lib} round {rnd + 1}/{opts.rounds}" if opts.rounds > 1 else lib
            t0 = time.monotonic()
            bar.start(label)
            try:
                got = _finished(start(lib, opts, opts_path, os.path.join(tmp, f"{lib}-{rnd}.json"),
                                      tmp), _timeout(lib))
            except LaunchFailed as exc:
                if lib == "collcomm":
                    raise
                failed.add(lib)
                notes.append(f"# {lib}: skipped: {exc}")
                continue
            finally:
                bar.stop()
            for r in got:
                r["round"] = rnd
            rows.extend(got)
            if opts.rounds > 1 or len(libs) > 1:
                print(f"# bench: {label}: {time.monotonic() - t0:.1f} s", file=err, flush=True)
    return rows


def _in_turns(opts: Options, libs: list[str], tmp: str, bar: ProgressBar,
              notes: list[str]) -> list[dict[str, Any]]:
    """--interleave size: every library's job up at once, taking turns at every size
    (turns.py); a peer that fails is noted and its turns skipped, collcomm's failure stops
    the run."""
    board_path = os.path.join(tmp, "turns")
    board = Board(board_path, len(libs), opts.nproc, create=True)
    opts_path = _options_file(opts, tmp, turns_path=board_path, turn_libs=libs,
                              turns_parent=os.getpid())
    jobs: list[Job] = []
    try:
        for lib in libs:
            jobs.append(start(lib, opts, opts_path, os.path.join(tmp, f"{lib}.json"), tmp))
        bar.start("turns")

        def on_turn(k: int, total: int, label: str) -> None:
            bar.write(k, total, label)

        failed = run_turns(board, libs, opts, lambda i: jobs[i].poll() is None, on_turn,
                           turn_timeout=PEER_TIMEOUT_S, on_fail=lambda i: jobs[i].kill())
        bar.stop()
        rows: list[dict[str, Any]] = []
        for i, job in enumerate(jobs):
            try:
                got = _finished(job, _timeout(job.lib))
                if i in failed:
                    raise LaunchFailed(f"{job.lib}: stopped (no turn done in time)")
            except LaunchFailed as exc:
                if job.lib == "collcomm":
                    raise
                notes.append(f"# {job.lib}: skipped: {exc}")
                continue
            rows.extend(got)
        return rows
    finally:
        bar.stop()
        try:        # (told to stop, a job between turns leaves by itself, its library cleanly)
            for job in jobs:
                job.settle(KILL_GRACE_S)
        finally:
            for job in jobs:
                job.kill()
                job.close()
            board.close()


def render(opts: Options, rows: list[dict[str, Any]], notes: list[str]) -> str:
    libs = ["collcomm"] + [lib for lib in opts.compare if any(r["lib"] == lib for r in rows)]
    head = (f"# collcomm bench: n={rows[0]['nproc'] if rows else opts.nproc} ops={','.join(opts.ops)} "
            f"dtype={opts.dtype} redop={opts.redop} iters<={opts.iters} warmup={opts.warmup} "
            f"alloc={opts.alloc} offset={'any' if opts.offset is None else opts.offset}"
            + (f" skew={opts.skew}" if opts.skew else "")
            + (" (peers only: collcomm.empty places collcomm's)" if opts.alloc == "shared" else "") + (f" algo={opts.algo}" if opts.algo else "")
            + (f" transport={opts.transport}" if opts.transport else ""))
    parts = [head]
    if opts.latency:
        parts.append(format_latency(rows))
    elif len(libs) > 1:
        parts.append(format_compare(rows, libs, opts.rounds, opts.interleave))
    else:
        parts.append(format_table([r for r in rows if r["lib"] == "collcomm"]))
    parts.extend(notes)
    return "\n".join(parts)


def finish(opts: Options, rows: list[dict[str, Any]], notes: list[str], out: TextIO) -> None:
    print(render(opts, rows, notes), file=out, flush=True)
    if opts.json_path:
        import datetime
        import platform

        meta = dict(options={k: v for k, v in vars(opts).items() if k != "progress_path"},
                    host=platform.node(), cpus=os.cpu_count(),
                    date=datetime.datetime.now().isoformat(timespec="seconds"), notes=notes)
        write_json(opts.json_path, rows, meta)
    if opts.plot_path:
        from .plot import plot_busbw

        msg = plot_busbw(rows, opts.plot_path)
        if msg:
            print(msg, file=sys.stderr)


def main(opts: Options, out: TextIO | None = None) -> int:
    out = out if out is not None else sys.stdout
    if in_job():
        from .worker import run_in_job

        if opts.compare:
            print("collcomm bench: --compare launches its own jobs; ignored inside a launched "
                  "job", file=sys.stderr)
        rows = run_in_job(opts)
        if int(os.environ.get("RANK", "0")) == 0:
            opts.compare = []
            finish(opts, merge_rounds(rows), facts_notes(rows), out)
        return 0
    try:
        rows, notes = bench(opts)
    except LaunchFailed as exc:
        print(f"collcomm bench: error: {exc}", file=sys.stderr)
        return 1
    finish(opts, rows, notes, out)
    return 0
