"""`janus sim --scenario one|mixed`: the dispatch-replay scenarios on the simulator, so
that real and simulated dispatch stand on one table (issue 36).

Shared with `janus bench dispatch-replay` (one owner each, imported, not copied):
- the scenario's trace: replay_trace.scenario_trace (the same generator, seed, classes
  and SLOs) and its flags, replay_trace.add_scenario_arguments;
- the served models and their SLOs (replay_setup.scenario_models) and each variant's
  daemon config (replay_setup.variants, daemon_config): the simulator runs that very
  TOML through sim/configured.py, so its [dispatch] keys (a peer kind's among them), its
  pins (every model on devices 0 and 1) and its [engine] limits are the daemon's;
- the capacity's definition: a closed loop of --capacity-concurrency clients drawing the
  scenario's length mix at relaxed SLOs under least_load, completions after the warm-up
  per second (replay_setup.capacity_rps); loads are multiples of the *simulated* capacity,
  as the real bench's are of its measured one;
- the figures: replay_figures.run_figures on the simulated rows.

The simulator's own: time and the workers (cpu devices of the performance model fitted to
this machine's engine bench, host figures scaled by the factor a real replay gave:
bench/cluster_sim.py's CALIBRATION and HOST_SCALE). Deterministic: one run per load and
variant. The one-model scenario's apps fold into the one served model, as the daemon
serves them (the simulator would otherwise make each app a model of its own).
`--bench-json FILE` (a real run's last line) puts its per-run token attainments beside
the simulated ones; the loads, seed and scenario are then the real run's.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from janusd.bench.replay_setup import (DEFAULT_OBJECTIVE, DEFAULT_PLAN, OBJECTIVES, POLICIES, BASELINES, RELAXED_SLO_MS,
                                       capacity_rps, daemon_config, parse_list, parse_loads, scenario_models,
                                       variants)
from janusd.bench.replay_trace import scenario_trace, synth_kw

DEVICE_MEMORY_MIB = 1024  # the bench's --memory-mib default
KV_CACHE_MIB = 256  # the bench's --kv-cache-mib default
CHECKPOINT = "demo:llama-small"
MAX_CLOSED_LOOP_RPS = 40.0  # rows made for the closed loop: well above any cpu capacity here


def add_arguments(p: argparse.ArgumentParser) -> None:
    from janusd.bench.replay_trace import add_scenario_arguments

    g = p.add_argument_group("dispatch-replay scenario (--scenario; then --trace, --devices, --policy unused)")
    add_scenario_arguments(g, scenario_default=None)
    g.add_argument("--bench-json", default=None,
                   help="a `janus bench dispatch-replay --json` result: its scenario, seed, loads, duration and "
                        "capacity flags are used, and its per-run figures printed beside the simulated ones")


def _archs(names: list[str]) -> dict[str, Any]:
    """Every served model is CHECKPOINT's architecture (the bench serves one checkpoint)."""
    import msgspec

    from janusd.engine.checkpoint.demo import demo_arch
    from janusd.hw.model_spec import ModelSpec
    from janusd.sim.specs import SimModel

    arch, size = CHECKPOINT.split(":")[1].split("-")
    spec = ModelSpec.from_config(msgspec.to_builtins(demo_arch(arch, size)))
    return {n: SimModel.from_spec(n, spec) for n in names}


def calibrated_perf(arch: Any) -> Any:
    """cluster_sim.py's calibration of the cpu model (the engine bench's steps, host
    figures times HOST_SCALE), for `arch` on devices of DEVICE_MEMORY_MIB."""
    import dataclasses

    from janusd.bench.cluster_sim import CALIBRATION, HOST_SCALE
    from janusd.hw import device_spec
    from janusd.sim.calibrate import fit, points_from_bench
    from janusd.sim.perfmodel import PerfModel

    result = json.loads(CALIBRATION.read_text().strip().splitlines()[-1])
    p = fit(points_from_bench(result, "demo-llama-small"), arch,
            PerfModel(device_spec("cpu", hbm_bytes=DEVICE_MEMORY_MIB * 2**20))).perf
    return dataclasses.replace(p, overhead_s=p.overhead_s * HOST_SCALE, seq_overhead_s=p.seq_overhead_s * HOST_SCALE)


