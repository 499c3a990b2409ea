"""``Probe``, ``Iprobe``, ``Mprobe``, ``Improbe`` (and lower case) of the point-to-point
mixin (:class:`._p2p.PointToPoint`): a probe of a message from one rank of this host in one
C call that leaves it in the ring (``P2P.probe``, native/_p2p_probe.c), else the engine's
probe (core/p2p.py), which also claims the message for ``Mprobe``.
"""
from __future__ import annotations

from typing import Any

from ..core import p2p
from ..errors import CollcommError
from ._consts import ANY_SOURCE, ANY_TAG, PROC_NULL
from ._errors import translate
from ._p2p_ops import EXACT, TAG_BITS, WILD, _null_status, _rtag, _source
from ._request import ORPHANS, Status


class Probes:
    """The probes (see the module docstring)."""

    __slots__ = ()
    _h: Any
    _grp: Any

    def _probe(self, source: int, tag: int, block: bool, take: bool, call: str) -> Any:
        g = self._grp(call)
        s, (t, mask) = _source(g, source, call), _rtag(tag, call)
        try:
            return g, p2p.probe(g, s, t, mask, block=block, take=take, op=call)
        except CollcommError as exc:
            raise translate(exc) from exc

    def _quick_probe(self, source: Any, tag: Any, block: bool, status: Status | None) -> Any:
        """A probe of a message from one rank of this host in one C call (P2P.probe,
        native/_p2p_probe.c: the message stays in the ring for the receive that follows):
        True (found: ``status`` set); False (``block`` False: none yet, and this rank has
        nothing else the engine's progress would move: MPI's Iprobe must progress, and the
        general way does, where there is); None (the general way's)."""
        g = self._h.g
        if g is None or g._closed or ORPHANS or type(source) is not int or type(tag) is not int \
                or not 0 <= source < g.size or source == g.rank:
            return None
        f = getattr(g, "_p2p_native", None)
        if f is None or not (0 <= tag <= TAG_BITS or tag == ANY_TAG):
            return None
        t, mask = tag, EXACT
        if tag < 0:
            t, mask = 0, WILD
        try:
            n = f.probe(source, t, mask, block)
        except CollcommError as exc:
            raise translate(exc) from exc
        if n is None:
            return None
        if n is False:
            return None if p2p.transport(g).outstanding() else False
        if status is not None:
            status._set(source, f.last_tag & TAG_BITS, n)
        return True

    def Probe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Status | None = None) -> bool:  # noqa: N802
        if source == PROC_NULL:
            _null_status(status)
            return True
        if self._quick_probe(source, tag, True, status):
            return True
        _, m = self._probe(source, tag, True, False, "Probe")
        if status is not None:
            status._set(m.source, m.tag & TAG_BITS, m.nbytes)
        return True

    def Iprobe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Status | None = None) -> bool:  # noqa: N802
        if source == PROC_NULL:
            _null_status(status)
            return True
        found = self._quick_probe(source, tag, False, status)
        if found is not None:
            return found
        _, m = self._probe(source, tag, False, False, "Iprobe")
        if m is not None and status is not None:
            status._set(m.source, m.tag & TAG_BITS, m.nbytes)
        return m is not None

    probe = Probe
    iprobe = Iprobe

    def Mprobe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Status | None = None) -> Any:  # noqa: N802
        if source == PROC_NULL:
            _null_status(status)
            from ._message import MESSAGE_NO_PROC
            return MESSAGE_NO_PROC
        g, m = self._probe(source, tag, True, True, "Mprobe")
        from ._message import Message
        return Message._claimed(g, m, status)

    def Improbe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Status | None = None) -> Any:  # noqa: N802
        if source == PROC_NULL:
            _null_status(status)
            from ._message import MESSAGE_NO_PROC
            return MESSAGE_NO_PROC
        g, m = self._probe(source, tag, False, True, "Improbe")
        from ._message import Message
        return None if m is None else Message._claimed(g, m, status)

    mprobe = Mprobe
    improbe = Improbe
