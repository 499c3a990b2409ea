"""Random traffic from several threads of every rank at once, as an mpi4py program under
``MPI.THREAD_MULTIPLE`` (which collcomm.MPI grants) makes it: every thread has its own
communicator (``COMM_WORLD.Dup()``, made in the same order on every rank) and runs the
steps of tests/random_overlap.py on it (rounds of messages and collectives, overlapping),
each thread from its own seed, all threads of a rank at the same time. What one thread's
calls may not do is disturb another's: match its messages, take its slots in a shared
arena, hold a lock it waits for, or leave it behind in a collective.

``python -m collcomm run -n N tests/random_threads.py SEED STEPS`` by hand;
``RANDOM_THREADS`` (default 2) threads a rank; the ``RANDOM_*`` options of
tests/random_overlap.py as there (subgroups are ``Split`` from each thread's
communicator).
"""
from __future__ import annotations

import os
import sys
import threading
from typing import Any

if __name__ == "__main__":      # (run by hand: the checkout's tests package)
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests.random_calls import Options
from tests.random_calls_mpi import MPI_CALLS, MPICaller
from tests.random_overlap import drive
from tests.random_p2p_mpi import MPITraffic

#: how long a thread may take before the rank reports it stuck (the job's own timeout,
#: COLLCOMM_TIMEOUT, ends a real hang before this)
JOIN_SECONDS = 300.0


def run(seed: int, steps: int) -> list[str]:
    """This rank's part: ``RANDOM_THREADS`` threads, thread t from seed ``seed * 100 + t``
    on its own communicator; what differed, every thread's."""
    from collcomm import MPI
    world = MPI.COMM_WORLD
    threads = int(os.environ.get("RANDOM_THREADS", "2"))
    groups = os.environ.get("RANDOM_GROUPS") == "1"
    comms = [world.Dup() for _ in range(threads)]
    results: list[list[str]] = [[] for _ in range(threads)]

    def body(t: int) -> None:
        comm = comms[t]
        try:
            caller = MPICaller(Options.from_env(comm.Get_rank()), comm)
            traffic = MPITraffic(groups, comm)
            results[t] = drive(traffic, caller, MPI_CALLS, seed * 100 + t, steps, comm.Barrier)
        except BaseException as exc:  # noqa: BLE001 - reported as this thread's failure
            results[t] = [f"rank {world.Get_rank()} thread {t}: {type(exc).__name__}: {exc}"]

    workers = [threading.Thread(target=body, args=(t,), name=f"random-{t}", daemon=True)
               for t in range(threads)]
    for w in workers:
        w.start()
    for t, w in enumerate(workers):
        w.join(JOIN_SECONDS)
        if w.is_alive():
            results[t] = [f"rank {world.Get_rank()} thread {t}: still running after {JOIN_SECONDS:g} s"]
    for c in comms:
        c.Free()
    return [bad for r in results for bad in r]


if __name__ == "__main__":
    from tests.random_jobs import main
    main(run)
