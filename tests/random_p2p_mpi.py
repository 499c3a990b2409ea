"""tests/random_p2p.py through ``collcomm.MPI``: the same rounds made as an mpi4py program
makes them, on ``COMM_WORLD`` and the ``Split`` communicators standing for the subgroups:
``Send`` / ``Ssend`` / ``Recv`` in order; ``Isend`` / ``Issend`` / ``Irecv`` (any-source
ones with ``MPI.ANY_SOURCE``) waited one by one with a ``Status`` in the drawn order, or
all with ``Request.Waitany`` (every third round) or ``Request.Waitall`` (every third,
the one after). Same checks and command line: ``python -m collcomm run -n N
tests/random_p2p_mpi.py SEED ROUNDS``."""
from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np

if __name__ == "__main__":      # (run by hand: the checkout's tests package)
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests.random_p2p import Message, Round, Traffic, drive


class MPITraffic(Traffic):
    """Traffic whose sides go through collcomm.MPI."""

    def __init__(self, groups: bool, comm: Any = None) -> None:
        """``comm``: the communicator standing for the world (COMM_WORLD by default)."""
        from collcomm import MPI
        self.MPI, world = MPI, MPI.COMM_WORLD if comm is None else comm
        self.rank, size = world.Get_rank(), world.Get_size()
        self.members = [list(range(size))]
        self.groups: list[Any] = [world]
        if groups and size >= 3:
            for ranks in (list(range(1, size)), list(range(0, size, 2))):
                sub = world.Split(0 if self.rank in ranks else MPI.UNDEFINED, self.rank)
                self.members.append(ranks)
                self.groups.append(sub)
        self.bad: list[str] = []

    def side(self, m: Message, blocking: bool) -> tuple[Any, np.ndarray]:
        MPI, comm, sending = self.MPI, self.groups[m.group], m.src == self.rank
        ranks = self.members[m.group]
        arr = m.data() if sending else np.zeros(m.count, m.dt)
        synchronous = m.local       # (the draw's spare bit: Ssend / Issend)
        if sending:
            dest = ranks.index(m.dst)
            if blocking:
                (comm.Ssend if synchronous else comm.Send)(arr, dest, m.tag)
                arr[...] = 1 if m.dt.kind == "b" else 99
                return None, arr
            return (comm.Issend if synchronous else comm.Isend)(arr, dest, m.tag), arr
        source = MPI.ANY_SOURCE if m.any_source else ranks.index(m.src)
        if blocking:
            comm.Recv(arr, source, m.tag)
            return None, arr
        return comm.Irecv(arr, source, m.tag), arr

    def start_round(self, rnd: Round) -> tuple[dict[int, Any], dict[int, np.ndarray]]:
        me = self.rank
        works: dict[int, Any] = {}
        arrays: dict[int, np.ndarray] = {}
        order = [m.index for m in rnd.messages] if not rnd.at_once else rnd.order[me]
        for i in order:
            m = rnd.messages[i]
            if me in (m.src, m.dst):
                blocking = not rnd.at_once and (m.send_blocking if m.src == me else m.recv_blocking)
                w, arrays[i] = self.side(m, blocking)
                if w is not None:
                    works[i] = w
        return works, arrays

    def finish_round(self, rnd: Round, number: int, works: dict[int, Any], arrays: dict[int, np.ndarray]) -> None:
        me = self.rank
        received_from: dict[int, int] = {}
        done = self._wait_all(works, rnd.waits[me], number)
        for i, status in done.items():
            m = rnd.messages[i]
            if m.src == me:
                arrays[i][...] = 1 if m.dt.kind == "b" else 99
            elif m.any_source:
                received_from[i] = self.members[m.group][status.Get_source()]
        self.check(rnd, number, arrays, received_from)

    def _wait_all(self, works: dict[int, Any], waits: list[int], number: int) -> dict[int, Any]:
        """Wait for ``works``; {message index: its Status}."""
        MPI = self.MPI
        ids = [i for i in waits if i in works]
        if number % 3 == 2:           # Waitany until none is left
            reqs, done = [works[i] for i in ids], {}
            for _ in ids:
                st = MPI.Status()
                k = MPI.Request.Waitany(reqs, st)
                done[ids[k]] = st
            return done
        if number % 3 == 0:
            statuses = [MPI.Status() for _ in ids]
            MPI.Request.Waitall([works[i] for i in ids], statuses)
            return dict(zip(ids, statuses))
        done = {}
        for i in ids:
            done[i] = MPI.Status()
            works[i].Wait(done[i])
        return done


def run(seed: int, rounds: int) -> list[str]:
    """random_p2p.run through collcomm.MPI."""
    from collcomm import MPI
    return drive(MPITraffic(os.environ.get("RANDOM_GROUPS") == "1"), seed, rounds, MPI.COMM_WORLD.Barrier)


if __name__ == "__main__":
    from tests.random_jobs import main
    main(run)
