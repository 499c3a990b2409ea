"""A stand-in for pytest inside rank processes, which tests/rank_main.py installs before it
imports the test's module.

A rank runs one function of a test module, but importing that module imported pytest too:
~0.2 s of CPU in every rank process (``import pytest`` 0.45 s wall against 0.16 for a bare
interpreter on the 2-vCPU Intel VM), and the suite starts well over a thousand of them. Here
the names a module uses while it is imported cost nothing: ``mark`` and ``fixture`` are
decorators that hand back what they decorate (a rank never runs tests), ``param`` keeps its
values, ``importorskip`` imports. Any other name (``raises``, ``approx``, ``skip``, ...)
loads the real pytest and is taken from it, so a rank function using one behaves as before.
"""
from __future__ import annotations

import importlib
import sys
from typing import Any


class _Decorator:
    """``pytest.mark.<name>``, ``pytest.mark.<name>(...)``, ``pytest.fixture(...)``: applied
    to a function or class, that function or class; called otherwise, itself again."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]
        return self

    def __getattr__(self, name: str) -> "_Decorator":
        if name.startswith("__"):
            raise AttributeError(name)
        return self


mark = _Decorator()
fixture = _Decorator()


def param(*values: Any, **_: Any) -> tuple[Any, ...]:
    return values


def importorskip(modname: str, minversion: str | None = None, reason: str | None = None) -> Any:
    return importlib.import_module(modname)


def __getattr__(name: str) -> Any:
    """Any other name: the real pytest's (imported now, in place of this module)."""
    if name.startswith("__"):
        raise AttributeError(name)
    me = sys.modules[__name__]
    if sys.modules.get("pytest") is me:        # (not yet replaced by the real one)
        del sys.modules["pytest"]
        try:
            importlib.import_module("pytest")
        except BaseException:
            sys.modules["pytest"] = me
            raise
    return getattr(sys.modules["pytest"], name)


def install() -> None:
    """Make ``import pytest`` in this process give this module (unless pytest is in already)."""
    if "pytest" not in sys.modules:
        sys.modules["pytest"] = sys.modules[__name__]
