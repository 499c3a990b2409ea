"""Random point-to-point traffic overlapping random collectives: the program
tests/test_random_overlap.py runs on every rank (``python -m collcomm run -n N
tests/random_overlap.py SEED STEPS`` by hand; ``RANDOM_FRONT=mpi`` or ``torch`` for the
other front ends, the ``RANDOM_*`` options of tests/random_calls.py and
tests/random_p2p.py as there).

Every step draws a round of messages (tests/random_p2p.py) and one to three collective
calls (tests/random_calls.py), and where the calls go: before the round starts, between
its start and its waits, or after. So collectives run while sends and receives of the
same ranks are outstanding (posted, not yet waited), as a program overlapping a halo
exchange with an all_reduce does, and asynchronous collectives (``RANDOM_ASYNC_RANKS``)
are still pending on their group's worker while the round's messages go. Blocking sides
of an in-order round end before the collectives; a blocking send whose receiver posted
its receive and then went into a collective must still end (the receiver is inside a
call of the library, which MPI requires to make progress).

The round's tags start at 6: the collective calls' own sendrecv uses tag 0 (collcomm,
torch) or 5 (collcomm.MPI). Every message and every call is checked as in the two
programs; what differs is returned, one line each.
"""
from __future__ import annotations

import os
import sys
from typing import Any, Callable

import numpy as np

if __name__ == "__main__":      # (run by hand: the checkout's tests package)
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests.random_calls import CALLS, Caller, Options, draw
from tests.random_p2p import Traffic, draw_round

#: the first round's number in the tags' sense (tags 0-5 are the calls' own)
FIRST_ROUND = 2
BEFORE, BETWEEN, AFTER = range(3)


def drive(traffic: Traffic, caller: Caller, calls: list[str], seed: int, steps: int,
          barrier: Callable[[], Any]) -> list[str]:
    """``steps`` steps from ``seed`` (see the module doc); what differed, both sides'."""
    rng = np.random.default_rng(seed)
    world = len(traffic.members[0])
    names = [c for c in calls if c not in caller.opts.skip]
    for step in range(steps):
        rnd = draw_round(rng, step + FIRST_ROUND, world, traffic.members)
        drawn = [draw(rng, world, names, len(caller.groups)) for _ in range(int(rng.integers(1, 4)))]
        where = int(rng.integers(3))
        if where == BEFORE:
            for k, c in enumerate(drawn):
                caller.run(c, step * 4 + k)
        started = traffic.start_round(rnd)
        if where == BETWEEN:
            for k, c in enumerate(drawn):
                caller.run(c, step * 4 + k)
        traffic.finish_round(rnd, step, *started)
        if where == AFTER:
            for k, c in enumerate(drawn):
                caller.run(c, step * 4 + k)
    caller.settle(False)
    barrier()
    return traffic.bad + caller.bad


def _groups_env() -> bool:
    return os.environ.get("RANDOM_GROUPS") == "1"


def run(seed: int, steps: int) -> list[str]:
    """This rank's part of ``steps`` steps from ``seed`` through the front end
    ``RANDOM_FRONT`` names (collcomm's functional API by default)."""
    front = os.environ.get("RANDOM_FRONT", "")
    if front == "mpi":
        from collcomm import MPI
        from tests.random_calls_mpi import MPI_CALLS, MPICaller
        from tests.random_p2p_mpi import MPITraffic
        mpi_caller = MPICaller(Options.from_env(MPI.COMM_WORLD.Get_rank()))
        return drive(MPITraffic(_groups_env()), mpi_caller, MPI_CALLS, seed, steps, MPI.COMM_WORLD.Barrier)
    if front == "torch":
        from tests.random_calls_torch import TORCH_CALLS, TorchCaller
        from tests.random_jobs import in_torch_job
        from tests.random_p2p_torch import TorchTraffic

        def body(td: Any) -> list[str]:
            caller = TorchCaller(Options.from_env(td.get_rank()))
            return drive(_sharing(TorchTraffic(False), caller), caller, TORCH_CALLS, seed, steps, td.barrier)
        return in_torch_job(body)
    import collcomm as dist
    caller = Caller(Options.from_env(dist.get_rank()))
    return drive(_sharing(Traffic(False), caller), caller, CALLS, seed, steps, dist.barrier)


def _sharing(traffic: Traffic, caller: Caller) -> Traffic:
    """``traffic`` on ``caller``'s groups (the same ranks in the same order as its own would
    be: one set of subgroups for both)."""
    traffic.members, traffic.groups = caller.members, caller.groups
    return traffic


if __name__ == "__main__":
    from tests.random_jobs import main
    main(run, init=os.environ.get("RANDOM_FRONT") != "torch")
