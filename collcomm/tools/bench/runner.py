"""The parent side of ``collcomm bench``: launch the jobs, interleave the libraries, print.

:func:`bench` returns the merged rows (testable); :func:`main` prints them. Inside an
already launched job (``RANK`` and ``WORLD_SIZE`` set) the sweep runs in place and rank 0
prints.
"""
from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any, TextIO

from .options import Options, collcomm_env
from .report import format_compare, format_latency, format_table, merge_rounds, write_json

PEER_TIMEOUT_S = 1800.0


class LaunchFailed(RuntimeError):
    pass


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


def mpiexec_path() -> str | None:
    for cand in (os.path.join(sys.prefix, "bin", "mpiexec"),
                 os.path.join(os.path.dirname(sys.executable), "mpiexec")):
        if os.path.exists(cand):
            return cand
    return shutil.which("mpiexec")


def peer_unavailable(lib: str) -> str | None:
    """None if ``lib`` can run here, else the one-line reason it is skipped."""
    if lib == "mpi":
        if importlib.util.find_spec("mpi4py") is None:
            return "mpi4py is not installed (pip install 'collcomm[bench]')"
        if mpiexec_path() is None:
            return "mpiexec not found (pip install 'collcomm[bench]' provides Open MPI)"
        return None
    if lib in ("gloo", "cc-torch"):
        if importlib.util.find_spec("torch") is None:
            return "torch is not installed (pip install 'collcomm[torch]')"
        return None
    if lib == "cc-mpi":
        return None if importlib.util.find_spec("collcomm.MPI") else "collcomm.MPI is missing"
    return f"unknown peer {lib!r}"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _read_rows(path: str, lib: str) -> list[dict[str, Any]]:
    import json

    try:
        with open(path) as fh:
            return list(json.load(fh))
    except (OSError, ValueError) as exc:
        raise LaunchFailed(f"{lib}: no results ({exc})") from None


def _tail(text: str, lines: int = 6) -> str:
    return " | ".join(text.strip().splitlines()[-lines:])


def _wait_procs(procs: list[subprocess.Popen[bytes]], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    try:
        for p in procs:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
    finally:
        for p in procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def run_collcomm(opts: Options, opts_path: str, out_path: str) -> list[dict[str, Any]]:
    from ..launcher import LaunchConfig, launch

    cfg = LaunchConfig(nproc=opts.nproc, program="collcomm.tools.bench.worker",
                       args=[opts_path, out_path], module=True, prefix=False)
    with _environ(collcomm_env(opts)):
        code = launch(cfg)
    if code != 0:
        raise LaunchFailed(f"collcomm ranks failed (exit code {code})")
    return _read_rows(out_path, "collcomm")


def run_mpi(opts: Options, opts_path: str, out_path: str) -> list[dict[str, Any]]:
    mpiexec = mpiexec_path()
    assert mpiexec is not None
    cmd = [mpiexec, "--allow-run-as-root", "--oversubscribe", "-n", str(opts.nproc),
           sys.executable, "-m", "collcomm.tools.bench.peers", "mpi", opts_path, out_path]
    env = dict(os.environ)
    env.setdefault("OMPI_MCA_rmaps_base_oversubscribe", "1")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, env=env, start_new_session=True)
    try:
        _, err = proc.communicate(timeout=PEER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise LaunchFailed("mpi: timed out") from None
    if proc.returncode != 0:
        raise LaunchFailed(f"mpi: mpiexec exited {proc.returncode}: "
                           f"{_tail(err.decode('utf-8', 'replace'))}")
    return _read_rows(out_path, "mpi")


def run_gloo(opts: Options, opts_path: str, out_path: str) -> list[dict[str, Any]]:
    port = _free_port()
    procs: list[subprocess.Popen[bytes]] = []
    errs: list[str] = []
    with tempfile.TemporaryDirectory(prefix="collcomm-bench-gloo-") as tmp:
        files = []
        for rank in range(opts.nproc):
            env = dict(os.environ)
            env.update(RANK=str(rank), WORLD_SIZE=str(opts.nproc), LOCAL_RANK=str(rank),
                       LOCAL_WORLD_SIZE=str(opts.nproc), MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(port))
            fh = open(os.path.join(tmp, f"err{rank}"), "w+b")
            files.append(fh)
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "collcomm.tools.bench.peers", "gloo", opts_path, out_path],
                stdout=subprocess.DEVNULL, stderr=fh, stdin=subprocess.DEVNULL, env=env,
                start_new_session=True))
        try:
            _wait_procs(procs, PEER_TIMEOUT_S)
        finally:
            for fh in files:
                fh.seek(0)
                errs.append(fh.read().decode("utf-8", "replace"))
                fh.close()
    bad = [(i, p.returncode) for i, p in enumerate(procs) if p.returncode != 0]
    if bad:
        i, code = bad[0]
        raise LaunchFailed(f"gloo: rank {i} exited {code}: {_tail(errs[i])}")
    return _read_rows(out_path, "gloo")


