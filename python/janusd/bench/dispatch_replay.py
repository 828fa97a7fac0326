"""`janus bench dispatch-replay`: the dispatch policies compared end to end on a real daemon.

Setup: one model (`--model`, default demo:llama-small) with an instance on each of two
CPU devices (devices = [0, 1]), served by a real `janus serve` (bench/daemon_proc.py),
TTFT SLO 500 ms and TPOT SLO 50 ms (`--ttft-slo-ms`, `--tpot-slo-ms`; in the model's
config and on every trace row, so the dispatcher schedules by exactly the SLO the
accounting checks). Each policy of `--policies` is one `dispatch.policy`; each plan of
`--plans` other than "global" is written as `dispatch.plan` for lst_imh (the plan only
changes how LST-IMH plans, so the baselines run without the key). With `--plans` left at
"global" no `plan` key is written at all, so the bench runs against a daemon that does
not know the key yet.

Baselines (`--baselines`, default both): "peer" runs round_robin and least_load as the
routers of peer systems do, with no deadline anywhere (`requeue = "keep"`: a late request
is served late, never refused; `admission = "queue"`; `decode_guard = false`), the
comparison the paper makes (its 92.4% vs 64.8% at 2x). "guarded" runs them with the
daemon's defaults, i.e. with janus' own deadline machinery (the early refusal, the
reject-on-late requeue and the decode guard) wrapped around the baseline's instance
choice: not a system anyone deploys, but the test of what the assignment rule alone adds.
Both are labelled `policy/peer` and `policy/guarded` when both are asked.

1. Capacity. A fresh daemon (least_load, SLOs of 600 s so nothing is rejected) serves a
   closed loop of `--capacity-concurrency` clients for `--capacity-s` seconds; each client
   sends requests drawn in turn from the trace's length mix (the same synthesizer
   parameters and seed, a longer span: other draws of the same per-app length
   distributions) and sends the next as soon as one completes. Capacity is the
   number of requests completed after `--capacity-warmup-s` divided by the rest of the
   window. Why this definition: in a closed loop every completion is replaced by a fresh
   draw from the mix, so in steady state the completion rate *is* the sustained request
   rate at that mix, prefill and decode work included, with no tokens-to-requests
   conversion to assume; the bounded client count keeps both instances busy (two full
   batches' worth at the default 32) without the ever-growing queue of an over-driven
   open loop, and the warm-up drops the start, when only short requests have completed.
   It is a saturation throughput, not an SLO-bounded one: 1.0x is the most the two
   instances complete, whatever the latency. The load generator shares the machine (as
   in the replays), so on a small box the figure includes the client's cost.
   `--capacity-rps R` skips the phase and uses R.
2. Traces (bench/replay_trace.py). For each load x of `--loads` (default 0.7 and 1.5), trace/synth.py (the code
   behind `janus trace synth`) makes `--apps` apps with its skewed, per-app length mix and
   its bursts: it synthesizes `--compress` x the run's duration at rate x * capacity /
   compress, with `--bursts-per-app` expected bursts per app over that span, and the
   time axis is then compressed by `--compress` (trace/transform.py), so a burst's 1-5 s
   ramp and 20-120 s decay become sharper, as when the paper compresses its day. Every
   app is mapped onto the one model, lengths are capped by the synthesizer's own clip
   (`--max-input`, `--max-output`) and every row carries the bench's SLO. The trace of a
   load is the same for every policy and every run (seeded by `--seed`): the runs of a
   policy differ by the system's own noise only, and the comparison is paired.
3. Runs. `--runs` repetitions in interleaved order (run 1 of every load and policy, then
   run 2, ...), a fresh daemon per run. Before each replay a few sequential requests of
   lengths spanning the mix (`--warmup-requests`, generous SLO) warm both workers and
   the prefill estimator; then trace/replay.py replays the trace open loop. From the
   per-request results (trace/slo.py): per-token attainment, TTFT attainment, requests
   rejected with 503 slo_unattainable, other failures, p50/p99 TTFT of the requests that
   produced tokens (rejected requests have none; their cost shows in the attainments).
   /metrics is scraped before and after the replay (prometheus_client's parser): the
   difference gives `janusd_rejected_total{reason="slo"}` and, when the daemon exports
   `janusd_prefill_estimate_error_seconds` (histogram or summary of absolute errors),
   the replay's mean absolute prefill estimate error (sum / count; null when absent).
   A run whose replayer fell behind schedule by more than `--max-lag-ms` is marked
   invalid (its figures describe the client) and still reported.
4. Output. Per load and policy: mean, min and max over runs of token attainment, TTFT
   attainment, rejections, p99 TTFT and the prefill estimate error; per load a verdict
   on token attainment for each lst_imh variant against every other variant:
   "beyond_spread" (its worst run >= the other's best run), "mean_above", "tie" (equal
   means) or "not_better"; "overall" is the weakest of those, "missing" names any variant
   without a successful run to compare with. Last line: one JSON object.

Default cost: 2 loads x 5 variants (lst_imh, two baselines x two kinds) x 3 runs = 30 runs
of `--duration-s` (25 s) plus, per run, a daemon start (~5 s on a busy 2-core VM), the warm-up (~1 s), the drain of what is
still in flight when the trace ends (seconds at 1.5x) and the stop (~2 s); with the
capacity phase (~35 s) about 20 minutes on that VM.

What runs (variants, order, daemon config) is bench/replay_setup.py, the daemon runs
bench/replay_runs.py, the figures and verdicts bench/replay_figures.py; this module holds
the flags and the steps in order.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from janusd.bench.replay_figures import _fmt, _table, aggregate, rounded, verdicts
from janusd.bench.replay_runs import log, measure_capacity, one_run, warm_triples
from janusd.bench.replay_setup import (BASELINES, DEFAULT_OBJECTIVE, DEFAULT_PLAN, OBJECTIVES, PLANS, POLICIES,
                                       parse_list, parse_loads, schedule, scenario_models, variants)
from janusd.bench.replay_trace import add_scenario_arguments, peak_to_mean, scenario_trace, synth_kw


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="demo:llama-small",
                   help="checkpoint spec of the one model, or of each mixed model (default demo:llama-small)")
    add_scenario_arguments(p)
    p.add_argument("--plans", default=DEFAULT_PLAN,
                   help="comma-separated dispatch.plan values for lst_imh (global|window); a plan other than "
                        "global is written into [dispatch], the default writes no plan key")
    p.add_argument("--runs", type=int, default=3, help="runs per load and policy (interleaved, fresh daemon each)")
    p.add_argument("--capacity-rps", type=float, default=None, help="skip the capacity phase and use this rate")
    p.add_argument("--warmup-requests", type=int, default=8, help="sequential warm-up requests before each replay")
    p.add_argument("--max-lag-ms", type=float, default=100.0, help="replayer lag bound; beyond it a run is invalid")
    p.add_argument("--memory-mib", type=int, default=1024, help="page pool per device")
    p.add_argument("--kv-cache-mib", type=int, default=256, help="KV cache per instance")
    p.add_argument("--torch-threads", type=int, default=1, help="torch threads per worker")
    p.add_argument("--cache-dir", default=None, help="checkpoint cache dir (default: the config default)")
    p.add_argument("--out-dir", default=None, help="keep traces, results and daemon logs here (default: a temp dir)")


def _capacity(args: argparse.Namespace, cache: str, out: Path, kw: dict[str, Any]) -> dict[str, Any]:
    """Step 1: the capacity given (--capacity-rps) or measured by the closed loop."""
    if args.capacity_rps is not None:
        if not args.capacity_rps > 0:
            raise ValueError("--capacity-rps must be > 0")
        return {"capacity_rps": args.capacity_rps, "method": "given"}
    log(f"measuring capacity: closed loop of {args.capacity_concurrency} clients for {args.capacity_s} s")
    return measure_capacity(args, cache, out, kw)


def _traces(args: argparse.Namespace, loads: list[float], cap: float, out: Path,
            kw: dict[str, Any]) -> tuple[dict[float, Any], dict[str, Any]]:
    """Step 2: the trace of each load, written to the out dir, and what each is like."""
    traces: dict[float, Any] = {}
    trace_info: dict[str, Any] = {}
    for load in loads:
        from janusd.trace.formats import write_trace

        t = scenario_trace(getattr(args, "scenario", "one"), load * cap, args.duration_s,
                           ttft_slo_ms=args.ttft_slo_ms, tpot_slo_ms=args.tpot_slo_ms, synth=kw)
        traces[load] = t
        write_trace(t, out / f"trace-{load}.csv")
        trace_info[str(load)] = {"rate_rps": round(load * cap, 3), "requests": len(t),
                                 "span_s": round(t.duration_s, 2), "peak_to_mean_2s": peak_to_mean(t.arrival_s),
                                 "mean_input": round(float(t.input_tokens.mean()), 1),
                                 "mean_output": round(float(t.output_tokens.mean()), 1)}
    return traces, trace_info


def _runs(args: argparse.Namespace, cache: str, out: Path, loads: list[float], vs: list[dict[str, str | None]],
          traces: dict[float, Any], warm: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
    """Step 3: every run in interleaved order; a failed run is recorded with its error."""
    labels = [str(v["label"]) for v in vs]
    by_label = {str(v["label"]): v for v in vs}
    records: list[dict[str, Any]] = []
    plan = schedule(loads, labels, args.runs)
    for k, (r, load, label) in enumerate(plan, start=1):
        run_dir = out / f"load{load}" / label.replace("/", "-") / f"run{r}"
        run_dir.mkdir(parents=True, exist_ok=True)
        rec: dict[str, Any] = {"load": load, "variant": label, "run": r}
        try:
            rec.update(one_run(args, cache, run_dir, by_label[label], traces[load], warm))
            log(f"[{k}/{len(plan)}] load {load} {label} run {r}: token att {_fmt(rec['token_attainment'])}, "
                f"ttft att {_fmt(rec['ttft_attainment'])}, rejected {rec['rejected']}, "
                f"p99 ttft {_fmt(rec['ttft_p99_ms'], 1)} ms, valid {rec['valid']} ({rec['wall_s']} s)")
        except (RuntimeError, OSError, ValueError) as e:
            rec["error"] = f"{type(e).__name__}: {e}"[-2000:]
            log(f"[{k}/{len(plan)}] load {load} {label} run {r} FAILED: {rec['error'][-600:]}")
        records.append(rec)
    return records


def run(args: argparse.Namespace) -> dict[str, Any]:
    from janusd.config import ServerConfig, cache_dir
    from janusd.trace.results import jsonable

    policies = parse_list(args.policies, POLICIES, "policy")
    plans = parse_list(args.plans, PLANS, "plan")
    objectives = parse_list(args.objectives, OBJECTIVES, "objective")
    loads = parse_loads(args.loads)
    if args.runs < 1 or not args.duration_s > 0:
        raise ValueError("--runs must be >= 1 and --duration-s > 0")
    baselines = parse_list(args.baselines, BASELINES, "baseline kind")
    vs = variants(policies, plans, objectives, baselines)
    labels = [str(v["label"]) for v in vs]
    cache = args.cache_dir or str(cache_dir(ServerConfig()))
    out = Path(args.out_dir) if args.out_dir else Path(tempfile.mkdtemp(prefix="janus-bench-dispatch-replay-"))
    out.mkdir(parents=True, exist_ok=True)
    kw = synth_kw(args)
    t_start = time.monotonic()

    capacity = _capacity(args, cache, out, kw)
    cap = float(capacity["capacity_rps"])
    log(f"capacity {cap:.2f} req/s")
    traces, trace_info = _traces(args, loads, cap, out, kw)
    import numpy as np

    all_triples = [(t.models[int(m)], int(i), 1) for t in traces.values()
                   for m, i in zip(np.asarray(t.model_id), np.asarray(t.input_tokens), strict=True)]
    warm = warm_triples(all_triples, args.warmup_requests)
    records = _runs(args, cache, out, loads, vs, traces, warm)

    agg = aggregate(records, loads, labels)
    pol = {str(v["label"]): str(v["policy"]) for v in vs}
    verdict = {load: verdicts(per, pol) for load, per in agg.items()}
    for line in _table(agg, verdict):
        print(line)
    return jsonable(rounded({  # type: ignore[return-value]
        "bench": "dispatch-replay",
        "scenario": args.scenario,
        "model": args.model,
        "served": [{"name": n, "ttft_slo_ms": a, "tpot_slo_ms": b}
                   for n, a, b in scenario_models(args.scenario, args.ttft_slo_ms, args.tpot_slo_ms)],
        "devices": [0, 1],
        "ttft_slo_ms": args.ttft_slo_ms,
        "tpot_slo_ms": args.tpot_slo_ms,
        "policies": policies,
        "plans": plans,
        "objectives": objectives,
        "baselines": baselines,
        "runs": args.runs,
        "duration_s": args.duration_s,
        "seed": args.seed,
        "synth": kw,
        "capacity": capacity,
        "traces": trace_info,
        "results": agg,
        "verdict": verdict,
        "failed_runs": sum(1 for r in records if r.get("error")),
        "invalid_runs": sum(1 for r in records if r.get("valid") is False),
        "per_run": [{k: v for k, v in r.items()} for r in records],
        "out_dir": str(out),
        "wall_s": round(time.monotonic() - t_start, 1),
    }))
