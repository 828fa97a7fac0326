"""The import graph of janusd, read from the source with ast (nothing is imported): no
import circle anywhere, and the layers DESIGN.md draws hold where a test can see them.

Every import statement counts, a function's own included: an import moved into a
function to dodge a circle at load time still ties the two modules together."""

from __future__ import annotations

import ast
from pathlib import Path

import janusd

ROOT = Path(janusd.__file__).parent


def _module_name(f: Path) -> str:
    parts = list(f.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(f): f for f in ROOT.rglob("*.py")}


def _resolve(name: str) -> str | None:
    """The janusd module `name` is, or is inside (`janusd.config.ModelConfig` -> janusd.config)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str) -> set[str]:
    """The janusd modules `module` imports, anywhere in its file."""
    f = MODULES[module]
    package = module if f.name == "__init__.py" else module.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(f.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(up + ([base] if base else []))
            names = [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for n in names:
            r = _resolve(n)
            if r is not None and r != module:
                out.add(r)
    return out


GRAPH = {m: imports_of(m) for m in MODULES}


def find_circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle (its modules, the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                return path[path.index(d):] + [d]
            if d not in state and (found := visit(d)):
                return found
        path.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_the_graph_sees_the_imports_it_must():
    # the reader itself: an absolute, a relative-free submodule and a lazy import are edges
    assert "janusd.config.checks" in GRAPH["janusd.config"]
    assert "janusd.hw.spec" in GRAPH["janusd.hw.cpu_peaks"]
    assert "janusd.hw.cpu_peaks" in GRAPH["janusd.hw.devices"]
    assert len(MODULES) > 150


def test_find_circle_finds_one_through_a_function_level_import():
    assert find_circle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_circle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_no_janusd_module_imports_itself_back():
    circle = find_circle(GRAPH)
    assert circle is None, "import circle: " + " -> ".join(circle or [])


def test_wire_and_policy_import_nothing_of_config():
    """Config runs one way: config/ composes the components' settings (policy/policy_config.py)
    and the sender converts what travels (wire/ has its own Structs)."""
    offenders = {m: sorted(d for d in deps if d == "janusd.config" or d.startswith("janusd.config."))
                 for m, deps in GRAPH.items() if m.startswith(("janusd.wire", "janusd.policy"))}
    assert {m: d for m, d in offenders.items() if d} == {}
    assert "janusd.policy.policy_config" in GRAPH["janusd.config.sections"]  # config composes the policies'


def test_hw_imports_nothing_else_of_janusd():
    """DESIGN.md: hw/ (device and model specs) sits below everything."""
    outside = {m: sorted(d for d in deps if not d.startswith("janusd.hw"))
               for m, deps in GRAPH.items() if m.startswith("janusd.hw")}
    assert {m: d for m, d in outside.items() if d} == {}
