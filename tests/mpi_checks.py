"""Shared helpers of the collcomm.MPI tests (tests/test_mpi_*.py).

``Checker`` collects failures instead of stopping at the first (a rank body returns the
list, the test asserts it is empty on every rank). ``KINDS`` are the buffer kinds every
buffer test loops over: numpy arrays, ``array.array``, ``memoryview``, ``bytearray``
(bytes only) and torch CPU tensors when torch is installed. ``specs`` gives the buffer
spec forms mpi4py accepts for a buffer.
"""
from __future__ import annotations

import array
import sys
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import numpy as np


def same(a: Any, b: Any) -> bool:
    """Equal values: numpy arrays (and buffers) elementwise, containers item by item."""
    if isinstance(a, (np.ndarray, array.array, memoryview)) or isinstance(b, (np.ndarray, array.array, memoryview)):
        try:
            return bool(np.array_equal(np.asarray(a), np.asarray(b)))
        except Exception:  # noqa: BLE001 - not comparable: not equal
            return False
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001
        return False


class Checker:
    def __init__(self, rank: int, size: int) -> None:
        self.rank, self.size = rank, size
        self.fails: list[str] = []
        self.count = 0

    def eq(self, got: Any, want: Any, what: str) -> None:
        self.count += 1
        if not same(got, want):
            self.fails.append(f"rank {self.rank}/{self.size} {what}: got {got!r:.300}, want {want!r:.300}")

    def true(self, ok: bool, what: str) -> None:
        self.count += 1
        if not ok:
            self.fails.append(f"rank {self.rank}/{self.size} {what}")

    def raises(self, fn: Callable[[], Any], kind: Any, what: str, error_class: int | None = None) -> None:
        self.count += 1
        try:
            fn()
        except kind as exc:
            if error_class is not None and exc.Get_error_class() != error_class:
                self.fails.append(f"rank {self.rank} {what}: error class {exc.Get_error_class()}, want {error_class}: {exc}")
            return
        except Exception as exc:  # noqa: BLE001
            self.fails.append(f"rank {self.rank} {what}: raised {type(exc).__name__}: {exc}, want {kind}")
            return
        self.fails.append(f"rank {self.rank} {what}: did not raise {kind}")


def _torch() -> Any:
    try:
        import torch  # noqa: F401 - only when installed
    except ImportError:
        return None
    return sys.modules["torch"]


class Kind:
    """A buffer kind: ``make(values)`` builds one holding ``values`` (numpy, its dtype),
    ``read(buf)`` gives its contents as numpy."""

    def __init__(self, name: str, make: Callable[[np.ndarray], Any], read: Callable[[Any], np.ndarray],
                 codes: str) -> None:
        self.name, self.make, self.read, self.codes = name, make, read, codes

    def __repr__(self) -> str:
        return self.name


def kinds() -> list[Kind]:
    out = [
        Kind("numpy", lambda v: v.copy(), lambda b: np.asarray(b).reshape(-1), "ildfb"),
        Kind("array", lambda v: array.array(v.dtype.char, v.tolist()), lambda b: np.array(b), "ild"),
        Kind("memoryview", lambda v: memoryview(v.copy()), lambda b: np.asarray(b), "id"),
        Kind("bytearray", lambda v: bytearray(v.astype(np.uint8).tobytes()),
             lambda b: np.frombuffer(bytes(b), dtype=np.uint8), "B"),
    ]
    torch = _torch() if USE_TORCH[0] else None
    if torch is not None:
        out.append(Kind("torch", lambda v: torch.from_numpy(v.copy()), lambda b: b.numpy().reshape(-1), "idf"))
    return out


def values(code: str, n: int, seed: int) -> np.ndarray:
    """n values of typecode ``code`` that depend on ``seed`` (exact in every dtype used)."""
    return ((np.arange(n) * 3 + seed * 7) % 50 + (1 if code != "B" else 0)).astype(np.dtype(code))


def specs(MPI: Any, buf: Any, code: str, count: int) -> list[Any]:
    """The simple buffer spec forms of ``buf`` (``count`` elements of typecode ``code``)."""
    dt = MPI.Datatype.fromcode(code) if code != "B" else MPI.UNSIGNED_CHAR
    return [buf, [buf, dt], [buf, code], [buf, count, dt], (buf, (count, 0), dt), [buf, count]]


@contextmanager
def python_waits(MPI: Any, on: bool = True) -> Iterator[bool]:
    """Within: ``Request.Wait``, ``wait``, ``Test`` and the class methods ``Waitall``, ``Testall``,
    ``Waitany``, ``Waitsome`` the Python methods
    (``on``), else as installed (the core's where it is built: native/_mpi_request_wait.c);
    gives whether the core's are in place. The checks that put a recorder around the
    module's native wait or test entry see the Python methods' calls only (the C methods
    call the core directly), so the sections that hold such checks run each way."""
    from collcomm.MPI import _request_waits as waits
    req = MPI.Request
    names = ("Wait", "wait", "Test", "Waitall", "Testall", "Waitany", "Waitsome")
    installed = [req.__dict__.get(name) for name in names]    # (Testall: the mixin's if not C's)
    python = (waits.PY_WAIT, waits.PY_WAIT_VALUE, waits.PY_TEST, classmethod(waits.PY_WAITALL),
              classmethod(waits.PY_TESTALL), classmethod(waits.PY_WAITANY), classmethod(waits.PY_WAITSOME))
    try:
        for name, method in zip(names, python if on else installed):
            if method is not None:
                setattr(req, name, method)
        yield core_waits(MPI)
    finally:
        for name, method in zip(names, installed):
            if method is not None:
                setattr(req, name, method)
            elif name in req.__dict__:
                delattr(req, name)


