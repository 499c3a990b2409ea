"""The zygote of the test ranks: one Python process per pytest worker, numpy and the
standard modules collcomm uses already imported, that forks each rank tests/harness.py
asks for instead of the harness starting a fresh interpreter (which spent ~0.3 s of CPU
on those imports alone, per rank: about a quarter of the suite's time on the 2-core CI
machine, whose cores the suite keeps busy).

A forked rank gets what a fresh ``python -m tests.rank_main DIR`` gets, but for the
modules already imported: its own process group (set from both sides of the fork, so the
harness can kill the group as soon as it has the pid), the job's environment in place of
the zygote's, stdout and stderr into its log, stdin from /dev/null, the repository as its
working directory, numpy's global random state reseeded (``random`` reseeds itself at a
fork), the signal handlers at their defaults. Jobs whose environment could change how an
interpreter or numpy starts (:func:`startup_env`: PYTHON*, LD_*, OMP_*, OPENBLAS_*, ...)
are started fresh by the harness instead, as are all jobs when COLLCOMM_TEST_ZYGOTE=0.

Protocol, over the zygote's stdin and stdout (pickled frames after a 4-byte length): the
harness sends ``(tmp, rank, env, log)``, the zygote answers the child's pid (0: it
refuses, the harness starts the rank fresh). When a child exits the zygote writes its exit
code (Popen's ``returncode``: negative for a signal) into ``tmp/exit-RANK``, where the
harness reads it, and only then reaps it; the harness signals the child through a pidfd
(:class:`Forked`), so neither can reach a reused pid. The zygote exits when its stdin
closes (its pytest worker is done or gone), killing any child still running.
"""
from __future__ import annotations

import ctypes
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import threading
import time
import traceback
from typing import Any

#: Variables read when an interpreter or numpy (OpenBLAS) starts: a job that sets one of
#: them differently from the zygote's own start needs a fresh process.
STARTUP_PREFIXES = ("PYTHON", "LD_", "OMP_", "OPENBLAS_", "MKL_", "NPY_", "NUMPY_", "GOTO",
                    "MALLOC_", "GLIBC_", "TORCH", "PYTORCH", "KMP_", "GOMP_", "CUDA", "LANG",
                    "LC_", "TZ", "OPENSSL_")
#: What a rank imports besides collcomm and the tests (measured with ``sys.modules``), and
#: numpy.random (shared state a fork must reseed: tests/test_harness_zygote.py checks it).
PRELOAD = ("numpy", "numpy.random", "array", "base64", "copy", "dataclasses", "faulthandler",
           "fcntl", "glob", "hashlib", "hmac", "json", "locale", "logging", "mmap", "secrets",
           "selectors", "socket", "string", "subprocess")
_LEN = struct.Struct("<I")
#: How long the harness waits for the zygote's answer (its first one: numpy or torch
#: imported on a loaded machine) before it starts the rank fresh.
REPLY_SECONDS = 120.0
#: A forked rank's exit code when its zygote died before it could tell it.
UNKNOWN_EXIT = 254


def startup_env(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(STARTUP_PREFIXES)}


def read_frame(fd: int) -> Any:
    """One pickled frame from ``fd``; None at its end."""
    head = _read_exactly(fd, _LEN.size)
    if head is None:
        return None
    body = _read_exactly(fd, _LEN.unpack(head)[0])
    return None if body is None else pickle.loads(body)


def write_frame(fd: int, value: Any) -> None:
    body = pickle.dumps(value)
    data = _LEN.pack(len(body)) + body
    while data:
        data = data[os.write(fd, data):]


def _read_exactly(fd: int, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        chunk = os.read(fd, n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def _child(tmp: str, rank: int, env: dict[str, str], log: str, wake: tuple[int, int]) -> None:
    """The forked rank: becomes what a fresh one would be, then runs tests.rank_main."""
    code = 1
    try:
        os.setpgid(0, 0)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in wake:
            os.close(fd)
        out = os.open(log, os.O_WRONLY | os.O_APPEND)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(out)
        os.close(null)
        os.chdir(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        ctypes.CDLL(None).clearenv()   # (also what C code set in the zygote's environment)
        os.environ.clear()
        os.environ.update(env)
        sys.argv = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "rank_main.py"), tmp]
        import numpy as np

        np.random.seed()
        from tests.rank_main import main

        code = main(tmp)      # (it ends the process itself)
    except BaseException:  # noqa: BLE001 - the rank's log has it; the harness sees the code
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _reap(children: dict[int, str]) -> None:
    """Write each exited child's code to its exit file, then reap it (in that order: its
    pid stays taken until the harness can know it exited)."""
    while children:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if info is None or info.si_pid == 0:
            return
        code = info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
        path = children.pop(info.si_pid, None)
        if path is not None:
            try:
                with open(path + ".tmp", "w") as f:
                    f.write(str(code))
                os.replace(path + ".tmp", path)
            except OSError:
                pass          # the job's folder is gone: the harness gave up on it
        os.waitpid(info.si_pid, 0)


def serve(extra: list[str]) -> None:
    """Import what every rank imports and the ``extra`` modules (``torch`` for the torch
    jobs: 3.4 s of CPU per rank; a zygote of its own, as a few of collcomm's checks look
    for torch in ``sys.modules``), then fork ranks as asked until stdin closes. A fork
    is refused (pid 0: the harness starts the rank fresh) when a preloaded library has
    started a thread, which a forked child would lack."""
    import importlib

    for name in (*PRELOAD, *extra):
        importlib.import_module(name)
    wake = os.pipe()
    for fd in wake:
        os.set_blocking(fd, False)
    signal.set_wakeup_fd(wake[1])
    signal.signal(signal.SIGCHLD, lambda *_: None)   # (the wake-up fd breaks the select)
    children: dict[int, str] = {}
    try:
        while True:
            ready, _, _ = select.select([0, wake[0]], [], [])
            if wake[0] in ready:
                try:
                    while os.read(wake[0], 512):
                        pass
                except BlockingIOError:
                    pass
                _reap(children)
            if 0 not in ready:
                continue
            request = read_frame(0)
            if request is None:
                return
            tmp, rank, env, log = request
            if len(os.listdir("/proc/self/task")) != 1:
                write_frame(1, 0)
                continue
            pid = os.fork()
            if pid == 0:
                _child(tmp, rank, env, log, wake)
            try:
                os.setpgid(pid, pid)
            except OSError:
                pass      # (the child did it first, or is gone already: its exit tells)
            children[pid] = os.path.join(tmp, f"exit-{rank}")
            write_frame(1, pid)
            _reap(children)
    finally:
        for pid in children:
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass


# ---------------------------------------------------------------------- the harness's side

def _readable(fd: int, seconds: float) -> bool:
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(seconds * 1000))


