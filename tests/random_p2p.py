"""Random point-to-point traffic checked message by message: the program
tests/test_random_p2p.py runs on every rank (``python -m collcomm run -n N
tests/random_p2p.py SEED ROUNDS`` by hand; options from ``RANDOM_*`` variables as in
tests/random_calls.py: ``RANDOM_GROUPS=1``, ``RANDOM_PYTHON_RANKS``).

Every rank draws the same rounds from one seed. A round is one to eight messages, each
with its sender and receiver, tag, dtype, a byte count near the sizes where the library
changes its way (inline in the ring, lent, read by CMA, past the pool), the world or a
subgroup holding both ranks, and peers named by global rank or by ``group_dst`` /
``group_src``. Two kinds of round:

* **in order**: every rank walks the messages in the drawn order and makes its side of
  each blocking (``send`` / ``recv``) or not (``isend`` / ``irecv``, waited at the end of
  the round in a drawn order). Deadlock-free by construction: a blocking call of message
  i waits only for the other side of message i, which that rank reaches once its own
  earlier steps are done.
* **all at once**: every rank starts its side of all the round's messages without
  waiting, in its own drawn order (messages of one sender, receiver, group and tag in
  the order drawn on both sides), some in one to three ``batch_isend_irecv`` calls and
  some one by one, receives from any source (``src=None``) where the round's messages on
  that receiver, group and tag all have one size, then waits for them in a drawn order.

Tags are the round's own (3 per round), so a rank that runs ahead cannot feed a later
round's message to an earlier round's any-source receive. Checks: every receive gets its
message's bytes (an any-source one: one of its candidates, each taken once, in each
sender's order, with the source it reports); a send's array is overwritten as soon as its
own wait returns (a receiver still reading it would get the junk).
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

if __name__ == "__main__":      # (run by hand: the checkout's tests package)
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests.random_calls import BOUNDS, DTYPES

TAGS_PER_ROUND = 3


@dataclass
class Message:
    index: int         # in its round: the first element of its data (any-source receives)
    src: int           # global ranks
    dst: int
    tag: int
    dt: np.dtype
    count: int
    group: int         # index into Traffic.groups
    local: bool        # peers given as group_dst / group_src
    send_blocking: bool
    recv_blocking: bool
    any_source: bool   # received with src=None

    def data(self) -> np.ndarray:
        x = (np.arange(self.count) * 3 + self.index * 11) % 97
        if self.count:
            x[0] = self.index
        return (x % 2 if self.dt.kind == "b" else x).astype(self.dt)

    def __str__(self) -> str:
        return (f"message {self.index} {self.src}->{self.dst} tag={self.tag} {self.dt} count={self.count} "
                f"group={self.group}{' any-source' if self.any_source else ''}")


@dataclass
class Round:
    at_once: bool
    messages: list[Message]
    order: dict[int, list[int]]     # per rank: the order it starts its sides (all at once)
    waits: dict[int, list[int]]     # per rank: the order it waits for its non-blocking sides
    batches: dict[int, list[int]]   # per rank: how many of its first sides go in each batch


def draw_round(rng: np.random.Generator, number: int, world: int, members: list[list[int]]) -> Round:
    at_once = bool(rng.integers(2))
    messages: list[Message] = []
    for i in range(int(rng.integers(1, 9))):
        src = int(rng.integers(world))
        dst = int((src + rng.integers(1, world)) % world)
        fits = [g for g, ranks in enumerate(members) if src in ranks and dst in ranks]
        dt = np.dtype(DTYPES[rng.integers(len(DTYPES))])
        count = max(0, BOUNDS[rng.integers(len(BOUNDS))] // dt.itemsize + int(rng.integers(-2, 3)))
        m = Message(i, src, dst, number * TAGS_PER_ROUND + int(rng.integers(TAGS_PER_ROUND)), dt, count,
                    fits[rng.integers(len(fits))], bool(rng.integers(2)), not at_once and bool(rng.integers(2)),
                    not at_once and bool(rng.integers(2)), at_once and bool(rng.integers(2)))
        same = [p for p in messages if (p.dst, p.group, p.tag) == (m.dst, m.group, m.tag)]
        if m.any_source or any(p.any_source for p in same):
            # one size on a receiver's group and tag, data told apart by their first element
            first = same[0] if same else m
            dt, count = first.dt if first.dt.kind not in "bc" else np.dtype(np.int32), max(first.count, 1)
            for p in same + [m]:
                p.dt, p.count, p.any_source = dt, count, True
        messages.append(m)
    order, waits, batches = {}, {}, {}
    for r in range(world):
        mine = [m.index for m in messages if r in (m.src, m.dst)]
        order[r] = _same_pair_in_order([mine[k] for k in rng.permutation(len(mine))], messages)
        waits[r] = [mine[k] for k in rng.permutation(len(mine))]
        cuts = sorted(int(x) for x in rng.integers(0, len(mine) + 1, size=int(rng.integers(0, 4))))
        batches[r] = [b - a for a, b in zip([0] + cuts, cuts)]
    return Round(at_once, messages, order, waits, batches)


def _same_pair_in_order(order: list[int], messages: list[Message]) -> list[int]:
    """``order`` with the messages of one sender, receiver, group and tag put back in their
    drawn order (the places they hold kept): both sides then post them in one order, as
    a program must for messages the library cannot tell apart."""
    out = list(order)
    key = lambda i: (messages[i].src, messages[i].dst, messages[i].group, messages[i].tag)   # noqa: E731
    for k in {key(i) for i in order}:
        places = [j for j, i in enumerate(order) if key(i) == k]
        for j, i in zip(places, sorted(order[j] for j in places)):
            out[j] = i
    return out


class Traffic:
    """This rank's side of the drawn rounds (see the module doc)."""

    def __init__(self, groups: bool, dist: Any = None) -> None:
        """``dist``: the module whose point-to-point calls it makes (collcomm;
        torch.distributed for random_p2p_torch, whose calls have the same names)."""
        if dist is None:
            import collcomm as dist
        self.dist = dist
        self.rank, world = dist.get_rank(), dist.get_world_size()
        self.members = [list(range(world))]
        self.groups: list[Any] = [None]
        if groups and world >= 3:
            for ranks in (list(range(1, world)), list(range(0, world, 2))):
                self.members.append(ranks)
                self.groups.append(dist.new_group(ranks))
        self.bad: list[str] = []

    def peer(self, m: Message, sending: bool) -> dict[str, Any]:
        """The peer keyword of ``m``'s side here (none for an any-source receive)."""
        other = m.dst if sending else m.src
        if not sending and m.any_source:
            return {}
        if m.local:
            return {("group_dst" if sending else "group_src"): self.members[m.group].index(other)}
        return {("dst" if sending else "src"): other}

    def side(self, m: Message, blocking: bool) -> tuple[Any, np.ndarray]:
        """Make this rank's side of ``m``: (its Work or None, its array)."""
        d, grp, sending = self.dist, self.groups[m.group], m.src == self.rank
        arr = m.data() if sending else np.zeros(m.count, m.dt)
        fn = (d.send if sending else d.recv) if blocking else (d.isend if sending else d.irecv)
        out = fn(self.wrap(arr), group=grp, tag=m.tag, **self.peer(m, sending))
        if blocking:
            if sending:
                arr[...] = 1 if m.dt.kind == "b" else 99
            return None, arr
        return out, arr

    def wrap(self, arr: np.ndarray) -> Any:
        """What the calls get for ``arr`` (the array itself; a tensor sharing its memory)."""
        return arr

    def source_of(self, work: Any, m: Message) -> int:
        """The global rank an any-source receive of ``m`` reports."""
        return int(work.source_rank())

    def batches(self, ops: list[tuple[int, Any]], rnd: Round) -> list[list[tuple[int, Any]]]:
        """The ``batch_isend_irecv`` calls that start ``ops`` ((message index, P2POp)):
        one (collcomm takes any mix of groups in one batch)."""
        return [ops] if ops else []

    def op(self, m: Message, arr: np.ndarray) -> Any:
        d, sending = self.dist, m.src == self.rank
        other = m.dst if sending else m.src
        if m.local:
            return d.P2POp(d.isend if sending else d.irecv, self.wrap(arr), group=self.groups[m.group],
                           tag=m.tag, group_peer=self.members[m.group].index(other))
        return d.P2POp(d.isend if sending else d.irecv, self.wrap(arr), other, self.groups[m.group], m.tag)

    def run_round(self, rnd: Round, number: int) -> None:
        self.finish_round(rnd, number, *self.start_round(rnd))

    def start_round(self, rnd: Round) -> tuple[dict[int, Any], dict[int, np.ndarray]]:
        """Make this rank's sides of ``rnd`` (blocking ones to their end); (the works of
        the others by message index, every side's array by message index)."""
        me = self.rank
        works: dict[int, Any] = {}
        arrays: dict[int, np.ndarray] = {}
        if not rnd.at_once:
            for m in rnd.messages:
                if me in (m.src, m.dst):
                    blocking = m.send_blocking if m.src == me else m.recv_blocking
                    w, arrays[m.index] = self.side(m, blocking)
                    if not blocking:
                        works[m.index] = w
        else:
            order = list(rnd.order[me])
            for size in rnd.batches[me]:
                part, order = order[:size], order[size:]
                ops = []
                for i in part:
                    m = rnd.messages[i]
                    if m.dst == me and m.any_source:      # (a P2POp needs a peer)
                        works[i], arrays[i] = self.side(m, False)
                        continue
                    arrays[i] = m.data() if m.src == me else np.zeros(m.count, m.dt)
                    ops.append((i, self.op(m, arrays[i])))
                for batch in self.batches(ops, rnd):
                    for (i, _), w in zip(batch, self.dist.batch_isend_irecv([p for _, p in batch])):
                        works[i] = w
            for i in order:
                works[i], arrays[i] = self.side(rnd.messages[i], False)
        return works, arrays

    def finish_round(self, rnd: Round, number: int, works: dict[int, Any], arrays: dict[int, np.ndarray]) -> None:
        """Wait for ``works`` in the drawn order, then check the round."""
        me = self.rank
        received_from: dict[int, int] = {}
        for i in rnd.waits[me]:
            if i in works:
                m = rnd.messages[i]
                works[i].wait()
                if m.src == me:
                    arrays[i][...] = 1 if m.dt.kind == "b" else 99
                elif m.any_source:
                    received_from[i] = self.source_of(works[i], m)
        self.check(rnd, number, arrays, received_from)

    def check(self, rnd: Round, number: int, arrays: dict[int, np.ndarray], received_from: dict[int, int]) -> None:
        me = self.rank
        # in the order this rank posted its receives; a sender's in the order it sent
        posted = rnd.order[me] if rnd.at_once else [m.index for m in rnd.messages]
        mine = [rnd.messages[i] for i in posted if rnd.messages[i].dst == me]
        taken: set[int] = set()
        last_from: dict[tuple[int, int, int], int] = {}   # (sender, group, tag): its last send taken
        for m in mine:
            got = arrays[m.index]
            what = f"rank {me} round {number} {m}"
            if not m.any_source:
                if not np.array_equal(got, m.data()):
                    self.bad.append(f"{what}: wrong at {np.nonzero(got != m.data())[0][:4].tolist()}")
                continue
            cands = [p for p in rnd.messages if (p.dst, p.group, p.tag) == (m.dst, m.group, m.tag)]
            which = next((p for p in cands if p.index not in taken and np.array_equal(got, p.data())), None)
            if which is None:
                self.bad.append(f"{what}: got none of its candidates (first {got[:3].tolist()})")
                continue
            taken.add(which.index)
            src = received_from.get(m.index)
            if src != which.src:
                self.bad.append(f"{what}: got message {which.index} from {which.src}, reported source {src}")
            sent, pair = rnd.order[which.src].index(which.index), (which.src, m.group, m.tag)
            if last_from.get(pair, -1) > sent:
                self.bad.append(f"{what}: message {which.index} from {which.src} overtook one sent before it")
            last_from[pair] = sent


def drive(traffic: Traffic, seed: int, rounds: int, barrier: Callable[[], Any]) -> list[str]:
    """``rounds`` rounds from ``seed`` made by ``traffic``, then ``barrier()``; what differed."""
    rng = np.random.default_rng(seed)
    for number in range(rounds):
        traffic.run_round(draw_round(rng, number, len(traffic.members[0]), traffic.members), number)
    barrier()
    return traffic.bad


def run(seed: int, rounds: int) -> list[str]:
    """This rank's part of ``rounds`` random rounds from ``seed`` (the job already
    initialised); what differed."""
    import collcomm as dist
    return drive(Traffic(os.environ.get("RANDOM_GROUPS") == "1"), seed, rounds, dist.barrier)


if __name__ == "__main__":
    from tests.random_jobs import main
    main(run)
