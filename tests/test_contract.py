"""The algorithms' contract (collcomm/algorithms/contract.py) and their import structure.

* Every class handed to the algorithms as a comm has each member of the protocols it
  claims, with parameters a caller of the protocol can use: GroupComm (all of them), the
  tracing wrapper (over anything that has them all), the in-process test double (the
  point-to-point Comm); every arena shm_direct gets (the real one, the tracing wrapper)
  and the native core have what contract.Arena / contract.NativeCore list.
  ``isinstance`` on a runtime_checkable Protocol would check neither instance attributes
  of slotted classes reliably nor any signature, so the members are compared one by one.
* The modules of collcomm.algorithms import each other without a cycle (also the lazy
  imports inside functions), and each imports on its own in a fresh interpreter.
"""
from __future__ import annotations

import ast
import inspect
import mmap
import os
import re
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from collcomm.algorithms import contract
from collcomm.core.call_comm import GroupComm
from collcomm.core.tracing import TracingArena, TracingComm
from collcomm.transport import arena as arena_mod

try:
    from threadcomm import ThreadComm
except ImportError:  # pragma: no cover - run from the repository root
    from tests.threadcomm import ThreadComm

ALGORITHMS = Path(contract.__file__).parent

#: Members of the contract GroupComm does not have yet (asked of core/group.py; hierarchical
#: falls back to the group's private list meanwhile). Remove a name once it is there.
PENDING: dict[type, set[str]] = {}


# ------------------------------------------------------------------------------ helpers
def members(proto: type) -> dict[str, typing.Any]:
    """name -> the protocol's function (methods) or None (attributes), over its bases."""
    out: dict[str, typing.Any] = {}
    for klass in reversed(proto.__mro__):
        if klass in (object, typing.Protocol, typing.Generic) or not getattr(klass, "_is_protocol", False):
            continue
        for name in klass.__dict__.get("__annotations__", {}):
            out[name] = None
        for name, value in klass.__dict__.items():
            if not name.startswith("_") and inspect.isfunction(value):
                out[name] = value
    return out


def compatible(proto_fn: typing.Any, impl: typing.Any, bound: bool) -> str | None:
    """Why ``impl`` cannot be called as ``proto_fn`` is (None: it can)."""
    want = list(inspect.signature(proto_fn).parameters.values())[1:]   # drop self
    try:
        have = list(inspect.signature(impl).parameters.values())
    except (TypeError, ValueError):
        return None   # a builtin without a text signature: see test_native_core
    if not bound:
        have = have[1:]
    if any(p.kind is p.VAR_POSITIONAL for p in have):
        return None
    positional = [p for p in have if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) < len(want):
        return f"takes {len(positional)} positional parameters, the contract passes {len(want)}"
    for w, h in zip(want, positional):
        if w.kind is not w.POSITIONAL_ONLY and w.name != h.name:
            return f"parameter {h.name!r} where the contract names {w.name!r}"
        if w.default is not w.empty and h.default is h.empty:
            return f"parameter {h.name!r} needs a default (the contract may omit it)"
    extra = [p for p in positional[len(want):] if p.default is p.empty]
    extra += [p for p in have if p.kind is p.KEYWORD_ONLY and p.default is p.empty]
    if extra:
        return f"parameters {[p.name for p in extra]} the contract never passes"
    return None


def problems(obj: typing.Any, proto: type, skip: typing.Iterable[str] = ()) -> list[str]:
    """What ``obj`` (a class, or an instance) lacks of ``proto``."""
    out = []
    is_class = isinstance(obj, type)
    for name, fn in members(proto).items():
        if name in skip:
            continue
        if not hasattr(obj, name):
            out.append(f"{name}: missing")
            continue
        if fn is None:
            continue
        impl = getattr(obj, name)
        if not callable(impl):
            out.append(f"{name}: not callable")
            continue
        why = compatible(fn, impl, bound=not is_class or isinstance(inspect.getattr_static(obj, name),
                                                                   (staticmethod, classmethod)))
        if why:
            out.append(f"{name}: {why}")
    return out


def standin(proto: type, **values: typing.Any) -> typing.Any:
    """An object with exactly ``proto``'s members (the protocol's own methods)."""
    ns = {name: (fn if fn is not None else values.get(name)) for name, fn in members(proto).items()}
    return type(f"StandIn{proto.__name__}", (), ns)()


@pytest.fixture
def arena():
    n, slot = 2, 4096
    a = arena_mod.Arena(mmap.mmap(-1, arena_mod.arena_size(n, slot)), n, 0, slot,
                        [os.getpid()] * n, [0, 1], 1.0)
    yield a
    a.close()


# --------------------------------------------------------------------------- the contract
def test_protocols_are_what_the_module_lists():
    assert all(getattr(p, "_is_protocol", False) for p in contract.PROTOCOLS)
    assert set(members(contract.FullComm)) == (
        set(members(contract.Comm)) | set(members(contract.Scratch)) | set(members(contract.Topology))
        | set(members(contract.Hierarchy)) | set(members(contract.SharedMemory)))
    assert set(members(contract.Comm)) == {"rank", "size", "isend", "irecv"}


def test_groupcomm_has_the_whole_contract():
    pending = PENDING.get(GroupComm, set())
    assert problems(GroupComm, contract.FullComm, skip=pending) == []
    # a member that has arrived must leave PENDING (and hierarchical its fallback)
    arrived = {name for name in pending if hasattr(GroupComm, name)}
    assert not arrived, f"GroupComm now has {arrived}: drop them from PENDING and the fallback"