def scenario_config(scenario: str, work: Path, variant: dict[str, Any], ttft_slo_ms: float, tpot_slo_ms: float,
                    relaxed: bool = False) -> Any:
    """The daemon config the real bench runs for `variant` (relaxed: the capacity phase's)."""
    from janusd.config import load_config

    models = scenario_models(scenario, ttft_slo_ms, tpot_slo_ms)
    if relaxed:
        models = [(m, RELAXED_SLO_MS, RELAXED_SLO_MS) for m, _, _ in models]
    text = daemon_config(run_dir=work, cache=str(work), checkpoint=CHECKPOINT, policy=str(variant["policy"]),
                         plan=variant.get("plan"), objective=variant.get("objective"),
                         baseline=variant.get("baseline"), ttft_slo_ms=ttft_slo_ms, tpot_slo_ms=tpot_slo_ms,
                         memory_mib=DEVICE_MEMORY_MIB, kv_cache_mib=KV_CACHE_MIB, models=models)
    path = work / "janusd.toml"
    path.write_text(text)
    return load_config(path)


def served_trace(scenario: str, trace: Any) -> Any:
    """The trace as the daemon serves it: one served model per scenario model (module doc)."""
    from janusd.trace.formats import Trace

    if scenario == "mixed":
        return trace
    return Trace(trace.arrival_s, trace.model_id.copy(), trace.model_id, trace.input_tokens, trace.output_tokens,
                 trace.ttft_slo_ms, trace.tpot_slo_ms, trace.models, trace.models)


def _cluster(trace: Any, cfg: Any, perf: Any) -> Any:
    from janusd.sim.run import configured_cluster
    from janusd.sim.worker import EngineLimits

    engine = EngineLimits(max_num_seqs=cfg.engine.max_num_seqs, max_batched_tokens=cfg.engine.max_num_batched_tokens,
                          kv_wait_timeout_s=cfg.engine.kv_wait_timeout_s)
    return configured_cluster(trace, _archs(list(trace.models)), 2, "static", perf, engine, cfg, keep_times=True)


def sim_capacity(args: argparse.Namespace, perf: Any, work: Path) -> dict[str, Any]:
    """The closed loop of the real capacity phase, simulated (module doc)."""
    import numpy as np

    from janusd.trace.formats import Trace

    mix = served_trace(args.scenario, scenario_trace(args.scenario, 20.0, 300.0, ttft_slo_ms=RELAXED_SLO_MS,
                                                     tpot_slo_ms=RELAXED_SLO_MS, synth=synth_kw(args)))
    order = np.random.default_rng(args.seed).permutation(len(mix))  # replay_runs.mix_triples' order
    c = args.capacity_concurrency
    n = c + int(MAX_CLOSED_LOOP_RPS * args.capacity_s)
    rows = order[np.arange(n) % len(order)]
    later = 1e9  # rows not yet sent: released one per completion (Cluster.release)
    arrival = np.where(np.arange(n) < c, 0.0, later)
    names = [mix.models[int(mix.model_id[k])] for k in rows]
    t = Trace.build(arrival, names, names, mix.input_tokens[rows], mix.output_tokens[rows],
                    np.full(n, RELAXED_SLO_MS), np.full(n, RELAXED_SLO_MS))
    cfg = scenario_config(args.scenario, work, {"policy": "least_load"}, RELAXED_SLO_MS, RELAXED_SLO_MS, relaxed=True)
    cluster = _cluster(t, cfg, perf)
    done: list[float] = []
    nxt = [c]

    def on_done(_row: int, now: float) -> None:
        if now < args.capacity_s:
            done.append(now)
            if nxt[0] < n:
                cluster.release(nxt[0], now)
                nxt[0] += 1

    cluster.on_done = on_done
    cluster.run()
    return {"capacity_rps": round(capacity_rps(done, args.capacity_warmup_s, args.capacity_s), 3),
            "method": "simulated_closed_loop", "concurrency": c, "seconds": args.capacity_s,
            "warmup_s": args.capacity_warmup_s}


def sim_run(args: argparse.Namespace, trace: Any, variant: dict[str, Any], perf: Any, work: Path) -> dict[str, Any]:
    """One variant on one load's trace: the real bench's figures of the simulated rows."""
    from janusd.bench.replay_figures import run_figures

    cfg = scenario_config(args.scenario, work, variant, args.ttft_slo_ms, args.tpot_slo_ms)
    cluster = _cluster(served_trace(args.scenario, trace), cfg, perf)
    cluster.run()
    import msgspec

    # a request the core refused as late is what the daemon answers with 503 slo_unattainable
    rows = [msgspec.structs.replace(r, http_status=503, error="slo_unattainable (simulated)")
            if r.error == "rejected" else r for r in cluster.result_rows()]
    return {**run_figures(rows, trace.duration_s), "outcomes": dict(sorted(cluster.outcome_counts.items()))}


