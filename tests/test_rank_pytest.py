"""tests/rank_pytest.py, the stand-in for pytest in rank processes: what a test module
uses while it is imported costs nothing (no ``_pytest`` loaded), and any other name is the
real pytest's (loaded once, then every ``import pytest`` gives the real module). Run in a
fresh interpreter: this one has the real pytest already."""
from __future__ import annotations

import subprocess
import sys

from tests.harness import ROOT

SCRIPT = r'''
import sys
from tests import rank_pytest
rank_pytest.install()
import pytest
assert pytest is rank_pytest

@pytest.mark.timeout(3)
@pytest.mark.parametrize("a", [pytest.param(1, id="x")])
def f(a):
    return a

@pytest.mark.slow
class C:
    pass

@pytest.fixture(scope="session")
def fx():
    return 1

assert f(2) == 2 and isinstance(C, type) and fx() == 1
assert pytest.param(1, 2, id="y") == (1, 2)
assert pytest.importorskip("json").__name__ == "json"
assert "_pytest" not in sys.modules, "the decorators loaded pytest"
raises = pytest.raises                       # the real pytest, loaded now
import pytest as real
assert real is not rank_pytest and raises is real.raises
assert pytest.approx is real.approx and sys.modules["pytest"] is real   # no second copy
with pytest.raises(ZeroDivisionError):
    1 / 0
print("ok")
'''


def test_the_stand_in() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stdout + done.stderr