def test_tracing_comm_keeps_the_contract():
    inner = standin(contract.FullComm, rank=0, size=1, sig=0, can_share_memory=False,
                    spans_hosts=False, n_hosts=1, link="tcp", hosts=["h"])
    assert problems(inner, contract.FullComm) == []
    assert problems(TracingComm(inner), contract.FullComm) == []
    assert problems(TracingComm, contract.Comm, skip={"rank", "size"}) == []


def test_thread_double_is_a_point_to_point_comm():
    assert problems(ThreadComm, contract.Comm, skip={"rank", "size"}) == []
    src = inspect.getsource(ThreadComm.__init__)
    assert "self.rank" in src and "self.size" in src


def test_arena_has_what_shm_direct_uses(arena):
    assert problems(arena, contract.Arena) == []
    assert problems(arena_mod.Arena, contract.Arena,
                    skip={n for n, f in members(contract.Arena).items() if f is None}) == []


def test_tracing_arena_keeps_the_contract(arena):
    comm = TracingComm(standin(contract.FullComm, rank=0, size=2, sig=0))
    assert problems(TracingArena(arena, comm), contract.Arena) == []
    inner = standin(contract.Arena, n=2, rank=0, slot=4096, phase=0, cma=False, cma_write=False,
                     cma_cost=1.0, global_ranks=[0, 1])
    assert problems(TracingArena(inner, comm), contract.Arena) == []


def test_native_core(arena):
    core = arena.native_core
    if core is None:
        pytest.skip("the native core is not built")
    assert problems(core, contract.NativeCore) == []
    for name, fn in members(contract.NativeCore).items():   # builtins: their doc's signature
        if fn is None:          # (a data member: present, checked by problems above)
            continue
        doc = getattr(core, name).__doc__ or ""
        found = re.match(rf"{name}\(([^)]*)\)", doc)
        assert found, f"{name}: no signature in its doc {doc!r}"
        have = [p.strip() for p in found.group(1).split(",") if p.strip()]
        want = list(inspect.signature(fn).parameters)[1:]
        assert len(have) == len(want), f"{name}{tuple(have)} but the contract passes {want}"


# ------------------------------------------------------------------------------- imports
def _type_checking_only(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return True
    return False


def import_graph() -> dict[str, set[str]]:
    """module -> the collcomm.algorithms modules it imports (anywhere in the file)."""
    package = "collcomm.algorithms"
    names = {p.stem for p in ALGORITHMS.glob("*.py")}
    graph: dict[str, set[str]] = {}
    for path in sorted(ALGORITHMS.glob("*.py")):
        me = package if path.stem == "__init__" else f"{package}.{path.stem}"
        tree = ast.parse(path.read_text(), str(path))
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        deps: set[str] = set()
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)) or _type_checking_only(node, parents):
                continue
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                if node.level:
                    base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                targets = [f"{target}.{a.name}" if target == package and a.name in names else target
                           for a in node.names]
            for t in targets:
                if t == package or t.startswith(package + "."):
                    t = ".".join(t.split(".")[:3])   # collcomm.algorithms.<module>
                    if t != me:
                        deps.add(t)
        graph[me] = deps
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}   # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                return stack[stack.index(d):] + [d]
            if d not in state:
                found = visit(d)
                if found:
                    return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_algorithms_import_graph_is_acyclic():
    graph = import_graph()
    assert "collcomm.algorithms.registry" in graph["collcomm.algorithms"]
    assert "collcomm.algorithms.hierarchical" in graph["collcomm.algorithms.registry"]
    assert find_cycle(graph) is None, f"import cycle: {' -> '.join(find_cycle(graph) or [])}"
    users = [m for m, deps in graph.items() if "collcomm.algorithms.registry" in deps]
    assert users == ["collcomm.algorithms"], f"only the package imports the registry, not {users}"


def test_each_module_imports_alone():
    """Fresh interpreters (two at a time: the import is all CPU, and a second core would idle);
    before each module every collcomm module is forgotten."""
    mods = sorted(f"collcomm.algorithms.{p.stem}" for p in ALGORITHMS.glob("*.py") if p.stem != "__init__")
    root = ALGORITHMS.parent.parent
    procs = []
    for part in (mods[0::2], mods[1::2]):
        code = (
            "import importlib, sys\n"
            f"for name in {part!r}:\n"
            "    for m in [m for m in sys.modules if m == 'collcomm' or m.startswith('collcomm.')]:\n"
            "        del sys.modules[m]\n"
            "    importlib.import_module(name)\n"
            "    h = sys.modules['collcomm.algorithms.hierarchical']\n"
            "    r = sys.modules['collcomm.algorithms.registry']\n"
            "    assert h._best is r.best, name + ': hierarchical has no step chooser'\n"
            "print('ok', len(" f"{part!r}" "))\n")
        procs.append((part, subprocess.Popen(
            [sys.executable, "-c", code], cwd=root, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(root)})))
    try:
        for part, proc in procs:
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err[-3000:]
            assert out.strip() == f"ok {len(part)}"
    finally:
        for _, proc in procs:
            proc.kill()
            proc.wait()
    assert sum(len(part) for part, _ in procs) == len(mods) > 10
