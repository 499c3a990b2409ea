"""Suite-wide guard: after all tests, no child process and no shared memory of our jobs is
left. And before them: collcomm and the tests compiled to bytecode once (see
``pytest_configure``), with Ctrl-C turned back on where the suite was started with it ignored."""
from __future__ import annotations

import compileall
import os
import shutil
import signal
import tempfile

import pytest

from tests import harness


def pytest_configure(config: pytest.Config) -> None:
    """Write collcomm's and the tests' bytecode now, once. Where PYTHONDONTWRITEBYTECODE is
    set (this project's machines set it) no process writes it, so each of the suite's
    ~1,000 rank and launcher processes compiled every module it imports from source:
    ~0.09 s of CPU each for ``import collcomm`` alone (0.28 -> 0.19 s measured). A cache
    Python finds stale (an edited source) is ignored as usual."""
    for folder in ("collcomm", "tests"):
        compileall.compile_dir(os.path.join(harness.ROOT, folder), quiet=2)
    # numpy's OpenBLAS starts a thread per CPU at import and spins it up: ~0.12 s of CPU
    # in every one of those processes (measured on the 2-vCPU VM), 10-15% of the suite's
    # CPU time. No test uses a threaded BLAS (the launcher's own setting is tested with
    # these variables cleared: test_launcher.py).
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    # A shell without job control starts its background commands with SIGINT ignored, and
    # Python then leaves it so, in this process and every rank it starts: the tests of
    # Ctrl-C (test_native_checks, test_async_queue, test_bench_turns) would never see one.
    # Handled here, the signal is back at its default in the ranks (an exec resets handlers).
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """``--dist loadfile`` (pyproject's), but the files of the shared collcomm.MPI job
    (tests/mpi_checks.py SECTIONS: every section at 1-5 ranks, over TCP and with torch,
    cached per process) go to one worker as one unit: split between the two, each worker
    ran the whole job set (~36 s of the 2-vCPU VM, measured from the workers' timelines).
    None (xdist's own choice) for any other mode, or if xdist's scheduler is not the one
    this was written against (3.x)."""
    if config.getoption("dist", None) != "loadfile":
        return None
    try:
        from xdist.scheduler import LoadFileScheduling
    except ImportError:
        return None
    from tests.mpi_checks import SECTIONS

    shared = {"tests/" + spec.split(":")[0].split(".")[-1] + ".py" for spec in SECTIONS.values()}

    class SharedJobScheduling(LoadFileScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            return "tests/mpi_checks.py (shared job)" if scope in shared else scope

    return SharedJobScheduling(config, log)


def _open_mpi_segments() -> set[str]:
    shm = "/dev/shm"
    return {n for n in os.listdir(shm) if n.startswith("sm_segment.")} if os.path.isdir(shm) else set()


def _running(proc) -> bool:
    """Not a zombie (a zygote's rank that exited is reaped a moment after the harness
    read its exit code)."""
    import psutil

    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture(scope="session", autouse=True)
def _nothing_left_behind():
    before = _open_mpi_segments()
    yield
    import psutil

    # Open MPI (the peer the comparison tests run under mpiexec) leaves its 16 MiB
    # sm_segment.* file when one of its jobs is killed: remove the ones this session made
    for name in _open_mpi_segments() - before:
        try:
            os.unlink(os.path.join("/dev/shm", name))
        except OSError:
            pass

    # the ranks' zygotes live as long as the session: anything else (their ranks too)
    # still running is left behind
    zygotes = harness.zygote_pids()
    children = [c for c in psutil.Process(os.getpid()).children(recursive=True)
                if c.pid not in zygotes and _running(c)]
    for c in children:
        c.kill()
    harness.stop_zygotes()
    # the flight recorder's default dump folder of every harness job (tests that read
    # dumps set COLLCOMM_FR_DIR themselves): thousands of folders per run otherwise
    for job in harness.JOBS:
        shutil.rmtree(os.path.join(tempfile.gettempdir(), f"collcomm-fr-{job}"), ignore_errors=True)
    leaked = [path for job in harness.JOBS for path in harness.shm_files(job)]
    for path in leaked:
        os.unlink(path)
    assert not children, f"processes left running after the suite: {[c.pid for c in children]}"
    assert not leaked, f"shared-memory segments left after the suite: {sorted(leaked)}"


@pytest.fixture(scope="module")
def world_of_one_left_closed(request):
    """For a test file that uses ``collcomm.MPI`` in the pytest process itself (a world of
    one, joined on first use): the world is closed again after the file, so the worker's
    next files find nothing initialized (as they expect)."""
    import collcomm
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"):
        assert var not in os.environ, f"{var} is set in the test process"
    was = collcomm.is_initialized()
    yield
    if collcomm.is_initialized() and not was:
        collcomm.destroy_process_group()
