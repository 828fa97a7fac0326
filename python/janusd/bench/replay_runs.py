"""The daemon runs of `janus bench dispatch-replay` (bench/dispatch_replay.py, steps 1 and
3 of its doc): a fresh `janus serve` per run, warmed, then loaded (the capacity phase's
closed loop, or one replay of a trace) and scraped; each run's figures come from
bench/replay_figures.py."""

from __future__ import annotations

import argparse
import asyncio
import http.client
import sys
import time
from pathlib import Path
from typing import Any

from janusd.bench import daemon_proc
from janusd.bench.closed_loop import closed_loop, warmup
from janusd.bench.replay_figures import metrics_delta, metrics_figures, run_figures
from janusd.bench.replay_setup import (MODEL_NAME, RELAXED_SLO_MS, capacity_rps, daemon_config, scenario_models,
                                       warmup_lengths)
from janusd.bench.replay_trace import scenario_trace

MIX_RATE_RPS, MIX_SPAN_S = 20.0, 300.0  # the capacity mix: another rate and span of the scenario's trace


def _arun(coro: Any) -> Any:
    try:
        import uvloop  # the replayer's own lag stays lower on uvloop (as in `janus replay`)
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def _scrape(port: int) -> dict[str, float | None]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", "/metrics")
        return metrics_figures(conn.getresponse().read().decode())
    finally:
        conn.close()


def log(msg: str) -> None:
    print(f"dispatch-replay: {msg}", file=sys.stderr, flush=True)


def _scenario(args: argparse.Namespace) -> str:
    return str(getattr(args, "scenario", "one"))


def mix_triples(args: argparse.Namespace, kw: dict[str, Any]) -> tuple[Any, list[tuple[str, int, int]]]:
    """The scenario's length mix as (model, input, output) triples in a seeded random order
    (another span and rate of the same generator: other draws of the same per-app or
    per-class distributions), and the trace they come from."""
    import numpy as np

    # the same seed: the synthesizer's app profiles (kinds, length means) come from it, so
    # another seed would be another length mix; the other span and rate give other draws
    mix_trace = scenario_trace(_scenario(args), MIX_RATE_RPS, MIX_SPAN_S, ttft_slo_ms=RELAXED_SLO_MS,
                               tpot_slo_ms=RELAXED_SLO_MS, synth=kw)
    order = np.random.default_rng(kw["seed"]).permutation(len(mix_trace))
    names = mix_trace.models
    return mix_trace, [(names[int(mix_trace.model_id[i])], int(mix_trace.input_tokens[i]),
                        int(mix_trace.output_tokens[i])) for i in order]


def warm_triples(triples: list[tuple[str, int, int]], n: int) -> list[tuple[str, int, int]]:
    """n warm-up requests per served model, spread over that model's input lengths."""
    out: list[tuple[str, int, int]] = []
    for name in dict.fromkeys(t[0] for t in triples):
        mine = [(i, o) for m, i, o in triples if m == name]
        out += [(name, i, o) for i, o in warmup_lengths(mine, n)]
    return out


