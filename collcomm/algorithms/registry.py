"""The algorithm registry and the rule that picks one per call.

``ALGORITHMS[collective][family]`` is the function implementing ``collective`` with
``family``. :func:`select` picks, in order of precedence:

1. an explicit ``algorithm`` name (anything but ``"auto"``);
2. the environment variable ``COLLCOMM_ALGO_<COLLECTIVE>`` (e.g.
   ``COLLCOMM_ALGO_ALL_REDUCE=ring``);
3. the automatic rule below, from the message size ``nbytes`` and the group size ``n``.

Automatic rule, from the group's topology (the same on every rank):

1. every rank shares memory with this one (one host, not forced to TCP): ``shm_direct``;
2. the group spans several hosts and some host has more than one of its ranks:
   ``hierarchical`` for all_reduce, broadcast, reduce and barrier;
3. otherwise the point-to-point family with the lowest predicted time in the α-β cost
   model of :mod:`.cost` (constants from ``collcomm bench --calibrate``), for the group's
   link ("shm" channels or "tcp").

Aliases: ``binomial`` = ``tree``, ``recursive`` = ``recursive_doubling`` (or
``recursive_halving`` for reduce_scatter), ``naive``/``basic`` = ``linear``.

Imports go one way: the registry imports the families, never the reverse (``hierarchical``
gets its per-step chooser, :func:`best`, handed in below).
"""
from __future__ import annotations

import os
from typing import Any, Callable

from ..errors import InvalidArgumentError
from . import dissemination
from . import bruck, cost, hierarchical, linear, pairwise, recursive, ring, shm_direct, tree
from .contract import Comm

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
    if _collective in ("all_reduce", "broadcast", "reduce", "barrier"):
        _table_["hierarchical"] = getattr(hierarchical, _collective)

#: The reduce families that take ``recv`` identical to ``send`` at the root (an in-place
#: reduce, torch's form) as it is: each part of ``send`` is read (staged) before that part
#: of ``recv`` is written. The core copies ``send`` first for every other family (and for
#: any partial overlap).
REDUCE_IN_PLACE_OK = frozenset({shm_direct.reduce})

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


#: Point-to-point families ``auto`` may pick, in tie-break order (bruck all_to_all needs
#: equal counts, which only the caller knows, so it is never picked automatically).
_CANDIDATES = {
    "all_reduce": ["recursive_doubling", "rabenseifner", "ring", "tree", "linear"],
    "all_gather": ["bruck", "recursive_doubling", "ring", "linear"],
    "reduce_scatter": ["recursive_halving", "ring", "linear"],
    "broadcast": ["tree", "linear"],
    "reduce": ["tree", "linear"],
    "gather": ["tree", "linear"],
    "scatter": ["tree", "linear"],
    "all_to_all": ["pairwise", "linear"],
    "barrier": ["dissemination", "linear"],
}
HIERARCHICAL = ("all_reduce", "broadcast", "reduce", "barrier")
_ENV = {c: f"COLLCOMM_ALGO_{c.upper()}" for c in ALGORITHMS}


def auto(collective: str, nbytes: int, n: int, shm: bool = False, hosts: int = 1,
         link: str = "tcp") -> str:
    """The family the automatic rule picks (see the module docstring)."""
    _table(collective)
    if n > 1 and shm:
        return "shm_direct"
    if 1 < hosts < n and collective in HIERARCHICAL:
        return "hierarchical"
    if n == 1:
        return _CANDIDATES[collective][0]
    return cost.cheapest(collective, n, nbytes, _CANDIDATES[collective], link)


def topology(comm: Comm) -> dict[str, Any]:
    """What ``auto`` needs to know about a comm (the same on every rank of the group).

    :class:`.contract.Topology` is optional (a bare point-to-point comm has none: one host
    over TCP without shared memory): those are the defaults read here."""
    return {"shm": bool(getattr(comm, "can_share_memory", False)),
            "hosts": int(getattr(comm, "n_hosts", 1)),
            "link": getattr(comm, "link", "tcp")}


def best(collective: str, nbytes: int, comm: Comm) -> Callable[..., None]:
    """The automatic choice for ``comm`` (no environment override: for inner steps)."""
    return _table(collective)[auto(collective, nbytes, comm.size, **topology(comm))]


hierarchical.use_chooser(best)


def select(collective: str, nbytes: int, n: int, algorithm: str = "auto", shm: bool = False,
           hosts: int = 1, link: str = "tcp", env: bool = True) -> Callable[..., None]:
    """The function to run ``collective`` of ``nbytes`` over ``n`` ranks (see module doc).

    ``env=False`` ignores ``COLLCOMM_ALGO_*`` (a group's call plan reads them once)."""
    table = _table(collective)
    if algorithm == "auto":   # the hot path: no override, one host
        override = os.environ.get(_ENV[collective]) if env else None
        if override is None and shm and n > 1:
            return table["shm_direct"]
    name = (algorithm or "auto").strip().lower()
    source = "algorithm argument"
    if name == "auto" and env:
        env = _ENV[collective]
        name = os.environ.get(env, "auto").strip().lower() or "auto"
        source = env
    if name == "auto":
        return table[auto(collective, nbytes, n, shm, hosts, link)]
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
