"""Every collective call's full signature (collective, dtype, count, root, op) is checked
across the ranks: a mismatch is a MismatchError on every rank naming both sides, never a
wrong answer (hardening issue, item 1)."""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest

from collcomm.algorithms import signature
from tests.harness import run_ranks


# ----------------------------------------------------------------------------- the word itself
def test_signature_fields_round_trip() -> None:
    sig = signature.make("all_reduce", np.float32, 4, None, "SUM")
    assert signature.describe(sig) == "all_reduce(float32[4], op=SUM)"
    assert signature.describe(signature.make("broadcast", np.int64, 3, 1)) == "broadcast(int64[3], root=1)"
    assert signature.describe(signature.make("reduce", "bfloat16", 7, 0, "MAX")) == \
        "reduce(bfloat16[7], op=MAX, root=0)"
    assert signature.describe(signature.make("barrier")) == "barrier"


@pytest.mark.parametrize("field,other", [
    ("dtype", signature.make("all_reduce", np.float64, 4, None, "SUM")),
    ("dtype", signature.make("all_reduce", np.int32, 4, None, "SUM")),
    ("count", signature.make("all_reduce", np.float32, 5, None, "SUM")),
    ("op", signature.make("all_reduce", np.float32, 4, None, "MAX")),
    ("op", signature.make("all_reduce", np.float32, 4, None, "AVG")),
    ("collective", signature.make("reduce_scatter", np.float32, 4, None, "SUM")),
])
def test_every_field_tells_calls_apart(field: str, other: int) -> None:
    mine = signature.make("all_reduce", np.float32, 4, None, "SUM")
    assert mine != other
    assert field in signature.differences(mine, other)


def test_all_dtypes_have_distinct_codes() -> None:
    dtypes = [np.bool_, np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64,
              np.uint64, np.float16, np.float32, np.float64, np.complex64, np.complex128, "bfloat16"]
    codes = [signature.dtype_code(d) for d in dtypes]
    assert len(set(codes)) == len(codes)


def test_user_ops_and_roots() -> None:
    a = signature.make("reduce", np.float32, 1, 0, "CUSTOM")
    b = signature.make("reduce", np.float32, 1, 2, "CUSTOM")
    assert a != b and "root" in signature.differences(a, b)
    assert "a user function" in signature.describe(a)


# ----------------------------------------------------------------------------- across ranks
def _cases(rank: int) -> list[tuple[str, Callable[[], Any]]]:
    """(what differs, the call this rank makes): rank 1 differs from the others."""
    import collcomm as dist

    odd = rank == 1
    f32 = np.float32

    def ar(dtype: Any = f32, count: int = 4, op: Any = dist.ReduceOp.SUM) -> Callable[[], Any]:
        return lambda: dist.all_reduce(np.ones(count, dtype=dtype), op=op)

    def bc(dtype: Any, root: int) -> Callable[[], Any]:
        return lambda: dist.broadcast(np.ones(3, dtype=dtype), src=root)

    def rd(root: int, op: Any) -> Callable[[], Any]:
        return lambda: dist.reduce(np.ones(2, dtype=f32), dst=root, op=op)

    n = dist.get_world_size()

    def ag(dtype: Any) -> Callable[[], Any]:
        return lambda: dist.all_gather_into_tensor(np.empty(2 * n, dtype=dtype), np.ones(2, dtype=dtype))

    def ga(root: int) -> Callable[[], Any]:
        return lambda: dist.gather(np.ones(2, dtype=f32),
                                   [np.empty(2, dtype=f32) for _ in range(n)] if rank == root else None,
                                   dst=root)

    def rs(dtype: Any) -> Callable[[], Any]:
        return lambda: dist.reduce_scatter_tensor(np.empty(2, dtype=dtype), np.ones(2 * n, dtype=dtype))

    def a2a(extra: int) -> Callable[[], Any]:
        out_split = [2] * n
        in_split = [2] * n
        if odd:
            in_split[0] += extra
        return lambda: dist.all_to_all_single(np.empty(sum(out_split), dtype=f32),
                                              np.ones(sum(in_split), dtype=f32),
                                              out_split, in_split)

    return [
        ("dtype", ar(np.float64 if odd else f32)),
        ("dtype", ar(np.int32 if odd else f32)),          # same byte size
        ("count", ar(count=5 if odd else 4)),
        ("op", ar(op=dist.ReduceOp.MAX if odd else dist.ReduceOp.SUM)),
        ("op", ar(op=dist.ReduceOp.AVG if odd else dist.ReduceOp.SUM)),
        ("dtype", bc(f32 if odd else np.int64, 0)),        # seed 004's sync_random_seed
        ("root", bc(f32, 1 if odd else 0)),
        ("root", rd(1 if odd else 0, dist.ReduceOp.SUM)),
        ("op", rd(0, dist.ReduceOp.MIN if odd else dist.ReduceOp.SUM)),
        ("dtype", ag(np.float64 if odd else f32)),
        ("root", ga(1 if odd else 0)),
        ("dtype", rs(np.float64 if odd else f32)),
        ("collective", (lambda: dist.broadcast(np.ones(4, dtype=f32), src=0)) if odd else ar()),
        ("split sizes", a2a(2)),
    ]


