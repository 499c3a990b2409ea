"""tests/random_p2p.py through ``torch.distributed`` on the collcomm backend: the same
rounds, the messages torch tensors sharing the checked arrays' memory (``send`` /
``recv`` / ``isend`` / ``irecv`` / ``batch_isend_irecv`` with ``P2POp``, ``src=None`` for
any source, subgroups from ``new_group``, peers by global or group rank). Same checks and
command line: ``python -m collcomm run -n N tests/random_p2p_torch.py SEED ROUNDS``."""
from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np

if __name__ == "__main__":      # (run by hand: the checkout's tests package)
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests.random_jobs import in_torch_job, main
from tests.random_p2p import Message, Round, Traffic, drive


class TorchTraffic(Traffic):
    """Traffic whose sides go through torch.distributed."""

    def __init__(self, groups: bool) -> None:
        import torch
        import torch.distributed as td
        super().__init__(groups, td)
        self.torch = torch

    def wrap(self, arr: np.ndarray) -> Any:
        return self.torch.from_numpy(arr)

    def batches(self, ops: list[tuple[int, Any]], rnd: Round) -> list[list[tuple[int, Any]]]:
        """One batch per group, in the order of each group's first op (torch wants one
        group in a batch)."""
        by_group: dict[int, list[tuple[int, Any]]] = {}
        for i, p in ops:
            by_group.setdefault(rnd.messages[i].group, []).append((i, p))
        return list(by_group.values())

    def source_of(self, work: Any, m: Message) -> int:
        return self.members[m.group][int(work.source_rank())]   # (a rank of the work's group)


def run(seed: int, rounds: int) -> list[str]:
    """random_p2p.run through torch.distributed (the backend initialised here)."""
    return in_torch_job(lambda td: drive(TorchTraffic(os.environ.get("RANDOM_GROUPS") == "1"), seed, rounds,
                                         td.barrier))


if __name__ == "__main__":
    main(run, init=False)
