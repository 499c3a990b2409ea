"""collcomm: collective communication for Python processes, numpy only.

``import collcomm as dist`` stands in for the CPU parts of ``torch.distributed``::

    import numpy as np, collcomm as dist
    dist.init_process_group()                 # under `collcomm run -n 4 python x.py`
    t = np.full(2, dist.get_rank() + 1.0)
    dist.all_reduce(t, op=dist.ReduceOp.AVG)   # every rank: [2.5 2.5] (4 ranks)

Run a tour of every operation: ``collcomm run -n 4 -m collcomm.tour``.
"""
from __future__ import annotations

from typing import Any

from .core import runtime as _runtime
from .api import (
    P2POp, P2PWork, all_gather, all_gather_into_tensor, all_reduce, all_to_all, all_to_all_single,
    barrier, batch_isend_irecv, broadcast, gather, get_backend, get_global_rank, get_group_rank,
    get_process_group_ranks, get_rank, get_world_size, irecv, is_available, isend,
    monitored_barrier, recv, reduce, reduce_scatter, reduce_scatter_tensor, scatter, send,
)
from .errors import (
    AuthError, ClosedError, CollcommError, CommTimeoutError, InvalidArgumentError, MismatchError,
    PeerLostError,
)
from .core.group import NON_GROUP_MEMBER, ProcessGroup
from .core.timeouts import call_timeout
from .objects import (
    all_gather_object, all_reduce_object, broadcast_object_list, gather_object, recv_object_list,
    reduce_object, scatter_object_list, send_object_list,
)
from .ops import ReduceOp
from .memory import empty, empty_like, full, is_shared, zeros
from .core.runtime import destroy_process_group, init_process_group, is_initialized, new_group
from .api_groups import new_subgroups, new_subgroups_by_enumeration, split_group
from .core.work import Work
from .core.stats import stats  # per-op statistics (COLLCOMM_STATS), see core/stats.py

__version__ = "0.1.0"


class _GroupMember:
    """torch's ``GroupMember``: ``GroupMember.WORLD`` (the world group, None before init)
    and ``GroupMember.NON_GROUP_MEMBER`` (what ``new_group`` returns to non-members)."""

    NON_GROUP_MEMBER = NON_GROUP_MEMBER

    @property
    def WORLD(self) -> Any:  # noqa: N802 - torch's name
        return _runtime._world

    def __repr__(self) -> str:
        return "GroupMember"


GroupMember = _GroupMember()

__all__ = [
    # runtime and groups
    "GroupMember", "NON_GROUP_MEMBER", "ProcessGroup", "call_timeout", "destroy_process_group",
    "init_process_group", "is_available", "is_initialized", "new_group", "new_subgroups",
    "new_subgroups_by_enumeration", "split_group",
    "get_backend", "get_global_rank", "get_group_rank", "get_process_group_ranks", "get_rank",
    "get_world_size",
    # collectives
    "all_gather", "all_gather_into_tensor", "all_reduce", "all_to_all", "all_to_all_single",
    "barrier", "broadcast", "gather", "monitored_barrier", "reduce", "reduce_scatter",
    "reduce_scatter_tensor", "scatter",
    # zero-copy buffers in shared memory
    "empty", "empty_like", "full", "is_shared", "zeros",
    # point to point
    "P2POp", "P2PWork", "batch_isend_irecv", "irecv", "isend", "recv", "send",
    # objects
    "all_gather_object", "all_reduce_object", "broadcast_object_list", "gather_object",
    "recv_object_list", "reduce_object", "scatter_object_list", "send_object_list",
    # observability
    "stats",
    # ops, handles, errors
    "ReduceOp", "Work", "AuthError", "ClosedError", "CollcommError", "CommTimeoutError",
    "InvalidArgumentError", "MismatchError", "PeerLostError",
]
