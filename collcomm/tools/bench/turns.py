"""Per-size turns: every library measured at each size next to the others, not a whole
sweep apart (``collcomm bench --compare``, the default ``--interleave size``).

Why: the machines this is measured on change speed under a running job. On the 2-vCPU VM
of BENCHMARKS.md one CPU hands 256 KiB of freshly written memory to the other in ~20, ~50
or ~200 µs depending on where the host has placed the two vCPUs at that moment, and the
placement moves every few seconds. Alternating whole sweeps, a library whose sweep met a
slow stretch looked 3-5x slower at some sizes than its rival (one run's rounds of the same
cell: 257, 1331, 1368 µs), and ratios built from such pairs flipped from run to run.

How: every library's job is started once and stays up. A *cell* is one (op, size, mode)
of the sweep; the schedule is, for each cell, ``rounds`` rounds, and in each round every
library once, the order rotating from round to round (A B, B A, ...). The parent hands
the turns out through named pipes in the run's temporary folder (a *board*): one per rank
of each library, on which the rank blocks in read() until its turn's number arrives, and
one the libraries' rank 0 write to (ready, turn done) and the parent blocks on. Nobody
polls: a waiting job costs the one being timed nothing (a first version looked at a shared
word every 0.5 ms from every waiting rank, and those 2,000 wake-ups a second per rank,
landing on the CPUs the timed ranks spun on, made 1-µs calls read 6-9 µs). A turn's ranks
measure the cell exactly as a whole sweep would. The parent starts turn 0 only when every
job is ready (torch's import and the libraries' start-up do not run beside a measurement),
skips the turns of a library whose job died or overran, and stops everything when
collcomm's fails.
"""
from __future__ import annotations

import os
import select
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from .options import Options, count_for, format_size

#: the turn number that stops every waiting rank (the schedule is over, or given up)
STOP = 1 << 62
_WORD = struct.Struct("<q")
_PAIR = struct.Struct("<qq")
#: how often the parent, blocked on the pipe, looks whether a job died
CHECK_S = 0.2
#: a woken rank spins this long before its turn (see RankTurns.wait)
SPREAD_S = 0.01
#: how often a waiting rank looks whether the parent still runs
CHECK_PARENT_S = 1.0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


class Stopped(Exception):
    """The parent stopped the schedule (or skipped this library's turn): leave quietly."""


@dataclass(frozen=True)
class Turn:
    cell: int      # index into cells()
    round: int
    lib: int       # index into the libraries list


def cells(opts: Options, n: int | None = None) -> list[tuple[str, int, str]]:
    """The sweep's (op, size, mode) cells in order at ``n`` ranks (``opts.nproc``), without
    those with no element per rank (every library skips them alike)."""
    n = opts.nproc if n is None else n
    itemsize = np.dtype(opts.dtype).itemsize
    out = []
    for op in opts.ops:
        for size in ([0] if op == "barrier" else opts.sizes):
            if op != "barrier" and count_for(op, size, itemsize, n)[1] == 0:
                continue
            out.extend((op, size, mode) for mode in opts.modes)
    return out


def schedule(ncells: int, rounds: int, nlibs: int) -> list[Turn]:
    """Cell by cell; in round r the libraries start at index r mod nlibs."""
    return [Turn(c, r, (r + k) % nlibs) for c in range(ncells) for r in range(rounds)
            for k in range(nlibs)]


class Board:
    """The pipes of one run in folder ``path``: ``go.<lib>.<rank>`` (parent -> rank: the
    number of the turn now on, or STOP) and ``back`` (rank 0 -> parent: (lib, -1) ready,
    (lib, count) turns done; 16-byte writes, atomic whoever writes). Every end is opened
    read-write, so no open() blocks and no write fails for want of a reader."""

    def __init__(self, path: str, nlibs: int, nproc: int, create: bool = False) -> None:
        self.path, self.nlibs, self.nproc = path, nlibs, nproc
        if create:
            os.makedirs(path, exist_ok=True)
            for name in self._names():
                os.mkfifo(os.path.join(path, name), 0o600)
        self._fds: dict[str, int] = {}

    def _names(self) -> list[str]:
        return ["back"] + [f"go.{i}.{r}" for i in range(self.nlibs) for r in range(self.nproc)]

    def _fd(self, name: str) -> int:
        fd = self._fds.get(name)
        if fd is None:
            fd = self._fds[name] = os.open(os.path.join(self.path, name), os.O_RDWR)
        return fd

    # -- the ranks' side
    def wait_go(self, lib: int, rank: int, parent: int | None = None) -> int:
        """Block until the parent names a turn for this rank; that number (STOP when
        process ``parent`` is gone: nobody is left to name one)."""
        data = b""
        fd = self._fd(f"go.{lib}.{rank}")
        while len(data) < 8:
            if not select.select([fd], [], [], CHECK_PARENT_S)[0]:
                if parent is not None and not _alive(parent):
                    return STOP
                continue
            data += os.read(fd, 8 - len(data))
        return int(_WORD.unpack(data)[0])

    def tell(self, lib: int, value: int) -> None:
        os.write(self._fd("back"), _PAIR.pack(lib, value))

    # -- the parent's side
    def open_all(self) -> None:
        for name in self._names():
            fd = self._fd(name)
            if name != "back":
                os.set_blocking(fd, False)

    def go(self, lib: int, turn: int) -> None:
        for r in range(self.nproc):
            try:
                os.write(self._fd(f"go.{lib}.{r}"), _WORD.pack(turn))
            except BlockingIOError:     # a pipe nobody reads any more (its job died)
                pass

    def stop(self) -> None:
        for lib in range(self.nlibs):
            self.go(lib, STOP)

    def hear(self, timeout: float) -> tuple[int, int] | None:
        """The next (lib, value) a rank 0 wrote, or None after ``timeout`` s."""
        fd = self._fd("back")
        if not select.select([fd], [], [], timeout)[0]:
            return None
        data = os.read(fd, _PAIR.size)
        while len(data) < _PAIR.size:
            data += os.read(fd, _PAIR.size - len(data))
        lib, value = _PAIR.unpack(data)
        return int(lib), int(value)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


