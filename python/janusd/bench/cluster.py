"""`janus bench cluster`: does the controller earn its keep on a real daemon ([W])?

One bursty six-app trace (bench/cluster_setup.py) replayed open loop on a managed daemon
(janus) and on an unmanaged one with the operator's even split (static), runs alternating
(janus, static, janus, ...) so that the machine's drift hits both, and the same trace
simulated by `janus sim --device cpu` (the same control room on the simulator's cpu
model of this machine, not calibrated per run). Per arm, real and simulated side by side:
token attainment overall and per app, refusals and errors, p99 TTFT, Active
device-seconds (a device counts while any instance on it is Active), and for janus the
bursty apps' scale-out delays (burst start -> their second Active instance, from
/metrics sampled every POLL_S) and scale-outs undone (a second instance gone and back
within the hold time, from the samples; and the daemon's own
janusd_controller_scale_outs_undone_total: a replica scaled in within the hold of its
scale-out).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from janusd.bench import daemon_proc
from janusd.bench.cluster_figures import ModelTimeline, figures, scale_out_delays, undone_scale_outs
from janusd.bench.cluster_sim import fit_host_scale, simulate
from janusd.bench.cluster_setup import APPS, HOLD_S, burst_starts, config, expected_active, make_trace
from janusd.trace.formats import write_trace

POLL_S = 0.25


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seconds", type=float, default=240.0, help="trace length (default 240)")
    p.add_argument("--runs", type=int, default=3, help="runs per arm, alternating (default 3)")
    p.add_argument("--seed", type=int, default=1, help="trace seed (default 1)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per worker (default 1: a core each)")
    p.add_argument("--no-sim", action="store_true", help="skip the simulated prediction")
    p.add_argument("--out", default="", help="keep the run directories here (default: a temporary one)")


class _Poller:
    """Each model's Active devices every POLL_S, from /metrics (a thread: the replay owns the loop)."""

    def __init__(self, port: int, t0_wall: float) -> None:
        self.port, self.t0 = port, t0_wall
        self.timeline = ModelTimeline()
        self.undone_metric = 0  # janusd_controller_scale_outs_undone_total, all models, last read
        self._stop = False

    def run(self) -> None:
        import http.client

        from prometheus_client.parser import text_string_to_metric_families

        while not self._stop:
            try:
                c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                c.request("GET", "/metrics")
                text = c.getresponse().read().decode()
                c.close()
                # stamped when the reply is in, not when it was asked for: a daemon busy with a
                # burst answers late, and a state stamped at the asking showed scale-outs
                # before their bursts began (delays never understated)
                t = time.time() - self.t0
                active: dict[str, set[int]] = {}
                for fam in text_string_to_metric_families(text):
                    if fam.name == "janusd_instance_state":
                        for s in fam.samples:
                            if s.labels.get("state") == "active" and s.value == 1:
                                active.setdefault(s.labels["model"], set()).add(int(s.labels["device"]))
                    elif fam.name == "janusd_controller_scale_outs_undone":
                        self.undone_metric = int(sum(s.value for s in fam.samples if s.name.endswith("_total")))
                self.timeline.add(t, active)
            except (OSError, ValueError):
                pass
            time.sleep(POLL_S)

    def stop(self) -> None:
        self._stop = True


def _one_run(arm: str, trace: Any, run_dir: Path, threads: int) -> dict[str, Any]:
    import threading

    from janusd.trace.replay import ReplayConfig, replay

    run_dir.mkdir(parents=True, exist_ok=True)
    proc, port = daemon_proc.start(config(arm, str(run_dir)), run_dir, threads, expected_active(arm))
    try:
        start_at = time.time() + 2.0
        poller = _Poller(port, start_at)
        th = threading.Thread(target=poller.run, daemon=True)
        th.start()
        cfg = ReplayConfig(url=f"http://127.0.0.1:{port}/v1", devices_poll_s=0.0, timeout_s=120.0)
        summary = asyncio.run(replay(trace, cfg, run_dir / "replay", start_at=start_at))
        poller.stop()
        th.join(5)
    finally:
        daemon_proc.stop(proc)
    return {"summary": summary, "timeline": poller.timeline, "undone_metric": poller.undone_metric}


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.runs < 1:
        raise ValueError("--runs must be >= 1")
    trace = make_trace(args.seconds, args.seed)
    base = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="janus-bench-cluster-"))
    base.mkdir(parents=True, exist_ok=True)
    trace_path = base / "trace.csv"
    write_trace(trace, trace_path)
    bursts = burst_starts(args.seconds)
    real: dict[str, list[dict[str, Any]]] = {"janus": [], "static": []}
    for k in range(args.runs):
        for arm in ("janus", "static"):
            r = _one_run(arm, trace, base / f"{arm}-{k}", args.threads)
            f = figures(base / f"{arm}-{k}" / "replay" / "results.jsonl", trace, r["timeline"].device_seconds())
            if arm == "janus":
                f["scale_out_delays_s"] = scale_out_delays(r["timeline"], bursts)
                f["scale_outs_undone"] = undone_scale_outs(r["timeline"], list(bursts), HOLD_S)
                f["scale_outs_undone_metric"] = r["undone_metric"]  # the daemon's own count (control/burst.py)
            real[arm].append(f)
            print(json.dumps({"arm": arm, "run": k, **{x: f[x] for x in ("token_attainment", "device_seconds")}}),
                  file=sys.stderr, flush=True)
    out: dict[str, Any] = {"seconds": args.seconds, "seed": args.seed, "runs": args.runs,
                           "requests": len(trace.arrival_s), "cpus": os.cpu_count(), "hold_s": HOLD_S}
    for arm, runs in real.items():
        out[arm] = _mean_of(runs)
    if not args.no_sim:  # bench/cluster_sim.py: uncalibrated, then calibrated on the real static arm
        for arm in ("janus", "static"):
            out[arm]["simulated"] = simulate(arm, trace, trace_path, base / f"sim-{arm}", args.seconds)
        scale, static_fit = fit_host_scale(trace, trace_path, base / "sim-fit", args.seconds,
                                           out["static"]["token_attainment"])
        out["sim_host_scale_fitted_on_static"] = scale
        out["static"]["simulated_fitted"] = static_fit
        out["janus"]["simulated_fitted"] = simulate("janus", trace, trace_path, base / "sim-janus-fitted",
                                                    args.seconds, scale)
    j, s = out["janus"], out["static"]
    out["janus_over_static"] = {"token_attainment": j["token_attainment"] - s["token_attainment"],
                                "device_seconds_ratio": j["device_seconds"] / s["device_seconds"]}
    return out


def _mean_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-run figures and their means (the spread is the runs' min..max)."""
    keys = ("token_attainment", "app_worst_token_attainment", "refused", "errors", "ttft_p99_ms", "device_seconds")
    out: dict[str, Any] = {k: statistics.fmean(r[k] for r in runs) for k in keys}
    out["runs"] = runs
    out["spread_token_attainment"] = [min(r["token_attainment"] for r in runs),
                                      max(r["token_attainment"] for r in runs)]
    out["per_app"] = {app: statistics.fmean(r["per_app"][app] for r in runs) for app in APPS}
    return out