def _pidfd_works() -> bool:
    try:
        os.close(os.pidfd_open(os.getpid()))
    except (OSError, AttributeError):
        return False
    return True


_HAS_PIDFD = _pidfd_works()


class Forked:
    """What the harness uses of ``subprocess.Popen``, for a rank the zygote forked. Its
    exit code comes from its exit file; its signals go through a pidfd (never to a
    reused pid). Should the zygote die without writing the file, a rank whose pidfd says
    it exited has code UNKNOWN_EXIT."""

    def __init__(self, pid: int, exit_path: str, zygote: subprocess.Popen) -> None:
        self.pid, self.args = pid, ["tests.rank_main (forked)"]
        self._exit_path, self._zygote = exit_path, zygote
        self.returncode: int | None = None
        try:
            self._pidfd: int | None = os.pidfd_open(pid)
        except ProcessLookupError:
            self._pidfd = None    # (gone already: its exit file tells)

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                with open(self._exit_path) as f:
                    self.returncode = int(f.read())
            except (FileNotFoundError, ValueError):
                if self._zygote.poll() is not None and not self._running():
                    self.returncode = UNKNOWN_EXIT
            if self.returncode is not None:
                self._close()
        return self.returncode

    def _running(self) -> bool:
        return self._pidfd is not None and not _readable(self._pidfd, 0.0)

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            time.sleep(0.005)
        return self.returncode  # type: ignore[return-value]

    def send_signal(self, sig: int) -> None:
        if self.poll() is None and self._pidfd is not None:
            try:
                signal.pidfd_send_signal(self._pidfd, sig)
            except ProcessLookupError:
                pass

    def _close(self) -> None:
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None

    __del__ = _close


class Zygote:
    """A zygote of this pytest worker, started at its first use (see the module docstring),
    ``preload`` imported in it besides numpy, with the harness's environment (no job's
    own variables): jobs whose start-up variables differ from it start fresh."""

    def __init__(self, preload: tuple[str, ...] = ()) -> None:
        self.preload = preload
        self._proc: subprocess.Popen | None = None
        self._startup: dict[str, str] = {}
        self._lock = threading.Lock()

    def fork(self, tmp: str, rank: int, env: dict[str, str], log: str,
             plain: dict[str, str]) -> Forked | None:
        """The rank forked, or None: the harness starts it fresh (a job whose environment
        ``env`` differs where it matters at start-up from ``plain``, the harness's own
        without any job's variables, which a zygote starts with; the zygote off, refusing
        or failed; no pidfds here)."""
        if (os.environ.get("COLLCOMM_TEST_ZYGOTE", "1") == "0" or env.get("OPENBLAS_NUM_THREADS") != "1"
                or not _HAS_PIDFD):
            return None
        with self._lock:
            if self._proc is not None and self._proc.poll() is not None:
                self.stop()           # it died: the next one
            if self._proc is None:
                self._start(plain)
            if startup_env(env) != self._startup:
                return None
            proc = self._proc
            assert proc is not None and proc.stdin is not None and proc.stdout is not None
            try:
                write_frame(proc.stdin.fileno(), (tmp, rank, env, log))
                ready = _readable(proc.stdout.fileno(), REPLY_SECONDS)
                pid = read_frame(proc.stdout.fileno()) if ready else None
            except OSError:
                pid = None
            except BaseException:     # (a pytest timeout, Ctrl-C: the pipe is out of step)
                self.stop()
                raise
            if pid is None:
                self.stop()           # gone or stuck: the next job starts another
                return None
            if pid == 0:
                return None           # refused
            return Forked(pid, os.path.join(tmp, f"exit-{rank}"), proc)

    def _start(self, env: dict[str, str]) -> None:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        self._proc = subprocess.Popen([sys.executable, "-m", "tests.rank_zygote", *self.preload], env=env,
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=root,
                                      start_new_session=True)
        self._startup = startup_env(env)

    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def stop(self) -> None:
        """End the zygote (it kills any rank of its own still running)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                pipe.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    serve(sys.argv[1:])