class RankTurns:
    """A rank's side: ``wait(k)`` blocks until global turn ``k`` is on (Stopped when the
    parent stopped or passed it); ``done()`` after each turn (rank 0 tells the parent)."""

    def __init__(self, opts: Options, lib: str, rank: int) -> None:
        self.lib = opts.turn_libs.index(lib)
        self.rank = rank
        self.parent = opts.turns_parent
        assert opts.turns_path is not None
        self.board = Board(opts.turns_path, len(opts.turn_libs), opts.nproc)
        self.table = cells(opts)
        turns = schedule(len(self.table), opts.rounds, len(opts.turn_libs))
        #: (global turn index, cell, round) of this library's turns, in order
        self.mine = [(k, t.cell, t.round) for k, t in enumerate(turns) if t.lib == self.lib]
        self.count = 0

    def ready(self) -> None:
        if self.rank == 0:
            self.board.tell(self.lib, -1)

    def wait(self, k: int) -> None:
        """Then spin SPREAD_S: a pipe's reader is woken onto its writer's CPU (the kernel
        takes the writer for one about to sleep), so the ranks of a turn all wake on the
        parent's CPU; two of them spinning there are spread over the idle CPUs by the
        scheduler within a few ms. Unspread, two collcomm ranks stayed on one CPU through
        whole cells (their waits hand over at once to a rank on the same CPU): 6-9 µs
        calls instead of 1 in a third of the rounds on the 2-vCPU VM (Open MPI binds its
        ranks to cores and was not touched)."""
        now = self.board.wait_go(self.lib, self.rank, self.parent)
        if now != k:
            raise Stopped(f"turn {k} not given (got {now})")
        end = time.perf_counter() + SPREAD_S
        while time.perf_counter() < end:
            pass

    def done(self) -> None:
        self.count += 1
        if self.rank == 0:
            self.board.tell(self.lib, self.count)


def run_turns(board: Board, libs: Sequence[str], opts: Options, alive: Callable[[int], bool],
              on_turn: Callable[[int, int, str], None], ready_timeout: float = 300.0,
              turn_timeout: float = 1800.0, essential: int = 0,
              on_fail: Callable[[int], None] | None = None) -> set[int]:
    """The parent's side: wait until every live job is ready, then hand out the schedule.
    ``alive(i)``: library i's job still runs; ``on_turn(done, total, label)`` reports
    progress; ``on_fail(i)`` is called as soon as library i has failed (died, or never
    became ready / finished a turn in time: a hung job would otherwise go on loading the
    CPUs the others are timed on; the runner stops it there). Returns the failed
    libraries; their turns are skipped, and once library ``essential`` (collcomm) has
    failed nothing more is handed out; the essential library's turns have no time
    limit (its calls have their own). Stops every rank at the end either way."""
    failed: set[int] = set()
    ready: set[int] = set()
    done = [0] * len(libs)

    def fail(i: int) -> None:
        if i not in failed:
            failed.add(i)
            if on_fail is not None:
                on_fail(i)

    def listen(timeout: float) -> bool:
        heard = board.hear(timeout)
        if heard is None:
            return False
        lib, value = heard
        if value < 0:
            ready.add(lib)
        else:
            done[lib] = max(done[lib], value)
        return True

    board.open_all()
    try:
        deadline = time.monotonic() + ready_timeout
        while True:
            pending = [i for i in range(len(libs)) if i not in failed and i not in ready]
            for i in pending:
                if not alive(i):
                    fail(i)
            pending = [i for i in pending if i not in failed]
            if not pending or essential in failed:
                break
            if time.monotonic() > deadline:
                for i in pending:
                    fail(i)
                break
            listen(CHECK_S)
        table = cells(opts)
        turns = schedule(len(table), opts.rounds, len(libs))
        counts = [0] * len(libs)
        for k, t in enumerate(turns):
            if essential in failed:
                break
            if t.lib in failed:
                continue
            op, size, mode = table[t.cell]
            on_turn(k, len(turns), f"{libs[t.lib]} {op} {format_size(size)} {mode}")
            board.go(t.lib, k)
            counts[t.lib] += 1
            deadline = None if t.lib == essential else time.monotonic() + turn_timeout
            while done[t.lib] < counts[t.lib]:
                if not alive(t.lib) or (deadline is not None and time.monotonic() > deadline):
                    while done[t.lib] < counts[t.lib] and listen(0):
                        pass    # (its last word may have come just before it exited)
                    if done[t.lib] < counts[t.lib]:
                        fail(t.lib)
                    break
                listen(CHECK_S if deadline is None
                       else min(CHECK_S, max(0.0, deadline - time.monotonic())))
    finally:
        board.stop()
    return failed
