"""The arena: one shared-memory segment that all ranks of a one-host group work in.

Layout (``n`` ranks, slot size ``C`` bytes, ``P`` = 2 phases; every word is in
:mod:`.arena_layout`):

* a header with 128 bytes per rank: its *arrival counter* and a few info words (the page
  offset its data sits at, a size it announces, the signature of the call it is in, ...);
* ``P × n`` slots of ``C + 4096`` bytes: slot (phase, rank) is written only by that rank.

:meth:`Arena.sync` is a counter barrier: a rank bumps its counter and waits until every
counter has reached it. Collectives alternate the phase they write in, so a rank may
overwrite its slot of phase p only after the next sync, by which time everybody has
finished reading the previous use of phase p. Waiting spins (20x less when the group has
more ranks than this process has CPUs), then yields, then blocks on a futex on the late
rank's counter (woken by its arrival; 1 ms at most per wait, so a lost wake-up costs no
more than polling; without futex, sleeps of 50 µs doubling to 1 ms); it checks the other ranks' pids every 100 ms (PeerLostError)
and names the ranks that never arrived when it times out. The segment is mapped with
MAP_POPULATE (no page faults later) and unlinked as soon as every rank has mapped it.
Where collcomm's native core is built (:mod:`collcomm.native`), the same barrier runs in
C (:attr:`Arena.native_core`): the same words and steps, the GIL released while it
waits, and these same checks (``_check``) called from it every 100 ms.

Cross-memory attach (CMA: reading a peer's buffer directly instead of staging it, probed
and timed when the arena is built) is the Arena's base class
:class:`~.arena_cma.CrossMemoryAttach`, in arena_cma.py with libc's bindings for it; what
a long wait checks (dead, departed, stopped ranks; the timeout) is its base class
:class:`~.arena_liveness.Liveness`.

Shared memory per group: ``P × n × (C + 4096)`` bytes plus one page per 64 ranks; with
the default ``C`` = 4 MiB (``COLLCOMM_SHM_SLOT``) that is 16 MiB for 2 ranks, 32 MiB for 4.
"""
from __future__ import annotations

import ctypes
import math
import mmap
import os
import time
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from .. import native
from ..errors import MismatchError, PeerLostError
from .arena_cma import CrossMemoryAttach
from .arena_liveness import Liveness
from .arena_layout import LEFT as LEFT_WORD
from .arena_layout import HOLD, LINE, PHASES, PROBE_MAGIC, WORDS
from .arena_layout import ALL_REDUCE_EXTRA, ONE_STEP_ALWAYS, pack_settings, unpack_settings
from .arena_layout import PHASE as PHASE_WORD
from .arena_layout import SETTINGS as SETTINGS_WORD
from .arena_layout import SIZE as SIZE_WORD
from .arena_layout import SLEEPERS as SLEEPERS_WORD
from .peer_process import cpus
from .shm import PAGE

SPIN, YIELD = 400, 100
#: With a CPU per rank, a wait goes on yielding until this far in before it sleeps on the
#: futex (COLLCOMM_POLL_US overrides; 0 with more ranks than CPUs, where a yielding rank
#: takes the CPU back from the rank it waits for). A sleeper's wake-up is slow on a VM
#: (50-150 µs when its CPU halted), and a late rank makes the others sleep too if they
#: poll for less, so every call then pays a wake-up. Measured (bench, 8 B - 2 KiB calls):
#: on a 16-core VM at n=4, 6 of 48 cells at 17-176 µs instead of 2-3 with 100 yields and
#: no window, 0 of 68 with it; on the 2-vCPU VM at n=2, 6 of 30 at 6-17 µs, 0 of 60.
#: Open MPI polls for as long as it waits. (BENCHMARKS.md, session 12.)
POLL_SECONDS = 1e-3
#: ... at most (the liveness and timeout checks run after the window)
POLL_MAX_US = 100_000
#: A wait that sleeps runs the rank's point-to-point progress this often (set_progress;
#: the native core's PROGRESS_NS): MPI's progress rule, a synchronous send to a rank that
#: posted the receive and went into a collective completes.
PROGRESS_SECONDS = 1e-3


