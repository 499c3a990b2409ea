"""Suite-wide guard: after all tests, no child process and no shared memory of our jobs is left."""
from __future__ import annotations

import os

import pytest

from tests import harness


@pytest.fixture(scope="session", autouse=True)
def _nothing_left_behind():
    yield
    import psutil

    children = psutil.Process(os.getpid()).children(recursive=True)
    for c in children:
        c.kill()
    leaked = [path for job in harness.JOBS for path in harness.shm_files(job)]
    for path in leaked:
        os.unlink(path)
    assert not children, f"processes left running after the suite: {[c.pid for c in children]}"
    assert not leaked, f"shared-memory segments left after the suite: {sorted(leaked)}"