def run_front_end(lib: str) -> Any:
    """A runner for one of collcomm's other front ends (``--api``): the peer sweep of
    peers.py on collcomm, launched like the functional API's."""
    def run(opts: Options, opts_path: str, out_path: str) -> list[dict[str, Any]]:
        from ..launcher import LaunchConfig, launch

        cfg = LaunchConfig(nproc=opts.nproc, program="collcomm.tools.bench.peers",
                           args=[lib, opts_path, out_path], module=True, prefix=False)
        with _environ(collcomm_env(opts)):
            code = launch(cfg)
        if code != 0:
            raise LaunchFailed(f"{lib} ranks failed (exit code {code})")
        return _read_rows(out_path, lib)
    return run


_RUNNERS = {"collcomm": run_collcomm, "mpi": run_mpi, "gloo": run_gloo,
            "cc-mpi": run_front_end("cc-mpi"), "cc-torch": run_front_end("cc-torch")}


class ProgressBar:
    """Draws the ranks' progress file as one ``\\r`` line on a tty stderr."""

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
    rows: list[dict[str, Any]] = []
    failed: set[str] = set()
    with tempfile.TemporaryDirectory(prefix="collcomm-bench-") as tmp:
        bar = ProgressBar(os.path.join(tmp, "progress"), err, err.isatty())
        opts_path = os.path.join(tmp, "options.json")
        worker_opts = Options.from_json(opts.to_json())
        worker_opts.progress_path = bar.path
        with open(opts_path, "w") as fh:
            fh.write(worker_opts.to_json())
        for rnd in range(opts.rounds):
            for lib in libs:
                if lib in failed:
                    continue
                out_path = os.path.join(tmp, f"{lib}-{rnd}.json")
                label = f"{lib} round {rnd + 1}/{opts.rounds}" if opts.rounds > 1 else lib
                t0 = time.monotonic()
                bar.start(label)
                try:
                    got = _RUNNERS[lib](opts, opts_path, out_path)
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
    merged = merge_rounds(rows)
    return merged, notes


def render(opts: Options, rows: list[dict[str, Any]], notes: list[str]) -> str:
    libs = ["collcomm"] + [lib for lib in opts.compare if any(r["lib"] == lib for r in rows)]
    head = (f"# collcomm bench: n={rows[0]['nproc'] if rows else opts.nproc} ops={','.join(opts.ops)} "
            f"dtype={opts.dtype} redop={opts.redop} iters<={opts.iters} warmup={opts.warmup} "
            f"alloc={opts.alloc}" + (f" algo={opts.algo}" if opts.algo else "")
            + (f" transport={opts.transport}" if opts.transport else ""))
    parts = [head]
    if opts.latency:
        parts.append(format_latency(rows))
    elif len(libs) > 1:
        parts.append(format_compare(rows, libs, opts.rounds))
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
            finish(opts, merge_rounds(rows), [], out)
        return 0
    try:
        rows, notes = bench(opts)
    except LaunchFailed as exc:
        print(f"collcomm bench: error: {exc}", file=sys.stderr)
        return 1
    finish(opts, rows, notes, out)
    return 0
