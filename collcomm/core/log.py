"""Logging for logger ``collcomm``: ``COLLCOMM_LOG=INFO|DEBUG`` (or WARNING, ERROR).

INFO logs the transport chosen per peer (once per job), the algorithm chosen per call
(the first time per group, collective and family), calls slower than
``COLLCOMM_LOG_SLOW`` seconds (default 1) and the flight recorder's store traffic on a
timeout; WARNING (shown even without ``COLLCOMM_LOG``, through Python's last-resort
handler) the stall warnings. Lines go to stderr as ``[collcomm rank R] LEVEL message``.
A program that configures logging itself keeps its own handlers: this only adds one when
``COLLCOMM_LOG`` is set and the logger has none.
"""
from __future__ import annotations

import logging
import os

LOGGER = "collcomm"
_LEVELS = {"DEBUG": logging.DEBUG, "INFO": logging.INFO, "WARNING": logging.WARNING,
           "WARN": logging.WARNING, "ERROR": logging.ERROR}


def setup(rank: int | None = None) -> logging.Logger:
    """Configure logger ``collcomm`` from ``COLLCOMM_LOG`` (idempotent; the rank goes into
    every line's prefix)."""
    logger = logging.getLogger(LOGGER)
    level = _LEVELS.get(os.environ.get("COLLCOMM_LOG", "").strip().upper())
    if level is None:
        return logger
    logger.setLevel(level)
    prefix = f"[collcomm rank {rank}]" if rank is not None else "[collcomm]"
    fmt = logging.Formatter(f"{prefix} %(levelname)s %(message)s")
    ours = [h for h in logger.handlers if getattr(h, "_collcomm", False)]
    if ours:
        ours[0].setFormatter(fmt)
    elif not logger.handlers:
        handler = logging.StreamHandler()
        handler._collcomm = True  # type: ignore[attr-defined]
        handler.setFormatter(fmt)
        logger.addHandler(handler)
    return logger
