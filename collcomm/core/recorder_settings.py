"""The flight recorder's and the other observations' switches, read from the environment.

:class:`Settings` reads ``COLLCOMM_FR_SIZE``, ``COLLCOMM_TRACE``, ``COLLCOMM_STATS``,
``COLLCOMM_DEBUG``, ``COLLCOMM_STALL_WARN``, ``COLLCOMM_LOG_SLOW`` and ``COLLCOMM_LOG``.
The process's instance is :data:`collcomm.core.recorder.settings` (re-read by
:func:`collcomm.core.recorder.reload_settings`).
"""
from __future__ import annotations

import os

DEFAULT_SIZE = 2000
DEFAULT_STALL_WARN = 60.0


def _float_env(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


class Settings:
    """The observation switches, read from the environment once per process."""

    def __init__(self) -> None:
        env = os.environ
        try:
            self.fr_size = max(0, int(env.get("COLLCOMM_FR_SIZE", DEFAULT_SIZE)))
        except ValueError:
            self.fr_size = DEFAULT_SIZE
        self.trace_dir = env.get("COLLCOMM_TRACE", "") or ""
        self.stats = env.get("COLLCOMM_STATS", "") not in ("", "0")
        self.detail = env.get("COLLCOMM_DEBUG", "").upper() == "DETAIL"
        self.stall_warn = _float_env("COLLCOMM_STALL_WARN", DEFAULT_STALL_WARN)
        self.slow_log = _float_env("COLLCOMM_LOG_SLOW", 1.0)
        self.log = env.get("COLLCOMM_LOG", "").upper()

    @property
    def extra(self) -> bool:
        """Anything beyond the flight recorder (the slower observed path)."""
        return bool(self.trace_dir or self.stats or self.detail
                    or self.log in ("INFO", "DEBUG"))
