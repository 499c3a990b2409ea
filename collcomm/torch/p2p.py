"""Point to point and ``monitored_barrier`` of :class:`~collcomm.torch.ProcessGroupCollcomm`.

``send``/``recv``/``recv_anysource`` post one transport operation in the group's own
point-to-point tag space (torch's ``tag``) and return a :class:`~collcomm.torch.work.P2PWork`
at once: sends complete without the receiver (eager copy), a receive from any rank tells its
sender through ``_source_rank()`` (what ``dist.recv(src=None)`` returns); a message of
another dtype than the receiving tensor's is refused (``BackendMismatchError``). torch's
``batch_isend_irecv`` issues these one by one.

A plain contiguous CPU tensor to or from a peer of this host takes the native
point-to-point path first (:mod:`collcomm.core.p2p`, native/_p2p.c), as the functional
``collcomm.isend``/``irecv`` do: a send written into the peer's ring at once (an already
completed ``Work``), a receive deferred to its ``wait()``, which receives natively and is
still matched in posting order. Whatever it declines (no native core, a peer on another
host, a full ring, a large message, any source) goes the regular way below, with its errors.

``monitored_barrier`` is gloo's: every other rank reports to rank 0, which waits for each
within the timeout and names the late ones, then releases them. It uses the reserved tag
:data:`MONITORED_BARRIER_TAG` (the highest of the group's point-to-point tags).
"""
from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as dist

from ..algorithms import signature
from ..core import p2p as core_p2p
from ..core.group import ProcessGroup
from ..core.tags import MAX_USER_TAG
from ..errors import CollcommError, CommTimeoutError
from .errors import BackendTimeoutError, translate
from .tensors import RAW, View, fast_array
from .work import P2PWork, seconds

__all__ = ["MONITORED_BARRIER_TAG", "PointToPoint"]

#: The point-to-point tag monitored_barrier uses in each group (user code must not).
MONITORED_BARRIER_TAG = MAX_USER_TAG


def _sig(v: View) -> int:
    """The message's signature: its dtype (raw bytes as uint8), so a receive into another
    dtype fails (MismatchError naming both) instead of reinterpreting the bytes."""
    return signature.p2p(v.arr.dtype if v.dtype == RAW else v.dtype)


class PointToPoint:
    """The point-to-point half of the process group (mixed into ProcessGroupCollcomm)."""

    core_group: ProcessGroup
    _where: str
    _view: Callable[..., View]          # ProcessGroupCollcomm's

    def _native(self, tensors: list[torch.Tensor], peer: Any, tag: Any, receiving: bool) -> Any:
        """The native start of a send (a completed handle) or a receive (a deferred one)
        of ``tensors[0]`` with local rank ``peer``, or None having done nothing: not a plain
        contiguous CPU tensor, not a valid peer of this host other than this rank, not a
        valid tag, no native core (the regular path then runs, with its errors)."""
        g = self.core_group
        try:
            f = g._p2p_native
        except AttributeError:
            f = core_p2p.native(g)
        if (f is None or len(tensors) != 1 or type(peer) is not int or not 0 <= peer < g.size
                or peer == g.rank or type(tag) is not int or not 0 <= tag <= MAX_USER_TAG):
            return None
        arr = fast_array(tensors[0])
        if arr is None:
            return None
        sig, record = signature.p2p(arr.dtype), g.observer is not None
        if receiving:
            return core_p2p.defer(f, g, arr, peer, tag, MAX_USER_TAG, sig, record)
        return core_p2p.native_isend(f, g, arr, peer, tag, sig, record)

    def send(self, tensors: list[torch.Tensor], dstRank: int, tag: int = 0) -> dist.Work:  # noqa: N803
        h = self._native(tensors, dstRank, tag, False)
        if h is not None:
            return P2PWork("send", h, self.core_group.to_local, tensors)
        v = self._view(tensors[0], "send", "tensor")
        try:
            h = self.core_group.p2p_isend(v.arr, dstRank, tag, _sig(v), lend=True)   # (a Work: untouched till done)
        except CollcommError as exc:
            raise translate(exc) from None
        return P2PWork("send", h, self.core_group.to_local, tensors)

    def recv(self, tensors: list[torch.Tensor], srcRank: int, tag: int = 0) -> dist.Work:  # noqa: N803
        h = self._native(tensors, srcRank, tag, True)
        if h is not None:
            return P2PWork("recv", h, self.core_group.to_local, tensors)
        return self._recv(tensors, srcRank, tag)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int = 0) -> dist.Work:
        return self._recv(tensors, None, tag)

    def _recv(self, tensors: list[torch.Tensor], src: int | None, tag: int) -> dist.Work:
        v = self._view(tensors[0], "recv", "tensor")
        try:
            h = self.core_group.p2p_irecv(v.arr, src, tag, _sig(v))
        except CollcommError as exc:
            raise translate(exc) from None
        return P2PWork("recv", h, self.core_group.to_local, tensors, v.finish if v.tmp is not None else None)

    def monitored_barrier(self, timeout: Any = None, wait_all_ranks: bool = False) -> None:
        """gloo's monitored barrier: rank 0 hears from every rank within ``timeout`` (else it
        raises naming the first late rank, or all of them with ``wait_all_ranks``), then
        releases them. Other ranks raise if rank 0 does not release them in time."""
        g = self.core_group
        limit = seconds(timeout) or g.timeout
        if g.size == 1:
            return
        tag = MONITORED_BARRIER_TAG
        token = np.zeros(1, dtype=np.uint8)
        # a receive that timed out is withdrawn (a wait(timeout) alone leaves it posted), so
        # that a later monitored_barrier's token does not land in it
        try:
            if g.rank != 0:
                g.p2p_isend(token, 0, tag).wait(limit)
                release = g.p2p_irecv(token, 0, tag)
                try:
                    release.wait(limit)
                except CommTimeoutError:
                    core_p2p.cancel(g, release)
                    raise
                return
            handles = {r: g.p2p_irecv(np.zeros(1, dtype=np.uint8), r, tag) for r in range(1, g.size)}
            deadline = time.monotonic() + limit
            late = []
            for r, h in handles.items():
                try:
                    h.wait(max(0.0, deadline - time.monotonic()) if wait_all_ranks or not late else 0.0)
                except CommTimeoutError:
                    core_p2p.cancel(g, h)
                    late.append(r)
            if late:
                which = (f"Ranks {', '.join(map(str, late))}" if wait_all_ranks
                         else f"Rank {late[0]}")
                raise BackendTimeoutError(
                    f"monitored_barrier on {self._where}: {which} failed to pass "
                    f"monitoredBarrier in {limit * 1000:.0f} ms", peer=late[0])
            for h in [g.p2p_isend(token, r, tag) for r in range(1, g.size)]:
                h.wait(limit)
        except CollcommError as exc:
            raise translate(exc) from None