def each_wait_way(c: "Checker", MPI: Any, comm: Any, parts: list[Callable[..., None]]) -> None:
    """Every part, ``part(c, MPI, comm)``, with ``Request.Wait``, ``wait``, ``Test`` and
    ``Waitall`` as installed (the core's where it is built), then with the Python methods
    (python_waits)."""
    for python in (False, True):
        with python_waits(MPI, python):
            for part in parts:
                part(c, MPI, comm)
        comm.Barrier()


def core_waits(MPI: Any) -> bool:
    """Are ``Request.Wait``, ``Test`` and ``Waitall`` the core's now (see python_waits)?"""
    from collcomm.MPI._request_waits import PY_WAIT
    return MPI.Request.Wait is not PY_WAIT


# ----------------------------------------------------------------------------- one job, every file
#: The sections of the MPI suite: "file:function", each function(c, MPI, comm) -> None.
SECTIONS = {
    "cco_buf": "tests.test_mpi_cco_buf:cco_buf",
    "cco_obj": "tests.test_mpi_cco_obj:cco_obj",
    "p2p_buf": "tests.test_mpi_p2p_buf:p2p_buf",
    "p2p_obj": "tests.test_mpi_p2p_obj:p2p_obj",
    "comm": "tests.test_mpi_comm:comm_checks",
    "group": "tests.test_mpi_group:group_checks",
    "cart": "tests.test_mpi_cart:cart_checks",
    "status_request": "tests.test_mpi_status_request:status_request",
    "datatypes": "tests.test_mpi_datatypes:datatype_checks",
    "neighbor": "tests.test_mpi_neighbor:neighbor_checks",
    "neighbor_quick": "tests.test_mpi_neighbor_quick:neighbor_quick_checks",
    "neighbor_random": "tests.test_mpi_neighbor_random:neighbor_random_checks",
    "persistent_order": "tests.test_mpi_persistent_order:persistent_order_checks",
    "collv_fast": "tests.test_mpi_collv_fast:collv_fast_checks",
    "collv_parts": "tests.test_mpi_collv_parts:collv_parts_checks",
    "obj_small": "tests.test_mpi_obj_small:obj_small_checks",
    "obj_native": "tests.test_mpi_obj_native:obj_native_checks",
    "scan_paths": "tests.test_mpi_scan_paths:scan_paths_checks",
    "obj_irecv": "tests.test_mpi_obj_irecv:obj_irecv_checks",
    "random_nb": "tests.test_mpi_random_nb:random_nb_checks",
    "wait_native": "tests.test_mpi_wait_native:wait_native_checks",
    "request_waits": "tests.test_mpi_request_waits:request_waits_checks",
    "start_spares": "tests.test_mpi_start_spares:start_spares_checks",
    "probe_native": "tests.test_mpi_probe_native:probe_native_checks",
    "persistent_p2p": "tests.test_mpi_persistent_p2p:persistent_p2p_checks",
    "wait_collective": "tests.test_mpi_wait_collective:wait_collective_checks",
    "spec_fast": "tests.test_mpi_spec_fast:spec_fast_checks",
    "demo_idioms": "tests.test_mpi_demo_idioms:demo_idiom_checks",
    "prequest_start": "tests.test_mpi_prequest_start:prequest_start_checks",
    "obj_quick": "tests.test_obj_quick:obj_quick_checks",
}
USE_TORCH: list[bool] = [False]
SIZES = [1, 2, 3, 4, 5]
TORCH_SIZES = (1, 3)      # torch's import costs seconds per rank: two sizes are enough


def run_sections(names: list[str], use_torch: bool) -> dict[str, list[str]]:
    """A rank body: run the named sections in order on COMM_WORLD; failures per section.
    After a section raises, the rest are skipped (the ranks may no longer agree)."""
    import importlib
    import traceback

    from collcomm import MPI

    USE_TORCH[0] = use_torch
    comm = MPI.COMM_WORLD
    out: dict[str, list[str]] = {}
    for name in names:
        module, fn = SECTIONS[name].split(":")
        c = Checker(comm.rank, comm.size)
        try:
            getattr(importlib.import_module(module), fn)(c, MPI, comm)
        except Exception as exc:  # noqa: BLE001 - reported per section
            c.fails.append(f"rank {c.rank}/{c.size}: {name} raised {exc!r}\n{traceback.format_exc()}")
            out[name] = c.fails
            for rest in names[names.index(name) + 1:]:
                out[rest] = [f"rank {c.rank}: skipped after {name} raised"]
            break
        if c.count == 0:
            c.fails.append(f"rank {c.rank}: section {name} checked nothing")
        out[name] = c.fails
        comm.Barrier()
    return out


_JOBS: dict[Any, list[dict[str, list[str]]]] = {}


def job(n: int, transport: str | None = None, only: str | None = None) -> list[dict[str, list[str]]]:
    """Every section on ``n`` ranks, once per test session (the files share the job);
    torch tensors join the buffer kinds at TORCH_SIZES over shared memory. ``only``: a job
    of that one section (a size no other file shares: the whole suite again there cost
    ~19 s of the CI's time for one section's checks)."""
    use_torch = transport is None and n in TORCH_SIZES
    key = (n, transport, use_torch, only)
    if key not in _JOBS:
        from tests.harness import run_ranks

        _JOBS[key] = run_ranks(run_sections, n, [only] if only else list(SECTIONS), use_torch,
                               transport=transport, timeout=150, env={"COLLCOMM_TIMEOUT": "30"})
    return _JOBS[key]


def check(results: list[dict[str, list[str]]], section: str) -> None:
    fails = [f for per_rank in results for f in per_rank.get(section, ["section missing"])]
    assert not fails, "\n".join(fails)