class _TimeSpec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _futex_syscall() -> Any:
    """libc's syscall() for futex(2) on shared memory, or None (then waiters just sleep)."""
    import platform

    number = {"x86_64": 202, "aarch64": 98}.get(platform.machine())
    if number is None or os.environ.get("COLLCOMM_FUTEX", "1") == "0":
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).syscall
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_long
    return lambda addr, op, val, ts: fn(ctypes.c_long(number), ctypes.c_void_p(addr), ctypes.c_int(op),
                                        ctypes.c_int(val), ts, ctypes.c_void_p(0), ctypes.c_int(0))


_FUTEX = _futex_syscall()
FUTEX_WAIT, FUTEX_WAKE = 0, 1           # not the _PRIVATE ones: the word is shared between processes
_FUTEX_TIMEOUT = _TimeSpec(0, 1_000_000)  # 1 ms: a wake-up lost to store reordering costs no more


def poll_seconds(n: int, cores: int) -> float:
    """How long a wait of a group of ``n`` ranks on this host polls before it sleeps, this
    process having ``cores`` CPUs (:func:`cpus`)."""
    env = os.environ.get("COLLCOMM_POLL_US", "").strip()
    if env:
        try:
            us = float(env)
        except ValueError:
            us = math.nan
        if 0 <= us <= POLL_MAX_US:
            return us * 1e-6
        from .shm import warn_once
        warn_once("poll_us", f"COLLCOMM_POLL_US={env!r} is not a number of µs from 0 to "
                             f"{POLL_MAX_US}; ignored")
    return POLL_SECONDS if n <= cores else 0.0


def eager_rooted(n: int, cores: int) -> bool:
    """Whether a rank that needs nobody's data leaves a one-step broadcast or scatter
    without waiting for the others (the root; the receivers wait for the root alone), the
    full signature check settled by its next call (native/_arena_sync.c, enter):
    COLLCOMM_EAGER_ROOTED=1 always, 0 never, unset or ``auto`` when the group has more
    ranks than CPUs (there waiting for every rank costs context switches: an 8-byte
    broadcast at n=4 on 2 vCPUs took 9-26 µs against Open MPI's 1-6, whose roots do not
    wait). Ranks may differ in this: the steps in the arena are the same."""
    env = os.environ.get("COLLCOMM_EAGER_ROOTED", "auto").strip().lower()
    if env in ("0", "1"):
        return env == "1"
    if env not in ("", "auto"):
        from .shm import warn_once
        warn_once("eager_rooted", f"COLLCOMM_EAGER_ROOTED={env!r} is not 0, 1 or auto; auto used")
    return n > cores


def slot_bytes() -> int:
    return int(os.environ.get("COLLCOMM_SHM_SLOT", 4 << 20)) // PAGE * PAGE or PAGE


def arena_size(n: int, slot: int) -> int:
    header = (n * LINE + PAGE - 1) // PAGE * PAGE
    return header + PHASES * n * (slot + PAGE)