def measure_capacity(args: argparse.Namespace, cache: str, out: Path, kw: dict[str, Any]) -> dict[str, Any]:
    mix_trace, triples = mix_triples(args, kw)
    run_dir = out / "capacity"
    run_dir.mkdir(parents=True, exist_ok=True)
    served = scenario_models(_scenario(args), RELAXED_SLO_MS, RELAXED_SLO_MS)
    cfg = daemon_config(run_dir=run_dir, cache=cache, checkpoint=args.model, policy="least_load", plan=None,
                        ttft_slo_ms=RELAXED_SLO_MS, tpot_slo_ms=RELAXED_SLO_MS, memory_mib=args.memory_mib,
                        kv_cache_mib=args.kv_cache_mib,
                        models=[(m, RELAXED_SLO_MS, RELAXED_SLO_MS) for m, _, _ in served])
    proc, port = daemon_proc.start(cfg, run_dir, args.torch_threads, {m: 2 for m, _, _ in served})
    pairs = triples
    try:
        _arun(warmup(port, MODEL_NAME, warm_triples(triples, args.warmup_requests), RELAXED_SLO_MS))
        loop = _arun(closed_loop(port, MODEL_NAME, pairs, args.capacity_concurrency, args.capacity_s, RELAXED_SLO_MS))
    finally:
        daemon_proc.stop(proc)
    rps = capacity_rps(loop["done_s"], args.capacity_warmup_s, args.capacity_s)
    counted = sum(1 for t in loop["done_s"] if t >= args.capacity_warmup_s)
    if loop["failures"] > 0.05 * max(1, loop["sent"]) or counted < 10:
        raise RuntimeError(f"capacity phase unusable: {counted} completions counted, {loop['failures']} failures "
                           f"of {loop['sent']} sent (daemon log: {run_dir / 'daemon.log'})")
    return {"capacity_rps": round(rps, 3), "method": "closed_loop", "concurrency": args.capacity_concurrency,
            "seconds": args.capacity_s, "warmup_s": args.capacity_warmup_s, "completed_counted": counted,
            "failures": loop["failures"], "mix_mean_input": round(float(mix_trace.input_tokens.mean()), 1),
            "mix_mean_output": round(float(mix_trace.output_tokens.mean()), 1)}


def one_run(args: argparse.Namespace, cache: str, run_dir: Path, variant: dict[str, str | None], trace: Any,
             warm: list[tuple[Any, ...]]) -> dict[str, Any]:
    import msgspec

    from janusd.trace.replay import ReplayConfig, replay
    from janusd.trace.results import RequestResult

    cfg = daemon_config(run_dir=run_dir, cache=cache, checkpoint=args.model, policy=str(variant["policy"]),
                        plan=variant["plan"], objective=variant.get("objective"),
                        baseline=variant.get("baseline"), ttft_slo_ms=args.ttft_slo_ms, tpot_slo_ms=args.tpot_slo_ms,
                        memory_mib=args.memory_mib, kv_cache_mib=args.kv_cache_mib,
                        models=scenario_models(_scenario(args), args.ttft_slo_ms, args.tpot_slo_ms))
    marks = [time.monotonic()]
    proc, port = daemon_proc.start(cfg, run_dir, args.torch_threads,
                                   {m: 2 for m, _, _ in scenario_models(_scenario(args), 0.0, 0.0)})
    try:
        marks.append(time.monotonic())
        _arun(warmup(port, MODEL_NAME, warm, RELAXED_SLO_MS))
        before = _scrape(port)
        marks.append(time.monotonic())
        rcfg = ReplayConfig(url=f"http://127.0.0.1:{port}", max_lag_ms=args.max_lag_ms, timeout_s=300.0,
                            ttft_slo_ms=args.ttft_slo_ms, tpot_slo_ms=args.tpot_slo_ms, devices_poll_s=0.0)
        summary = _arun(replay(trace, rcfg, run_dir))
        after = _scrape(port)
        marks.append(time.monotonic())
    finally:
        exit_code = daemon_proc.stop(proc)
    marks.append(time.monotonic())
    steps = (round(b - a, 1) for a, b in zip(marks, marks[1:], strict=False))
    phases = dict(zip(("start_s", "warmup_s", "replay_s", "stop_s"), steps, strict=False))
    dec = msgspec.json.Decoder(RequestResult)
    rows = [dec.decode(line) for line in (run_dir / "results.jsonl").read_bytes().splitlines() if line.strip()]
    return {**run_figures(rows, trace.duration_s), **metrics_delta(before, after), "valid": summary["valid"],
            "lag_max_ms": summary["lag_max_ms"], "daemon_exit": exit_code, "wall_s": round(marks[-1] - marks[0], 1),
            **phases}
