"""The simulated side of `janus bench cluster` ([W]): the same trace and the arm's own
daemon config through `janus sim --device cpu` (the same control room on the simulator's
cpu model of this machine), scored by bench/cluster_figures.py like a real run.

Two predictions per arm:
- uncalibrated: the engine bench's step figures of demo:llama-small (CALIBRATION, a
  quiet machine), host figures times HOST_SCALE (2.70: fitted to a real replay's median
  TPOT at light load, bench/RESULTS.md "sim, second pass");
- calibrated on static: the host scale found by bisection so that the simulated static
  arm meets the real static arm's token attainment, then used for both arms. The janus
  arm is then a prediction from the other arm's measurement. Why a second one: the
  simulator's cpu devices are independent, while on the real machine the daemon, the
  token streams and the replayer share the two cores with the workers, so the host cost
  per step grows with load (the first bench run: real static 0.47, simulated 1.0 at 2.70).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from janusd.bench.cluster_figures import figures
from janusd.bench.cluster_setup import APPS, config
from janusd.trace.formats import Trace

CALIBRATION = Path(__file__).resolve().parents[3] / "tests" / "data" / "sim_calib_engine.json"
HOST_SCALE = 2.70
SCALE_RANGE = (1.0, 30.0)  # the host scales the static fit searches
FIT_STEPS = 8  # bisection steps: the bracket ends within (30 - 1) / 2^8 = 0.11 of the scale


def simulate(arm: str, trace: Trace, trace_path: Path, run_dir: Path, seconds: float,
             host_scale: float = HOST_SCALE) -> dict[str, Any]:
    """The arm simulated at `host_scale`: the figures of a real run, or {"error": why}."""
    try:
        s = _sim(arm, trace_path, run_dir, host_scale)
    except subprocess.CalledProcessError as e:  # the simulator refuses the arm: say why
        return {"error": (e.stderr or b"").decode(errors="replace").strip()[-500:]}
    dev = np.loadtxt(s["devices"], delimiter=",", skiprows=1, ndmin=2)
    return figures(s["results"], trace, step_integral(dev, seconds))


def fit_host_scale(trace: Trace, trace_path: Path, base: Path, seconds: float, static_attainment: float
                   ) -> tuple[float, dict[str, Any]]:
    """The host scale at which the simulated static arm's token attainment meets the real
    one (bisection: more host time per step serves fewer tokens on time), and the static
    figures there."""
    lo, hi = SCALE_RANGE
    best: tuple[float, dict[str, Any]] | None = None
    for k in range(FIT_STEPS):
        mid = (lo + hi) / 2.0
        f = simulate("static", trace, trace_path, base / f"fit-{k}", seconds, mid)
        if "error" in f:
            return mid, f
        if best is None or abs(f["token_attainment"] - static_attainment) < abs(
                best[1]["token_attainment"] - static_attainment):
            best = (mid, f)
        lo, hi = (mid, hi) if f["token_attainment"] > static_attainment else (lo, mid)
    assert best is not None
    return best


def _sim(arm: str, trace_path: Path, run_dir: Path, host_scale: float) -> dict[str, Path]:
    """`janus sim --device cpu --config` on the trace: the arm's own daemon config, simulated."""
    models = run_dir / "models.toml"
    run_dir.mkdir(parents=True, exist_ok=True)
    from janusd.engine.checkpoint.demo import demo_arch

    lines = []
    for app, (ckpt, _, _) in APPS.items():
        arch, size = ckpt.split(":")[1].split("-")
        cfg_path = run_dir / f"{app}.json"
        cfg_path.write_text(json.dumps(msgspec.to_builtins(demo_arch(arch, size))))
        lines.append(f'[{app}]\nconfig = "{cfg_path.name}"\nttft_slo_ms = 1000\ntpot_slo_ms = 100\n')
    models.write_text("\n".join(lines))
    daemon_cfg = run_dir / "janusd.toml"  # the very config the daemon ran (sim/configured.py)
    daemon_cfg.write_text(config(arm, str(run_dir)))
    out = run_dir / "sim"
    cmd = [sys.executable, "-m", "janusd.cli", "sim", "--trace", str(trace_path), "--devices", "2", "--policy", arm,
           "--device", "cpu", "--device-memory-mib", "512", "--models", str(models), "--config", str(daemon_cfg),
           "--out", str(out), "--json"]
    if CALIBRATION.exists():
        perf = run_dir / "perf.json"
        perf.write_text(json.dumps(calibrated_perf(run_dir / "burst-a.json", host_scale)))
        cmd += ["--perf", str(perf)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=1800)
    return {"results": out / "results.jsonl", "devices": out / "devices.csv"}


def calibrated_perf(arch_config: Path, host_scale: float) -> dict[str, float]:
    """The simulator's cpu figures fitted to CALIBRATION (demo:llama-small's steps), host
    figures times `host_scale`: what `janus sim --calibrate ... --calibrate-tpot-ms` finds."""
    from janusd.hw import device_spec
    from janusd.sim.calibrate import fit, points_from_bench
    from janusd.sim.perfmodel import PerfModel
    from janusd.sim.specs import load_models_file

    models = arch_config.parent / "calib.toml"
    models.write_text(f'[llm]\nconfig = "{arch_config.name}"\n')
    m = load_models_file(models)["llm"]
    result = json.loads(CALIBRATION.read_text().strip().splitlines()[-1])
    f = fit(points_from_bench(result, "demo-llama-small"), m, PerfModel(device_spec("cpu", hbm_bytes=512 * 2**20)))
    p = f.perf
    return {"overhead_s": p.overhead_s * host_scale, "seq_overhead_s": p.seq_overhead_s * host_scale,
            "compute_eff": p.compute_eff, "bandwidth_eff": p.bandwidth_eff}


def step_integral(dev: np.ndarray, end: float) -> float:
    """Seconds x active devices of a (t_s, active_devices, ...) step series up to `end`."""
    dev = dev[dev[:, 0] < end] if len(dev) else dev
    if len(dev) == 0:
        return 0.0
    t = np.append(dev[:, 0], end)
    return float(np.sum(np.diff(t) * dev[:, 1]))