class Arena(CrossMemoryAttach, Liveness):
    """This rank's view of a group's arena (see module docstring)."""

    def __init__(self, mm: mmap.mmap, n: int, rank: int, slot: int, pids: Sequence[int],
                 ranks: Sequence[int], timeout: float) -> None:
        self.mm, self.n, self.rank, self.slot = mm, n, rank, slot
        self.pids, self.global_ranks, self.timeout = list(pids), list(ranks), timeout
        self._stopped_since: dict[int, float] = {}   # late rank -> when we saw it stopped
        self.view = memoryview(mm)
        self.words = self.view[: n * LINE].cast("Q")
        self.header = (n * LINE + PAGE - 1) // PAGE * PAGE
        self.bytes = np.frombuffer(mm, dtype=np.uint8)
        self.address = self.bytes.__array_interface__["data"][0]
        self._me = rank * WORDS   # this rank's first header word
        self._views: dict[tuple, np.ndarray] = {}
        self._probe_buf = np.full(1, PROBE_MAGIC, dtype=np.uint64)
        self.cma = False          # set by arena_setup.build(): peers can read our memory directly
        self.ag_vote_min = 0      # set by build(): see there
        self.cma_write = False    # set by build(): ... and write it (write_remote)
        #: set by build() when ``cma``: a byte read from a peer's memory costs this many
        #: memcpy'd bytes (the same on every rank; see _time_cma)
        self.cma_cost = 1.0
        #: set by build() (check_settings): the fewest CPUs any rank may run on (the same on
        #: every rank): n <= cores means a core per rank, so parallel copies run at once
        self.cores = cpus()
        #: set by build() (check_settings): the group's all_reduce_one_step bound
        self.all_reduce_extra = ALL_REDUCE_EXTRA if n <= self.cores else ONE_STEP_ALWAYS
        self.eager = False    # (check_settings sets it: eager_rooted of the agreed cores)
        self.lost: PeerLostError | None = None
        # more ranks than CPUs: a spinning rank steals the CPU the late rank needs
        self.spin = SPIN if n <= self.cores else SPIN // 20
        self.poll = poll_seconds(n, self.cores)
        self.put(SETTINGS_WORD, pack_settings(ALL_REDUCE_EXTRA, self.cores))   # check_settings
        #: the native core's view of this arena (collcomm.native), or None: Python only
        self.native_core: Any = native.attach(self)
        #: called every PROGRESS_SECONDS of a wait that sleeps (set_progress)
        self.progress: Callable[[], None] | None = None

    def set_progress(self, progress: Callable[[], None] | None) -> None:
        """Have this rank's waits that sleep call ``progress`` every PROGRESS_SECONDS (the
        rank's point-to-point progress: Engine.collective_progress), natively too."""
        self.progress = progress
        if self.native_core is not None:
            self.native_core.progress = progress

    # -- info words (word 0 is the counter) -------------------------------------------------
    def put(self, word: int, value: int) -> None:
        self.words[self.rank * WORDS + word] = value

    def get(self, rank: int, word: int) -> int:
        return int(self.words[rank * WORDS + word])

    # -- slots ------------------------------------------------------------------------------
    @property
    def phase(self) -> int:
        """The slot set (0 or 1) this rank's last call wrote: a header word, so the native
        core and the Python code flip the same one."""
        return self.words[self._me + PHASE_WORD]

    def next_phase(self) -> int:
        phase = self.words[self._me + PHASE_WORD] ^ 1
        self.words[self._me + PHASE_WORD] = phase
        return phase

    @property
    def count(self) -> int:
        """This rank's arrival counter (header word 0)."""
        return self.words[self._me]

    def slot_base(self, phase: int, rank: int) -> int:
        return self.header + (phase * self.n + rank) * (self.slot + PAGE)

    def slot_array(self, phase: int, rank: int, dtype: np.dtype, count: int, offset: int = 0) -> np.ndarray:
        """``count`` elements of ``dtype`` in slot (phase, rank), starting ``offset`` bytes in
        (views are cached: the same few shapes recur call after call)."""
        key = (phase, rank, dtype, count, offset)
        view = self._views.get(key)
        if view is None:
            if len(self._views) > 256:
                self._views.clear()
            start = self.slot_base(phase, rank) + offset
            view = self._views[key] = self.bytes[start:start + count * dtype.itemsize].view(dtype)
        return view

    # -- synchronisation ----------------------------------------------------------------------
    def sync(self) -> None:
        """Counter barrier over the group's ranks (in C when the native core is there)."""
        if self.native_core is not None:
            self.native_core.sync(self)
            return
        target = self._arrive()
        self._wait_for(range(self.n), target)

    def sync_last(self, phase: int) -> None:
        """The sync of a barrier whose rank arrives last (Python path; the native core's
        enter_last): wait for every other rank to reach the next counter value, then
        arrive, the SIZE word of ``phase`` saying so meanwhile (arena_layout.HOLD)."""
        target = self.words[self._me] + 1
        self.put(SIZE_WORD + phase, HOLD | target)
        self._wait_for((r for r in range(self.n) if r != self.rank), target)
        self._arrive()

    def _arrive(self) -> int:
        """Bump our counter, wake whoever sleeps on it; the value everybody must reach."""
        words, me = self.words, self._me
        target = words[me] + 1
        words[me] = target
        if words[me + SLEEPERS_WORD] and _FUTEX is not None:   # somebody sleeps on us: wake
            words[me + SLEEPERS_WORD] = 0
            _FUTEX(self.address + me * 8, FUTEX_WAKE, 0x7FFFFFFF, None)
        return target

    def _wait_for(self, ranks: Iterable[int], target: int) -> None:
        """Wait until the counters of ``ranks`` reach ``target``: spin, yield, then sleep on
        the futex of a late one, with the checks of a long wait every 100 ms."""
        words, stride = self.words, WORDS
        late = [r for r in ranks if words[r * stride] < target]
        if not late:
            return
        rounds = 0
        sleep = 50e-6
        start = time.monotonic()
        next_check, next_progress = start + 0.1, start + PROGRESS_SECONDS
        progress = self.progress
        while True:
            late = [r for r in late if words[r * stride] < target]
            if not late:
                return
            rounds += 1
            if rounds < self.spin:
                continue
            if rounds < self.spin + YIELD or time.monotonic() - start < self.poll:
                os.sched_yield()
                continue
            if _FUTEX is not None:
                self._sleep_on(late[0], target)
            else:
                time.sleep(sleep)
                sleep = min(sleep * 2, 1e-3)
            now = time.monotonic()
            if progress is not None and now >= next_progress:
                next_progress = now + PROGRESS_SECONDS
                progress()
            if now >= next_check:
                next_check = now + 0.1
                self._check(late, target, now - start)

    def check_settings(self) -> None:
        """After the sync that follows every rank's writing its settings word: the same
        ALL_REDUCE_EXTRA everywhere (else MismatchError on every rank), the fewest CPUs
        as ``cores``, and from both the group's all_reduce bound (the native core's too)."""
        words = [unpack_settings(self.get(r, SETTINGS_WORD)) for r in range(self.n)]
        extras = [extra for extra, _ in words]
        self.cores = min(c for _, c in words)
        self.all_reduce_extra = extras[0] if self.n <= self.cores else ONE_STEP_ALWAYS
        self.eager = eager_rooted(self.n, self.cores)
        if self.native_core is not None:
            self.native_core.all_reduce_extra = self.all_reduce_extra
            self.native_core.eager = self.eager
        if len(set(extras)) > 1:
            who = ", ".join(f"rank {g}: {x}" for g, x in zip(self.global_ranks, extras))
            raise MismatchError(
                f"rank {self.global_ranks[self.rank]}: COLLCOMM_ALL_REDUCE_EXTRA differs between "
                f"the group's ranks ({who}); set it alike on every rank (a rank reducing in one "
                "step where another takes two would desynchronize the group)")

    def _sleep_on(self, r: int, target: int) -> None:
        """Block (≤ 1 ms) until rank ``r`` bumps its counter: announce ourselves, re-check,
        then futex-wait on the counter's low 32 bits."""
        words, at = self.words, r * WORDS
        words[at + SLEEPERS_WORD] = 1
        seen = words[at]
        if seen < target:
            _FUTEX(self.address + at * 8, FUTEX_WAIT, seen & 0xFFFFFFFF, ctypes.byref(_FUTEX_TIMEOUT))

    def close(self) -> None:
        self.put(LEFT_WORD, 1)    # we leave cleanly: not a crash
        self._views.clear()
        try:
            self.words.release()
            self.view.release()
            self.mm.close()
        except (BufferError, ValueError):
            pass  # arrays still point into it: the mapping goes when they do

