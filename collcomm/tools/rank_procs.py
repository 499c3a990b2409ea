"""The ranks' processes for ``collcomm run``: start each in its own session, forward its
output line by line, notice it stopped (SIGSTOP), stop the whole job, clean up its
shared memory.

Each rank is a child in its own process group (``start_new_session``), so signalling the
group reaches whatever the rank started. One reader thread per pipe forwards whole lines,
prefixed ``[rank] ``, under one lock (ranks never interleave within a line) and keeps the
last ``STDERR_TAIL_LINES`` of stderr for the summary; one thread per rank records the exit
code and its exact time and wakes the launcher's watch loop. Stopping is SIGTERM (and
SIGCONT, so a stopped rank acts on it) to every group, SIGKILL after the grace period.
"""
from __future__ import annotations

import collections
import glob
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import BinaryIO, TextIO

from ..errors import InvalidArgumentError

__all__ = ["Output", "Rank", "check_stopped", "live_group_members", "process_state",
           "remove_shm", "shm_segments", "signal_group", "start_rank", "stop"]

STDERR_TAIL_LINES = 15
#: A rank seen stopped this long is named on stderr.
STOPPED_REPORT_S = 0.2
POLL_S = 0.05


@dataclass
class Rank:
    rank: int
    local_rank: int
    proc: subprocess.Popen[bytes]
    readers: list[threading.Thread] = field(default_factory=list)
    stderr_tail: collections.deque[str] = field(
        default_factory=lambda: collections.deque(maxlen=STDERR_TAIL_LINES))
    returncode: int | None = None
    exit_t: float | None = None
    signalled: bool = False
    stopped_since: float | None = None   # first seen stopped (still stopped, or when it died)
    stop_seen: float | None = None       # the current stop's first sighting
    stop_named: bool = False


class Output:
    """Writes whole lines to our stdout/stderr under one lock so ranks never interleave."""

    def __init__(self) -> None:
        self.lock = threading.Lock()

    def write(self, stream: TextIO, data: bytes) -> None:
        with self.lock:
            try:
                buffer = getattr(stream, "buffer", None)
                if buffer is not None:
                    buffer.write(data)
                    buffer.flush()
                else:  # a text-only stream (e.g. replaced by a test harness)
                    stream.write(data.decode("utf-8", "replace"))
                    stream.flush()
            except (OSError, ValueError):
                pass


def _pump(pipe: BinaryIO, out: TextIO, prefix: bytes, output: Output,
          tail: collections.deque[str] | None) -> None:
    """Forward ``pipe`` line by line to ``out`` until EOF. Every line written ends with a
    newline (an unterminated last line gets one), so no rank's line runs into another's."""
    try:
        for line in iter(pipe.readline, b""):
            if not line.endswith(b"\n"):
                line += b"\n"
            output.write(out, prefix + line)
            if tail is not None:
                tail.append(line.decode("utf-8", "replace").rstrip("\n"))
    except (OSError, ValueError):
        pass
    finally:
        pipe.close()


