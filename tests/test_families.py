"""Every algorithm family of every collective through the real transports (processes).

tests/test_algorithms.py checks the point-to-point families on thread-ranks
(tests/threadcomm.py); this file runs every family on separate processes, through the
entry points (``collcomm.algorithms.X(comm, ..., algorithm=family)`` inside
``world.run``), in three kinds of job: all ranks over shared memory (``shm``, 1-5 ranks),
all over TCP (``tcp``, 2, 3, 5 ranks), and pretend multi-host jobs (``multi``: each rank's
COLLCOMM_HOST_ID names its "host"; shm inside one, TCP between). Large messages go through
shm segments / partial socket writes, and ``shm_direct`` really uses its arena (chunked
when a buffer is larger than its 4 MiB slot; also on shared-heap buffers, zero-copy).

One job per configuration runs every case on every rank (``_rank_main``); each rank checks
its own results against a numpy reference computed from (rank, size, case) and returns a
list of failures, which the per-(collective, family) tests then report. Data is
integer-valued (|x| <= 3) so float sums are exact whatever the combination order.

Where a family cannot work (``shm_direct`` without shared memory, ``hierarchical`` on one
host) its test checks that every collective it has raises InvalidArgumentError naming it,
on every rank, and that the group still works afterwards.

The rank side is in tests/families_common.py (data, references, ``Ctx``),
tests/families_checks.py (each collective's cases, the refusals) and
tests/families_sequences.py (sequences of calls); this module runs the jobs and reports.
"""
from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np
import pytest

from collcomm.algorithms import ALGORITHMS, available
from tests.families_checks import CHECKS, rejected
from tests.families_common import DTYPES, Ctx, data, supported
from tests.families_sequences import SEQUENCES
from tests.harness import run_ranks

SHM_SIZES = [1, 2, 3, 4, 5]
TCP_SIZES = [2, 3, 5]
#: Pretend multi-host jobs (COLLCOMM_HOST_ID per rank): shm inside a "host", tcp between.
#: "ABABB": hosts with interleaved, non-contiguous ranks; "ABB": a host with one rank.
MULTI_HOSTS = ["ABB", "ABABB"]
#: (mode, hosts): mode "shm"/"tcp" forces COLLCOMM_TRANSPORT; "multi" mixes them.
#: "shm-staged": shared memory with cross-memory attach off (COLLCOMM_CMA=0), so large
#: chunks go through the arena's staging slots instead of being read from the peers.
#: "shm-python": shm_direct (only) with the native core off (COLLCOMM_NATIVE=0): the
#: pure-Python implementation, which the other shm jobs bypass where the core is built.
CONFIGS = ([("shm", "A" * n) for n in SHM_SIZES] + [("shm-staged", "AAA")]
           + [("shm-python", "AA"), ("shm-python", "AAA")]
           + [("tcp", "A" * n) for n in TCP_SIZES] + [("multi", h) for h in MULTI_HOSTS])
#: families the "shm-python" jobs run (the others have no native path)
PYTHON_ONLY = ("shm_direct",)

JOB_TIMEOUT = 240.0     # one whole (transport, size) job
CALL_TIMEOUT = "30"     # COLLCOMM_TIMEOUT: bounds a hung case, so later cases still run
TEST_TIMEOUT = 300      # the first test of a configuration pays for its whole job

#: Known library bugs: (predicate(mode, n, collective, family, what), reason).
#: A failure matching one is reported as xfail (only if every other case passed).
KNOWN_BUGS: list[tuple[Callable[[str, int, str, str, str], bool], str]] = []


def config_id(mode: str, hosts: str) -> str:
    return f"multi-{hosts}" if mode == "multi" else f"{mode}-n{len(hosts)}"


def _rank_main(mode: str, only: tuple[str, ...] | None = None) -> dict[str, Any]:
    """Run every case on this rank (of the families in ``only``, if given); return its
    failures, timings and barrier times."""
    import collcomm.core.runtime as rt

    ctx = Ctx(rt.get_world("test_families"), mode)
    timings: dict[str, float] = {}
    for collective, table in ALGORITHMS.items():
        for fam in sorted(table):
            t0 = time.monotonic()
            if supported(fam, mode) and (only is None or fam in only):
                CHECKS[collective](ctx, fam)
                timings[f"{collective}/{fam}"] = time.monotonic() - t0
    for fam in sorted({f for table in ALGORITHMS.values() for f in table}):
        if not supported(fam, mode) and only is None:
            t0 = time.monotonic()
            rejected(ctx, fam)
            timings[f"{fam} rejected"] = time.monotonic() - t0
    for name, seq in SEQUENCES.items():
        t0 = time.monotonic()
        seq(ctx)
        timings[f"sequence/{name}"] = time.monotonic() - t0
    return {"failures": ctx.failures, "barrier": ctx.barrier_times, "timings": timings}