def run_mismatch_matrix(skip: tuple[str, ...] = ()) -> list[tuple[str, str, str]]:
    import collcomm as dist

    rank = dist.get_rank()
    seen = []
    for what, call in _cases(rank):
        if what in skip:
            continue
        try:
            call()
        except dist.MismatchError as exc:
            seen.append((what, "MismatchError", str(exc)))
        except Exception as exc:  # noqa: BLE001 - reported to the test
            seen.append((what, type(exc).__name__, str(exc)))
        else:
            seen.append((what, "no error", ""))
        # the group is still usable and right after a refused call
        t = np.full(2, rank + 1.0)
        dist.all_reduce(t)
        n = dist.get_world_size()
        assert t.tolist() == [n * (n + 1) / 2] * 2, t
    return seen


@pytest.mark.parametrize("n", [2, 3])
def test_mismatch_matrix_over_shared_memory(n: int) -> None:
    # every rank raises within the call: the eager rooted calls off (on by default where
    # the group has more ranks than CPUs, as n=3 on a 2-CPU machine)
    _check_matrix(run_ranks(run_mismatch_matrix, n, timeout=90,
                            env={"COLLCOMM_EAGER_ROOTED": "0"}))


def run_eager_matrix() -> list[tuple[str, str, str, str]]:
    """The matrix with eager rooted calls: each case, then a follow-up all_reduce; which
    raised; then a second all_reduce that must be right everywhere (every rank in step)."""
    import collcomm as dist

    rank, n = dist.get_rank(), dist.get_world_size()
    seen = []
    for what, call in _cases(rank):
        kinds = []
        for step in (call, lambda: dist.all_reduce(np.full(2, 1.0))):
            try:
                step()
            except dist.MismatchError as exc:
                kinds.append(("MismatchError", str(exc)))
            except Exception as exc:  # noqa: BLE001 - reported to the test
                kinds.append((type(exc).__name__, str(exc)))
            else:
                kinds.append(("no error", ""))
        t = np.full(2, rank + 1.0)
        dist.all_reduce(t)
        assert t.tolist() == [n * (n + 1) / 2] * 2, (what, t)
        seen.append((what, kinds[0][0], kinds[1][0], kinds[0][1] + kinds[1][1]))
    return seen


@pytest.mark.parametrize("n", [2, 3])
def test_mismatch_matrix_with_eager_rooted_calls(n: int) -> None:
    """COLLCOMM_EAGER_ROOTED=1: a broadcast's or scatter's root leaves before the others
    arrive and its receivers wait for the root alone, so a rank that cannot see a mismatch
    in the call raises it as its next call begins (naming the call, both sides and why it
    came late) and takes that call's step with a word no call makes, so that the ranks
    which raised in the call raise in the follow-up too: every rank raises, no result is
    wrong, and the ranks stay in step (the last all_reduce of each case is right)."""
    results = run_ranks(run_eager_matrix, n, timeout=90, env={"COLLCOMM_EAGER_ROOTED": "1"})
    late = 0
    for case in range(len(results[0])):
        what = results[0][case][0]
        for rank, seen in enumerate(results):
            _, in_call, follow_up, text = seen[case]
            assert {in_call, follow_up} <= {"MismatchError", "no error"}, (what, rank, seen[case])
            assert "MismatchError" in (in_call, follow_up), (what, rank, seen[case])
            assert "differs in" in text or what == "split sizes", (what, rank, text)
            if in_call == "no error":
                late += 1
                assert "found when this rank's next call" in text, text
    from collcomm import native
    if native.core is not None:   # (the broadcast cases: the root learns it late; without
        assert late > 0           # the native core every rank raises within the call)


