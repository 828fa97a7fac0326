"""One simulation from a trace to its headline figures and run directory.

The summary's keys are the issue's (`janus sim` prints them as its last line):
policy, requests, token_attainment, ttft_attainment, tpot_attainment, goodput_rps,
device_hours, mean_app_attainment, worst_app_attainment, wall_s; plus what explains them
(outcomes by kind, the worst app's name, simulated requests per wall second, devices,
device kind, the controller's counts: policy decisions, keep-alive rests and wake-ups). A run directory gets results.jsonl, devices.csv and summary.json
(trace/results.py), so `janus report` reads a simulated run like a replayed one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from janusd.config import JanusConfig
from janusd.hw import device_spec
from janusd.sim.cluster import Cluster
from janusd.sim.served import served_models
from janusd.sim.perfmodel import PerfModel
from janusd.sim.policies import POLICIES
from janusd.sim.specs import SimModel
from janusd.sim.worker import EngineLimits
from janusd.trace import slo
from janusd.trace.formats import Trace
from janusd.trace.results import jsonable


def simulate(trace: Trace, archs: dict[str, SimModel], devices: int, policy: str,
             device: str = "ascend-910c-die", keep_times: bool = False,
             perf: PerfModel | None = None, engine: EngineLimits = EngineLimits(), oracle_error: float = 0.0,
             oracle_seed: int = 0, config: JanusConfig | None = None) -> tuple[Cluster, dict[str, Any]]:
    """Run `policy` on `devices` devices of kind `device`; ValueError for bad arguments
    (unknown policy, a pool too small for one instance of every model, an oracle error
    outside [0, 1)). `oracle_error`: a controller policy's oracle misjudges each model's load
    by up to that fraction (sim/oracle_error.py). `config`: a daemon's configuration to run
    as that daemon would (sim/configured.py; policy janus runs its room, static only places)."""
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r} (known: {', '.join(POLICIES)})")
    if devices < 1:
        raise ValueError(f"--devices must be >= 1, got {devices}")
    pol = POLICIES[policy]
    perf = perf or PerfModel(device_spec(device))
    served, req_model = served_models(trace, archs)
    if config is not None:
        cluster = _configured(config, policy, trace, served, req_model, perf, devices, engine, keep_times,
                              oracle_error, oracle_seed)
    else:
        cluster = Cluster(trace, served, req_model, perf, devices, pol.dispatch, engine=engine, keep_times=keep_times)
        pol.setup(cluster, served, trace, req_model, oracle_error, oracle_seed)
    wall = cluster.run()
    out = summary(cluster, policy, wall)
    if pol.controlled:
        out["oracle_error"] = oracle_error
    return cluster, out


def configured_cluster(trace: Trace, archs: dict[str, SimModel], devices: int, policy: str, perf: PerfModel,
                       engine: EngineLimits, config: JanusConfig, keep_times: bool = False) -> Cluster:
    """A daemon configuration's cluster, set up and not yet run (simulate() with `config`
    runs it): for drivers that watch the run, as bench/replay_sim.py's closed loop does."""
    served, req_model = served_models(trace, archs)
    return _configured(config, policy, trace, served, req_model, perf, devices, engine, keep_times, 0.0, 0)


def _configured(cfg: JanusConfig, policy: str, trace: Trace, served: list, req_model: np.ndarray, perf: PerfModel,
                devices: int, engine: EngineLimits, keep_times: bool, oracle_error: float,
                oracle_seed: int) -> Cluster:
    """A cluster running a daemon's configuration (sim/configured.py)."""
    from janusd.sim import configured
    from janusd.sim.control_shell import SimControl

    if policy not in ("janus", "static"):
        raise ValueError(f"--config runs the daemon's own policy: janus (its controller) or static (its "
                         f"placement alone), not {policy!r}")
    pins = configured.pinned(cfg, served, devices)
    if policy == "static" and any(not m.devices for m in pins.values()):
        raise ValueError("static with --config: every model needs `devices` (an unmanaged daemon places nothing)")
    cluster = Cluster(trace, served, req_model, perf, devices, cfg.dispatch, engine=engine, keep_times=keep_times,
                      model_wait_timeout_s=cfg.server.model_wait_timeout_s, telemetry_window_s=cfg.control.window_s)
    configured.apply(cluster.core.models(), pins)
    control = msgspec.structs.replace(cfg.control, managed=True)
    SimControl(cluster, served, "janus", oracle_error=oracle_error, oracle_seed=oracle_seed, control=control,
               plans=policy == "janus").start()
    return cluster


def summary(cluster: Cluster, policy: str, wall_s: float) -> dict[str, Any]:
    tr = cluster.trace
    n = len(tr.arrival_s)
    duration = float(tr.arrival_s[-1] - tr.arrival_s[0]) if n > 1 else 1.0
    s = slo.summarize(cluster.outcome().outcomes(), tr.app_id, len(tr.apps), max(duration, 1e-9))
    return {
        "policy": policy, "requests": n, "token_attainment": s["token_attainment"],
        "ttft_attainment": s["ttft_attainment"], "tpot_attainment": s["tpot_attainment"],
        "e2e_attainment": s["e2e_attainment"], "goodput_rps": s["goodput_rps"],
        "device_hours": cluster.device_hours, "devices": cluster.n_devices,
        "device": cluster.perf.device.name, "outcomes": dict(sorted(cluster.outcome_counts.items())),
        "sim_end_s": cluster.now, "sim_requests_per_wall_s": n / wall_s if wall_s > 0 else float("inf"),
        "mean_app_attainment": s["app_mean_token_attainment"],
        "worst_app_attainment": s["app_worst_token_attainment"], "worst_app": worst_app(cluster),
        "controller": cluster.figures() if cluster.figures is not None else {},
        "wall_s": wall_s,
    }


def worst_app(cluster: Cluster) -> str | None:
    """The app with the lowest per-token attainment (the summary's worst_app_attainment)."""
    tok = per_app(cluster)["token_attainment"]
    if not np.isfinite(tok).any():
        return None
    return cluster.trace.apps[int(np.nanargmin(tok))]


def write_run(cluster: Cluster, out: str | Path, summ: dict[str, Any]) -> None:
    """results.jsonl (token times only where the run kept them), devices.csv, summary.json."""
    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    enc = msgspec.json.Encoder()
    with open(d / "results.jsonl", "wb") as f:
        for row in cluster.result_rows():
            f.write(enc.encode(row))
            f.write(b"\n")
    with open(d / "devices.csv", "w") as f:
        f.write("t_s,active_devices,active_instances\n")
        t0 = float(cluster.trace.arrival_s[0]) if len(cluster.trace.arrival_s) else 0.0
        for t, dev, inst in cluster.device_series:
            f.write(f"{max(t, t0):.6f},{dev},{inst}\n")
        f.write(f"{cluster.now:.6f},{cluster.device_series[-1][1]},{cluster.device_series[-1][2]}\n")
    (d / "summary.json").write_text(json.dumps(jsonable(summ), indent=1) + "\n")


def per_app(cluster: Cluster) -> dict[str, np.ndarray]:
    tr = cluster.trace
    return slo.per_app(cluster.outcome().outcomes(), tr.app_id, len(tr.apps))
