"""The shells reach the core through its face ([U]): no module of server/ or sim/ imports a
module of core/ (only the package, whose names are the face: core/__init__.py), no module
of server/, sim/ or control/ reads a ServingCore's parts (its registry, request table,
Dispatcher, held queues, ...: it calls the core's methods, core/serving.py's views), and no
module of server/ reads a clock but daemon_clock.py, the daemon's one clock."""

from __future__ import annotations

import ast
from pathlib import Path

import janusd
import janusd.core

ROOT = Path(janusd.__file__).parent


def _files(*rooms: str) -> list[Path]:
    return sorted(f for r in rooms for f in (ROOT / r).glob("*.py"))


def _core_imports(tree: ast.AST) -> list[str]:
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom) and n.module and n.module.startswith("janusd.core."):
            out.append(n.module)
        elif isinstance(n, ast.Import):
            out += [a.name for a in n.names if a.name.startswith("janusd.core.")]
    return out


def test_shells_import_the_core_by_its_face_only():
    bad = {f.name: _core_imports(ast.parse(f.read_text())) for f in _files("server", "sim")}
    assert {k: v for k, v in bad.items() if v} == {}
    for name in janusd.core.__all__:  # the face is real: every name it lists is there
        assert getattr(janusd.core, name) is not None


# ServingCore's parts (core/core_state.py): a shell calls the core's methods instead
INTERNAL = frozenset({"registry", "requests", "dispatch", "telemetry", "held", "guard", "handoff", "limits",
                      "workers", "obs", "tokenizing"})
CORE_NAMES = ("core", "_core")  # what the shells call a ServingCore (`self.core`, `ops.core`, `core`)


def _internal_reads(tree: ast.AST) -> list[str]:
    """`core.<part>` and `<anything>.core.<part>` (also `_core`), and any private `core._x`."""
    reads = []
    for n in ast.walk(tree):
        if not isinstance(n, ast.Attribute) or not (n.attr in INTERNAL or n.attr.startswith("_")):
            continue
        v = n.value
        if (isinstance(v, ast.Name) and v.id in CORE_NAMES) or (isinstance(v, ast.Attribute) and v.attr in CORE_NAMES):
            reads.append((n.lineno, n.col_offset, f"line {n.lineno}: {ast.unparse(n)}"))
    return [r for *_, r in sorted(reads)]


def test_shells_read_the_core_through_its_methods():
    reads = {f"{f.parent.name}/{f.name}": _internal_reads(ast.parse(f.read_text()))
             for f in _files("server", "sim", "control")}
    assert {k: v for k, v in reads.items() if v} == {}
    # the scan sees each shape a shell used to write
    snippet = ("a = self.core.requests.count()\nb = core.dispatch.stats()\nc = self._core.held\n"
               "d = ops.core.registry.model('m')\ne = self.host.core.telemetry\nf = core._now\n"
               "ok = self.core.in_flight() + core.window('m', 0.0).request_rate + self.registry.x\n")
    assert [r.split(": ")[1] for r in _internal_reads(ast.parse(snippet))] == [
        "self.core.requests", "core.dispatch", "self._core.held", "ops.core.registry", "self.host.core.telemetry",
        "core._now"]


def _clock_reads(tree: ast.AST) -> list[str]:
    reads = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "time" and \
                n.attr in ("monotonic", "time", "perf_counter", "monotonic_ns", "time_ns"):
            reads.append(f"time.{n.attr}")
    return reads


def test_the_daemon_reads_one_clock():
    reads = {f.name: _clock_reads(ast.parse(f.read_text())) for f in _files("server") if f.name != "daemon_clock.py"}
    assert {k: v for k, v in reads.items() if v} == {}
    assert _clock_reads(ast.parse("import time\nx = time.monotonic()\n")) == ["time.monotonic"]  # the scan sees one