def _check_matrix(results: list[Any]) -> None:
    for rank, seen in enumerate(results):
        for what, kind, text in seen:
            assert kind == "MismatchError", f"rank {rank}, {what} mismatch: got {kind} {text}"
            if what != "split sizes":
                assert "rank 1 called" in text or (rank == 1 and "but rank" in text), text
                assert "differs in" in text


def run_tcp_matrix() -> list[tuple[str, str, str]]:
    """The matrix minus the cases no message can reveal over point-to-point (a root that
    differs: both sides wait for each other; those end in the call timeout, tested below)."""
    import collcomm as dist

    with dist.call_timeout(20):
        return run_mismatch_matrix(skip=("root",))


@pytest.mark.parametrize("n", [2, 3])
def test_mismatch_matrix_over_tcp(n: int) -> None:
    """Over TCP the signature travels in every message header. A rank whose receive gets
    another call's message raises and tells every member it abandoned the call, so every
    rank that receives in the call raises at once; a rank that only sends (a broadcast
    root, a reduce leaf) cannot know and returns. Never a wrong result: the follow-up
    all_reduce of each case checks the group is still right."""
    results = run_ranks(run_tcp_matrix, n, timeout=120, transport="tcp")
    for case in range(len(results[0])):
        what = results[0][case][0]
        kinds = [seen[case][1] for seen in results]
        assert set(kinds) <= {"MismatchError", "no error"}, (what, [s[case] for s in results])
        assert "MismatchError" in kinds, (what, kinds)
        for seen in results:
            if seen[case][1] == "MismatchError" and what != "split sizes":
                assert "differs in" in seen[case][2] or "abandoned" in seen[case][2], seen[case][2]
    assert results[1][0][1] == "MismatchError"      # the odd rank is told in an all_reduce


def different_roots() -> str:
    import collcomm as dist

    rank = dist.get_rank()
    with dist.call_timeout(2):
        try:
            dist.reduce(np.ones(2, dtype=np.float32), dst=rank)
        except dist.CollcommError as exc:
            return type(exc).__name__
    return "no error"


def test_different_roots_over_tcp_time_out_naming_the_peer() -> None:
    """Both ranks think they are the root: no message can tell them, so the call timeout
    does (a rank may instead see the other leave after its own timeout); never a hang."""
    kinds = run_ranks(different_roots, 2, timeout=60, transport="tcp")
    assert "CommTimeoutError" in kinds and set(kinds) <= {"CommTimeoutError", "PeerLostError"}, kinds


def seed_004_sync_random_seed() -> str:
    """Seed 004's sync_random_seed with an int64 tensor on rank 0 and float32 elsewhere."""
    import collcomm as dist

    seed = np.array([136044], dtype=np.int64) if dist.get_rank() == 0 else np.zeros(1, dtype=np.float32)
    try:
        dist.broadcast(seed, src=0)
    except dist.MismatchError as exc:
        return str(exc)
    return f"no error: seed {seed[0]!r}"


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_seed_004_dtype_mismatch_is_refused(transport: str) -> None:
    texts = run_ranks(seed_004_sync_random_seed, 2, timeout=60, transport=transport)
    receiver = texts[1]
    assert "int64" in receiver and "float32" in receiver and "dtype" in receiver, receiver
    if transport == "shm":    # over TCP the root only sends, so it cannot know
        assert "int64" in texts[0] and "float32" in texts[0], texts[0]


def p2p_other_dtype() -> str:
    """rank 0 sends float64[2]; rank 1 receives into float32[4] (the same 16 bytes)."""
    import collcomm as dist

    if dist.get_rank() == 0:
        dist.send(np.arange(2, dtype=np.float64), dst=1)
        dist.send(np.arange(2, dtype=np.float64), dst=1)   # the stream goes on after a refusal
        return "sent"
    try:
        dist.recv(np.empty(4, dtype=np.float32), src=0)
    except dist.MismatchError as exc:
        text = str(exc)
    else:
        text = "no error"
    good = np.empty(2, dtype=np.float64)
    dist.recv(good, src=0)
    return text + f" | then {good.tolist()}"


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_p2p_receive_of_another_dtype_is_refused(transport: str) -> None:
    sent, text = run_ranks(p2p_other_dtype, 2, timeout=60, transport=transport)
    assert sent == "sent"
    assert "float32" in text and "float64" in text and "never reinterpreted" in text, text
    assert text.endswith("then [0.0, 1.0]"), text