# ---------------------------------------------------------------------- the pytest side

def test_data_formula():
    """data() is its formula, computed the short way, and varies along the vector."""
    for rank in range(6):
        for salt in (0, 1, 4, 9):
            for count in (0, 1, 7, 1001):
                for dtype in DTYPES:
                    x = (np.arange(count, dtype=np.int64) + rank * 13 + salt * 5) % 7 - 3
                    want = np.ascontiguousarray(x.astype(dtype))
                    got = data(rank, count, dtype, salt)
                    assert got.dtype == want.dtype and np.array_equal(got, want)
                    assert got.flags.writeable and got.flags.c_contiguous
                    assert count < 7 or len(set(got.tolist())) == 7


_JOBS: dict[tuple[str, str], Any] = {}


def job(mode: str, hosts: str) -> list[dict[str, Any]]:
    """The per-rank results of the (mode, hosts) job, run once per session."""
    key = (mode, hosts)
    if key not in _JOBS:
        n = len(hosts)
        rank_env = None
        if mode == "multi":
            rank_env = {r: {"COLLCOMM_HOST_ID": h} for r, h in enumerate(hosts)}
        env = {"COLLCOMM_TIMEOUT": CALL_TIMEOUT}
        rank_mode, only = mode, None
        if mode == "shm-staged":
            rank_mode, env["COLLCOMM_CMA"] = "shm", "0"
        if mode == "shm-python":
            rank_mode, env["COLLCOMM_NATIVE"], only = "shm", "0", PYTHON_ONLY
        try:
            _JOBS[key] = run_ranks(_rank_main, n, rank_mode, only,
                                   transport=None if mode == "multi" else rank_mode,
                                   timeout=JOB_TIMEOUT, env=env, rank_env=rank_env)
        except Exception as exc:  # noqa: BLE001 - every test of this configuration reports it
            _JOBS[key] = exc
    result = _JOBS[key]
    if isinstance(result, Exception):
        raise result
    return result


def report(mode: str, hosts: str, collective: str, family: str) -> None:
    results = job(mode, hosts)
    n = len(hosts)
    fails = [(r, f) for r, res in enumerate(results) for f in res["failures"]
             if f[0] == collective and f[1] == family]
    known, unknown = [], []
    for r, (coll, fam, what, msg) in fails:
        reason = next((why for pred, why in KNOWN_BUGS if pred(mode, n, coll, fam, what)), None)
        (known if reason else unknown).append((reason, f"{what}: {msg}"))
    assert not unknown, (f"{collective}/{family} on {config_id(mode, hosts)}: "
                         f"{len(unknown)} failures:\n" + "\n".join(m for _, m in unknown[:40]))
    if known:
        pytest.xfail(str(known[0][0]) + "\n" + "\n".join(m for _, m in known[:10]))


def params() -> list[Any]:
    out = []
    for mode, hosts in CONFIGS:
        cid = config_id(mode, hosts)
        for collective in ALGORITHMS:
            for fam in available(collective):
                if mode == "shm-python" and fam not in PYTHON_ONLY:
                    continue
                out.append(pytest.param(mode, hosts, collective, fam,
                                        id=f"{cid}-{collective}-{fam}"))
        for name in SEQUENCES:
            out.append(pytest.param(mode, hosts, "sequence", name, id=f"{cid}-sequence-{name}"))
    return out


@pytest.mark.timeout(TEST_TIMEOUT)
@pytest.mark.parametrize("mode, hosts, collective, family", params())
def test_family(mode, hosts, collective, family):
    report(mode, hosts, collective, family)
    if collective == "barrier" and supported(family, mode):
        results = job(mode, hosts)
        for rnd in range(2):
            per_rank = [res["barrier"][family][rnd] for res in results]
            last_arrival = max(a for a, _ in per_rank)
            early = [r for r, (_, left) in enumerate(per_rank) if left < last_arrival]
            assert not early, (f"barrier {family} on {config_id(mode, hosts)}, round {rnd}: "
                               f"ranks {early} left before the last one arrived")


@pytest.mark.timeout(TEST_TIMEOUT)
@pytest.mark.parametrize("mode, hosts", [pytest.param(m, h, id=config_id(m, h))
                                         for m, h in CONFIGS])
def test_no_failures_outside_the_table(mode, hosts):
    """Every failure the job recorded belongs to some (collective, family) test above."""
    known = {(c, f) for c in ALGORITHMS for f in available(c)}
    known |= {("sequence", s) for s in SEQUENCES}
    stray = [f for res in job(mode, hosts) for f in res["failures"] if (f[0], f[1]) not in known]
    assert not stray, stray
