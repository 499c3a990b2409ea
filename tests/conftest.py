"""Suite-wide guard: after all tests, no child process and no collcomm shared memory is left."""
from __future__ import annotations

import glob
import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def _nothing_left_behind():
    before = set(glob.glob("/dev/shm/collcomm-*"))
    yield
    import psutil

    children = psutil.Process(os.getpid()).children(recursive=True)
    for c in children:
        c.kill()
    leaked = set(glob.glob("/dev/shm/collcomm-*")) - before
    for path in leaked:
        os.unlink(path)
    assert not children, f"processes left running after the suite: {[c.pid for c in children]}"
    assert not leaked, f"shared-memory segments left after the suite: {sorted(leaked)}"