def start_rank(argv: list[str], local_rank: int, env: dict[str, str], prefix: bool,
                output: Output, wake: threading.Event) -> Rank:
    # rank 0 reads the launcher's standard input, as under mpiexec (`echo 10 | collcomm run
    # -n 4 prog.py`, a prompt answered at the terminal); the other ranks read nothing
    stdin = None if env.get("RANK") == "0" else subprocess.DEVNULL
    try:
        proc = subprocess.Popen(argv, env=env, stdin=stdin,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
    except OSError as exc:
        raise InvalidArgumentError(f"cannot start {argv[0]!r}: {exc}") from exc
    r = Rank(rank=int(env["RANK"]), local_rank=local_rank, proc=proc)
    tag = f"[{r.rank}] ".encode() if prefix else b""
    assert proc.stdout is not None and proc.stderr is not None
    for pipe, out, tail in ((proc.stdout, sys.stdout, None),
                            (proc.stderr, sys.stderr, r.stderr_tail)):
        t = threading.Thread(target=_pump, args=(pipe, out, tag, output, tail),
                             daemon=True, name=f"collcomm-run-pipe-{r.rank}")
        t.start()
        r.readers.append(t)

    def wait_exit() -> None:  # records the exit time exactly, whatever the polling does
        code = proc.wait()
        r.exit_t = time.monotonic()
        r.returncode = code
        wake.set()

    threading.Thread(target=wait_exit, daemon=True, name=f"collcomm-run-wait-{r.rank}").start()
    return r


# --------------------------------------------------------------------------- watching

def process_state(pid: int) -> str:
    """The state letter of ``/proc/<pid>/stat`` ('R', 'S', 'T' stopped, 'Z'...), '' if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            text = fh.read().decode("ascii", "replace")
    except OSError:
        return ""
    return text[text.rfind(")") + 2:].split(" ", 1)[0]


def check_stopped(r: Rank, now: float, output: Output) -> None:
    if r.returncode is not None:
        # A named rank that exited between two polls ran again first, unless SIGKILL ended it
        # while stopped: say it resumed, as if a poll had seen it running.
        if r.stop_named and r.returncode != -signal.SIGKILL:
            output.write(sys.stderr, f"collcomm run: rank {r.rank} (pid {r.proc.pid}) "
                                     "resumed\n".encode())
        r.stop_seen, r.stopped_since, r.stop_named = None, None, False
        return
    if process_state(r.proc.pid) == "T":
        if r.stop_seen is None:
            r.stop_seen = now
        if r.stopped_since is None:
            r.stopped_since = now
        if not r.stop_named and now - r.stop_seen >= STOPPED_REPORT_S:
            r.stop_named = True
            output.write(sys.stderr, (
                f"collcomm run: rank {r.rank} (pid {r.proc.pid}) is stopped (state T, e.g. "
                f"SIGSTOP): ranks waiting on it will time out; 'kill -CONT {r.proc.pid}' "
                "resumes it\n").encode())
    elif r.stop_seen is not None:
        if r.stop_named:
            output.write(sys.stderr, f"collcomm run: rank {r.rank} (pid {r.proc.pid}) "
                                     "resumed\n".encode())
        r.stop_seen, r.stopped_since, r.stop_named = None, None, False


# --------------------------------------------------------------------------- stopping

def signal_group(r: Rank, sig: int) -> None:
    try:
        os.killpg(r.proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def live_group_members(pgids: set[int]) -> set[int]:
    """Pids (not zombies) whose process group is one of ``pgids``; Linux /proc scan."""
    alive = set()
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat, "rb") as fh:
                text = fh.read().decode("ascii", "replace")
        except OSError:
            continue
        fields = text[text.rfind(")") + 2:].split()
        if len(fields) > 2 and fields[0] != "Z" and int(fields[2]) in pgids:
            alive.add(int(text.split(" ", 1)[0]))
    return alive


def stop(ranks: list[Rank], first_signal: int, grace: float) -> None:
    """Signal every rank's group (and wake stopped ones), SIGKILL what is left after ``grace``."""
    for r in ranks:
        if r.returncode is None:
            r.signalled = True
        signal_group(r, first_signal)
        signal_group(r, signal.SIGCONT)  # a stopped process acts on SIGTERM only when resumed
    deadline = time.monotonic() + grace
    pgids = {r.proc.pid for r in ranks}
    while time.monotonic() < deadline:
        if all(r.returncode is not None for r in ranks) and not live_group_members(pgids):
            break
        time.sleep(POLL_S)
    for r in ranks:
        if r.returncode is None:
            r.signalled = True
        signal_group(r, signal.SIGKILL)
    for r in ranks:
        try:
            r.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
    deadline = time.monotonic() + 1.0  # the exit threads record what wait() saw
    while any(r.returncode is None and r.proc.returncode is not None for r in ranks) and \
            time.monotonic() < deadline:
        time.sleep(0.005)


def shm_segments(job_id: str) -> list[str]:
    """The job's shared-memory files on this host."""
    return glob.glob(f"/dev/shm/collcomm-{job_id}-*")


def remove_shm(job_id: str) -> None:
    for path in shm_segments(job_id):
        try:
            os.unlink(path)
        except OSError:
            pass
