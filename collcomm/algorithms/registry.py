"""The algorithm registry and the rule that picks one per call.

``ALGORITHMS[collective][family]`` is the function implementing ``collective`` with
``family``. :func:`select` picks, in order of precedence:

1. an explicit ``algorithm`` name (anything but ``"auto"``);
2. the environment variable ``COLLCOMM_ALGO_<COLLECTIVE>`` (e.g.
   ``COLLCOMM_ALGO_ALL_REDUCE=ring``);
3. the automatic rule below, from the message size ``nbytes`` and the group size ``n``.

Automatic rule: when every rank of the group shares memory with this one (one host, not
forced to TCP), ``shm_direct`` for every collective; otherwise (``SMALL`` = 64 KiB; ``nbytes`` is the size of the call's largest buffer,
which is the same on every rank, so every rank picks the same algorithm):

==============  ================================================================
all_reduce      n = 1 or nbytes < SMALL: recursive_doubling; else ring
all_gather      total (n·k) bytes < SMALL: bruck; else ring
reduce_scatter  total (n·k) bytes < SMALL: recursive_halving; else ring
broadcast       tree (binomial)
reduce          tree (binomial)
gather          tree (binomial)
scatter         tree (binomial)
all_to_all      pairwise (counts may differ per rank, so no size rule)
barrier         dissemination
==============  ================================================================

Aliases: ``binomial`` = ``tree``, ``recursive`` = ``recursive_doubling`` (or
``recursive_halving`` for reduce_scatter), ``naive``/``basic`` = ``linear``.
"""
from __future__ import annotations

import os
from typing import Callable

from ..errors import InvalidArgumentError
from . import dissemination
from . import bruck, linear, pairwise, recursive, ring, shm_direct, tree

SMALL = 64 * 1024

ALGORITHMS: dict[str, dict[str, Callable[..., None]]] = {
    "broadcast": {"linear": linear.broadcast, "tree": tree.broadcast},
    "reduce": {"linear": linear.reduce, "tree": tree.reduce},
    "all_reduce": {
        "linear": linear.all_reduce,
        "tree": tree.all_reduce,
        "ring": ring.all_reduce,
        "recursive_doubling": recursive.all_reduce,
        "rabenseifner": recursive.all_reduce_rabenseifner,
    },
    "all_gather": {
        "linear": linear.all_gather,
        "ring": ring.all_gather,
        "recursive_doubling": recursive.all_gather,
        "bruck": bruck.all_gather,
    },
    "reduce_scatter": {
        "linear": linear.reduce_scatter,
        "ring": ring.reduce_scatter,
        "recursive_halving": recursive.reduce_scatter,
    },
    "gather": {"linear": linear.gather, "tree": tree.gather},
    "scatter": {"linear": linear.scatter, "tree": tree.scatter},
    "all_to_all": {
        "linear": linear.all_to_all,
        "pairwise": pairwise.all_to_all,
        "bruck": bruck.all_to_all,
    },
    "barrier": {"linear": linear.barrier, "dissemination": dissemination.barrier},
}
for _collective, _table_ in ALGORITHMS.items():
    _table_["shm_direct"] = getattr(shm_direct, _collective)

_ALIASES = {
    "binomial": "tree",
    "binomial_tree": "tree",
    "naive": "linear",
    "basic": "linear",
    "recursive": "recursive_doubling",
    "halving": "recursive_halving",
    "doubling": "recursive_doubling",
    "rd": "recursive_doubling",
}


def available(collective: str) -> list[str]:
    """The family names implementing ``collective`` (sorted)."""
    return sorted(_table(collective))


def _table(collective: str) -> dict[str, Callable[..., None]]:
    table = ALGORITHMS.get(collective)
    if table is None:
        raise InvalidArgumentError(
            f"unknown collective {collective!r}; known: {', '.join(sorted(ALGORITHMS))}"
        )
    return table


def auto(collective: str, nbytes: int, n: int, shm: bool = False) -> str:
    """The family the automatic rule picks (see the module docstring)."""
    if shm and n > 1:
        return "shm_direct"
    if collective == "all_reduce":
        return "recursive_doubling" if n == 1 or nbytes < SMALL else "ring"
    if collective == "all_gather":
        return "bruck" if nbytes < SMALL else "ring"
    if collective == "reduce_scatter":
        return "recursive_halving" if nbytes < SMALL else "ring"
    if collective == "all_to_all":
        return "pairwise"
    if collective == "barrier":
        return "dissemination"
    _table(collective)
    return "tree"


def select(collective: str, nbytes: int, n: int, algorithm: str = "auto",
           shm: bool = False) -> Callable[..., None]:
    """The function to run ``collective`` of ``nbytes`` over ``n`` ranks (see module doc)."""
    table = _table(collective)
    name = (algorithm or "auto").strip().lower()
    source = "algorithm argument"
    if name == "auto":
        env = f"COLLCOMM_ALGO_{collective.upper()}"
        name = os.environ.get(env, "auto").strip().lower() or "auto"
        source = env
    if name == "auto":
        return table[auto(collective, nbytes, n, shm)]
    if name not in table and name in _ALIASES:
        alias = _ALIASES[name]
        if collective == "reduce_scatter" and alias == "recursive_doubling":
            alias = "recursive_halving"
        name = alias
    fn = table.get(name)
    if fn is None:
        raise InvalidArgumentError(
            f"unknown {collective} algorithm {name!r} (from {source}); valid: "
            f"auto, {', '.join(sorted(table))}"
        )
    return fn
