"""The shells reach the core through its face ([U]): no module of server/ or sim/ imports a
module of core/ (only the package, whose names are the face: core/__init__.py), and no
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
