"""The controller's decisions live in control/ alone ([U]): no module of a shell (server/,
sim/) imports a decision policy or one of the room's rule modules, or defines a function
by a policy's name; the shells reach the room through its faces (room, observe, ops,
snapshot, view, wake, start). A second controller written in a shell fails here."""

from __future__ import annotations

import ast
from pathlib import Path

import janusd

ROOT = Path(janusd.__file__).parent
# the room's faces a shell may call; every other module of control/ is a rule of the room
FACES = {"janusd.control.room", "janusd.control.observe", "janusd.control.ops", "janusd.control.snapshot",
         "janusd.control.view", "janusd.control.wake", "janusd.control.start"}
# policy modules a shell may read types and settings from, by the names it may import
ALLOWED_POLICY = {"janusd.policy.policy_config": None, "janusd.policy.pinned": {"place"},
                  "janusd.policy.demand": {"SteadyModel"}, "janusd.policy.start_placement": {"NO_LOAD"},
                  "janusd.policy.snapshot": None}
POLICY_NAMES = {"classify", "plan", "scale", "elastic_demand", "steady_items", "residency", "plan_roles",
                "meet_count", "meet_extras", "meet_roles", "keepalive_ops", "placement_snapshot", "plan_fast",
                "plan_slow", "start_placement", "first_come", "wake_op", "traffic_from_counts"}


def _imports(tree: ast.AST) -> list[tuple[str, set[str]]]:
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom) and n.module:
            out.append((n.module, {a.name for a in n.names}))
        elif isinstance(n, ast.Import):
            out += [(a.name, set()) for a in n.names]
    return out


def _shell_files() -> list[Path]:
    return sorted([*(ROOT / "server").glob("*.py"), *(ROOT / "sim").glob("*.py")])


def test_no_shell_imports_a_decision():
    bad = []
    for f in _shell_files():
        for mod, names in _imports(ast.parse(f.read_text())):
            if mod.startswith("janusd.control") and mod not in FACES:
                bad.append(f"{f.name}: {mod}")
            if mod.startswith("janusd.policy"):
                allowed = ALLOWED_POLICY.get(mod, set())
                if allowed is not None and not names <= allowed:
                    bad.append(f"{f.name}: {mod} {sorted(names - allowed)}")
    assert bad == []


def test_no_shell_defines_a_policy_function():
    # plan_fast / plan_slow are allowed in server/controller.py only as the room's callers
    for f in _shell_files():
        tree = ast.parse(f.read_text())
        defined = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        clash = defined & POLICY_NAMES
        if f.name == "controller.py":
            src = f.read_text()
            clash = {n for n in clash if f"self.room.{n}(" not in src}
        assert not clash, f"{f.relative_to(ROOT)} defines {clash}"


def test_the_check_sees_a_shell_that_decides(tmp_path):
    """The scan itself: a shell module importing the scaling policy is named."""
    tree = ast.parse("from janusd.policy.scaling import scale\nfrom janusd.control.extras import meet_extras\n")
    mods = dict(_imports(tree))
    assert "janusd.policy.scaling" in mods and "janusd.control.extras" in mods
    assert "janusd.policy.scaling" not in ALLOWED_POLICY and "janusd.control.extras" not in FACES
