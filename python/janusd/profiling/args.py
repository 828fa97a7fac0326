"""What one `janus profile` run is asked to do (profile_cli.py fills it from the command
line, whose defaults are these)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass
class ProfileArgs:
    spec: str
    device: str = "cpu"  # engine device kind
    device_spec: str | None = None  # hw preset; None = the kind's default
    out: Path = Path("profile.npz")
    budget_s: float = 180.0
    max_instances: int = 2
    point_s: float = 8.0
    ttft_slo_ms: float = 1000.0
    tpot_slo_ms: float = 200.0
    mixes: tuple[str, ...] = ("short", "long")
    start_rate: float = 1.0
    max_rate: float = 256.0
    memory_mib: int = 1024
    kv_cache_mib: int = 256
    dtype: str = "float32"
    torch_threads: int = 1
    cache_dir: str | None = None
    seed: int = 0
    repeats: int = 2  # measurements of each load point (noise.py: their spread is the noise floor)
    pin_cores: bool = False  # cpu: workers on cores of their own, the daemon and the replayer on the rest (split_cores)
    quiet: bool = False
    keep_dir: Path | None = None
