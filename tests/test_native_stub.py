"""The hand-written stub `_native.pyi` must match the built extension (mypy stubtest)."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_native_stub_matches_extension():
    proc = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "janusd._native", "--allowlist", str(REPO / ".stubtest-allowlist")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
