"""Registers collcomm as a torch.distributed backend when torch starts, so that
``dist.init_process_group("collcomm")`` is the only change a torch program needs.

torch calls every ``torch.backends`` entry point at the end of ``import torch`` (its
out-of-tree backend autoload; ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` turns it off). This module
is what that entry point names. It must stay tiny and must never raise: it imports nothing
of collcomm (which would cost numpy's import on every ``import torch``) and registers a
creator that loads :mod:`collcomm.torch.backend` on the first ``init_process_group`` /
``new_group`` with backend "collcomm". ``import collcomm.torch`` then finds the backend
registered and leaves it as is.
"""
from __future__ import annotations

from typing import Any


def _create(*args: Any, **kwargs: Any) -> Any:
    from collcomm.torch import backend

    return backend.create(*args, **kwargs)


def register() -> None:
    """The entry point: register "collcomm" for CPU tensors (idempotent, never raises)."""
    try:
        import torch.distributed as dist

        if not dist.is_available() or "COLLCOMM" in dist.Backend._plugins:
            return
        dist.Backend.register_backend("collcomm", _create, extended_api=True, devices=["cpu"])
    except Exception:  # noqa: BLE001 - an autoload must never break `import torch`
        pass