def _adopt(args: argparse.Namespace, real: dict[str, Any]) -> None:
    """The real run's scenario, seed, loads, variants and capacity flags onto args."""
    if real.get("bench") != "dispatch-replay" or "results" not in real:
        raise ValueError("--bench-json: not a `janus bench dispatch-replay --json` result")
    args.scenario = real.get("scenario", "one")
    for key in ("seed", "duration_s", "ttft_slo_ms", "tpot_slo_ms"):
        setattr(args, key, real[key])
    for key, value in (real.get("synth") or {}).items():
        setattr(args, key, value)
    args.loads = ",".join(real["results"])
    args.policies = ",".join(real.get("policies") or POLICIES)
    args.baselines = ",".join(real.get("baselines") or BASELINES)
    args.objectives = ",".join(real.get("objectives") or [DEFAULT_OBJECTIVE])
    cap = real.get("capacity") or {}
    if cap.get("method") == "closed_loop":
        args.capacity_concurrency, args.capacity_s, args.capacity_warmup_s = (
            cap["concurrency"], cap["seconds"], cap["warmup_s"])


def real_runs(real: dict[str, Any] | None, load: str, label: str) -> list[float]:
    """The real run's token attainment of each run of (load, variant), in run order."""
    if real is None:
        return []
    return [r["token_attainment"] for r in real.get("per_run") or []
            if str(r.get("load")) == load and r.get("variant") == label and r.get("token_attainment") is not None]


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every load and variant simulated; a table (with the real runs beside) to stderr."""
    import sys

    real = None
    if args.bench_json:
        real = json.loads(Path(args.bench_json).read_text().strip().splitlines()[-1])
        _adopt(args, real)
    vs = variants(parse_list(args.policies, POLICIES, "policy"), [DEFAULT_PLAN],
                  parse_list(args.objectives, OBJECTIVES, "objective"),
                  parse_list(args.baselines, BASELINES, "baseline kind"))
    loads = parse_loads(args.loads)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="janus-sim-scenario-") as d:
        work = Path(d)
        names = [m for m, _, _ in scenario_models(args.scenario, 0.0, 0.0)]
        perf = calibrated_perf(_archs(names[:1])[names[0]])
        capacity = sim_capacity(args, perf, work)
        cap = float(capacity["capacity_rps"])
        for load in loads:
            trace = scenario_trace(args.scenario, load * cap, args.duration_s, ttft_slo_ms=args.ttft_slo_ms,
                                   tpot_slo_ms=args.tpot_slo_ms, synth=synth_kw(args))
            results[str(load)] = {str(v["label"]): sim_run(args, trace, v, perf, work) for v in vs}
    real_cap = ((real or {}).get("capacity") or {}).get("capacity_rps")
    print(f"capacity: simulated {capacity['capacity_rps']} req/s"
          + (f", real {real_cap} req/s" if real_cap is not None else ""), file=sys.stderr)
    for line in table(results, real):
        print(line, file=sys.stderr)
    return {"bench": "dispatch-replay", "source": "sim", "scenario": args.scenario, "seed": args.seed,
            "duration_s": args.duration_s, "capacity": capacity,
            "real_capacity": (real or {}).get("capacity"), "results": results,
            "real": {load: {label: real_runs(real, load, label) for label in per} for load, per in results.items()}
            if real is not None else None}


def table(results: dict[str, Any], real: dict[str, Any] | None) -> list[str]:
    """Per load and variant: simulated token attainment and refusals, the real runs beside."""
    lines = []
    for load, per in results.items():
        lines.append(f"load {load}x: variant  sim token_att  sim rejected  real token_att runs (mean)")
        for label, f in per.items():
            runs = real_runs(real, load, label)
            mean = f" ({sum(runs) / len(runs):.3f})" if runs else ""
            by = "  ".join(f"{m} {x['token_attainment']:.3f}" for m, x in (f.get("by_model") or {}).items())
            lines.append(f"  {label:<20} {f['token_attainment']:.3f}  {f['rejected']:>4}  "
                         f"{', '.join(f'{x:.3f}' for x in runs) or '-'}{mean}   {by}")
    return lines
